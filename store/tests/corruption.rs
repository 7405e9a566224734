//! Seeded damage to a closed store — bit flips and zeroed sectors in sealed and active segments,
//! bit flips in the manifest — then fsck, open, reads, repair and reads again. Every record whose
//! checksummed bytes were hit is a miss and fsck reports the damage; every record outside the
//! damaged region is still served; no read ever returns different bytes.

mod common;

use orbitkv_testkit::Xorshift;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use common::{config, key, meta, payload};
use orbitkv_segments::{FRAME_HEADER_LEN, SEGMENT_HEADER_LEN};
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::FaultIo;
use orbitkv_store::{Durability, StateStore, fsck};

const RECORDS: u64 = 48;
const SEGMENT_BYTES: u64 = 40 << 10;

fn len_of(i: u64) -> usize {
    1500 + (i as usize * 331) % 2500
}

/// Where each record's checksummed bytes lie: segment id → (record, frame start, frame end).
type Layout = BTreeMap<u64, Vec<(u64, u64, u64)>>;

/// A store of [`RECORDS`] records over several sealed segments and an active one (dropped
/// without closing, so the last segment is scanned on open).
fn build(seed: u64) -> (FaultIo, Layout, BTreeSet<u64>) {
    let io = FaultIo::new();
    let store = common::open(&io, SEGMENT_BYTES, Durability::EveryPut);
    for i in 0..RECORDS {
        let p = payload(seed, i, len_of(i));
        store
            .put(&[(meta(i), p.as_slice())])
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let mut layout = Layout::new();
    for i in 0..RECORDS {
        let r = store
            .index()
            .get(&key(i))
            .unwrap_or_else(|| panic!("record {i} not indexed"));
        let end = r.offset + (FRAME_HEADER_LEN as u64) + u64::from(r.stored_len);
        layout
            .entry(u64::from(r.segment))
            .or_default()
            .push((i, r.offset, end));
    }
    let sealed = store
        .segments()
        .into_iter()
        .filter(|(_, sealed)| *sealed)
        .map(|(id, _)| id)
        .collect();
    drop(store);
    (io, layout, sealed)
}

fn seg_path(id: u64) -> PathBuf {
    PathBuf::from(format!("data/segments/{id:08x}.seg"))
}

fn reopen(io: &FaultIo) -> orbitkv_store::Result<StateStore> {
    let io: Arc<dyn Io> = Arc::new(io.clone());
    StateStore::open(io, config(SEGMENT_BYTES, Durability::EveryPut))
}

/// Reads every record: the set found; panics on different bytes.
fn served(store: &StateStore, seed: u64) -> BTreeSet<u64> {
    let mut found = BTreeSet::new();
    for i in 0..RECORDS {
        let mut out = Vec::new();
        let got = store
            .get(&key(i), &mut out)
            .unwrap_or_else(|e| panic!("{e}"));
        if got.is_some() {
            assert!(
                out == payload(seed, i, len_of(i)),
                "record {i} came back with different bytes"
            );
            found.insert(i);
        }
    }
    found
}

/// Records that must be misses and records that may be (the rest must be served), for damage
/// at byte positions `hit` of segment `id`.
fn classify(
    layout: &Layout,
    sealed: &BTreeSet<u64>,
    id: u64,
    hit: &[u64],
) -> (BTreeSet<u64>, BTreeSet<u64>) {
    let mut must = BTreeSet::new();
    let mut may = BTreeSet::new();
    let recs = layout.get(&id).map(Vec::as_slice).unwrap_or_default();
    let data_end = recs.iter().map(|r| r.2).max().unwrap_or(0);
    for &p in hit {
        if p < SEGMENT_HEADER_LEN as u64 || (sealed.contains(&id) && p >= data_end) {
            // A header or footer: the segment is quarantined (or, in unverified fill, not).
            may.extend(recs.iter().map(|r| r.0));
        }
        for &(i, start, end) in recs {
            if (start..end).contains(&p) {
                must.insert(i);
            } else if (end..end.next_multiple_of(8)).contains(&p) {
                may.insert(i);
            }
        }
    }
    may.extend(must.iter().copied());
    (must, may)
}

fn check_report(io: &FaultIo) -> fsck::FsckReport {
    fsck::check(io, &PathBuf::from("data"), &|_, _| {}).unwrap_or_else(|e| panic!("{e}"))
}

/// Damage, then: fsck reports it; open serves exactly the unaffected records; repair leaves a
/// clean store serving the same.
fn damage_and_verify(seed: u64, zero_sector: bool) {
    let (io, layout, sealed) = build(seed);
    let mut rng = Xorshift::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let ids: Vec<u64> = layout.keys().copied().collect();
    // Alternate sealed and active segments.
    let active: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|i| !sealed.contains(i))
        .collect();
    let id = if seed.is_multiple_of(3) && !active.is_empty() {
        active[rng.below(active.len() as u64) as usize]
    } else {
        ids[rng.below(ids.len() as u64) as usize]
    };
    let path = seg_path(id);
    let mut bytes = io.read_file(&path).unwrap_or_else(|| panic!("no {path:?}"));
    let mut hit = Vec::new();
    if zero_sector {
        let sectors = bytes.len() as u64 / 512;
        let s = rng.below(sectors) * 512;
        let sector = &mut bytes[s as usize..s as usize + 512];
        if sector.iter().all(|b| *b == 0) {
            return damage_and_verify(seed + 1000, zero_sector);
        }
        sector.fill(0);
        hit.extend(s..s + 512);
    } else {
        for _ in 0..1 + rng.below(3) {
            let p = rng.below(bytes.len() as u64);
            bytes[p as usize] ^= 1 << rng.below(8);
            hit.push(p);
        }
    }
    assert!(io.write_file(&path, &bytes));
    let (must, may) = classify(&layout, &sealed, id, &hit);
    let all: BTreeSet<u64> = (0..RECORDS).collect();
    let must_serve: BTreeSet<u64> = all.difference(&may).copied().collect();

    let report = check_report(&io);
    if !must.is_empty() {
        assert!(
            !report.is_clean(),
            "seed {seed}: damage to records {must:?} in segment {id} not reported"
        );
    }

    let store = reopen(&io).unwrap_or_else(|e| panic!("seed {seed}: open: {e}"));
    let found = served(&store, seed);
    assert!(
        found.is_disjoint(&must),
        "seed {seed}: damaged records served: {:?}",
        found.intersection(&must).collect::<Vec<_>>()
    );
    assert!(
        must_serve.is_subset(&found),
        "seed {seed}: undamaged records missing: {:?}",
        must_serve.difference(&found).collect::<Vec<_>>()
    );
    drop(store);

    let report = check_report(&io);
    if !report.is_clean() {
        let io_arc: Arc<dyn Io> = Arc::new(io.clone());
        fsck::repair(io_arc, config(SEGMENT_BYTES, Durability::EveryPut), &report)
            .unwrap_or_else(|e| panic!("seed {seed}: repair: {e}"));
        let after = check_report(&io);
        assert!(
            after.is_clean(),
            "seed {seed}: not clean after repair: {:?}",
            after.problems()
        );
    }
    let store = reopen(&io).unwrap_or_else(|e| panic!("seed {seed}: reopen: {e}"));
    let again = served(&store, seed);
    assert!(again.is_disjoint(&must));
    assert!(must_serve.is_subset(&again), "seed {seed}: lost by repair");
}

#[test]
fn seeded_bit_flips_in_segments_are_misses_and_reported() {
    for seed in 1..=40 {
        damage_and_verify(seed, false);
    }
}

#[test]
fn seeded_zeroed_sectors_in_segments_are_misses_and_reported() {
    for seed in 1..=30 {
        damage_and_verify(seed, true);
    }
}

#[test]
fn a_sealed_segment_with_a_bad_header_or_footer_is_quarantined_whole() {
    for (seed, in_footer) in [(7u64, false), (8, true)] {
        let (io, layout, sealed) = build(seed);
        let id = *sealed
            .iter()
            .next()
            .unwrap_or_else(|| panic!("no sealed segment"));
        let recs = &layout[&id];
        let data_end = recs.iter().map(|r| r.2).max().unwrap_or(0);
        let path = seg_path(id);
        let mut bytes = io.read_file(&path).unwrap_or_else(|| panic!("no {path:?}"));
        // A field of the segment header, or the footer's first entry.
        let p = if in_footer {
            data_end.next_multiple_of(8) as usize + 40
        } else {
            8
        };
        bytes[p] ^= 0x04;
        assert!(io.write_file(&path, &bytes));
        let report = check_report(&io);
        let seg = report
            .segments
            .iter()
            .find(|s| s.id == id)
            .unwrap_or_else(|| panic!("segment {id} not checked"));
        assert!(seg.unreadable.is_some(), "{seg:?}");
        let store = reopen(&io).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            store
                .recovery_report()
                .quarantined
                .iter()
                .any(|(q, _)| *q == id)
        );
        let found = served(&store, seed);
        for &(i, _, _) in recs {
            assert!(
                !found.contains(&i),
                "record {i} of a quarantined segment served"
            );
        }
        let others = layout
            .iter()
            .filter(|(s, _)| **s != id)
            .flat_map(|(_, r)| r.iter().map(|x| x.0));
        for i in others {
            assert!(
                found.contains(&i),
                "record {i} of an intact segment missing"
            );
        }
    }
}

#[test]
fn seeded_bit_flips_in_the_manifest_never_serve_wrong_bytes() {
    let manifest = PathBuf::from("data/manifest.log");
    let mut refused = 0;
    for seed in 1..=30u64 {
        let (io, _, _) = build(seed);
        let mut bytes = io
            .read_file(&manifest)
            .unwrap_or_else(|| panic!("no manifest"));
        let mut rng = Xorshift::new(seed);
        let p = rng.below(bytes.len() as u64) as usize;
        bytes[p] ^= 1 << rng.below(8);
        assert!(io.write_file(&manifest, &bytes));
        let report = check_report(&io);
        assert!(
            !report.is_clean(),
            "seed {seed}: a flipped manifest byte {p} was not reported"
        );
        match reopen(&io) {
            // A torn tail is truncated; whatever is served is exact.
            Ok(store) => {
                served(&store, seed);
            }
            // Corruption before valid records: refused, with the damage named by fsck.
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().is_empty());
                assert!(!report.problems().is_empty());
            }
        }
    }
    // Most of the manifest is records followed by later ones: most flips are refused.
    assert!(refused > 0);
}
