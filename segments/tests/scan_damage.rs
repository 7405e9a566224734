//! The damage matrix, in the spirit of LevelDB's log tests: truncation at every byte, every bit
//! of a frame flipped, a zeroed sector, a duplicated frame, a frame spliced in from another
//! segment, stale bytes from an earlier use of the file. Every case is either decoded exactly or
//! reported with the right typed reason — never decoded wrong.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::{header, meta, payload, segment};
use orbitkv_segments::frame::encode_frame;
use orbitkv_segments::{
    Alignment, Compression, Error, FrameBody, FrameRef, ScanEnd, ScanItem, ScanMode, Scanner,
    SegmentHeader, StopReason,
};

/// (record sequence, payload) of every frame the scan returned.
fn frames(items: &[ScanItem], bytes: &[u8]) -> Vec<(u64, Vec<u8>)> {
    items
        .iter()
        .filter_map(|i| match i {
            ScanItem::Frame(FrameRef {
                header, payload, ..
            }) => Some((header.record_sequence, bytes[payload.clone()].to_vec())),
            ScanItem::Corrupt { .. } => None,
        })
        .collect()
}

fn corrupt(items: &[ScanItem]) -> Vec<(u64, Error)> {
    items
        .iter()
        .filter_map(|i| match i {
            ScanItem::Corrupt { offset, error, .. } => Some((*offset, error.clone())),
            ScanItem::Frame(_) => None,
        })
        .collect()
}

fn scan(bytes: &[u8], mode: ScanMode) -> (Vec<ScanItem>, ScanEnd) {
    let h = SegmentHeader::decode(bytes).unwrap();
    Scanner::new(bytes, h, mode).run()
}

const N: u64 = 4;
const LEN: usize = 300;

fn originals(n: u64, len: usize) -> Vec<(u64, Vec<u8>)> {
    (0..n).map(|i| (100 + i, payload(i, len))).collect()
}

#[test]
fn clean_segment_scans_exactly_in_both_modes() {
    for align in [Alignment::Packed, Alignment::Direct] {
        let b = segment(7, align, N, LEN);
        for mode in [ScanMode::TolerateTail, ScanMode::Strict] {
            let (items, end) = scan(b.bytes(), mode);
            assert_eq!(frames(&items, b.bytes()), originals(N, LEN));
            assert_eq!(end.reason, StopReason::CleanEnd);
            assert_eq!(end.valid_len as usize, b.bytes().len());
        }
        // Preallocated zero space after the frames: clean when tolerating, an error when strict.
        let mut pre = b.bytes().to_vec();
        pre.resize(pre.len() + 64 * 1024, 0);
        let (items, end) = scan(&pre, ScanMode::TolerateTail);
        assert_eq!(frames(&items, &pre).len(), N as usize);
        assert_eq!(end.reason, StopReason::CleanEnd);
        assert_eq!(end.valid_len as usize, b.bytes().len());
        let (_, end) = scan(&pre, ScanMode::Strict);
        assert!(matches!(end.reason, StopReason::Corrupt { .. }));
    }
}

#[test]
fn truncation_at_every_byte_keeps_exactly_the_complete_frames() {
    for align in [Alignment::Packed, Alignment::Direct] {
        let b = segment(7, align, N, LEN);
        let full = b.bytes();
        let ends: Vec<usize> = b
            .entries()
            .iter()
            .map(|e| (e.offset + u64::from(e.frame_len)) as usize)
            .collect();
        let start = orbitkv_segments::SEGMENT_HEADER_LEN;
        for cut in start..=full.len() {
            let bytes = &full[..cut];
            let (items, end) = scan(bytes, ScanMode::TolerateTail);
            let complete = ends.iter().filter(|&&e| e <= cut).count();
            let got = frames(&items, bytes);
            assert_eq!(got, originals(N, LEN)[..complete].to_vec(), "cut {cut}");
            assert!(corrupt(&items).is_empty(), "cut {cut}");
            let valid = if complete == 0 {
                start
            } else {
                ends[complete - 1]
            };
            assert_eq!(end.valid_len as usize, valid, "cut {cut}");
            if cut == valid {
                assert_eq!(end.reason, StopReason::CleanEnd, "cut {cut}");
            } else if full[valid..cut].iter().all(|&x| x == 0) {
                // Only alignment zero fill of the torn frame survived.
                assert!(
                    matches!(
                        end.reason,
                        StopReason::CleanEnd | StopReason::TornTail { .. }
                    ),
                    "cut {cut}"
                );
            } else {
                assert!(
                    matches!(end.reason, StopReason::TornTail { .. }),
                    "cut {cut}: {:?}",
                    end.reason
                );
            }
            // Strict: a cut inside a frame is corruption, never a clean end.
            if cut != valid {
                let (_, strict) = scan(bytes, ScanMode::Strict);
                assert!(
                    matches!(strict.reason, StopReason::Corrupt { .. }),
                    "strict cut {cut}"
                );
            }
        }
    }
}

#[test]
fn every_bit_flip_of_a_frame_is_decoded_exactly_or_reported() {
    let b = segment(7, Alignment::Packed, 3, 64);
    let e = &b.entries()[1];
    let (from, to) = (
        e.offset as usize,
        (e.offset + u64::from(e.frame_len)) as usize,
    );
    let orig = originals(3, 64);
    for bit in from * 8..to * 8 {
        let mut bytes = b.bytes().to_vec();
        bytes[bit / 8] ^= 1 << (bit % 8);
        let (items, end) = scan(&bytes, ScanMode::TolerateTail);
        let got = frames(&items, &bytes);
        // Never a frame that was not written: every returned frame is an original, in order.
        for g in &got {
            assert!(orig[..3].contains(g), "bit {bit}: a frame decoded wrong");
        }
        if got.len() == 3 {
            continue; // the flip hit alignment fill, which carries no data
        }
        // Otherwise the middle frame is reported and the last one is still found.
        assert_eq!(got, vec![orig[0].clone(), orig[2].clone()], "bit {bit}");
        let bad = corrupt(&items);
        assert_eq!(bad.len(), 1, "bit {bit}");
        assert_eq!(bad[0].0, e.offset, "bit {bit}");
        assert_eq!(end.reason, StopReason::CleanEnd, "bit {bit}");
    }
}

#[test]
fn a_segment_shorter_than_its_header_block_is_torn() {
    // Found by the segment_scan fuzz target: the scan must not claim bytes that do not exist.
    let b = segment(7, Alignment::Packed, 1, 10);
    let short = &b.bytes()[..100];
    let (items, end) = scan(short, ScanMode::TolerateTail);
    assert!(items.is_empty());
    assert_eq!(end.valid_len, 100);
    assert!(matches!(
        end.reason,
        StopReason::TornTail {
            error: Error::Truncated { .. }
        }
    ));
    let (_, end) = scan(short, ScanMode::Strict);
    assert!(matches!(end.reason, StopReason::Corrupt { .. }));
}

#[test]
fn a_zeroed_sector_loses_only_the_records_it_held() {
    let b = segment(7, Alignment::Packed, 40, 200);
    let mut bytes = b.bytes().to_vec();
    let sector = 4096 * 3;
    bytes[sector..sector + 4096].fill(0);
    let (items, end) = scan(&bytes, ScanMode::TolerateTail);
    let got = frames(&items, &bytes);
    let all: Vec<(u64, Vec<u8>)> = (0..40).map(|i| (100 + i, payload(i, 200))).collect();
    let lost: Vec<usize> = b
        .entries()
        .iter()
        .enumerate()
        .filter(|(_, e)| {
            let (s, t) = (
                e.offset as usize,
                (e.offset + u64::from(e.frame_len)) as usize,
            );
            s < sector + 4096 && t > sector
        })
        .map(|(i, _)| i)
        .collect();
    let kept: Vec<(u64, Vec<u8>)> = (0..40)
        .filter(|i| !lost.contains(i))
        .map(|i| all[i].clone())
        .collect();
    assert_eq!(got, kept);
    assert!(
        !lost.is_empty() && *lost.last().unwrap() < 39,
        "later records exist"
    );
    assert_eq!(corrupt(&items).len(), 1);
    assert_eq!(end.reason, StopReason::CleanEnd);
}

#[test]
fn a_duplicated_frame_is_reported_not_returned_twice() {
    let b = segment(7, Alignment::Packed, 3, 64);
    let e = b.entries()[1].clone();
    let frame = b.bytes()[e.offset as usize..(e.offset + u64::from(e.frame_len)) as usize].to_vec();
    let mut bytes = b.bytes().to_vec();
    bytes.extend_from_slice(&frame);
    let (items, end) = scan(&bytes, ScanMode::TolerateTail);
    assert_eq!(frames(&items, &bytes), originals(3, 64));
    let bad = corrupt(&items);
    assert_eq!(bad.len(), 1);
    assert!(matches!(
        bad[0].1,
        Error::SequenceNotIncreasing {
            previous: 102,
            found: 101,
            ..
        }
    ));
    assert_eq!(end.reason, StopReason::CleanEnd);
}

#[test]
fn a_frame_from_another_segment_is_stale() {
    let ours = segment(7, Alignment::Packed, 2, 64);
    let theirs = segment(8, Alignment::Packed, 1, 64);
    let e = &theirs.entries()[0];
    let foreign =
        theirs.bytes()[e.offset as usize..(e.offset + u64::from(e.frame_len)) as usize].to_vec();

    // Spliced between our frames: reported, and our later frame is kept.
    let split = (ours.entries()[1].offset) as usize;
    let mut bytes = ours.bytes()[..split].to_vec();
    bytes.extend_from_slice(&foreign);
    bytes.extend_from_slice(&ours.bytes()[split..]);
    let (items, end) = scan(&bytes, ScanMode::TolerateTail);
    assert_eq!(frames(&items, &bytes), originals(2, 64));
    let bad = corrupt(&items);
    assert_eq!(bad.len(), 1);
    assert!(matches!(
        bad[0].1,
        Error::StaleSequence {
            expected: 7,
            found: 8,
            ..
        }
    ));
    assert_eq!(end.reason, StopReason::CleanEnd);

    // At the end (bytes left from an earlier use of the file): a torn tail that names it.
    let mut tail = ours.bytes().to_vec();
    tail.extend_from_slice(&foreign);
    let (items, end) = scan(&tail, ScanMode::TolerateTail);
    assert_eq!(frames(&items, &tail), originals(2, 64));
    assert!(matches!(
        end.reason,
        StopReason::TornTail {
            error: Error::StaleSequence { .. }
        }
    ));
    assert_eq!(end.valid_len as usize, ours.bytes().len());
}

#[test]
fn compressed_frames_in_a_segment_without_compression_are_refused() {
    let with = header(7, Alignment::Packed, true);
    let mut bytes = header(7, Alignment::Packed, false).encode();
    encode_frame(
        &with,
        FrameBody::Record(meta(1, 0)),
        1,
        &vec![b'z'; 5000],
        Compression::Zstd { level: 1 },
        &mut bytes,
    )
    .unwrap();
    let (items, end) = scan(&bytes, ScanMode::TolerateTail);
    assert!(frames(&items, &bytes).is_empty());
    assert!(matches!(
        end.reason,
        StopReason::TornTail {
            error: Error::InvalidField { .. }
        }
    ));
}
