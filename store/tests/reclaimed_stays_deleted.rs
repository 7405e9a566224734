//! A segment the SSD tier reclaimed stays deleted across a power loss: reclaim syncs the
//! segments directory after unlinking its victim, so a crash right after the put that
//! reclaimed finds no orphan file (one the SSD budget would count until `fsck --repair`).

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use std::sync::Arc;

use common::*;
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::{Crash, FaultIo};
use orbitkv_store::{Durability, StateStore, StoreConfig};

const LEN: usize = 4000;

fn store(io: &FaultIo) -> StateStore {
    let mut c = StoreConfig::new("data");
    c.durability = Durability::EveryPut;
    c.ssd_bytes = Some(1 << 20);
    c.segment_bytes = 256 << 10;
    let s = StateStore::open(Arc::new(io.clone()) as Arc<dyn Io>, c).unwrap();
    s.register_namespace(NS, info()).unwrap();
    s
}

#[test]
fn no_power_loss_right_after_a_reclaim_leaves_an_orphan() {
    // Where each reclaim happens, in a run without crashes.
    let io = FaultIo::new();
    let s = store(&io);
    let mut reclaiming = Vec::new();
    for i in 0..600u64 {
        let before = s.stats().reclaimed_segments;
        let p = payload(8, i, LEN);
        s.put(&[(meta(i), p.as_slice())]).unwrap();
        if s.stats().reclaimed_segments > before {
            reclaiming.push(i);
        }
    }
    assert!(reclaiming.len() >= 4, "{reclaiming:?}");
    drop(s);
    // A power loss right after each of them.
    for &at in &reclaiming {
        let io = FaultIo::new();
        let s = store(&io);
        for i in 0..=at {
            let p = payload(8, i, LEN);
            s.put(&[(meta(i), p.as_slice())]).unwrap();
        }
        drop(s);
        io.crash(Crash::DropUnsynced);
        let s = store(&io);
        let orphans = &s.recovery_report().orphans;
        assert!(
            orphans.is_empty(),
            "after the put {at}: orphans {orphans:?}"
        );
    }
}
