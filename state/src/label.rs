//! Short engine-given names (dtypes, releases, backends) that enter identities and formats verbatim.

use std::fmt;

use crate::error::{Error, Result};

/// Longest label accepted, in bytes.
pub const MAX_LABEL_LEN: usize = 128;

/// A short name such as `bfloat16`, `0.33.0` or `FLASH_ATTN`: 1 to [`MAX_LABEL_LEN`] bytes of
/// printable ASCII without spaces (0x21..=0x7e). Compared exactly; never case-folded, so two
/// spellings are two labels (a miss, never a collision).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Label(String);

impl Label {
    /// Validates `value` as a label; `what` names it in the error.
    pub fn new(what: &'static str, value: impl Into<String>) -> Result<Self> {
        let value = value.into();
        let reason = if value.is_empty() {
            Some("must not be empty".to_owned())
        } else if value.len() > MAX_LABEL_LEN {
            Some(format!("longer than {MAX_LABEL_LEN} bytes"))
        } else if !value.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            Some("only printable ASCII without spaces is allowed".to_owned())
        } else {
            None
        };
        match reason {
            Some(reason) => Err(Error::InvalidField {
                field: what,
                reason: format!("{reason} (got {value:?})"),
            }),
            None => Ok(Self(value)),
        }
    }
    /// The label's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates() {
        assert!(Label::new("t", "bfloat16").is_ok());
        assert!(Label::new("t", "0.33.0+cu128").is_ok());
        assert!(Label::new("t", "").is_err());
        assert!(Label::new("t", "a b").is_err());
        assert!(Label::new("t", "é").is_err());
        assert!(Label::new("t", "x".repeat(129)).is_err());
    }
}
