//! Segment scanning in both modes: never panics; every frame returned has a verified payload
//! inside the bytes, offsets and record sequences increase, and the valid length is in bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orbitkv_segments::{Alignment, SEGMENT_HEADER_LEN, ScanItem, ScanMode, Scanner, SegmentHeader};

fuzz_target!(|data: &[u8]| {
    // A real segment image as it is, or arbitrary frames behind a synthesized header.
    let (bytes, header) = match SegmentHeader::decode(data) {
        Ok(h) => (data.to_vec(), h),
        Err(_) => {
            let first = data.first().copied().unwrap_or(0);
            let h = SegmentHeader {
                segment_id: 1,
                sequence: u64::from(data.get(1).copied().unwrap_or(0)),
                created_unix_ms: 0,
                directory_id: [0; 16],
                alignment: if first & 1 == 0 {
                    Alignment::Packed
                } else {
                    Alignment::Direct
                },
                compression: first & 2 != 0,
            };
            let mut b = h.encode();
            b.extend_from_slice(data.get(2..).unwrap_or_default());
            (b, h)
        }
    };
    for mode in [ScanMode::TolerateTail, ScanMode::Strict] {
        let mut scanner = Scanner::new(&bytes, header, mode);
        let mut last_offset = SEGMENT_HEADER_LEN as u64;
        let mut last_seq = None;
        for item in scanner.by_ref() {
            match item {
                ScanItem::Frame(f) => {
                    assert!(f.offset >= last_offset);
                    let stored = &bytes[f.payload.clone()];
                    assert!(f.header.verify_payload(stored, f.offset).is_ok());
                    if f.header.record_sequence != 0 {
                        assert!(last_seq.is_none_or(|s| f.header.record_sequence > s));
                        last_seq = Some(f.header.record_sequence);
                    }
                    last_offset = f.offset + u64::from(f.header.frame_len);
                }
                ScanItem::Corrupt {
                    offset, resumed_at, ..
                } => {
                    assert!(offset >= last_offset && resumed_at > offset);
                    last_offset = resumed_at;
                }
            }
        }
        let end = scanner.end().cloned();
        assert!(end.is_some_and(|e| e.valid_len <= bytes.len() as u64));
    }
});
