//! Half-open token ranges in absolute prompt positions.

use std::fmt;

use crate::error::{Error, Result};

/// Tokens `[start, end)` of a prompt, in absolute positions (never renumbered from a partial
/// transfer's start). `start < end` always holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenRange {
    start: u64,
    end: u64,
}

impl TokenRange {
    /// `[start, end)`; refused unless `start < end`.
    pub fn new(start: u64, end: u64) -> Result<Self> {
        if start < end {
            Ok(Self { start, end })
        } else {
            Err(Error::InvalidTokenRange { start, end })
        }
    }
    /// First token.
    pub const fn start(self) -> u64 {
        self.start
    }
    /// One past the last token.
    pub const fn end(self) -> u64 {
        self.end
    }
    /// Number of tokens (at least one).
    pub const fn len(self) -> u64 {
        self.end - self.start
    }
    /// Never true: a range holds at least one token. Present for API symmetry.
    pub const fn is_empty(self) -> bool {
        false
    }
    /// True when `token` lies in the range.
    pub const fn contains(self, token: u64) -> bool {
        self.start <= token && token < self.end
    }
    /// True when the two ranges share at least one token.
    pub const fn overlaps(self, other: TokenRange) -> bool {
        self.start < other.end && other.start < self.end
    }
}

impl fmt::Display for TokenRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, {})", self.start, self.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enforces_start_below_end() {
        assert!(TokenRange::new(0, 1).is_ok());
        assert_eq!(
            TokenRange::new(5, 5),
            Err(Error::InvalidTokenRange { start: 5, end: 5 })
        );
        assert!(TokenRange::new(6, 5).is_err());
    }

    #[test]
    fn overlap_is_symmetric_and_half_open() {
        let a = TokenRange::new(0, 16).unwrap();
        let b = TokenRange::new(16, 32).unwrap();
        let c = TokenRange::new(8, 20).unwrap();
        assert!(!a.overlaps(b) && !b.overlaps(a));
        assert!(a.overlaps(c) && c.overlaps(a) && b.overlaps(c));
        assert!(a.contains(15) && !a.contains(16));
    }
}
