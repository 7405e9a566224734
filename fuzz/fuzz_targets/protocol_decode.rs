//! The engine protocol's decoder on arbitrary bytes: a whole frame, and a body of every type.
//! It must never panic; whatever decodes re-encodes to a frame that decodes to the same message.
//! A decoded pool registration is validated; one that passes has every run of its first and
//! last pages inside its page memory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orbitkv_protocol::{DEFAULT_MAX_BODY, Message, decode_frame};

fuzz_target!(|data: &[u8]| {
    if let Ok((req, m)) = decode_frame(data, DEFAULT_MAX_BODY) {
        let again = m
            .encode_frame(req)
            .unwrap_or_else(|e| panic!("re-encoding {m:?}: {e}"));
        assert_eq!(decode_frame(&again, DEFAULT_MAX_BODY), Ok((req, m.clone())));
        if let Message::RegisterPool { spec, .. } = m
            && spec.validate().is_ok()
        {
            let memory = u64::from(spec.pages) * spec.page_bytes;
            for g in &spec.groups {
                for page in [0, spec.pages - 1] {
                    for at in g.runs(page, g.all_layers()).take(4096) {
                        assert!(at + g.run_bytes() <= memory, "{spec:?}");
                    }
                }
            }
        }
    }
    // The body alone, under the type named by the first two bytes.
    if let [a, b, body @ ..] = data {
        let kind = u16::from_le_bytes([*a, *b]);
        if let Ok(m) = Message::decode(kind, body) {
            assert_eq!(Message::decode(m.kind(), &m.encode_body()), Ok(m));
        }
    }
});
