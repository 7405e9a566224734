//! Segment scanning, differentially: the input describes a segment (alignment, frame kinds and
//! sizes) and then damage (bit flips, zeroed runs, truncation, frames copied elsewhere). The scan,
//! in both modes, must never panic and must never return a frame that was not written: every
//! frame it returns equals an original (record sequence, body and payload), carries this
//! segment's sequence, and lies inside the bytes; the valid length is in bounds.
#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use orbitkv_segments::{
    Alignment, Compression, FrameBody, RecordMeta, ScanItem, ScanMode, Scanner, SegmentBuilder,
    SegmentHeader,
};
use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, HashDomain, Namespace, RankSpec, StateKey, TokenRange,
};

fn key(i: u64) -> Option<StateKey> {
    let mut native = [0u8; 32];
    native[..8].copy_from_slice(&i.to_le_bytes());
    StateKey::new(
        Namespace([3; 32]),
        HashDomain::SglangSha256,
        &native,
        CacheGroupId(0),
        Component::DenseKv,
        RankSpec::Rank(0),
    )
    .ok()
}

fn payload(seed: u64, len: usize) -> Vec<u8> {
    orbitkv_testkit::payload(orbitkv_testkit::seed_of(0, seed), len)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let align = if data[0] & 1 == 0 {
        Alignment::Packed
    } else {
        Alignment::Direct
    };
    let header = SegmentHeader {
        segment_id: 1,
        sequence: 77,
        created_unix_ms: 0,
        directory_id: [0; 16],
        alignment: align,
        compression: data[0] & 2 != 0,
    };
    let level = if data[0] & 4 != 0 {
        Compression::Zstd { level: 1 }
    } else {
        Compression::None
    };
    let mut b = SegmentBuilder::new(header, level);
    let frames = usize::from(data[1] % 12);
    let spec = data.get(2..2 + frames).unwrap_or_default();
    let mut written: HashSet<(u64, FrameBody, Vec<u8>)> = HashSet::new();
    for (i, &s) in spec.iter().enumerate() {
        let seq = 10 + i as u64;
        let Some(k) = key(i as u64) else { return };
        match s % 4 {
            0 => {
                if b.append_tombstone(k, seq).is_ok() {
                    written.insert((seq, FrameBody::Tombstone { key: k }, Vec::new()));
                }
            }
            1 if align == Alignment::Packed => {
                let _ = b.append_padding(256 + usize::from(s) * 8);
            }
            _ => {
                let len = usize::from(s) * 23 % 3000;
                // Repetitive payloads compress, random ones do not.
                let p = if s % 3 == 0 {
                    vec![s; len]
                } else {
                    payload(i as u64, len)
                };
                let Ok(range) = TokenRange::new(i as u64 * 16, i as u64 * 16 + 16) else {
                    return;
                };
                let meta = RecordMeta {
                    key: k,
                    parent: None,
                    range,
                    format: FormatDigest([1; 32]),
                };
                if b.append_record(meta.clone(), seq, &p).is_ok() {
                    written.insert((seq, FrameBody::Record(meta), p));
                }
            }
        }
    }
    let mut bytes = b.bytes().to_vec();
    // Damage, four bytes per operation.
    for op in data.get(2 + frames..).unwrap_or_default().chunks_exact(4) {
        if bytes.is_empty() {
            break;
        }
        let at = (usize::from(op[1]) << 8 | usize::from(op[2])) * 7 % bytes.len();
        match op[0] % 5 {
            0 => bytes[at] ^= op[3] | 1,
            1 => {
                let end = (at + 64).min(bytes.len());
                bytes[at..end].fill(0);
            }
            2 => bytes.truncate(at),
            3 => {
                // Copy a run of bytes (often a whole frame) to the end: duplicates and splices.
                let end = (at + 256 + usize::from(op[3]) * 16).min(bytes.len());
                let run = bytes[at..end].to_vec();
                bytes.extend_from_slice(&run);
            }
            _ => bytes.extend(std::iter::repeat_n(0u8, usize::from(op[3]) * 8)),
        }
    }
    for mode in [ScanMode::TolerateTail, ScanMode::Strict] {
        let mut scanner = Scanner::new(&bytes, header, mode);
        let mut last_end = 0u64;
        for item in scanner.by_ref() {
            match item {
                ScanItem::Frame(f) => {
                    assert!(f.offset >= last_end);
                    assert_eq!(f.header.segment_sequence, header.sequence);
                    let stored = &bytes[f.payload.clone()];
                    let content = f.header.payload(stored, f.offset).map(|p| p.into_owned());
                    assert!(content.is_ok(), "a returned frame must verify");
                    if !matches!(f.header.body, FrameBody::Padding) {
                        let entry = (
                            f.header.record_sequence,
                            f.header.body.clone(),
                            content.unwrap_or_default(),
                        );
                        assert!(written.contains(&entry), "a frame that was never written");
                    }
                    last_end = f.offset + u64::from(f.header.frame_len);
                }
                ScanItem::Corrupt {
                    offset, resumed_at, ..
                } => {
                    assert!(offset >= last_end && resumed_at > offset);
                    last_end = resumed_at;
                }
            }
        }
        assert!(
            scanner
                .end()
                .is_some_and(|e| e.valid_len <= bytes.len() as u64)
        );
    }
});
