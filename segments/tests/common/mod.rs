//! Builders shared by the segment tests.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]
#![allow(dead_code, reason = "shared by several test files; each uses a subset")]

use orbitkv_segments::{Alignment, Compression, RecordMeta, SegmentBuilder, SegmentHeader};
use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, HashDomain, Namespace, RankSpec, StateKey, TokenRange,
};

pub fn header(sequence: u64, alignment: Alignment, compression: bool) -> SegmentHeader {
    SegmentHeader {
        segment_id: 9,
        sequence,
        created_unix_ms: 1_764_547_200_000,
        directory_id: [0xd1; 16],
        alignment,
        compression,
    }
}

pub fn key(ns: u8, i: u64) -> StateKey {
    let mut native = [0u8; 32];
    native[..8].copy_from_slice(&i.to_le_bytes());
    StateKey::new(
        Namespace([ns; 32]),
        HashDomain::VllmSha256Cbor,
        &native,
        CacheGroupId((i % 3) as u32),
        Component::ALL[(i % 5) as usize],
        if i.is_multiple_of(4) {
            RankSpec::Replicated
        } else {
            RankSpec::Rank((i % 4) as u32)
        },
    )
    .unwrap()
}

pub fn meta(ns: u8, i: u64) -> RecordMeta {
    RecordMeta {
        key: key(ns, i),
        parent: (i > 0).then(|| key(ns, i - 1)),
        range: TokenRange::new(i * 16, i * 16 + 16).unwrap(),
        format: FormatDigest([(i % 251) as u8; 32]),
    }
}

/// Deterministic payload bytes.
pub fn payload(i: u64, len: usize) -> Vec<u8> {
    orbitkv_testkit::payload(orbitkv_testkit::seed_of(0, i), len)
}

/// A segment with `n` records of `len` bytes (record sequences 100, 101, …).
pub fn segment(sequence: u64, alignment: Alignment, n: u64, len: usize) -> SegmentBuilder {
    let mut b = SegmentBuilder::new(header(sequence, alignment, false), Compression::None);
    for i in 0..n {
        b.append_record(meta(1, i), 100 + i, &payload(i, len))
            .unwrap();
    }
    b
}
