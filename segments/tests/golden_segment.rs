//! Golden fixtures: committed segment images whose bytes must stay identical while the format
//! version stays the same. Regenerate (only with a version bump) with `ORBITKV_BLESS=1`. The
//! compressed record depends on the zstd library pinned in Cargo.lock; a zstd upgrade that changes
//! its output must regenerate these files and say so.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::{header, key, meta};
use orbitkv_segments::{
    Alignment, Compression, DataDirHeader, FrameBody, ScanItem, ScanMode, Scanner, SegmentBuilder,
    SegmentHeader, StopReason, TRAILER_LEN, Trailer,
};

fn golden(name: &str, bytes: &[u8]) {
    let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("ORBITKV_BLESS").is_some() {
        std::fs::write(&path, bytes).unwrap();
    }
    let committed = std::fs::read(&path).unwrap();
    assert!(
        committed == bytes,
        "{name} changed: the encoding differs from the committed v1 fixture (bump the version)"
    );
}

/// The directory id of the golden data-directory header; the golden segments belong to it.
const GOLDEN_DIR: [u8; 16] = *b"orbitkv-golden!!";

/// The first golden record's payload, written out: the golden files hold these bytes, whatever
/// the test payload generator produces.
const FIRST_PAYLOAD: &str = "414129256501710dff2ee489e6a3e47b2531af5cf0b9a2d97a9c69b76a0c1404381cf6fd52b80b2b3b59ab82c5025286fbdab3ca0dc1d4035d15eb5a6832487ed0217bb3f2ed1020967f83da45cdea7fbd00a67d5f971a9649035bf55c1856021c869fc8";

/// The payloads of the golden segments' records, in order.
fn payloads() -> Vec<Vec<u8>> {
    let first = (0..FIRST_PAYLOAD.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&FIRST_PAYLOAD[i..i + 2], 16).unwrap())
        .collect();
    vec![first, vec![0x42; 3000], Vec::new()]
}

fn build(alignment: Alignment) -> Vec<u8> {
    let mut h = header(0x5eed, alignment, true);
    h.directory_id = GOLDEN_DIR;
    let mut b = SegmentBuilder::new(h, Compression::Zstd { level: 3 });
    let p = payloads();
    b.append_record(meta(1, 0), 1, &p[0]).unwrap();
    b.append_record(meta(1, 1), 2, &p[1]).unwrap(); // compresses
    b.append_tombstone(key(1, 0), 3).unwrap();
    if alignment == Alignment::Packed {
        b.append_padding(512).unwrap();
    }
    b.append_record(meta(2, 2), 4, &p[2]).unwrap();
    b.seal()
}

#[test]
fn segment_v1_bytes_are_stable_and_decode() {
    for (name, align) in [
        ("segment-v1-packed.bin", Alignment::Packed),
        ("segment-v1-direct.bin", Alignment::Direct),
    ] {
        let bytes = build(align);
        golden(name, &bytes);
        let h = SegmentHeader::decode(&bytes).unwrap();
        assert_eq!(h.sequence, 0x5eed);
        assert_eq!(h.directory_id, GOLDEN_DIR);
        let t = Trailer::decode(&bytes[bytes.len() - TRAILER_LEN..], bytes.len() as u64).unwrap();
        let f = t
            .open_footer(
                &bytes[t.footer_offset as usize..(t.footer_offset + t.footer_len) as usize],
                h.alignment,
            )
            .unwrap();
        assert_eq!(f.entries.len(), 4);
        assert!(f.entries[1].compressed);
        let (items, end) =
            Scanner::new(&bytes[..t.footer_offset as usize], h, ScanMode::Strict).run();
        assert_eq!(end.reason, StopReason::CleanEnd);
        let frames: Vec<_> = items
            .iter()
            .filter_map(|i| match i {
                ScanItem::Frame(f) => Some(f),
                ScanItem::Corrupt { .. } => None,
            })
            .collect();
        assert_eq!(frames.len(), if align == Alignment::Packed { 5 } else { 4 });
        // The decoded payloads are the originals, the zstd-compressed one included.
        let records: Vec<Vec<u8>> = frames
            .iter()
            .filter(|f| matches!(f.header.body, FrameBody::Record(_)))
            .map(|f| {
                f.header
                    .payload(&bytes[f.payload.clone()], f.offset)
                    .unwrap()
                    .into_owned()
            })
            .collect();
        assert_eq!(records, payloads());
    }
}

#[test]
fn data_directory_header_v1_bytes_are_stable() {
    let h = DataDirHeader {
        directory_id: GOLDEN_DIR,
        created_unix_ms: 1_764_547_200_000,
        flags: 0,
    };
    golden("orbitkv-v1.dir", &h.encode());
    assert_eq!(DataDirHeader::decode(&h.encode()).unwrap(), h);
}
