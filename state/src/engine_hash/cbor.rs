//! The subset of canonical CBOR (RFC 8949 §4.2.1, as Python's `cbor2.dumps(canonical=True)` writes
//! it) that vLLM's block hashes need: unsigned and negative integers in their shortest form, byte
//! and text strings, definite-length arrays, and null.

const MAJOR_UINT: u8 = 0;
const MAJOR_NINT: u8 = 1;
const MAJOR_BYTES: u8 = 2;
const MAJOR_TEXT: u8 = 3;
const MAJOR_ARRAY: u8 = 4;
const NULL: u8 = 0xf6;

/// Appends a major type and argument in the shortest encoding.
pub(crate) fn head(out: &mut Vec<u8>, major: u8, arg: u64) {
    let m = major << 5;
    if arg < 24 {
        out.push(m | arg as u8);
    } else if arg <= u64::from(u8::MAX) {
        out.push(m | 24);
        out.push(arg as u8);
    } else if arg <= u64::from(u16::MAX) {
        out.push(m | 25);
        out.extend_from_slice(&(arg as u16).to_be_bytes());
    } else if arg <= u64::from(u32::MAX) {
        out.push(m | 26);
        out.extend_from_slice(&(arg as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&arg.to_be_bytes());
    }
}

pub(crate) fn uint(out: &mut Vec<u8>, v: u64) {
    head(out, MAJOR_UINT, v);
}

pub(crate) fn int(out: &mut Vec<u8>, v: i64) {
    if v >= 0 {
        head(out, MAJOR_UINT, v.unsigned_abs());
    } else {
        // -1 - v, computed without overflow for i64::MIN.
        head(out, MAJOR_NINT, (-(v + 1)) as u64);
    }
}

pub(crate) fn bytes(out: &mut Vec<u8>, v: &[u8]) {
    head(out, MAJOR_BYTES, v.len() as u64);
    out.extend_from_slice(v);
}

pub(crate) fn text(out: &mut Vec<u8>, v: &str) {
    head(out, MAJOR_TEXT, v.len() as u64);
    out.extend_from_slice(v.as_bytes());
}

pub(crate) fn array(out: &mut Vec<u8>, len: usize) {
    head(out, MAJOR_ARRAY, len as u64);
}

pub(crate) fn null(out: &mut Vec<u8>) {
    out.push(NULL);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc_uint(v: u64) -> Vec<u8> {
        let mut o = Vec::new();
        uint(&mut o, v);
        o
    }

    #[test]
    fn integer_width_boundaries() {
        // RFC 8949 Appendix A examples at every width boundary.
        assert_eq!(enc_uint(0), [0x00]);
        assert_eq!(enc_uint(23), [0x17]);
        assert_eq!(enc_uint(24), [0x18, 0x18]);
        assert_eq!(enc_uint(255), [0x18, 0xff]);
        assert_eq!(enc_uint(256), [0x19, 0x01, 0x00]);
        assert_eq!(enc_uint(65535), [0x19, 0xff, 0xff]);
        assert_eq!(enc_uint(65536), [0x1a, 0x00, 0x01, 0x00, 0x00]);
        assert_eq!(
            enc_uint(u64::from(u32::MAX)),
            [0x1a, 0xff, 0xff, 0xff, 0xff]
        );
        assert_eq!(
            enc_uint(1 << 32),
            [0x1b, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00]
        );
        assert_eq!(
            enc_uint(u64::MAX),
            [0x1b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
        );
        let mut o = Vec::new();
        int(&mut o, -1);
        int(&mut o, -24);
        int(&mut o, -25);
        int(&mut o, -1000);
        int(&mut o, i64::MIN);
        assert_eq!(
            o,
            [
                0x20, 0x37, 0x38, 0x18, 0x39, 0x03, 0xe7, 0x3b, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff,
                0xff, 0xff
            ]
        );
        let mut o = Vec::new();
        text(&mut o, "IETF");
        bytes(&mut o, &[1, 2]);
        array(&mut o, 2);
        null(&mut o);
        assert_eq!(o, [0x64, b'I', b'E', b'T', b'F', 0x42, 1, 2, 0x82, 0xf6]);
    }
}
