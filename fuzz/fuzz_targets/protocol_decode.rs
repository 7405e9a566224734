//! The engine protocol's decoder on arbitrary bytes: a whole frame, and a body of every type.
//! It must never panic; whatever decodes re-encodes to a frame that decodes to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orbitkv_protocol::{DEFAULT_MAX_BODY, Message, decode_frame};

fuzz_target!(|data: &[u8]| {
    if let Ok((req, m)) = decode_frame(data, DEFAULT_MAX_BODY) {
        let again = m
            .encode_frame(req)
            .unwrap_or_else(|e| panic!("re-encoding {m:?}: {e}"));
        assert_eq!(decode_frame(&again, DEFAULT_MAX_BODY), Ok((req, m)));
    }
    // The body alone, under the type named by the first two bytes.
    if let [a, b, body @ ..] = data {
        let kind = u16::from_le_bytes([*a, *b]);
        if let Ok(m) = Message::decode(kind, body) {
            assert_eq!(Message::decode(m.kind(), &m.encode_body()), Ok(m));
        }
    }
});
