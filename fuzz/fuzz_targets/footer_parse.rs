//! Trailer and footer parsing: never panics or over-allocates; a footer that decodes re-encodes
//! to the same bytes and obeys the entry rules. When the first input byte is odd the harness
//! repairs the footer CRC (and, for the trailer path, the trailer's digest and CRC) first, so the
//! checks behind them are fuzzed too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orbitkv_segments::footer::footer_digest;
use orbitkv_segments::{Alignment, FRAME_HEADER_LEN, Footer, TRAILER_LEN, Trailer};

fn check(f: &Footer, alignment: Alignment) {
    let mut prev_end = 4096u64;
    for e in &f.entries {
        assert!(e.offset >= prev_end);
        assert_eq!(e.offset % alignment.unit() as u64, 0);
        assert!(e.frame_len as usize >= FRAME_HEADER_LEN + e.stored_len as usize);
        prev_end = e.offset + u64::from(e.frame_len);
        assert!(prev_end <= f.data_end);
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let repair = mode & 1 == 1;
    let alignment = if mode & 2 == 0 {
        Alignment::Packed
    } else {
        Alignment::Direct
    };
    let mut data = rest.to_vec();
    if repair && data.len() >= 4 {
        let n = data.len() - 4;
        let crc = crc32c::crc32c(&data[..n]);
        data[n..].copy_from_slice(&crc.to_le_bytes());
    }
    if let Ok(f) = Footer::decode(&data, 4096, alignment) {
        assert_eq!(f.encode(), data);
        check(&f, alignment);
    }
    // As a sealed file: footer at 4096, trailer last (repaired to match when asked).
    let mut file = vec![0u8; 4096];
    file.extend_from_slice(&data);
    let footer_len = data.len() as u64;
    if repair {
        let t = Trailer {
            footer_offset: 4096,
            footer_len,
            segment_sequence: u64::from_le_bytes(
                data.get(8..16)
                    .and_then(|s| s.try_into().ok())
                    .unwrap_or_default(),
            ),
            footer_digest: footer_digest(&data),
        };
        file.extend_from_slice(&t.encode());
    }
    if file.len() >= 4096 + TRAILER_LEN {
        let len = file.len() as u64;
        if let Ok(t) = Trailer::decode(&file[file.len() - TRAILER_LEN..], len) {
            let start = t.footer_offset as usize;
            if let Some(footer) = file.get(start..start + t.footer_len as usize)
                && let Ok(f) = t.open_footer(footer, alignment)
            {
                check(&f, alignment);
                assert_eq!(f.data_end, t.footer_offset);
            }
        }
    }
});
