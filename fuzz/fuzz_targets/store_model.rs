//! The store against a `HashMap` oracle on the fault-injecting backend: the input is a program of
//! put / get / pin / get-pinned / unpin / retire / compact / sync / reopen / crash / fault steps.
//! The first byte picks a mode:
//! - **strict** (no budget, no faults): every put is accepted; a get returns exactly the oracle's
//!   value, present or absent; a pinned record stays readable until unpinned or retired;
//! - **budget** (a 1 MiB SSD tier with a DRAM tier): evictions may turn a get into a miss, never
//!   into other bytes; pinned records stay readable until retired;
//! - **faults** (EIO, short writes, failed syncs, ENOSPC): a get returns the oracle's value, a
//!   version whose put failed, or nothing;
//! - **manual** (manual durability: puts wait in the write-behind tail, or in writes left in
//!   flight, until a sync): strict until a power loss, which may take back what was put since
//!   the last sync (the key then reads as its last synced value or as one of the versions put
//!   since);
//! - **group** (group durability: puts are written but readable only once durable): as manual,
//!   except that before a sync a key reads as its last synced value, or as a version put since
//!   that a segment's seal made durable — never as a version no sync or seal has covered.
//!
//! In every mode: nothing put before a successful retirement is served again — by a get or
//! through a pin taken before it — across reopens and crashes; an accepted put (sync per put)
//! survives a crash unless its record was evicted.
#![no_main]

use std::collections::HashMap;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use orbitkv_segments::RecordMeta;
use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, HashDomain, Namespace, ParallelShape, RankSpec,
    StateKey, TokenRange,
};
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::{Crash, FaultIo, FaultPlan};
use orbitkv_store::{Durability, Pin, StateStore, StoreConfig};
use orbitkv_wal::NamespaceInfo;

const NAMESPACES: [Namespace; 2] = [Namespace([0x21; 32]), Namespace([0x42; 32])];
const KEYS: u8 = 12;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Strict,
    Budget,
    Faults,
    Manual,
    Group,
}

impl Mode {
    /// Puts wait for a sync to be durable (the durability bookkeeping of manual mode).
    fn deferred(self) -> bool {
        matches!(self, Mode::Manual | Mode::Group)
    }
}

fn info() -> NamespaceInfo {
    NamespaceInfo {
        identity: [1; 32],
        layout_digest: [2; 32],
        model: "org/fuzz".into(),
        revision: "0123456789abcdef0123456789abcdef01234567".into(),
        engine: "vllm".into(),
        engine_release: "0.33.0".into(),
        dtype: "bfloat16".into(),
        parallel: ParallelShape::SINGLE,
    }
}

fn key(ns: usize, k: u8) -> Option<StateKey> {
    let mut native = [0u8; 32];
    native[0] = k;
    native[1] = ns as u8;
    StateKey::new(
        NAMESPACES[ns],
        HashDomain::VllmSha256Cbor,
        &native,
        CacheGroupId(0),
        Component::DenseKv,
        RankSpec::Rank(0),
    )
    .ok()
}

fn payload(version: u64, len: usize) -> Vec<u8> {
    orbitkv_testkit::payload(orbitkv_testkit::seed_of(0, version), len)
}

fn config(mode: Mode) -> StoreConfig {
    let mut c = StoreConfig::new("data");
    c.segment_bytes = 24 << 10;
    c.durability = match mode {
        Mode::Manual => Durability::Manual,
        Mode::Group => Durability::Group,
        _ => Durability::EveryPut,
    };
    c.checkpoint_every = 16;
    if mode == Mode::Budget {
        c.ssd_bytes = Some(1 << 20);
        c.dram_bytes = 96 << 10;
    }
    c
}

fn open(io: &FaultIo, mode: Mode) -> Option<StateStore> {
    let dyn_io: Arc<dyn Io> = Arc::new(io.clone());
    match StateStore::open(dyn_io, config(mode)) {
        Ok(s) => {
            for ns in NAMESPACES {
                // Registered already after a reopen; a retired namespace takes new records.
                let _ = s.register_namespace(ns, info());
            }
            Some(s)
        }
        // With faults cleared by the crash that precedes every reopen, open must work.
        Err(e) => panic!("open failed: {e}"),
    }
}

/// What may be served for one key.
#[derive(Default, Clone)]
struct Slot {
    /// The last accepted value.
    value: Option<Vec<u8>>,
    /// Values whose put failed (faults mode), or put since the last sync and then cut off by a
    /// power loss (manual mode): they may or may not have reached the disk.
    maybe: Vec<Vec<u8>>,
    /// Manual mode: the value as of the last sync (what a power loss falls back to).
    synced: Option<Vec<u8>>,
    /// Manual mode: every value accepted since the last sync (a power loss may leave any one
    /// of them, a prefix of the log surviving).
    since_sync: Vec<Vec<u8>>,
}

struct Pinned {
    pin: Pin,
    bytes: Vec<u8>,
    /// Its namespace.
    ns: usize,
    /// Its namespace was retired since (surely, or perhaps: a retirement that failed may
    /// have taken).
    retired: Retired,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Retired {
    No,
    Maybe,
    Yes,
}

fn check_get(
    store: &StateStore,
    oracle: &HashMap<(usize, u8), Slot>,
    mode: Mode,
    ns: usize,
    k: u8,
) {
    let Some(key) = key(ns, k) else { return };
    let mut out = Vec::new();
    let got = match store.get(&key, &mut out) {
        Ok(g) => g,
        Err(e) => panic!("get failed: {e}"),
    };
    let slot = oracle.get(&(ns, k)).cloned().unwrap_or_default();
    match got {
        Some(_) if mode == Mode::Group => {
            // The value as of the last sync, or a later one a segment's seal made durable.
            let known = slot.synced.as_ref() == Some(&out)
                || slot.since_sync.contains(&out)
                || slot.maybe.contains(&out);
            assert!(known, "key ({ns},{k}) returned bytes not durable for it");
        }
        Some(_) => {
            let known = slot.value.as_ref() == Some(&out) || slot.maybe.contains(&out);
            assert!(known, "key ({ns},{k}) returned bytes never accepted for it");
        }
        None => {
            if matches!(mode, Mode::Strict | Mode::Manual) {
                assert!(slot.value.is_none(), "key ({ns},{k}) accepted but missing");
            }
            if mode == Mode::Group {
                assert!(slot.synced.is_none(), "key ({ns},{k}) synced but missing");
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&m, prog)) = data.split_first() else {
        return;
    };
    let mode = match m % 5 {
        0 => Mode::Strict,
        1 => Mode::Budget,
        2 => Mode::Faults,
        3 => Mode::Manual,
        _ => Mode::Group,
    };
    let io = FaultIo::new();
    if mode.deferred() {
        // Writes the store submits asynchronously stay in flight until it waits for them.
        io.set_plan(FaultPlan {
            defer_writes: true,
            ..FaultPlan::default()
        });
    }
    let Some(mut store) = open(&io, mode) else {
        return;
    };
    let mut oracle: HashMap<(usize, u8), Slot> = HashMap::new();
    let mut pins: Vec<Pinned> = Vec::new();
    let mut version = 0u64;
    for step in prog.chunks(3).take(200) {
        let [op, a, b] = [
            step[0],
            *step.get(1).unwrap_or(&0),
            *step.get(2).unwrap_or(&0),
        ];
        let ns = usize::from(a >> 7);
        let k = a % KEYS;
        match op % 10 {
            // put
            0..=2 => {
                let Some(key) = key(ns, k) else { continue };
                version += 1;
                let len = match mode {
                    Mode::Budget => 1 + usize::from(b) * 640,
                    // Now and then a bundle large enough to be written asynchronously.
                    Mode::Manual | Mode::Group if b == 255 => (1 << 20) + 1,
                    _ => 1 + usize::from(b) * 37,
                };
                let bytes = payload(version, len);
                let meta = RecordMeta {
                    key,
                    parent: None,
                    range: match TokenRange::new(0, 16) {
                        Ok(r) => r,
                        Err(_) => continue,
                    },
                    format: FormatDigest([3; 32]),
                };
                let slot = oracle.entry((ns, k)).or_default();
                match store.put(&[(meta, bytes.as_slice())]) {
                    Ok(r) => {
                        assert!(r.durable == !mode.deferred(), "durability misreported");
                        if mode.deferred() {
                            slot.since_sync.push(bytes.clone());
                        }
                        slot.value = Some(bytes);
                    }
                    Err(e) => {
                        assert!(
                            !matches!(mode, Mode::Strict | Mode::Manual | Mode::Group),
                            "put refused: {e}"
                        );
                        slot.maybe.push(bytes);
                    }
                }
            }
            // get
            3 | 4 => check_get(&store, &oracle, mode, ns, k),
            // pin, or read a pin
            5 => {
                if b % 2 == 0 && pins.len() < 4 {
                    let Some(key) = key(ns, k) else { continue };
                    let mut out = Vec::new();
                    if let Some(pin) = store.pin(&key) {
                        // What it pins is what a get returns now.
                        match store.get_pinned(pin, &mut out) {
                            Ok(Some(_)) => pins.push(Pinned {
                                pin,
                                bytes: out,
                                ns,
                                retired: Retired::No,
                            }),
                            Ok(None) => {
                                assert!(mode != Mode::Strict, "a fresh pin read nothing");
                                store.unpin(pin);
                            }
                            Err(e) => panic!("get_pinned: {e}"),
                        }
                    }
                } else if let Some(p) = pins.get(usize::from(b) % pins.len().max(1)) {
                    let mut out = Vec::new();
                    match store.get_pinned(p.pin, &mut out) {
                        Ok(Some(_)) => {
                            assert!(p.retired != Retired::Yes, "a retired pin was served");
                            assert!(out == p.bytes, "a pin returned other bytes");
                        }
                        Ok(None) => assert!(
                            mode == Mode::Faults || p.retired != Retired::No,
                            "a pinned record was lost"
                        ),
                        Err(e) => panic!("get_pinned: {e}"),
                    }
                }
            }
            // unpin
            6 => {
                if !pins.is_empty() {
                    let p = pins.swap_remove(usize::from(b) % pins.len());
                    assert!(store.unpin(p.pin));
                }
            }
            // retire a namespace
            7 => match store.retire_namespace(NAMESPACES[ns]) {
                Ok(_) => {
                    oracle.retain(|(n, _), _| *n != ns);
                    for p in pins.iter_mut().filter(|p| p.ns == ns) {
                        p.retired = Retired::Yes;
                        let mut out = Vec::new();
                        let got = store.get_pinned(p.pin, &mut out).ok().flatten();
                        assert!(got.is_none(), "a retired record was served through a pin");
                    }
                    for k in 0..KEYS {
                        let Some(key) = key(ns, k) else { continue };
                        let mut out = Vec::new();
                        let got = store.get(&key, &mut out).ok().flatten();
                        assert!(got.is_none(), "a retired record was served");
                    }
                }
                Err(e) => {
                    assert!(
                        !matches!(mode, Mode::Strict | Mode::Manual | Mode::Group),
                        "retire failed: {e}"
                    );
                    // Unknown whether it took: anything of the namespace may be gone.
                    for p in pins
                        .iter_mut()
                        .filter(|p| p.ns == ns && p.retired == Retired::No)
                    {
                        p.retired = Retired::Maybe;
                    }
                    for ((n, _), slot) in oracle.iter_mut() {
                        if *n == ns
                            && let Some(v) = slot.value.take()
                        {
                            slot.maybe.push(v);
                        }
                    }
                }
            },
            // compact, or (manual mode) sync
            8 => {
                if mode.deferred() && b % 2 == 0 {
                    assert!(store.sync().is_ok(), "sync failed");
                    for slot in oracle.values_mut() {
                        slot.synced.clone_from(&slot.value);
                        slot.since_sync.clear();
                    }
                    continue;
                }
                let r = store.compact_below(f64::from(b) / 255.0);
                assert!(
                    !matches!(mode, Mode::Strict | Mode::Manual | Mode::Group) || r.is_ok(),
                    "compaction failed"
                );
            }
            // reopen (clean close or crash), or set a fault plan
            _ => {
                if mode == Mode::Faults && b % 2 == 1 {
                    let n = u64::from(b >> 2) + 1;
                    io.set_plan(match b % 12 {
                        1 => FaultPlan {
                            fail_write: Some(n),
                            ..FaultPlan::default()
                        },
                        3 => FaultPlan {
                            short_write: Some(n),
                            ..FaultPlan::default()
                        },
                        5 => FaultPlan {
                            fail_sync: Some(n),
                            ..FaultPlan::default()
                        },
                        7 => FaultPlan {
                            space_bytes: Some(n * 4096),
                            ..FaultPlan::default()
                        },
                        9 => FaultPlan {
                            fail_sync_dir: Some(n),
                            ..FaultPlan::default()
                        },
                        _ => FaultPlan {
                            fail_writes_from: Some(n),
                            ..FaultPlan::default()
                        },
                    });
                    continue;
                }
                pins.clear();
                let closed = b % 4 == 0;
                if closed {
                    let r = store.close();
                    assert!(mode == Mode::Faults || r.is_ok(), "close failed");
                } else {
                    drop(store);
                }
                if mode.deferred() {
                    if closed {
                        // A close seals, so syncs, everything.
                        for slot in oracle.values_mut() {
                            slot.synced.clone_from(&slot.value);
                            slot.since_sync.clear();
                        }
                    } else {
                        // A power loss after a drop: what was put since the last sync may be
                        // gone, leaving the last synced value.
                        for slot in oracle.values_mut() {
                            if !slot.since_sync.is_empty() {
                                let since = std::mem::take(&mut slot.since_sync);
                                slot.maybe.extend(since);
                                slot.value.clone_from(&slot.synced);
                            }
                        }
                    }
                }
                io.crash(match b % 4 {
                    0 | 1 => Crash::DropUnsynced,
                    2 => Crash::TornPrefix(u64::from(b)),
                    _ => Crash::TornPages(u64::from(b)),
                });
                if mode.deferred() {
                    io.set_plan(FaultPlan {
                        defer_writes: true,
                        ..FaultPlan::default()
                    });
                }
                store = match open(&io, mode) {
                    Some(s) => s,
                    None => return,
                };
                for ns in 0..NAMESPACES.len() {
                    for k in 0..KEYS {
                        check_get(&store, &oracle, mode, ns, k);
                    }
                }
            }
        }
    }
    for ns in 0..NAMESPACES.len() {
        for k in 0..KEYS {
            check_get(&store, &oracle, mode, ns, k);
        }
    }
});
