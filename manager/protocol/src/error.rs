//! Why a message was refused.

/// A message that cannot be decoded, or is refused as it stands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The frame does not start with the protocol's magic.
    #[error("not an OrbitKV message (bad magic)")]
    BadMagic,
    /// A protocol version this build does not speak.
    #[error("protocol version {got} is not supported (this build speaks {supported})")]
    UnknownVersion {
        /// The version the frame names.
        got: u16,
        /// The one this build speaks.
        supported: u16,
    },
    /// A message type this build does not know.
    #[error("unknown message type {0:#06x}")]
    UnknownType(u16),
    /// A body longer than the limit.
    #[error("a message body of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// The body length the frame names.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The bytes end inside a field.
    #[error("{what}: needs {need} more bytes, {have} left")]
    Truncated {
        /// The field.
        what: &'static str,
        /// Bytes it needs.
        need: usize,
        /// Bytes left.
        have: usize,
    },
    /// Bytes left over after the last field.
    #[error("{what}: {extra} bytes after the last field")]
    TrailingBytes {
        /// The message.
        what: &'static str,
        /// How many.
        extra: usize,
    },
    /// A field's value is not allowed.
    #[error("{what}: {why}")]
    BadField {
        /// The field.
        what: &'static str,
        /// Why.
        why: String,
    },
}

/// The protocol's result.
pub type Result<T, E = ProtocolError> = std::result::Result<T, E>;
