//! StateKey and KeyHash decoding: never panics; whatever decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orbitkv_state::{KeyHash, StateKey};

fuzz_target!(|data: &[u8]| {
    if let Ok(k) = StateKey::decode(data) {
        assert_eq!(k.encode(), data);
        let _ = (
            k.hash.domain(),
            k.hash.group(),
            k.hash.component(),
            k.hash.rank(),
        );
    }
    if let Ok((h, used)) = KeyHash::decode_prefix(data) {
        assert_eq!(h.as_bytes(), &data[..used]);
    }
});
