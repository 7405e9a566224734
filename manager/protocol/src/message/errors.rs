//! The Error message and its codes: why a request was refused as a whole.

use super::Message;
use crate::error::{ProtocolError, Result};
use crate::wire::{Reader, Writer};

/// Why a request was refused as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// Not a message this daemon accepts (version, type, size, encoding).
    Malformed,
    /// The session token is unknown or forged.
    BadToken,
    /// The request's epoch is not the session's (the engine re-registered).
    StaleEpoch,
    /// The ranks disagree on a field; the detail names it.
    SealRefused,
    /// A declared rank did not register in time.
    SealTimeout,
    /// A per-client limit (leases, pins, bytes in flight) was reached.
    LimitExceeded,
    /// No such lease (released, expired, or another instance's).
    UnknownLease,
    /// The peer's credentials are not allowed.
    NotPermitted,
    /// Refused for good: the store takes no writes until an operator acts (read-only, a failed
    /// manifest checkpoint, ids exhausted, damage). Do not send it again to this daemon.
    Refused,
    /// Something failed inside the daemon.
    Internal,
    /// This daemon cannot do it here: a device pool on a daemon built without the CUDA
    /// backend, or on a machine without the driver or the device. The detail says which.
    Unsupported,
    /// Not done now, may be done later (the disk or SSD tier full, a failed write, a proven
    /// record that left the store before it was pinned): send it again after the error's
    /// retry-after.
    RetryLater,
    /// The request names a namespace this store does not hold.
    UnknownNamespace,
}

impl ErrorCode {
    const ALL: [ErrorCode; 13] = [
        ErrorCode::Malformed,
        ErrorCode::BadToken,
        ErrorCode::StaleEpoch,
        ErrorCode::SealRefused,
        ErrorCode::SealTimeout,
        ErrorCode::LimitExceeded,
        ErrorCode::UnknownLease,
        ErrorCode::NotPermitted,
        ErrorCode::Refused,
        ErrorCode::Internal,
        ErrorCode::Unsupported,
        ErrorCode::RetryLater,
        ErrorCode::UnknownNamespace,
    ];

    /// The wire code (from 1).
    pub fn code(self) -> u16 {
        Self::ALL.iter().position(|s| *s == self).unwrap_or(0) as u16 + 1
    }

    /// Its name in snake case, as clients show it (`retry_later`).
    pub const fn name(self) -> &'static str {
        match self {
            ErrorCode::Malformed => "malformed",
            ErrorCode::BadToken => "bad_token",
            ErrorCode::StaleEpoch => "stale_epoch",
            ErrorCode::SealRefused => "seal_refused",
            ErrorCode::SealTimeout => "seal_timeout",
            ErrorCode::LimitExceeded => "limit_exceeded",
            ErrorCode::UnknownLease => "unknown_lease",
            ErrorCode::NotPermitted => "not_permitted",
            ErrorCode::Refused => "refused",
            ErrorCode::Internal => "internal",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::RetryLater => "retry_later",
            ErrorCode::UnknownNamespace => "unknown_namespace",
        }
    }

    /// Whether the same request may succeed if sent again unchanged: after the retry-after
    /// (`RetryLater`), once the client holds fewer leases or bytes (`LimitExceeded`), or once
    /// every rank registers in time (`SealTimeout`). Every other code needs a change first.
    pub const fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::RetryLater | ErrorCode::LimitExceeded | ErrorCode::SealTimeout
        )
    }

    /// The error of a wire code.
    pub fn from_code(code: u16) -> Result<Self> {
        code.checked_sub(1)
            .and_then(|i| Self::ALL.get(i as usize))
            .copied()
            .ok_or_else(|| ProtocolError::BadField {
                what: "error code",
                why: format!("unknown code {code}"),
            })
    }
}

pub(super) fn encode_error(w: &mut Writer, code: ErrorCode, retry_after_ms: u32, detail: &str) {
    w.u16(code.code())
        .u32(retry_after_ms)
        .bytes16(detail.as_bytes());
}

pub(super) fn decode_error(r: &mut Reader<'_>) -> Result<Message> {
    Ok(Message::Error {
        code: ErrorCode::from_code(r.u16("error code")?)?,
        retry_after_ms: r.u32("retry after")?,
        detail: r.text16("detail")?,
    })
}
