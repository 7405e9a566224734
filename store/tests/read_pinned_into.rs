//! `read_pinned_into`: a pinned record's payload bytes, any sub-range, delivered into memory
//! the caller owns (a device pool's pinned staging) — straight from the SSD read, checked chunk
//! by chunk, or out of the DRAM tier's copy — byte-exact against the record; a range past the
//! payload, a payload of another length than the caller expects, an unpinned pin, or a damaged
//! record (even damage outside the range asked for) delivers nothing usable and says so.

mod common;

use std::path::PathBuf;

use common::*;
use orbitkv_segments::{Compression, FRAME_HEADER_LEN};
use orbitkv_store::io::fault::FaultIo;
use orbitkv_store::{Durability, StoreConfig};

/// Three read chunks and a bit: the streamed path delivers across chunk boundaries.
const LEN: usize = (700 << 10) + 1;

fn ranges() -> Vec<(usize, usize)> {
    let chunk = 256 << 10;
    vec![
        (0, LEN),
        (0, 1),
        (1, chunk),
        (chunk - 3, 10),
        (2 * chunk - 1, chunk + 2),
        (LEN - 5, 5),
        (300_000, 400_001),
        (LEN, 0),
    ]
}

fn assert_ranges(store: &orbitkv_store::StateStore, pin: orbitkv_store::Pin, want: &[u8]) {
    for (from, n) in ranges().into_iter().filter(|(f, n)| f + n <= want.len()) {
        let mut dst = vec![0xEE; n];
        assert!(
            store
                .read_pinned_into(pin, want.len(), from, &mut dst)
                .unwrap_or_else(|e| panic!("{e}")),
            "{n} bytes from {from}"
        );
        assert!(dst == want[from..from + n], "{n} bytes from {from} differ");
    }
    let mut dst = vec![0; 2];
    assert!(
        !store
            .read_pinned_into(pin, want.len(), want.len() - 1, &mut dst)
            .unwrap_or_else(|e| panic!("{e}")),
        "a range past the payload"
    );
    assert!(
        !store
            .read_pinned_into(pin, want.len() + 1, 0, &mut dst)
            .unwrap_or_else(|e| panic!("{e}")),
        "a payload of another length than the caller's geometry"
    );
}

#[test]
fn from_ssd_every_range_is_exact_and_damage_anywhere_refuses() {
    let io = FaultIo::new();
    let store = open(&io, 16 << 20, Durability::EveryPut);
    put_range(&store, 6, 0, 3, LEN);
    for i in 0..3 {
        let pin = store.pin(&key(i)).unwrap();
        let hits = store.stats().dram_hits;
        assert_ranges(&store, pin, &payload(6, i, LEN));
        assert_eq!(store.stats().dram_hits, hits, "no DRAM tier: read from SSD");
        assert!(store.unpin(pin));
        assert!(!store.read_pinned_into(pin, LEN, 0, &mut [0; 8]).unwrap());
    }
    // One flipped byte near the end of record 1's payload, far from the bytes asked for.
    let rec = store.index().get(&key(1)).unwrap();
    let path = PathBuf::from(format!("data/segments/{:08x}.seg", rec.segment));
    let mut seg = io.read_file(&path).unwrap();
    seg[rec.offset as usize + FRAME_HEADER_LEN + LEN - 2] ^= 0x10;
    assert!(io.write_file(&path, &seg));
    let pin = store.pin(&key(1)).unwrap();
    let failures = store.stats().checksum_failures;
    assert!(!store.read_pinned_into(pin, LEN, 0, &mut [0; 100]).unwrap());
    assert_eq!(store.stats().checksum_failures, failures + 1);
    // The others are untouched.
    let pin = store.pin(&key(2)).unwrap();
    let mut dst = vec![0; 1000];
    assert!(store.read_pinned_into(pin, LEN, 5, &mut dst).unwrap());
    assert_eq!(dst, payload(6, 2, LEN)[5..1005]);
}

#[test]
fn from_a_real_file_with_the_default_backend_every_range_is_exact() {
    // io_uring and O_DIRECT where this file system takes them: the chunks arrive as the
    // device delivers them.
    let dir = tempfile::tempdir().unwrap();
    let (io, direct) = default_backend(dir.path());
    let mut c = config(16 << 20, Durability::EveryPut);
    c.data_dir = dir.path().join("data");
    if direct {
        c.alignment = orbitkv_segments::Alignment::Direct;
    }
    let store = orbitkv_store::StateStore::open(io, c).unwrap();
    store.register_namespace(NS, info()).unwrap();
    put_range(&store, 8, 0, 3, LEN);
    store.sync().unwrap();
    for i in 0..3 {
        let pin = store.pin(&key(i)).unwrap();
        assert_ranges(&store, pin, &payload(8, i, LEN));
    }
}

#[test]
fn from_the_dram_tier_every_range_is_exact() {
    let mut c = StoreConfig::new("data");
    c.durability = Durability::Manual;
    c.dram_bytes = 8 << 20;
    let store = open_with(&FaultIo::new(), c);
    put_range(&store, 7, 0, 2, LEN);
    let pin = store.pin(&key(1)).unwrap();
    let hits = store.stats().dram_hits;
    assert_ranges(&store, pin, &payload(7, 1, LEN));
    assert!(store.stats().dram_hits > hits, "lent by the DRAM tier");
}

#[test]
fn a_compressed_record_is_delivered_through_its_whole_payload() {
    let mut c = config(16 << 20, Durability::EveryPut);
    c.compression = Compression::Zstd { level: 1 };
    let store = open_with(&FaultIo::new(), c);
    // Compressible: runs of one byte.
    let p: Vec<u8> = (0..LEN).map(|i| (i / 4096) as u8).collect();
    store.put(&[(meta(0), p.as_slice())]).unwrap();
    let stored = store.index().get(&key(0)).unwrap().stored_len as usize;
    assert!(stored < LEN / 4, "stored compressed ({stored} bytes)");
    let pin = store.pin(&key(0)).unwrap();
    assert_ranges(&store, pin, &p);
}
