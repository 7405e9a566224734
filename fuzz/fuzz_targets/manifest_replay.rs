//! Manifest replay: never panics; the valid prefix replays cleanly to the same state. When the
//! first input byte is odd the harness repairs every record's CRCs first, so record payloads and
//! the replay rules behind the checksums are fuzzed too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orbitkv_wal::record::{RECORD_HEADER_LEN, record_len};
use orbitkv_wal::{ReplayStop, replay};

fn repair(data: &mut [u8]) {
    let mut pos = 0usize;
    while pos + RECORD_HEADER_LEN <= data.len() {
        let len = u32::from_le_bytes([
            data[pos + 16],
            data[pos + 17],
            data[pos + 18],
            data[pos + 19],
        ]) as usize;
        if let Some(p) =
            data.get(pos + RECORD_HEADER_LEN..(pos + RECORD_HEADER_LEN).saturating_add(len))
        {
            let crc = crc32c::crc32c(p);
            data[pos + 20..pos + 24].copy_from_slice(&crc.to_le_bytes());
        }
        let crc = crc32c::crc32c(&data[pos..pos + 24]);
        data[pos + 24..pos + 28].copy_from_slice(&crc.to_le_bytes());
        pos = pos.saturating_add(record_len(len.min(data.len())));
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let mut data = rest.to_vec();
    if mode & 1 == 1 {
        repair(&mut data);
    }
    let r = replay(&data);
    assert!(r.valid_len as usize <= data.len());
    let again = replay(&data[..r.valid_len as usize]);
    assert_eq!(again.stop, ReplayStop::CleanEnd);
    assert_eq!(again.state, r.state);
    assert_eq!(again.records, r.records);
});
