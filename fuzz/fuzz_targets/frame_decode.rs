//! Frame header decoding and payload verification: never panics; a decoded header re-encodes to
//! the same 256 bytes; payload copies only succeed when the CRC verifies.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orbitkv_segments::{FRAME_HEADER_LEN, FrameHeader};

fuzz_target!(|data: &[u8]| {
    let Ok(h) = FrameHeader::decode(data, 0) else {
        return;
    };
    assert_eq!(&h.encode()[..], &data[..FRAME_HEADER_LEN]);
    let stored_end = FRAME_HEADER_LEN + h.stored_len as usize;
    if let Some(stored) = data.get(FRAME_HEADER_LEN..stored_end) {
        let verified = h.verify_payload(stored, 0).is_ok();
        let mut dst = vec![0u8; h.uncompressed_len as usize];
        if h.copy_payload(stored, &mut dst, 0).is_ok() {
            assert!(verified);
        }
        if let Ok(p) = h.payload(stored, 0) {
            assert!(verified);
            assert_eq!(p.len(), h.uncompressed_len as usize);
        }
    }
});
