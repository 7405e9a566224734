//! Page pools as an engine registers them: the pool id, page size and count, and the geometry of
//! the cache groups a page holds (per-layer offsets and strides, so a copy can target one layer);
//! pages named by generation-qualified references; and the page state word that fences them.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// A pool, as numbered by the engine rank that registers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(pub u32);

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A generation-qualified page reference: page `index` of `pool` as it was at `generation`.
/// The engine bumps a page's generation each time it reallocates the page, so a reference taken
/// before can never address the reused slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageRef {
    /// The pool.
    pub pool: PoolId,
    /// The page in it.
    pub index: u32,
    /// The page's generation the reference was taken at.
    pub generation: u64,
}

/// Where one cache group's bytes lie in a page: `layers` runs of `layer_bytes`, the first at
/// `offset`, each `layer_stride` after the previous. A record of the group holds the layers
/// packed, layer 0 first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupGeometry {
    /// The cache group's number in the engine's layout.
    pub group: u32,
    /// Layers of the group in a page.
    pub layers: u32,
    /// Offset of layer 0 in the page.
    pub offset: u64,
    /// Distance from one layer's start to the next's.
    pub layer_stride: u64,
    /// Bytes of one layer.
    pub layer_bytes: u64,
}

impl GroupGeometry {
    /// Bytes a record of the group holds for the layers `layers`.
    pub fn bytes_for(&self, layers: &Range<u32>) -> u64 {
        u64::from(layers.end.saturating_sub(layers.start)) * self.layer_bytes
    }

    /// All layers.
    pub fn all_layers(&self) -> Range<u32> {
        0..self.layers
    }

    /// The page-relative byte range of layer `l`.
    pub(crate) fn layer_range(&self, l: u32) -> Range<u64> {
        let start = self.offset + u64::from(l) * self.layer_stride;
        start..start + self.layer_bytes
    }
}

/// Where a pool's pages are, as its registration says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageMemory {
    /// In the shared-memory region the engine passes (the host backend).
    Host,
    /// In device memory the engine exported: the CUDA IPC handle of the allocation
    /// (`cuIpcGetMemHandle`), the device it is on, and the byte offset of page 0 in it (a KV
    /// tensor may be a view into a larger allocation). The region the engine passes beside it
    /// holds the pages' state words only ([`crate::HostPool::create_states`]).
    Device {
        /// The CUDA device ordinal.
        device: i32,
        /// The allocation's IPC handle.
        ipc_handle: [u8; 64],
        /// Byte offset of page 0 in the allocation.
        offset: u64,
    },
}

/// A pool's registration: what the engine says its pool is. Checked before use
/// ([`PoolSpec::validate`]); every copy is bounded by it, never by bytes in shared memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    /// The pool's id.
    pub pool: PoolId,
    /// Bytes per page.
    pub page_bytes: u64,
    /// Pages in the pool.
    pub pages: u32,
    /// The cache groups a page holds.
    pub groups: Vec<GroupGeometry>,
}

/// Largest page accepted (a page of one block of every layer of a large model is a few MiB).
pub const MAX_PAGE_BYTES: u64 = 1 << 30;

impl PoolSpec {
    /// Checks the geometry: sizes non-zero, every layer of every group inside the page, layers of
    /// one group not overlapping, groups not overlapping each other.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Geometry(m));
        if self.page_bytes == 0 || self.page_bytes > MAX_PAGE_BYTES {
            return bad(format!(
                "page size {} is not in 1..={MAX_PAGE_BYTES}",
                self.page_bytes
            ));
        }
        if self.pages == 0 {
            return bad("a pool of no pages".to_owned());
        }
        if self.groups.is_empty() {
            return bad("a page of no cache groups".to_owned());
        }
        let mut spans: Vec<(u64, u64, u32)> = Vec::new();
        for g in &self.groups {
            if g.layers == 0 || g.layer_bytes == 0 {
                return bad(format!("group {}: no layers or empty layers", g.group));
            }
            if g.layers > 1 && g.layer_stride < g.layer_bytes {
                return bad(format!(
                    "group {}: layer stride {} is below the layer size {}",
                    g.group, g.layer_stride, g.layer_bytes
                ));
            }
            let end = u64::from(g.layers - 1)
                .checked_mul(g.layer_stride)
                .and_then(|x| x.checked_add(g.offset))
                .and_then(|x| x.checked_add(g.layer_bytes));
            match end {
                Some(end) if end <= self.page_bytes => {}
                _ => {
                    return bad(format!(
                        "group {}: its last layer ends past the {}-byte page",
                        g.group, self.page_bytes
                    ));
                }
            }
            for l in 0..g.layers {
                let r = g.layer_range(l);
                spans.push((r.start, r.end, g.group));
            }
        }
        if self
            .groups
            .iter()
            .enumerate()
            .any(|(i, g)| self.groups[..i].iter().any(|h| h.group == g.group))
        {
            return bad("a cache group listed twice".to_owned());
        }
        spans.sort_unstable();
        for w in spans.windows(2) {
            if w[1].0 < w[0].1 {
                return bad(format!(
                    "layers of groups {} and {} overlap at byte {}",
                    w[0].2, w[1].2, w[1].0
                ));
            }
        }
        Ok(())
    }

    /// The geometry of `group`.
    pub fn group(&self, group: u32) -> Result<&GroupGeometry> {
        self.groups
            .iter()
            .find(|g| g.group == group)
            .ok_or_else(|| Error::Geometry(format!("pool {} holds no group {group}", self.pool)))
    }

    /// Checks that `index` is a page of the pool.
    pub fn check_index(&self, index: u32) -> Result<()> {
        if index >= self.pages {
            return Err(Error::IndexOutOfRange {
                pool: self.pool,
                index,
                pages: self.pages,
            });
        }
        Ok(())
    }
}

/// A page's state word, shared by the engine and the manager: the page's generation in the high
/// 48 bits, the manager's outstanding leases on it in the low 16. One atomic word, so taking a
/// lease (only at the named generation) and reallocating the page (only with no lease) exclude
/// each other without a lock.
pub struct PageState<'a>(pub(crate) &'a AtomicU64);

/// Bits of the lease count.
const LEASE_BITS: u32 = 16;
const LEASE_MASK: u64 = (1 << LEASE_BITS) - 1;

/// The generation a state word holds.
pub fn generation_of(word: u64) -> u64 {
    word >> LEASE_BITS
}

/// The leases a state word counts.
pub fn leases_of(word: u64) -> u32 {
    (word & LEASE_MASK) as u32
}

/// Checks that a state word is at `page`'s generation.
pub fn check_generation(word: u64, page: PageRef) -> Result<()> {
    let current = generation_of(word);
    if current != page.generation {
        return Err(Error::StaleGeneration {
            pool: page.pool,
            index: page.index,
            current,
            got: page.generation,
        });
    }
    Ok(())
}

impl PageState<'_> {
    /// The word now.
    pub fn load(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Takes a lease on the page if it is at `page.generation`.
    pub fn lease(&self, page: PageRef) -> Result<()> {
        let mut word = self.load();
        loop {
            check_generation(word, page)?;
            if leases_of(word) == LEASE_MASK as u32 {
                return Err(Error::TooManyLeases {
                    pool: page.pool,
                    index: page.index,
                });
            }
            match self
                .0
                .compare_exchange_weak(word, word + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(w) => word = w,
            }
        }
    }

    /// Gives back one lease. A word that counts none (the other side scribbled on it) is left
    /// as it is.
    pub fn release(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (leases_of(w) > 0).then(|| w - 1)
            });
    }

    /// The engine reallocates the page: its generation goes up by one, refused while leased.
    /// Returns the new generation.
    pub fn reuse(&self, pool: PoolId, index: u32) -> Result<u64> {
        let mut word = self.load();
        loop {
            let leases = leases_of(word);
            if leases > 0 {
                return Err(Error::PageLeased {
                    pool,
                    index,
                    leases,
                });
            }
            let next = (generation_of(word) + 1) << LEASE_BITS;
            match self
                .0
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(generation_of(next)),
                Err(w) => word = w,
            }
        }
    }

    /// What an engine that reallocates a page without asking does: the generation goes up even
    /// while leased. The manager's re-check after a copy out catches it; tests use this to play
    /// such an engine.
    pub fn reuse_ignoring_leases(&self) -> u64 {
        let old = self.0.fetch_add(1 << LEASE_BITS, Ordering::AcqRel);
        generation_of(old) + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> PoolSpec {
        PoolSpec {
            pool: PoolId(1),
            page_bytes: 4096,
            pages: 8,
            groups: vec![
                GroupGeometry {
                    group: 0,
                    layers: 4,
                    offset: 0,
                    layer_stride: 512,
                    layer_bytes: 256,
                },
                GroupGeometry {
                    group: 1,
                    layers: 4,
                    offset: 256,
                    layer_stride: 512,
                    layer_bytes: 256,
                },
            ],
        }
    }

    #[test]
    fn geometry_is_checked() {
        assert!(spec().validate().is_ok());
        let mut s = spec();
        s.groups[1].offset = 2048 + 1536 + 1; // last layer ends past the page
        assert!(matches!(s.validate(), Err(Error::Geometry(_))));
        let mut s = spec();
        s.groups[1].offset = 128; // interleaves with group 0's layers
        assert!(matches!(s.validate(), Err(Error::Geometry(m)) if m.contains("overlap")));
        let mut s = spec();
        s.groups[0].layer_stride = 100; // below the layer size
        assert!(s.validate().is_err());
        let mut s = spec();
        s.groups[0].layer_stride = u64::MAX; // overflows
        assert!(s.validate().is_err());
        let mut s = spec();
        s.groups[1].group = 0;
        assert!(s.validate().is_err());
        let mut s = spec();
        s.pages = 0;
        assert!(s.validate().is_err());
        assert!(spec().check_index(7).is_ok());
        assert!(matches!(
            spec().check_index(8),
            Err(Error::IndexOutOfRange {
                index: 8,
                pages: 8,
                ..
            })
        ));
    }

    #[test]
    fn leases_and_reuse_exclude_each_other() {
        let w = AtomicU64::new(0);
        let st = PageState(&w);
        let page = |generation| PageRef {
            pool: PoolId(1),
            index: 3,
            generation,
        };
        st.lease(page(0)).unwrap_or_else(|e| panic!("{e}"));
        st.lease(page(0)).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            st.reuse(PoolId(1), 3),
            Err(Error::PageLeased { leases: 2, .. })
        ));
        st.release();
        st.release();
        assert_eq!(st.reuse(PoolId(1), 3).unwrap_or_else(|e| panic!("{e}")), 1);
        // The old reference is stale now; the new one leases.
        assert!(matches!(
            st.lease(page(0)),
            Err(Error::StaleGeneration {
                current: 1,
                got: 0,
                ..
            })
        ));
        st.lease(page(1)).unwrap_or_else(|e| panic!("{e}"));
        // A forced reuse moves the generation even under a lease.
        assert_eq!(st.reuse_ignoring_leases(), 2);
        assert_eq!(generation_of(st.load()), 2);
        // Releasing more than was taken does not wrap the word.
        st.release();
        st.release();
        assert_eq!(leases_of(st.load()), 0);
        assert_eq!(generation_of(st.load()), 2);
    }

    #[test]
    fn leases_saturate_rather_than_overflow_into_the_generation() {
        let w = AtomicU64::new(LEASE_MASK);
        let st = PageState(&w);
        let r = st.lease(PageRef {
            pool: PoolId(0),
            index: 0,
            generation: 0,
        });
        assert!(matches!(r, Err(Error::TooManyLeases { .. })));
        assert_eq!(generation_of(st.load()), 0);
    }
}
