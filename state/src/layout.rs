//! `StorageLayout`: one instance's registered geometry — its cache groups and every rank's format.
//! GPU addresses and pool capacity are deliberately absent: they do not change stored bytes.

use crate::codec::{Writer, len_u32};
use crate::component::{CacheGroupId, Component};
use crate::error::{Error, Result};
use crate::format::{FormatDigest, ParallelShape, RankSpec, StateFormat, domain_digest};

/// Current StorageLayout encoding version.
pub const LAYOUT_VERSION: u16 = 1;
/// Domain tag of the layout digest.
pub const LAYOUT_DOMAIN: &str = "orbitkv.storage-layout";
/// Most cache groups one instance may register.
pub const MAX_GROUPS: usize = 256;

/// One cache group of an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheGroupSpec {
    /// The group's id (group zero included).
    pub id: CacheGroupId,
    /// What the group's records hold.
    pub component: Component,
    /// Tokens per page (block) of this group.
    pub block_tokens: u32,
    /// Bytes per page per rank.
    pub page_bytes: u64,
    /// Either one `Replicated` format, or one format per rank in rank order.
    pub formats: Vec<StateFormat>,
}

/// The registered geometry of an instance; built only through [`StorageLayout::new`], which
/// validates it, puts groups in canonical (id) order and computes its encoding and digests once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageLayout {
    parallel: ParallelShape,
    groups: Vec<CacheGroupSpec>,
    /// Per group (same order), the digest of each format.
    format_digests: Vec<Vec<FormatDigest>>,
    encoding: Vec<u8>,
    digest: [u8; 32],
}

impl StorageLayout {
    /// Validates and canonicalizes a layout.
    pub fn new(parallel: ParallelShape, mut groups: Vec<CacheGroupSpec>) -> Result<Self> {
        let bad = |reason: String| Error::InvalidLayout { reason };
        let world = parallel.world()?;
        if groups.is_empty() || groups.len() > MAX_GROUPS {
            return Err(bad(format!(
                "an instance registers 1..={MAX_GROUPS} cache groups"
            )));
        }
        groups.sort_by_key(|g| g.id);
        if groups.windows(2).any(|w| w[0].id == w[1].id) {
            return Err(bad("cache group ids must be unique".to_owned()));
        }
        let mut compat = None;
        for g in &groups {
            if g.block_tokens == 0 || g.page_bytes == 0 {
                return Err(bad(format!(
                    "group {}: block size and page bytes must be positive",
                    g.id
                )));
            }
            let replicated = g.formats.len() == 1 && g.formats[0].rank == RankSpec::Replicated;
            if !replicated {
                if g.formats.len() != world as usize {
                    return Err(bad(format!(
                        "group {}: {} formats for a world of {world} ranks (or one replicated format)",
                        g.id,
                        g.formats.len()
                    )));
                }
                for (i, f) in g.formats.iter().enumerate() {
                    if f.rank != RankSpec::Rank(len_u32(i)) {
                        return Err(bad(format!(
                            "group {}: format {i} is for {}, expected rank {i}",
                            g.id, f.rank
                        )));
                    }
                }
            }
            for f in &g.formats {
                f.validate()?;
                if f.parallel != parallel {
                    return Err(bad(format!(
                        "group {}: a format's parallel shape differs from the instance's",
                        g.id
                    )));
                }
                if f.block_tokens != g.block_tokens {
                    return Err(bad(format!(
                        "group {}: format block size {} differs from the group's {}",
                        g.id, f.block_tokens, g.block_tokens
                    )));
                }
                match &compat {
                    None => compat = Some(f.compat.clone()),
                    Some(c) if *c != f.compat => {
                        return Err(bad(
                            "all formats of one instance must carry the same implementation tag"
                                .to_owned(),
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        let mut w = Writer::with_capacity(256);
        w.u16(LAYOUT_VERSION)
            .u32(parallel.tensor)
            .u32(parallel.pipeline)
            .u32(parallel.context)
            .u32(len_u32(groups.len()));
        let mut format_digests = Vec::with_capacity(groups.len());
        for g in &groups {
            w.u32(g.id.0)
                .u8(g.component.code())
                .u32(g.block_tokens)
                .u64(g.page_bytes)
                .u32(len_u32(g.formats.len()));
            let mut digests = Vec::with_capacity(g.formats.len());
            for f in &g.formats {
                let (enc, digest) = f.encode_and_digest()?;
                digests.push(digest);
                w.u32(len_u32(enc.len())).raw(&enc);
            }
            format_digests.push(digests);
        }
        let encoding = w.into_bytes();
        let digest = domain_digest(LAYOUT_DOMAIN, &encoding);
        Ok(Self {
            parallel,
            groups,
            format_digests,
            encoding,
            digest,
        })
    }

    /// The instance's parallel shape.
    pub fn parallel(&self) -> ParallelShape {
        self.parallel
    }
    /// Groups in id order.
    pub fn groups(&self) -> &[CacheGroupSpec] {
        &self.groups
    }
    /// The group with `id`.
    pub fn group(&self, id: CacheGroupId) -> Option<&CacheGroupSpec> {
        self.groups
            .binary_search_by_key(&id, |g| g.id)
            .ok()
            .map(|i| &self.groups[i])
    }

    /// The format digests of group `id`, in rank order (one when replicated).
    pub fn format_digests(&self, id: CacheGroupId) -> Option<&[FormatDigest]> {
        self.groups
            .binary_search_by_key(&id, |g| g.id)
            .ok()
            .map(|i| self.format_digests[i].as_slice())
    }

    /// Canonical encoding (docs/format.md, "StorageLayout").
    pub fn encode(&self) -> &[u8] {
        &self.encoding
    }

    /// SHA-256(domain ‖ encoding).
    pub fn digest(&self) -> [u8; 32] {
        self.digest
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::format::tests::sample;

    pub(crate) fn two_rank_layout() -> StorageLayout {
        StorageLayout::new(
            sample(RankSpec::Rank(0)).parallel,
            vec![CacheGroupSpec {
                id: CacheGroupId(0),
                component: Component::DenseKv,
                block_tokens: 16,
                page_bytes: 65536,
                formats: vec![sample(RankSpec::Rank(0)), sample(RankSpec::Rank(1))],
            }],
        )
        .unwrap()
    }

    #[test]
    fn validates_ranks_and_groups() {
        let l = two_rank_layout();
        assert!(l.group(CacheGroupId(0)).is_some());
        let mut g = l.groups()[0].clone();
        g.formats.swap(0, 1);
        assert!(StorageLayout::new(l.parallel(), vec![g.clone()]).is_err());
        g.formats = vec![sample(RankSpec::Replicated)];
        assert!(StorageLayout::new(l.parallel(), vec![g.clone()]).is_ok());
        assert!(StorageLayout::new(l.parallel(), vec![g.clone(), g]).is_err());
        assert!(StorageLayout::new(l.parallel(), vec![]).is_err());
    }
}
