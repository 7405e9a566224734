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
    SegmentBuilder, SegmentHeader, StopReason,
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

/// A segment holding every frame kind: record, tombstone, padding (packed only), record, record.
fn mixed(align: Alignment) -> SegmentBuilder {
    let mut b = SegmentBuilder::new(header(7, align, false), Compression::None);
    b.append_record(meta(1, 0), 100, &payload(0, 64)).unwrap();
    b.append_tombstone(common::key(1, 0), 101).unwrap();
    if align == Alignment::Packed {
        b.append_padding(512).unwrap();
    }
    b.append_record(meta(1, 2), 102, &payload(2, 64)).unwrap();
    b.append_record(meta(1, 3), 103, &payload(3, 64)).unwrap();
    b
}

/// (offset, end, end of header + payload) of every frame of a segment image.
fn extents(bytes: &[u8]) -> Vec<(usize, usize, usize)> {
    let (items, _) = scan(bytes, ScanMode::Strict);
    items
        .iter()
        .filter_map(|i| match i {
            ScanItem::Frame(f) => Some((
                f.offset as usize,
                (f.offset + u64::from(f.header.frame_len)) as usize,
                f.payload.end,
            )),
            ScanItem::Corrupt { .. } => None,
        })
        .collect()
}

fn offsets(items: &[ScanItem]) -> Vec<u64> {
    items
        .iter()
        .filter_map(|i| match i {
            ScanItem::Frame(f) => Some(f.offset),
            ScanItem::Corrupt { .. } => None,
        })
        .collect()
}

#[test]
fn every_bit_flip_is_decoded_exactly_or_reported() {
    for align in [Alignment::Packed, Alignment::Direct] {
        let b = mixed(align);
        let clean = b.bytes().to_vec();
        let ext = extents(&clean);
        let all: Vec<u64> = ext.iter().map(|e| e.0 as u64).collect();
        let (clean_items, _) = scan(&clean, ScanMode::Strict);
        let clean_frames = frames(&clean_items, &clean);
        // Damage each frame but the first: a middle one, the padding/tombstone, and the last.
        for (k, &(from, to, data_end)) in ext.iter().enumerate().skip(1) {
            let last = k == ext.len() - 1;
            let mut bit = from * 8;
            while bit < to * 8 {
                let mut bytes = clean.clone();
                bytes[bit / 8] ^= 1 << (bit % 8);
                for mode in [ScanMode::TolerateTail, ScanMode::Strict] {
                    let (items, end) = scan(&bytes, mode);
                    let got = frames(&items, &bytes);
                    // Never a frame that was not written.
                    assert!(
                        got.iter().all(|g| clean_frames.contains(g)),
                        "{align:?} bit {bit}"
                    );
                    if bit / 8 >= data_end {
                        // Alignment fill carries no data: everything decodes exactly.
                        assert_eq!(offsets(&items), all, "{align:?} fill bit {bit}");
                        assert!(corrupt(&items).is_empty());
                        assert_eq!(end.reason, StopReason::CleanEnd);
                        continue;
                    }
                    let want: Vec<u64> =
                        all.iter().copied().filter(|&o| o != from as u64).collect();
                    assert_eq!(
                        offsets(&items),
                        want,
                        "{align:?} frame {k} bit {bit} {mode:?}"
                    );
                    if last {
                        // Nothing valid follows: a torn tail, or corruption when strict.
                        assert!(corrupt(&items).is_empty());
                        assert_eq!(end.valid_len as usize, from);
                        match mode {
                            ScanMode::TolerateTail => {
                                assert!(matches!(end.reason, StopReason::TornTail { .. }))
                            }
                            ScanMode::Strict => {
                                assert!(matches!(end.reason, StopReason::Corrupt { .. }))
                            }
                        }
                    } else {
                        let bad = corrupt(&items);
                        assert_eq!(bad.len(), 1, "{align:?} frame {k} bit {bit}");
                        assert_eq!(bad[0].0 as usize, from);
                        assert_eq!(end.reason, StopReason::CleanEnd);
                    }
                }
                // Every bit of headers and payloads; a sample of the (large, direct) fill.
                bit += if bit / 8 >= data_end { 61 } else { 1 };
            }
        }
    }
}

#[test]
fn a_frame_image_inside_a_damaged_payload_is_never_returned() {
    let seg = header(7, Alignment::Packed, false);
    // A payload that embeds a complete, valid frame of this very segment (sequence 1000).
    let mut inner = Vec::new();
    encode_frame(
        &seg,
        FrameBody::Record(meta(9, 9)),
        1000,
        &payload(9, 40),
        Compression::None,
        &mut inner,
    )
    .unwrap();
    let mut outer_payload = vec![0u8; 16];
    outer_payload.extend_from_slice(&inner);
    outer_payload.extend_from_slice(&[7u8; 24]);
    let mut b = SegmentBuilder::new(seg, Compression::None);
    b.append_record(meta(1, 0), 100, &payload(0, 64)).unwrap();
    b.append_record(meta(1, 1), 101, &outer_payload).unwrap();
    b.append_record(meta(1, 2), 102, &payload(2, 64)).unwrap();
    let mut bytes = b.bytes().to_vec();
    let damaged = b.entries()[1].clone();
    let last_payload_byte = (damaged.offset as usize) + 256 + outer_payload.len() - 1;
    bytes[last_payload_byte] ^= 1;
    let (items, end) = scan(&bytes, ScanMode::TolerateTail);
    let seqs: Vec<u64> = frames(&items, &bytes).iter().map(|f| f.0).collect();
    assert_eq!(seqs, vec![100, 102], "the embedded frame must not surface");
    assert_eq!(corrupt(&items).len(), 1);
    assert_eq!(end.reason, StopReason::CleanEnd);
}

#[test]
fn a_padding_frame_with_a_non_zero_payload_is_refused() {
    let seg = header(7, Alignment::Packed, false);
    let mut b = SegmentBuilder::new(seg, Compression::None);
    b.append_padding(512).unwrap();
    let mut bytes = b.bytes().to_vec();
    // Rewrite the padding payload to non-zero bytes with a matching CRC.
    let start = orbitkv_segments::SEGMENT_HEADER_LEN;
    bytes[start + 256..start + 512].fill(0xaa);
    let crc = crc32c::crc32c(&bytes[start + 256..start + 512]);
    bytes[start + 32..start + 36].copy_from_slice(&crc.to_le_bytes());
    let hcrc = crc32c::crc32c(&bytes[start..start + 252]);
    bytes[start + 252..start + 256].copy_from_slice(&hcrc.to_le_bytes());
    let (items, end) = scan(&bytes, ScanMode::TolerateTail);
    assert!(items.is_empty());
    assert!(matches!(
        end.reason,
        StopReason::TornTail {
            error: Error::InvalidField { .. }
        }
    ));
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
fn a_zeroed_block_in_a_direct_segment_loses_one_record() {
    let b = segment(7, Alignment::Direct, 6, 1000);
    let mut bytes = b.bytes().to_vec();
    let e = &b.entries()[2];
    bytes[e.offset as usize..e.offset as usize + 4096].fill(0);
    let (items, end) = scan(&bytes, ScanMode::TolerateTail);
    let seqs: Vec<u64> = frames(&items, &bytes).iter().map(|f| f.0).collect();
    assert_eq!(seqs, vec![100, 101, 103, 104, 105]);
    assert_eq!(corrupt(&items).len(), 1);
    assert_eq!(end.reason, StopReason::CleanEnd);
}

#[test]
fn a_duplicate_in_the_middle_is_skipped_and_later_frames_kept() {
    let b = segment(7, Alignment::Packed, 3, 64);
    let e0 = b.entries()[0].clone();
    let at = b.entries()[2].offset as usize;
    let copy =
        b.bytes()[e0.offset as usize..(e0.offset + u64::from(e0.frame_len)) as usize].to_vec();
    let mut bytes = b.bytes()[..at].to_vec();
    bytes.extend_from_slice(&copy);
    bytes.extend_from_slice(&b.bytes()[at..]);
    let (items, end) = scan(&bytes, ScanMode::Strict);
    assert_eq!(frames(&items, &bytes), originals(3, 64));
    assert!(matches!(
        corrupt(&items)[..],
        [(
            _,
            Error::SequenceNotIncreasing {
                previous: 101,
                found: 100,
                ..
            }
        )]
    ));
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
