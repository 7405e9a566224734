//! A segment whose header is damaged loses none of its frames: the manifest says what the header
//! held. `fsck --repair` salvages a sealed one's frames under the manifest's header (before, it
//! deleted them all). The open of an active one scans it under the manifest's header, and
//! writes that header back unless the store is read-only.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use orbitkv_store::Durability;
use orbitkv_store::fsck::{check as fsck_check, repair};
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::FaultIo;

const SEG: u64 = 12 << 10;
const LEN: usize = 2500;

fn seg_path(id: u32) -> std::path::PathBuf {
    Path::new("data/segments").join(format!("{id:08x}.seg"))
}

fn flip_header(io: &FaultIo, id: u32) {
    let path = seg_path(id);
    let mut b = io.read_file(&path).unwrap();
    b[20] ^= 0x40;
    assert!(io.write_file(&path, &b));
}

#[test]
fn a_sealed_segment_with_a_damaged_header_is_salvaged_whole() {
    let io = FaultIo::new();
    let s = open(&io, SEG, Durability::EveryPut);
    put_range(&s, 1, 0, 12, LEN);
    let victim = s.index().get(&key(0)).unwrap().segment;
    s.close().unwrap();
    flip_header(&io, victim);

    let r = fsck_check(&io, Path::new("data"), &|_, _| {}).unwrap();
    assert!(r.repairable() && !r.is_clean(), "{:?}", r.problems());
    repair(
        Arc::new(io.clone()) as Arc<dyn Io>,
        config(SEG, Durability::EveryPut),
        &r,
    )
    .unwrap();
    let after = fsck_check(&io, Path::new("data"), &|_, _| {}).unwrap();
    assert!(after.is_clean(), "{:?}", after.problems());
    let s = open(&io, SEG, Durability::EveryPut);
    for i in 0..12 {
        assert_eq!(check(&s, 1, i, LEN), Some(true), "record {i}");
    }
}

#[test]
fn an_active_segment_with_a_damaged_header_is_scanned_and_mended_on_open() {
    let io = FaultIo::new();
    let s = open(&io, 1 << 20, Durability::EveryPut);
    put_range(&s, 2, 0, 6, LEN);
    let active = s.index().get(&key(0)).unwrap().segment;
    // Dropped without closing: the segment stays active.
    drop(s);
    flip_header(&io, active);

    // Read-only: scanned under the manifest's header and served, the file left as it is.
    let damaged = io.read_file(&seg_path(active)).unwrap();
    let mut ro = config(1 << 20, Durability::EveryPut);
    ro.read_only = true;
    let s = open_with(&io, ro);
    assert!(s.recovery_report().quarantined.is_empty());
    for i in 0..6 {
        assert_eq!(check(&s, 2, i, LEN), Some(true), "record {i}, read-only");
    }
    drop(s);
    assert_eq!(io.read_file(&seg_path(active)).unwrap(), damaged);

    let s = open(&io, 1 << 20, Durability::EveryPut);
    let r = s.recovery_report();
    assert!(r.quarantined.is_empty(), "{r:?}");
    assert!(
        r.corrupt_records
            .iter()
            .any(|(id, at, why)| *id == u64::from(active) && *at == 0 && why.contains("header")),
        "{r:?}"
    );
    for i in 0..6 {
        assert_eq!(check(&s, 2, i, LEN), Some(true), "record {i}");
    }
    s.close().unwrap();
    let again = fsck_check(&io, Path::new("data"), &|_, _| {}).unwrap();
    assert!(again.is_clean(), "{:?}", again.problems());
}
