//! Group commit, off the request path: a Publish's copies, once PublishCopied is sent, go to the
//! committer, which appends the Publishes waiting — from every publisher — together, makes them
//! durable with one sync (the store holds records back, unreadable, until then) and sends each
//! PublishDurable from there. The publisher's connection meanwhile serves its next requests.
//! Two threads share the work: the encoder takes the Publishes waiting, in batches of at most
//! [`BATCH_BYTES`], and encodes their bundles (the payload copy and CRC); the committer appends
//! each bundle as it comes, syncs once it has caught up or appended [`SYNC_AFTER`] bytes, and
//! answers every Publish of the batches appended whole. So the next batch is encoded while the
//! last one is written and synced. On stop, Publishes not yet stored are dropped unanswered (they
//! were never acknowledged durable).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use orbitkv_protocol::Message;

use crate::metrics::Timed;
use crate::transfer::{Bundle, Copied, Stored, bundle_records, store_bundle, take_records};

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

    /// The encoder, until stopped: takes the Publishes waiting (up to [`BATCH_BYTES`] of them,
    /// oldest first), encodes their records in bundles and hands the batch to the committer
    /// through `to_committer` (bounded: it waits while the committer is that many bundles
    /// behind).
    pub(crate) fn run_encoder(&self, shared: &Shared, to_committer: &SyncSender<Handoff>) {
        loop {
            let mut jobs: Vec<Job> = {
                let mut q = self.queue();
                while q.jobs.is_empty() && !q.stopping {
                    q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                if q.stopping {
                    return;
                }
                // A batch is bounded, so its sync comes (and its publishers, answered, send
                // their next Publishes) while the rest waiting is still being written.
                let mut bytes = 0u64;
                let take = q
                    .jobs
                    .iter()
                    .take_while(|j| {
                        let first = bytes == 0;
                        bytes += j.reserved.max(1);
                        first || bytes <= BATCH_BYTES
                    })
                    .count();
                q.jobs.drain(..take).collect()
            };
            let mut copies: Vec<&mut Copied> = jobs.iter_mut().map(|j| &mut j.copied).collect();
            let records = take_records(&mut copies);
            let stored = copies.iter().map(|c| Stored::new(c)).collect();
            if to_committer.send(Handoff::Begin(jobs, stored)).is_err() {
                return;
            }
            let mut open = true;
            bundle_records(&shared.store, records, &mut |b| {
                open = to_committer.send(Handoff::Bundle(b)).is_ok();
                open
            });
            if !open || to_committer.send(Handoff::End).is_err() {
                return;
            }
        }
    }

    /// The committer, until stopped or the encoder ends: appends each bundle as it comes; once
    /// it has caught up with the encoder (or appended [`SYNC_AFTER`] bytes since its last sync),
    /// makes every batch appended whole durable with one sync and answers each Publish. Batches
    /// the encoder finished meanwhile share the next sync.
    pub(crate) fn run(&self, shared: &Shared, from_encoder: &Receiver<Handoff>) {
        // The batch being appended, and the batches appended whole since the last sync.
        let mut current: Option<Batch> = None;
        let mut appended: Vec<Batch> = Vec::new();
        let mut bytes = 0usize;
        loop {
            let h = match from_encoder.try_recv() {
                Ok(h) => h,
                Err(TryRecvError::Empty) if !appended.is_empty() => {
                    commit(shared, std::mem::take(&mut appended));
                    bytes = 0;
                    continue;
                }
                Err(TryRecvError::Empty) => match from_encoder.recv() {
                    Ok(h) => h,
                    Err(_) => return,
                },
                Err(TryRecvError::Disconnected) => return,
            };
            if self.queue().stopping {
                return;
            }
            match h {
                Handoff::Begin(jobs, stored) => {
                    current = Some(Batch {
                        jobs,
                        stored,
                        lost_before: shared.store.lost_records(),
                    });
                }
                Handoff::Bundle(b) => {
                    if let Some(Batch { stored, .. }) = &mut current {
                        bytes += b.bytes();
                        store_bundle(&shared.store, b, stored);
                    }
                }
                Handoff::End => appended.extend(current.take()),
            }
            if bytes >= SYNC_AFTER && !appended.is_empty() {
                commit(shared, std::mem::take(&mut appended));
                bytes = 0;
            }
        }
    }
}

/// The committer syncs at least once per this many bytes appended, even while the encoder keeps
/// it busy.
const SYNC_AFTER: usize = 32 << 20;

/// Bytes of Publishes one batch takes at most (at least one Publish): a sync can only answer
/// batches appended whole, so an unbounded batch — every Publish waiting — would leave each
/// publisher unanswered, and the device idle, until all of them are written.
const BATCH_BYTES: u64 = 16 << 20;

/// What the encoder hands the committer, for each batch: its Publishes, each bundle of their
/// records, then the end.
pub(crate) enum Handoff {
    /// A batch begins: its Publishes (their records taken out for the bundles that follow) and
    /// their statuses after the copy.
    Begin(Vec<Job>, Vec<Stored>),
    /// One bundle of the batch's records, encoded.
    Bundle(Bundle),
    /// Every bundle of the batch has been sent.
    End,
}

/// Bundles the committer may be behind the encoder: bounds the memory of encoded bundles
/// waiting (each at most [`crate::transfer::COMMIT_BUNDLE_BYTES`] of payload).
pub(crate) const BUNDLES_AHEAD: usize = 8;

/// A batch of Publishes the committer appends: their statuses, and the store's count of lost
/// records before the first of their records was put.
pub(crate) struct Batch {
    jobs: Vec<Job>,
    stored: Vec<Stored>,
    lost_before: u64,
}

/// Makes the records of `batches` (appended whole) durable with one sync and answers each
/// Publish. A Publish whose records waited for the sync is not durable if the sync failed, or
/// if the store lost records since its batch began: a failed write or sync drops every record
/// not yet synced, and another caller's sync (the next batch's, a client's Sync) may be the one
/// that reported it.
fn commit(shared: &Shared, batches: Vec<Batch>) {
    // A store that syncs every put has made them durable already; else one sync for all.
    let waiting = batches.iter().any(|b| b.stored.iter().any(|s| !s.durable));
    let synced = if waiting { shared.store.sync() } else { Ok(()) };
    let lost_now = shared.store.lost_records();
    let mut jobs = Vec::new();
    let mut stored = Vec::new();
    for b in batches {
        for mut s in b.stored {
            durable_after(&mut s, &synced, b.lost_before, lost_now);
            stored.push(s);
        }
        jobs.extend(b.jobs);
    }
    for (job, mut s) in jobs.into_iter().zip(stored) {
        shared.metrics.pages(&s.statuses, false);
        let (conn, request, started) = (job.conn.clone(), job.request, job.started);
        // The buffers go back first: the publisher's next Publish, sent as soon as this reply
        // arrives, finds them.
        let mut buffers = std::mem::take(&mut s.buffers);
        buffers.extend(job.copied.into_buffers());
        job.conn.memory.release(job.reserved);
        job.conn.publishes.release(job.reserved);
        conn.give_back(buffers);
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

/// What a Publish's statuses become after the commit's sync (`synced`): records that waited for
/// it are not stored if it failed, or if the store lost records between the batch's start
/// (`lost_before`) and now (`lost_now`).
fn durable_after(
    s: &mut Stored,
    synced: &orbitkv_store::Result<()>,
    lost_before: u64,
    lost_now: u64,
) {
    if s.durable {
        return;
    }
    if let Err(e) = synced {
        s.sync_failed(e);
    } else if lost_now > lost_before {
        s.sync_failed(&orbitkv_store::Error::Lost {
            records: lost_now - lost_before,
        });
    }
}

/// Gives a Publish's memory and copy buffers back to its connection.
fn release(job: Job) {
    job.conn.memory.release(job.reserved);
    job.conn.publishes.release(job.reserved);
    job.conn.give_back(job.copied.into_buffers());
}

#[cfg(test)]
mod tests {
    use orbitkv_protocol::PageStatus::{self, Refused, RetryLater};

    use super::*;

    fn waiting(statuses: &[PageStatus]) -> Stored {
        Stored {
            statuses: statuses.to_vec(),
            durable: false,
            retry_after: std::time::Duration::ZERO,
            buffers: Vec::new(),
        }
    }

    #[test]
    fn records_lost_since_the_batch_began_are_not_durable_after_a_good_sync() {
        // Another sync reported the loss: this one succeeds, yet the batch's records may be gone.
        let mut s = waiting(&[PageStatus::Ok, Refused, PageStatus::Ok]);
        durable_after(&mut s, &Ok(()), 10, 12);
        assert_eq!(s.statuses, [RetryLater, Refused, RetryLater]);
        // No loss since the batch began: stored.
        let mut s = waiting(&[PageStatus::Ok, PageStatus::Ok]);
        durable_after(&mut s, &Ok(()), 12, 12);
        assert_eq!(s.statuses, [PageStatus::Ok, PageStatus::Ok]);
        // A failed sync fails what waited for it.
        let mut s = waiting(&[PageStatus::Ok]);
        durable_after(
            &mut s,
            &Err(orbitkv_store::Error::Lost { records: 1 }),
            12,
            12,
        );
        assert_eq!(s.statuses, [RetryLater]);
        // Records durable at their put are not touched by a later loss.
        let mut s = waiting(&[PageStatus::Ok]);
        s.durable = true;
        durable_after(&mut s, &Ok(()), 0, 5);
        assert_eq!(s.statuses, [PageStatus::Ok]);
    }
}
