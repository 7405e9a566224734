//! The frame every message travels in: a 24-byte header (magic, version, type, request id, body
//! length, flags) and the body. Byte table in `docs/protocol.md` ("Frame").

use std::io::{self, Read};

use super::error::{ProtocolError, Result};

/// The first bytes of every frame.
pub const MAGIC: [u8; 4] = *b"OKVM";
/// The protocol version this build speaks.
pub const VERSION: u16 = 5;
/// Bytes of a frame header.
pub const HEADER_LEN: usize = 24;
/// Default limit on a message body; the daemon's is configurable.
pub const DEFAULT_MAX_BODY: u32 = 16 << 20;

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The message type.
    pub kind: u16,
    /// Chosen by the requester, echoed in every reply to it.
    pub request: u64,
    /// Body length.
    pub len: u32,
}

impl FrameHeader {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC);
        h[4..6].copy_from_slice(&VERSION.to_le_bytes());
        h[6..8].copy_from_slice(&self.kind.to_le_bytes());
        h[8..16].copy_from_slice(&self.request.to_le_bytes());
        h[16..20].copy_from_slice(&self.len.to_le_bytes());
        h
    }

    /// Decodes a header, refusing another magic or version, nonzero flags, and a body over
    /// `max_body` (the type is checked by [`super::Message::decode`]).
    pub fn decode(h: &[u8; HEADER_LEN], max_body: u32) -> Result<Self> {
        if h[0..4] != MAGIC {
            return Err(ProtocolError::BadMagic);
        }
        let version = u16::from_le_bytes([h[4], h[5]]);
        if version != VERSION {
            return Err(ProtocolError::UnknownVersion {
                got: version,
                supported: VERSION,
            });
        }
        let kind = u16::from_le_bytes([h[6], h[7]]);
        let mut r = [0u8; 8];
        r.copy_from_slice(&h[8..16]);
        let len = u32::from_le_bytes([h[16], h[17], h[18], h[19]]);
        if len > max_body {
            return Err(ProtocolError::TooLarge {
                len: u64::from(len),
                max: u64::from(max_body),
            });
        }
        if h[20..24] != [0; 4] {
            return Err(ProtocolError::BadField {
                what: "frame flags",
                why: "reserved bits set".into(),
            });
        }
        Ok(Self {
            kind,
            request: u64::from_le_bytes(r),
            len,
        })
    }
}

/// A whole frame: header then body.
pub fn encode_frame(kind: u16, request: u64, body: &[u8]) -> Result<Vec<u8>> {
    let len = u32::try_from(body.len()).map_err(|_| ProtocolError::TooLarge {
        len: body.len() as u64,
        max: u64::from(u32::MAX),
    })?;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&FrameHeader { kind, request, len }.encode());
    out.extend_from_slice(body);
    Ok(out)
}

/// Why reading a frame failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The stream failed or ended (`UnexpectedEof` at a frame boundary is a clean close).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The bytes are not a frame this build accepts.
    #[error("{0}")]
    Protocol(#[from] ProtocolError),
}

/// Reads one frame (header and body) from `r`.
pub fn read_frame(r: &mut impl Read, max_body: u32) -> Result<(FrameHeader, Vec<u8>), ReadError> {
    let mut h = [0u8; HEADER_LEN];
    r.read_exact(&mut h)?;
    let header = FrameHeader::decode(&h, max_body)?;
    Ok((header, read_body(r, &header)?))
}

/// Reads the body `header` announces from `r`.
pub fn read_body(r: &mut impl Read, header: &FrameHeader) -> Result<Vec<u8>, ReadError> {
    // Memory follows the bytes that arrive, not the length a peer claims.
    let len = header.len as usize;
    let mut body = Vec::with_capacity(len.min(64 << 10));
    r.take(u64::from(header.len)).read_to_end(&mut body)?;
    if body.len() != len {
        return Err(ReadError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the stream ended inside a frame body",
        )));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_bad_ones_are_refused() {
        let f = encode_frame(0x0101, 7, b"body").unwrap_or_else(|e| panic!("{e}"));
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&f[..HEADER_LEN]);
        let d = FrameHeader::decode(&h, 16).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((d.kind, d.request, d.len), (0x0101, 7, 4));
        assert!(matches!(
            FrameHeader::decode(&h, 3),
            Err(ProtocolError::TooLarge { len: 4, max: 3 })
        ));
        // Another version (here the previous one) is refused.
        let mut v = h;
        v[4] = 1;
        assert!(matches!(
            FrameHeader::decode(&v, 16),
            Err(ProtocolError::UnknownVersion { got: 1, .. })
        ));
        let mut m = h;
        m[0] = b'X';
        assert_eq!(FrameHeader::decode(&m, 16), Err(ProtocolError::BadMagic));
        let mut fl = h;
        fl[23] = 1;
        assert!(FrameHeader::decode(&fl, 16).is_err());
        let (hd, body) = read_frame(&mut &f[..], 16).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((hd, body.as_slice()), (d, &b"body"[..]));
        // A frame cut short is an early end of the stream, not a panic.
        assert!(matches!(
            read_frame(&mut &f[..f.len() - 1], 16),
            Err(ReadError::Io(_))
        ));
    }
}
