//! The engine protocol, version 1: length-framed binary messages over the control socket (and
//! the hot-path transport). Byte tables are in `docs/protocol.md`.
//!
//! - [`frame`]: the 24-byte header.
//! - [`message`]: every message body.
//! - [`wire`]: the bounds-checked field encoding.
//! - [`miss`]: the miss-reason codes and names.
//! - [`client`]: the Rust client an engine links.
//! - [`discover`]: where an engine finds the daemon's socket.
//!
//! It depends on the state vocabulary and the GPU bridge only, never on the store.

#![forbid(unsafe_code)]

pub mod client;
pub mod discover;
pub mod error;
pub mod frame;
pub mod message;
pub mod miss;
pub mod wire;

pub use error::{ProtocolError, Result};
pub use frame::{DEFAULT_MAX_BODY, FrameHeader, HEADER_LEN, VERSION, read_frame};
pub use message::{ErrorCode, Message, PageStatus, Role};

/// Decodes a whole frame held in `bytes` (header and body, nothing after).
pub fn decode_frame(bytes: &[u8], max_body: u32) -> Result<(u64, Message)> {
    let head: &[u8; HEADER_LEN] = bytes
        .get(..HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or(ProtocolError::Truncated {
            what: "frame header",
            need: HEADER_LEN,
            have: bytes.len(),
        })?;
    let h = FrameHeader::decode(head, max_body)?;
    let body = &bytes[HEADER_LEN..];
    if body.len() != h.len as usize {
        return Err(ProtocolError::Truncated {
            what: "frame body",
            need: h.len as usize,
            have: body.len(),
        });
    }
    Ok((h.request, Message::decode(h.kind, body)?))
}
