//! What a record holds (`Component`) and which of an engine's cache groups it belongs to.

use std::fmt;

use crate::error::{Error, Result};

/// The kind of model state a record holds. Each kind has its own recovery rule; two components of
/// one cache group (a Mamba layer's SSM and conv state) are separate records with separate keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    /// Dense (full) attention key/value pages.
    DenseKv,
    /// Multi-head latent attention (MLA) compressed KV pages.
    Mla,
    /// Sliding-window attention KV pages.
    SlidingWindowKv,
    /// Recurrent state of a state-space layer (Mamba SSM) at a boundary.
    SsmState,
    /// Convolution state of a state-space layer at a boundary.
    ConvState,
    /// DeepSeek sparse-attention indexer keys.
    DsaIndexer,
    /// KV of a speculative-decoding draft model.
    DraftKv,
    /// Any other engine state.
    Auxiliary,
}

impl Component {
    /// Every component, in code order.
    pub const ALL: [Component; 8] = [
        Component::DenseKv,
        Component::Mla,
        Component::SlidingWindowKv,
        Component::SsmState,
        Component::ConvState,
        Component::DsaIndexer,
        Component::DraftKv,
        Component::Auxiliary,
    ];

    /// The one-byte code used in every encoding (docs/format.md).
    pub const fn code(self) -> u8 {
        match self {
            Component::DenseKv => 1,
            Component::Mla => 2,
            Component::SlidingWindowKv => 3,
            Component::SsmState => 4,
            Component::ConvState => 5,
            Component::DsaIndexer => 6,
            Component::DraftKv => 7,
            Component::Auxiliary => 8,
        }
    }

    /// Decodes a component code; unknown codes are refused.
    pub fn from_code(code: u8) -> Result<Self> {
        Component::ALL
            .into_iter()
            .find(|c| c.code() == code)
            .ok_or(Error::UnknownCode {
                what: "component",
                code: u32::from(code),
            })
    }

    /// Stable lowercase name (`dense_kv`, `mla`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Component::DenseKv => "dense_kv",
            Component::Mla => "mla",
            Component::SlidingWindowKv => "sliding_window_kv",
            Component::SsmState => "ssm_state",
            Component::ConvState => "conv_state",
            Component::DsaIndexer => "dsa_indexer",
            Component::DraftKv => "draft_kv",
            Component::Auxiliary => "auxiliary",
        }
    }

    /// The component of a [`Component::name`]; unknown names are refused.
    pub fn from_name(name: &str) -> Result<Self> {
        Component::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| Error::InvalidField {
                field: "component",
                reason: format!("unknown component {name:?}"),
            })
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An engine cache group (vLLM's KV cache group index; SGLang's pool). Group zero is a group like any
/// other and is always written into keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheGroupId(pub u32);

impl fmt::Display for CacheGroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_refused() {
        for c in Component::ALL {
            assert_eq!(Component::from_code(c.code()).unwrap(), c);
        }
        assert!(Component::from_code(0).is_err());
        assert!(Component::from_code(9).is_err());
    }

    #[test]
    fn names_round_trip_and_unknown_refused() {
        for c in Component::ALL {
            assert_eq!(Component::from_name(c.name()).unwrap(), c);
        }
        assert!(Component::from_name("kv").is_err());
    }
}
