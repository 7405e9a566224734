//! Trailer and footer parsing: never panics or over-allocates; a footer that decodes re-encodes to
//! the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orbitkv_segments::{Footer, TRAILER_LEN, Trailer};

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = Footer::decode(data, 4096) {
        assert_eq!(f.encode(), data);
    }
    if data.len() >= TRAILER_LEN {
        let file_len = data.len() as u64;
        if let Ok(t) = Trailer::decode(&data[data.len() - TRAILER_LEN..], file_len) {
            let start = t.footer_offset as usize;
            let end = start + t.footer_len as usize;
            if let Some(footer) = data.get(start..end) {
                let _ = t.open_footer(footer);
            }
        }
    }
});
