//! A sealed segment opens from its tail alone: the trailer locates the footer, the footer lists
//! every record with what the index needs; damage to either is a typed error.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::{meta, payload, segment};
use orbitkv_segments::footer::{Footer, IndexEntry};
use orbitkv_segments::{
    Alignment, Checksum, Error, FRAME_HEADER_LEN, FrameHeader, ScanMode, Scanner, SegmentHeader,
    StopReason, TRAILER_LEN, Trailer,
};
use proptest::prelude::*;

fn open(file: &[u8]) -> Result<(Trailer, Footer), Error> {
    let len = file.len() as u64;
    let alignment = SegmentHeader::decode(file)?.alignment;
    let t = Trailer::decode(&file[file.len() - TRAILER_LEN..], len)?;
    let footer = &file[t.footer_offset as usize..(t.footer_offset + t.footer_len) as usize];
    let f = t.open_footer(footer, alignment)?;
    Ok((t, f))
}

#[test]
fn footer_lists_every_record_and_locates_payloads() {
    for align in [Alignment::Packed, Alignment::Direct] {
        let mut b = segment(11, align, 0, 0);
        for i in 0..20u64 {
            b.append_record(
                meta(1 + (i % 2) as u8, i),
                10 + i,
                &payload(i, 1000 + i as usize),
            )
            .unwrap();
        }
        b.append_tombstone(common::key(1, 3), 40).unwrap();
        let entries: Vec<IndexEntry> = b.entries().to_vec();
        let file = b.seal();
        assert_eq!(file.len() % align.unit(), 0);
        let (t, f) = open(&file).unwrap();
        assert_eq!(t.segment_sequence, 11);
        assert_eq!(f.entries, entries);
        assert_eq!(f.namespaces.len(), 2);
        assert_eq!(f.namespaces.iter().map(|n| n.records).sum::<u64>(), 21);
        // Each entry locates a frame whose header agrees and whose payload verifies.
        for e in &f.entries {
            let at = e.offset as usize;
            let h = FrameHeader::decode(&file[at..], e.offset).unwrap();
            assert_eq!(h.body, e.body);
            let stored =
                &file[at + FRAME_HEADER_LEN..at + FRAME_HEADER_LEN + h.stored_len as usize];
            h.verify_payload(stored, e.offset).unwrap();
        }
        // The data region scans strictly and ends exactly at the footer.
        let header = SegmentHeader::decode(&file).unwrap();
        let (items, end) =
            Scanner::new(&file[..t.footer_offset as usize], header, ScanMode::Strict).run();
        assert_eq!(items.len(), 21);
        assert_eq!(end.reason, StopReason::CleanEnd);
    }
}

#[test]
fn footer_damage_is_a_typed_error() {
    let file = segment(5, Alignment::Packed, 4, 64).seal();
    let (t, _) = open(&file).unwrap();
    let foot = t.footer_offset as usize;
    // Any flipped byte of the footer: digest mismatch (or a footer CRC error when re-digested).
    for at in [
        foot,
        foot + 40,
        foot + 300,
        foot + t.footer_len as usize - 1,
    ] {
        let mut bad = file.clone();
        bad[at] ^= 1;
        assert!(matches!(
            open(&bad),
            Err(Error::ChecksumMismatch {
                kind: Checksum::FooterDigest,
                ..
            })
        ));
    }
    // Any flipped byte of the trailer.
    for at in file.len() - TRAILER_LEN..file.len() {
        let mut bad = file.clone();
        bad[at] ^= 0x10;
        assert!(open(&bad).is_err(), "trailer byte {at}");
    }
    // A truncated file has no trailer where it should be.
    assert!(open(&file[..file.len() - 1]).is_err());
    assert!(Trailer::decode(&[0u8; 10], 10).is_err());
}

#[test]
fn footer_counts_cannot_make_it_allocate() {
    let file = segment(5, Alignment::Packed, 2, 64).seal();
    let (t, f) = open(&file).unwrap();
    let mut bytes = f.encode();
    // Claim 2^32 − 1 entries: the length check refuses before anything is allocated.
    bytes[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
    let n = bytes.len() - 4;
    let crc = crc32c::crc32c(&bytes[..n]);
    bytes[n..].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        Footer::decode(&bytes, t.footer_offset, Alignment::Packed),
        Err(Error::LengthOutOfBounds { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn footers_round_trip(n in 0u64..40, len in 0usize..600, direct in any::<bool>()) {
        let align = if direct { Alignment::Direct } else { Alignment::Packed };
        let b = segment(3, align, n, len);
        let entries = b.entries().to_vec();
        let file = b.seal();
        let (_, f) = open(&file).unwrap();
        prop_assert_eq!(&f.entries, &entries);
        prop_assert_eq!(Footer::decode(&f.encode(), f.data_end, align).unwrap(), f);
    }
}

/// Rewrites the footer of a sealed image with `edit`, then re-checksums the footer and re-digests
/// the trailer, so only the footer's own rules can refuse it.
fn forge(file: &[u8], edit: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
    let (t, _) = open(file).unwrap();
    let (from, to) = (
        t.footer_offset as usize,
        (t.footer_offset + t.footer_len) as usize,
    );
    let mut footer = file[from..to].to_vec();
    edit(&mut footer);
    let n = footer.len() - 4;
    let crc = crc32c::crc32c(&footer[..n]);
    footer[n..].copy_from_slice(&crc.to_le_bytes());
    let trailer = Trailer {
        footer_digest: orbitkv_segments::footer::footer_digest(&footer),
        ..t
    };
    let mut out = file[..from].to_vec();
    out.extend_from_slice(&footer);
    out.extend_from_slice(&file[to..file.len() - TRAILER_LEN]);
    out.extend_from_slice(&trailer.encode());
    out
}

const ENTRY: usize = 32; // first index entry
const E2: usize = 32 + 256; // second index entry

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn forged_footers_are_refused_by_the_entry_rules() {
    let file = segment(5, Alignment::Packed, 3, 64).seal();
    // The forge itself leaves a valid footer valid.
    assert!(open(&forge(&file, |_| {})).is_ok());
    type Edit = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("zero-length frame", Box::new(|f| put32(f, ENTRY + 4, 0))),
        (
            "overlapping entries",
            Box::new(|f| {
                let first = u64::from_le_bytes(f[ENTRY + 8..ENTRY + 16].try_into().unwrap());
                put64(f, E2 + 8, first);
            }),
        ),
        (
            "stored length beyond the limit",
            Box::new(|f| {
                put32(f, ENTRY + 24, u32::MAX);
                put32(f, ENTRY + 28, u32::MAX);
            }),
        ),
        (
            "two lengths without compression",
            Box::new(|f| put32(f, ENTRY + 28, 65)),
        ),
        (
            "frame length off the grid",
            Box::new(|f| {
                let l = u32::from_le_bytes(f[ENTRY + 4..ENTRY + 8].try_into().unwrap());
                put32(f, ENTRY + 4, l + 8);
            }),
        ),
        (
            "offset off the grid",
            Box::new(|f| {
                let o = u64::from_le_bytes(f[E2 + 8..E2 + 16].try_into().unwrap());
                put64(f, E2 + 8, o + 4);
            }),
        ),
        (
            "entry past the data end",
            Box::new(|f| put64(f, 16, 4096 + 100)),
        ),
        ("sequences out of order", Box::new(|f| put64(f, E2 + 16, 1))),
        (
            "a tombstone entry with a payload",
            Box::new(|f| {
                f[ENTRY] = 2; // kind: tombstone, yet 64 payload bytes
            }),
        ),
        (
            "summary mismatch",
            Box::new(|f| {
                let at = f.len() - 4 - 48 + 32;
                put64(f, at, 99);
            }),
        ),
        ("data end inside the header", Box::new(|f| put64(f, 16, 10))),
    ];
    for (name, edit) in cases {
        assert!(open(&forge(&file, edit)).is_err(), "{name} accepted");
    }
}
