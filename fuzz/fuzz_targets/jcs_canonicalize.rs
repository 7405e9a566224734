//! RFC 8785 canonicalization: never panics; canonical output is a fixed point.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orbitkv_state::jcs;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = jcs::canonicalize(data) {
        assert_eq!(jcs::canonicalize(&c).ok().as_deref(), Some(c.as_slice()));
    }
});
