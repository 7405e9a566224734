//! Golden fixtures: committed segment images whose bytes must stay identical while the format
//! version stays the same. Regenerate (only with a version bump) with `ORBITKV_BLESS=1`. The
//! compressed record depends on the zstd library pinned in Cargo.lock; a zstd upgrade that changes
//! its output must regenerate these files and say so.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::{header, key, meta, payload};
use orbitkv_segments::{
    Alignment, Compression, DataDirHeader, ScanItem, ScanMode, Scanner, SegmentBuilder,
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

fn build(alignment: Alignment) -> Vec<u8> {
    let mut b = SegmentBuilder::new(
        header(0x5eed, alignment, true),
        Compression::Zstd { level: 3 },
    );
    b.append_record(meta(1, 0), 1, &payload(0, 100)).unwrap();
    b.append_record(meta(1, 1), 2, &vec![0x42; 3000]).unwrap(); // compresses
    b.append_tombstone(key(1, 0), 3).unwrap();
    if alignment == Alignment::Packed {
        b.append_padding(512).unwrap();
    }
    b.append_record(meta(2, 2), 4, &[]).unwrap();
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
        let t = Trailer::decode(&bytes[bytes.len() - TRAILER_LEN..], bytes.len() as u64).unwrap();
        let f = t
            .open_footer(
                &bytes[t.footer_offset as usize..(t.footer_offset + t.footer_len) as usize],
            )
            .unwrap();
        assert_eq!(f.entries.len(), 4);
        assert!(f.entries[1].compressed);
        let (items, end) =
            Scanner::new(&bytes[..t.footer_offset as usize], h, ScanMode::Strict).run();
        assert_eq!(end.reason, StopReason::CleanEnd);
        let frames = items
            .iter()
            .filter(|i| matches!(i, ScanItem::Frame(_)))
            .count();
        assert_eq!(frames, if align == Alignment::Packed { 5 } else { 4 });
    }
}

#[test]
fn data_directory_header_v1_bytes_are_stable() {
    let h = DataDirHeader {
        directory_id: *b"orbitkv-golden!!",
        created_unix_ms: 1_764_547_200_000,
        flags: 0,
    };
    golden("orbitkv-v1.dir", &h.encode());
    assert_eq!(DataDirHeader::decode(&h.encode()).unwrap(), h);
}
