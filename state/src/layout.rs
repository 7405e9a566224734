//! `StorageLayout`: one instance's registered geometry — its cache groups and every rank's format.
//! GPU addresses and pool capacity are deliberately absent: they do not change stored bytes.

use crate::codec::{Reader, Writer, len_u32};
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

    /// Group `group`'s format for rank `rank` (its one replicated format, whatever the rank).
    pub fn format_of(&self, group: CacheGroupId, rank: u32) -> Option<&StateFormat> {
        let g = self.groups.iter().find(|g| g.id == group)?;
        match g.formats.as_slice() {
            [f] if f.rank == RankSpec::Replicated => Some(f),
            formats => formats.get(rank as usize),
        }
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

    /// Decodes a canonical encoding: every field is read and the layout rebuilt through
    /// [`StorageLayout::new`] (so it is validated), and the input must be exactly its canonical
    /// encoding (groups in id order, formats canonical) — there is one encoding per layout.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut r = Reader::new(bytes, "storage layout");
        let version = r.u16()?;
        if version != LAYOUT_VERSION {
            return Err(Error::UnsupportedVersion {
                what: "storage layout",
                version: u32::from(version),
            });
        }
        let parallel = ParallelShape {
            tensor: r.u32()?,
            pipeline: r.u32()?,
            context: r.u32()?,
        };
        let n = r.u32()? as usize;
        if n == 0 || n > MAX_GROUPS {
            return Err(Error::InvalidLayout {
                reason: format!("{n} cache groups; an instance registers 1..={MAX_GROUPS}"),
            });
        }
        let mut groups = Vec::with_capacity(n);
        for _ in 0..n {
            let id = CacheGroupId(r.u32()?);
            let component = Component::from_code(r.u8()?)?;
            let block_tokens = r.u32()?;
            let page_bytes = r.u64()?;
            let k = r.u32()? as usize;
            // Each format takes at least its length prefix: refuse counts the bytes cannot hold.
            if k > bytes.len() / 4 {
                return Err(Error::InvalidLayout {
                    reason: format!("group {}: {k} formats in {} bytes", id.0, bytes.len()),
                });
            }
            let mut formats = Vec::with_capacity(k);
            for _ in 0..k {
                let len = r.u32()? as usize;
                formats.push(StateFormat::decode(r.take(len)?)?);
            }
            groups.push(CacheGroupSpec {
                id,
                component,
                block_tokens,
                page_bytes,
                formats,
            });
        }
        r.finish()?;
        let layout = Self::new(parallel, groups)?;
        if layout.encoding != bytes {
            return Err(Error::InvalidLayout {
                reason: "not the canonical encoding (groups out of order or formats not canonical)"
                    .to_owned(),
            });
        }
        Ok(layout)
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

    #[test]
    fn decodes_its_own_encoding_and_nothing_else() {
        let l = two_rank_layout();
        let back = StorageLayout::decode(l.encode()).unwrap();
        assert_eq!(back, l);
        assert_eq!(back.digest(), l.digest());
        let bytes = l.encode();
        // Every prefix, a trailing byte, another version: refused, no panic.
        for cut in 0..bytes.len() {
            assert!(
                StorageLayout::decode(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert!(StorageLayout::decode(&longer).is_err());
        let mut v = bytes.to_vec();
        v[0] = 9;
        assert!(matches!(
            StorageLayout::decode(&v),
            Err(Error::UnsupportedVersion { .. })
        ));
        // A valid layout that is not canonical (groups out of id order) is refused.
        let g = |id: u32| CacheGroupSpec {
            id: CacheGroupId(id),
            ..l.groups()[0].clone()
        };
        let two = StorageLayout::new(l.parallel(), vec![g(0), g(1)]).unwrap();
        let enc = two.encode().to_vec();
        let half = (enc.len() - 18) / 2;
        let mut swapped = enc[..18].to_vec();
        swapped.extend_from_slice(&enc[18 + half..]);
        swapped.extend_from_slice(&enc[18..18 + half]);
        assert!(StorageLayout::decode(&swapped).is_err());
        assert_eq!(StorageLayout::decode(&enc).unwrap(), two);
    }
}
