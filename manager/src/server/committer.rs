//! Group commit, off the request path: a Publish's copies, once PublishCopied is sent, go to the
//! committer, which appends every Publish waiting — from every publisher — together, makes them
//! durable with one sync (the store holds records back, unreadable, until then) and sends each
//! PublishDurable from there. The publisher's connection meanwhile serves its next requests. On
//! stop, Publishes not yet begun are dropped unanswered (they were never acknowledged durable).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::metrics::Timed;
use crate::protocol::Message;
use crate::transfer::Copied;

use super::Shared;
use super::conn::Conn;

/// A Publish waiting to be stored.
pub(crate) struct Job {
    /// The publisher's connection.
    pub(crate) conn: Arc<Conn>,
    /// The Publish's request id.
    pub(crate) request: u64,
    /// Its copies.
    pub(crate) copied: Copied,
    /// Connection memory it holds until stored.
    pub(crate) reserved: u64,
    /// When the Publish arrived.
    pub(crate) started: Instant,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    stopping: bool,
}

/// The committer's queue.
#[derive(Default)]
pub(crate) struct Committer {
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl Committer {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job`; false (nothing queued) once stopping.
    pub(crate) fn submit(&self, job: Job) -> bool {
        let mut q = self.queue();
        if q.stopping {
            drop(q);
            release(job);
            return false;
        }
        q.jobs.push_back(job);
        self.wake.notify_one();
        true
    }

    /// Stops the committer: the bundle being stored finishes; the rest are dropped.
    pub(crate) fn stop(&self) {
        let jobs = {
            let mut q = self.queue();
            q.stopping = true;
            std::mem::take(&mut q.jobs)
        };
        self.wake.notify_all();
        for j in jobs {
            release(j);
        }
    }

    /// Runs until stopped: takes every Publish waiting, stores them together, answers each.
    pub(crate) fn run(&self, shared: &Shared) {
        loop {
            let jobs: Vec<Job> = {
                let mut q = self.queue();
                while q.jobs.is_empty() && !q.stopping {
                    q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                if q.stopping {
                    return;
                }
                q.jobs.drain(..).collect()
            };
            commit(shared, jobs);
        }
    }
}

/// Stores `jobs` together, makes them durable, and answers each Publish.
fn commit(shared: &Shared, jobs: Vec<Job>) {
    let copies: Vec<&Copied> = jobs.iter().map(|j| &j.copied).collect();
    let mut stored = crate::transfer::store_copies(&shared.store, &copies);
    // A store that syncs every put has made them durable already; else one sync for all.
    if stored.iter().any(|s| !s.durable)
        && let Err(e) = shared.store.sync()
    {
        for s in &mut stored {
            s.sync_failed(&e);
        }
    }
    for (job, s) in jobs.into_iter().zip(stored) {
        shared.metrics.pages(&s.statuses, false);
        let (conn, request, started) = (job.conn.clone(), job.request, job.started);
        // The buffers go back first: the publisher's next Publish, sent as soon as this reply
        // arrives, finds them.
        release(job);
        conn.outbox.send(
            request,
            &Message::PublishDurable {
                pages: s.statuses,
                retry_after_ms: crate::session::millis(s.retry_after),
            },
        );
        shared
            .metrics
            .observe(Timed::PublishDurable, started.elapsed());
        shared
            .metrics
            .committed_publishes
            .fetch_add(1, Ordering::Relaxed);
    }
    shared.metrics.commits.fetch_add(1, Ordering::Relaxed);
}

/// Gives a Publish's memory and copy buffers back to its connection.
fn release(job: Job) {
    job.conn.memory.release(job.reserved);
    job.conn.give_back(job.copied.into_buffers());
}
