//! StateFormat decoding: never panics; whatever decodes is valid and re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orbitkv_state::StateFormat;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = StateFormat::decode(data) {
        assert!(f.validate().is_ok());
        assert_eq!(f.encode().ok().as_deref(), Some(data));
        assert!(f.digest().is_ok());
    }
});
