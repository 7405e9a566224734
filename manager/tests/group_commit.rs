//! Durability off the request path, through the socket: once PublishCopied has arrived, the
//! publisher's next request on the same connection is answered while its records are still
//! being made durable (replies arrive out of request order, matched by request id); and the
//! Publishes of several publishers waiting together are made durable by shared syncs, not one
//! each.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::pages::{fill, hash, publish, publish_request, register_pool};
use common::slow_io::SlowSync;
use common::{Daemon, seal};
use orbitkv_protocol::{Message, PageStatus};
use orbitkv_sim::SimInstance;

#[test]
fn a_query_behind_a_publish_is_answered_before_its_records_are_durable() {
    let io = SlowSync::default();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::serve(io.store(), dir, |_| {});
    let sim = SimInstance::new("behind", 1);
    let mut s = seal(&d, &sim);
    let pool = register_pool(&mut s, &sim);
    let p0 = fill(&sim, &pool, 0, 0);
    assert_eq!(publish(&mut s, &sim, &[(0, p0)]), vec![PageStatus::Ok]);
    io.set_delay(Duration::from_millis(500));
    let p1 = fill(&sim, &pool, 1, 1);
    let req = publish_request(&s, &sim, 0, 0, &[(1, p1)]);
    let q = common::query(&s, vec![hash(0)], 16);
    let worker = &mut s.workers[0].0;
    let publish_id = worker
        .send(&Message::Publish(req))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        worker.reply(publish_id),
        Ok(Message::PublishCopied { .. })
    ));
    // The same connection asks on: answered while the Publish is still being stored.
    let t = Instant::now();
    let query_id = worker
        .send(&Message::Query(q))
        .unwrap_or_else(|e| panic!("{e}"));
    let answer = worker.reply(query_id).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(answer, Message::Proof(_)), "{answer:?}");
    let waited = t.elapsed();
    assert!(waited < Duration::from_millis(250), "{waited:?}");
    // The Publish's second reply came (or comes) after, matched by its request id.
    match worker.reply(publish_id) {
        Ok(Message::PublishDurable { pages, .. }) => assert_eq!(pages, vec![PageStatus::Ok]),
        other => panic!("{other:?}"),
    }
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    io.set_delay(Duration::ZERO);
}

#[test]
fn publishers_waiting_together_share_their_syncs() {
    let io = SlowSync::default();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::serve(io.store(), dir, |_| {});
    const PUBLISHERS: usize = 8;
    let sims: Vec<SimInstance> = (0..PUBLISHERS)
        .map(|i| SimInstance::new(&format!("group-{i}"), 1))
        .collect();
    let mut sealed: Vec<_> = sims.iter().map(|sim| seal(&d, sim)).collect();
    let pools: Vec<_> = sealed
        .iter_mut()
        .zip(&sims)
        .map(|(s, sim)| register_pool(s, sim))
        .collect();
    // Every sync takes 200 ms: eight Publishes synced one by one would take 1.6 s.
    io.set_delay(Duration::from_millis(200));
    let before = io.syncs();
    let barrier = Arc::new(Barrier::new(PUBLISHERS));
    let t = Instant::now();
    let threads: Vec<_> = sealed
        .into_iter()
        .zip(sims)
        .zip(pools)
        .enumerate()
        .map(|(i, ((mut s, sim), pool))| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let b = 100 + i as u32;
                let p = fill(&sim, &pool, 0, b);
                let req = publish_request(&s, &sim, 0, 0, &[(b, p)]);
                barrier.wait();
                let (_, durable) = common::pages::publish_replies(&mut s, 0, req);
                match durable {
                    Message::PublishDurable { pages, .. } => {
                        assert_eq!(pages, vec![PageStatus::Ok])
                    }
                    other => panic!("{other:?}"),
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap_or_else(|_| panic!("a publisher panicked"));
    }
    let took = t.elapsed();
    let syncs = io.syncs() - before;
    io.set_delay(Duration::ZERO);
    assert!(
        syncs < PUBLISHERS as u64,
        "{syncs} syncs for {PUBLISHERS} publishers"
    );
    assert!(took < Duration::from_millis(1400), "{took:?}");
}
