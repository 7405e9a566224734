//! A Load into a pool with staging memory (what a device pool is), through the daemon's Load
//! path with a stand-in device — memory behind a lock, copied to in planned batches through a
//! small staging buffer, fenced by real shared state words: each record is read by the store
//! straight into the staging buffer and lands byte-exact in its page (a layer sub-range too);
//! a record that fails verification, an unpinned record and a stale page reference are never
//! copied and their pages keep their bytes; each page's lease ends when its batch completes,
//! before the next batch is filled.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::staged_device::{
    EPOCH, LAYER_BYTES, LAYERS, PAGE, PAGES, SENTINEL, StandInDevice, key, pin_all, put_records,
    record, spec,
};
use orbitkv_gpu_bridge::{Bridge, FencedStates, HostPool};
use orbitkv_protocol::PageStatus;
use orbitkv_protocol::message::LoadPage;
use orbitkv_segments::FRAME_HEADER_LEN;
use orbitkv_store::io::fault::FaultIo;
use orbitkv_store::{Durability, StateStore, StoreConfig};

#[test]
fn staged_pages_come_straight_from_the_store_and_failures_touch_nothing() {
    let io = FaultIo::new();
    let mut config = StoreConfig::new("data");
    config.durability = Durability::EveryPut;
    let store = StateStore::open(Arc::new(io.clone()), config).unwrap();
    put_records(&store, 6);
    // Record 3 damaged on disk; record 4 unpinned before the Load.
    let rec = store.index().get(&key(3)).unwrap();
    let path = PathBuf::from(format!("data/segments/{:08x}.seg", rec.segment));
    let mut seg = io.read_file(&path).unwrap();
    seg[rec.offset as usize + FRAME_HEADER_LEN + PAGE - 9] ^= 0x01;
    assert!(io.write_file(&path, &seg));
    let pins = pin_all(&store, 6);
    assert!(store.unpin(pins[4].1));

    let engine = HostPool::create_states(spec()).unwrap();
    let states = FencedStates::attach(engine.fd().try_clone_to_owned().unwrap(), &spec()).unwrap();
    let device = Arc::new(StandInDevice::new(states));
    let bridge = Bridge::new();
    bridge.register(device.clone()).unwrap();
    // Page 5 is named at a generation the engine has since moved past.
    let stale = engine.page_ref(5).unwrap();
    engine.reuse(5).unwrap();
    let pages: Vec<LoadPage> = (0..6u32)
        .map(|i| LoadPage {
            block: i,
            group: 0,
            rank: 0,
            page: if i == 5 {
                stale
            } else {
                engine.page_ref(i).unwrap()
            },
            // Page 2 takes layers 1..3 only.
            layer_start: if i == 2 { 1 } else { 0 },
            layer_end: if i == 2 { 3 } else { LAYERS },
        })
        .collect();
    let (statuses, moved) = orbitkv_manager::transfer::load(&store, &bridge, EPOCH, &pins, &pages);
    use PageStatus::*;
    assert_eq!(
        statuses,
        vec![Ok, Ok, Ok, Missing, Missing, StaleGeneration]
    );
    assert_eq!(moved as usize, 2 * PAGE + PAGE / 2);
    let page = |i: usize| device.page(i);
    assert!(page(0) == record(0) && page(1) == record(1));
    let half = LAYER_BYTES as usize;
    assert!(page(2)[..half].iter().all(|&b| b == SENTINEL));
    assert!(page(2)[half..3 * half] == record(2)[half..3 * half]);
    assert!(page(2)[3 * half..].iter().all(|&b| b == SENTINEL));
    for untouched in 3..PAGES as usize {
        assert!(
            page(untouched).iter().all(|&b| b == SENTINEL),
            "page {untouched} was written"
        );
    }
    // Leases: those of a completed batch were given back before the next batch was filled,
    // and none is left.
    assert!(
        device
            .held_before_batch
            .lock()
            .unwrap()
            .iter()
            .all(|&h| h == 0),
        "{:?}",
        device.held_before_batch.lock().unwrap()
    );
    for i in 0..PAGES {
        assert_eq!(engine.leases(i).unwrap(), 0, "page {i}");
    }
}
