//! StorageLayout decoding on arbitrary bytes: never a panic; whatever decodes is exactly its own
//! canonical encoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orbitkv_state::StorageLayout;

fuzz_target!(|data: &[u8]| {
    if let Ok(l) = StorageLayout::decode(data) {
        assert_eq!(l.encode(), data);
    }
});
