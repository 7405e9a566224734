//! A Load holds no page lease while the store reads a record, its own page's or another's: an
//! engine that gives up on a Load during a slow read (a stalled disk) reuses the page at once,
//! and the record read after is then never copied into it. Through the daemon's Load path, into a host pool (page by
//! page) and into a pool with staging memory (in batches).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use common::slow_io::SlowSync;
use common::staged_device::{
    EPOCH, LAYERS, PAGE, SENTINEL, StandInDevice, key, pin_all, put_records, record, spec,
};
use orbitkv_gpu_bridge::{AttachedPool, Bridge, FencedStates, HostPool};
use orbitkv_protocol::PageStatus;
use orbitkv_protocol::message::LoadPage;
use orbitkv_segments::FRAME_HEADER_LEN;
use orbitkv_store::{Durability, StateStore, StoreConfig};

const RECORDS: u64 = 6;

fn store(io: &SlowSync) -> StateStore {
    let mut config = StoreConfig::new("data");
    config.durability = Durability::EveryPut;
    let store = StateStore::open(Arc::new(io.clone()), config).unwrap_or_else(|e| panic!("{e}"));
    put_records(&store, RECORDS);
    store
}

/// Loads records 0..6 into pages 0..6 of `engine`'s pool (registered on `bridge`). While the
/// store reads record `i`, for odd `i`, the engine reuses page `i`, as one that gave up on the
/// Load does. Returns each page's status and, per odd page, whether its reuse was allowed.
fn load_with_reuses_mid_read(
    io: &SlowSync,
    store: &StateStore,
    engine: &Arc<HostPool>,
    bridge: &Bridge,
) -> (Vec<PageStatus>, BTreeMap<u64, bool>) {
    // Where each record's frame lies: (segment, first byte, end).
    let frames: Vec<(u32, u64, u64)> = (0..RECORDS)
        .map(|i| {
            let r = store
                .index()
                .get(&key(i))
                .unwrap_or_else(|| panic!("record {i} indexed"));
            let at = r.offset;
            (r.segment, at, at + (FRAME_HEADER_LEN + PAGE) as u64)
        })
        .collect();
    let reused: Arc<Mutex<BTreeMap<u64, bool>>> = Arc::default();
    let hook = {
        let (engine, reused) = (engine.clone(), reused.clone());
        Box::new(move |path: &Path, offset: u64| {
            let segment = path
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| u32::from_str_radix(s, 16).ok());
            let Some(i) = (0..RECORDS).find(|&i| {
                let (seg, from, to) = frames[i as usize];
                Some(seg) == segment && (from..to).contains(&offset)
            }) else {
                return;
            };
            // No page of the Load is held while a record is read, not even one read before.
            for p in 0..RECORDS as u32 {
                let held = engine.leases(p).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(held, 0, "page {p} leased while record {i} is read");
            }
            let mut reused = reused.lock().unwrap_or_else(|e| e.into_inner());
            if i % 2 == 1 && !reused.contains_key(&i) {
                reused.insert(i, engine.reuse(i as u32).is_ok());
            }
        })
    };
    let pins = pin_all(store, RECORDS);
    let pages: Vec<LoadPage> = (0..RECORDS as u32)
        .map(|i| LoadPage {
            block: i,
            group: 0,
            rank: 0,
            page: engine.page_ref(i).unwrap_or_else(|e| panic!("{e}")),
            layer_start: 0,
            layer_end: LAYERS,
        })
        .collect();
    io.set_read_hook(hook);
    let (statuses, _) = orbitkv_manager::transfer::load(store, bridge, EPOCH, &pins, &pages);
    let reused = reused.lock().unwrap_or_else(|e| e.into_inner()).clone();
    (statuses, reused)
}

/// What every case must show: each odd page was reused during its read, and got nothing; each
/// even page got its record; no lease is left.
fn check(
    statuses: &[PageStatus],
    reused: &BTreeMap<u64, bool>,
    engine: &HostPool,
    page: impl Fn(usize) -> Vec<u8>,
) {
    let odd: Vec<u64> = (0..RECORDS).filter(|i| i % 2 == 1).collect();
    assert_eq!(
        reused.keys().copied().collect::<Vec<_>>(),
        odd,
        "reads seen"
    );
    for (i, allowed) in reused {
        assert!(allowed, "page {i} was leased while its record was read");
    }
    use PageStatus::*;
    assert_eq!(
        statuses,
        [
            Ok,
            StaleGeneration,
            Ok,
            StaleGeneration,
            Ok,
            StaleGeneration
        ]
    );
    for i in 0..RECORDS as usize {
        let bytes = page(i);
        if i % 2 == 0 {
            assert!(bytes == record(i as u64), "page {i} lacks its record");
        } else {
            assert!(
                bytes.iter().all(|&b| b == SENTINEL),
                "page {i}, reused during the read, was written"
            );
        }
        assert_eq!(engine.leases(i as u32).unwrap_or_else(|e| panic!("{e}")), 0);
    }
}

#[test]
fn a_host_page_reused_during_its_read_gets_nothing() {
    let io = SlowSync::default();
    let store = store(&io);
    let engine = Arc::new(HostPool::create(spec()).unwrap_or_else(|e| panic!("{e}")));
    for i in 0..RECORDS as u32 {
        engine
            .write(i, 0, &[SENTINEL; PAGE])
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let fd = engine
        .fd()
        .try_clone_to_owned()
        .unwrap_or_else(|e| panic!("{e}"));
    let pool = AttachedPool::attach(fd, spec(), EPOCH).unwrap_or_else(|e| panic!("{e}"));
    let bridge = Bridge::new();
    bridge.register(pool).unwrap_or_else(|e| panic!("{e}"));
    let (statuses, reused) = load_with_reuses_mid_read(&io, &store, &engine, &bridge);
    check(&statuses, &reused, &engine, |i| {
        let mut bytes = vec![0u8; PAGE];
        engine
            .read(i as u32, 0, &mut bytes)
            .unwrap_or_else(|e| panic!("{e}"));
        bytes
    });
}

#[test]
fn a_staged_page_reused_during_its_read_gets_nothing() {
    let io = SlowSync::default();
    let store = store(&io);
    let engine = Arc::new(HostPool::create_states(spec()).unwrap_or_else(|e| panic!("{e}")));
    let fd = engine
        .fd()
        .try_clone_to_owned()
        .unwrap_or_else(|e| panic!("{e}"));
    let states = FencedStates::attach(fd, &spec()).unwrap_or_else(|e| panic!("{e}"));
    let device = Arc::new(StandInDevice::new(states));
    let bridge = Bridge::new();
    bridge
        .register(device.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let (statuses, reused) = load_with_reuses_mid_read(&io, &store, &engine, &bridge);
    check(&statuses, &reused, &engine, |i| device.page(i));
}
