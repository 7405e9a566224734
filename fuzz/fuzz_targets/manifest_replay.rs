//! Manifest replay: never panics; the valid prefix replays cleanly to the same state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orbitkv_wal::{ReplayStop, replay};

fuzz_target!(|data: &[u8]| {
    let r = replay(data);
    assert!(r.valid_len as usize <= data.len());
    let again = replay(&data[..r.valid_len as usize]);
    assert_eq!(again.stop, ReplayStop::CleanEnd);
    assert_eq!(again.state, r.state);
    assert_eq!(again.records, r.records);
});
