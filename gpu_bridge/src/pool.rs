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

/// Where one cache group's bytes lie in a pool: for page `i`, layer `l` and part `p`, a run of
/// `layer_bytes / parts` bytes at `offset + i·page_stride + l·layer_stride + p·part_stride` from
/// the start of the pool's page memory. A record of the group holds its runs packed in one
/// canonical order, whatever the placement: layer 0 first, and in each layer part 0 first.
/// So a page placed layer-outermost (vLLM `LBNHC`: `page_stride` one run, `layer_stride` every
/// page's layer) and one placed page-outermost (`BLNHC`: `page_stride` the whole page) hold the
/// same record. The parts are an outer split of each layer (K and V: 2), placed apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupGeometry {
    /// The cache group's number in the engine's layout.
    pub group: u32,
    /// Layers of the group in a page.
    pub layers: u32,
    /// Offset of page 0's layer 0 (part 0) from the start of the pool's page memory.
    pub offset: u64,
    /// Distance from one page's bytes of the group to the next page's.
    pub page_stride: u64,
    /// Distance from one layer's start to the next's.
    pub layer_stride: u64,
    /// Bytes of one layer in a record (all its parts).
    pub layer_bytes: u64,
    /// Parts each layer is split into in the pool (at least 1), each `layer_bytes / parts` long.
    pub parts: u32,
    /// Distance from one part's start to the next's (unused with one part).
    pub part_stride: u64,
    /// The layers lie inside each run rather than one run each (SGLang's `page_first`: a
    /// page's K is one run, token-major with every layer inside each token): a run per page
    /// and part, `layers × layer_bytes / parts` long, and no layer sub-range is addressable.
    pub layers_inside: bool,
}

impl GroupGeometry {
    /// A group whose pages lie one after another, `page_bytes` apart, each layer one run.
    pub fn packed(
        group: u32,
        layers: u32,
        offset: u64,
        layer_stride: u64,
        layer_bytes: u64,
        page_bytes: u64,
    ) -> Self {
        Self {
            group,
            layers,
            offset,
            page_stride: page_bytes,
            layer_stride,
            layer_bytes,
            parts: 1,
            part_stride: 0,
            layers_inside: false,
        }
    }

    /// Bytes a record of the group holds for the layers `layers`.
    pub fn bytes_for(&self, layers: &Range<u32>) -> u64 {
        u64::from(layers.end.saturating_sub(layers.start)).saturating_mul(self.layer_bytes)
    }

    /// All layers.
    pub fn all_layers(&self) -> Range<u32> {
        0..self.layers
    }

    /// Bytes of one run (a part of a layer; with the layers inside, a part of the page).
    pub fn run_bytes(&self) -> u64 {
        let run = self.layer_bytes / u64::from(self.parts.max(1));
        if self.layers_inside {
            run.saturating_mul(u64::from(self.layers))
        } else {
            run
        }
    }

    /// Whether a copy of the layers `layers` can be placed: any range, unless the layers lie
    /// inside the runs (then all of them only).
    pub fn addresses(&self, layers: &Range<u32>) -> bool {
        !self.layers_inside || *layers == self.all_layers()
    }

    /// The runs of page `index`'s layers `layers`, in record order: each one's offset in the
    /// pool's page memory. Each is [`GroupGeometry::run_bytes`] long. With the layers inside
    /// the runs, the page's runs whatever `layers` says (check [`GroupGeometry::addresses`]
    /// first). Meaningful once the pool's spec is validated (no overflow then).
    pub fn runs(&self, index: u32, layers: Range<u32>) -> impl Iterator<Item = u64> + '_ {
        let page = self.offset + u64::from(index) * self.page_stride;
        let layers = if self.layers_inside { 0..1 } else { layers };
        layers.flat_map(move |l| {
            let layer = page + u64::from(l) * self.layer_stride;
            (0..self.parts.max(1)).map(move |p| layer + u64::from(p) * self.part_stride)
        })
    }

    /// The axes the runs lie along, as (count, stride), those of more than one.
    fn axes(&self, pages: u32) -> Vec<(u64, u64)> {
        let layers = if self.layers_inside { 1 } else { self.layers };
        [
            (pages, self.page_stride),
            (layers, self.layer_stride),
            (self.parts, self.part_stride),
        ]
        .into_iter()
        .filter(|(c, _)| *c > 1)
        .map(|(c, s)| (u64::from(c), s))
        .collect()
    }

    /// One past the last byte of the group's runs over `pages` pages; `None` on overflow.
    fn end(&self, pages: u32) -> Option<u64> {
        self.axes(pages)
            .iter()
            .try_fold(self.offset.checked_add(self.run_bytes())?, |e, (c, s)| {
                (c - 1).checked_mul(*s).and_then(|x| x.checked_add(e))
            })
    }

    /// Whether the group's runs are pairwise disjoint, shown by nesting: taken from the
    /// smallest stride up, each axis's stride is at least the extent of the axes inside it.
    /// `extra` adds an axis (another group of the same shape, that far apart).
    fn nests(&self, pages: u32, extra: Option<(u64, u64)>) -> bool {
        let mut axes = self.axes(pages);
        axes.extend(extra);
        axes.sort_unstable_by_key(|(_, s)| *s);
        let mut extent = self.run_bytes();
        for (c, s) in axes {
            if s < extent {
                return false;
            }
            extent = match (c - 1).checked_mul(s).and_then(|x| x.checked_add(extent)) {
                Some(e) => e,
                None => return false,
            };
        }
        true
    }

    /// Whether `other` has this group's placement but for its offset and layer count.
    fn same_lattice(&self, other: &Self) -> bool {
        (
            self.page_stride,
            self.layer_stride,
            self.layer_bytes,
            self.parts,
            self.part_stride,
        ) == (
            other.page_stride,
            other.layer_stride,
            other.layer_bytes,
            other.parts,
            other.part_stride,
        ) && self.layers_inside == other.layers_inside
            && (!self.layers_inside || self.layers == other.layers)
    }
}

/// Where a pool's pages are, as its registration says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageMemory {
    /// In the shared-memory region the engine passes (the host backend).
    Host,
    /// In memory the engine allocated itself (SGLang's `allocator: shm`): a second descriptor
    /// beside the frame, after the states-only region, holding the pages from `offset`
    /// (`pages × page_bytes` bytes; no header). Copied with `pread`/`pwrite` unless the
    /// descriptor is sealed against shrinking.
    Engine {
        /// Byte offset of the page memory in the descriptor.
        offset: u64,
    },
    /// In device memory the engine exported: the CUDA IPC handle of the allocation
    /// (`cuIpcGetMemHandle`), the device it is on, and the byte offset of page 0 in it (a KV
    /// tensor may be a view into a larger allocation). The region the engine passes beside it
    /// holds the pages' state words only ([`crate::HostPool::create_states`]).
    Device {
        /// The CUDA device ordinal, as the daemon numbers devices (used when `uuid` is zero).
        device: i32,
        /// The device's UUID (`cuDeviceGetUuid`), the same in every process whatever its
        /// ordinal there; all zero when the engine does not know it.
        uuid: [u8; 16],
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
    /// Bytes per page: the pool's page memory is `pages × page_bytes` long.
    pub page_bytes: u64,
    /// Pages in the pool.
    pub pages: u32,
    /// Whether the groups share the same bytes (vLLM's hybrid allocator): page `i` of every
    /// group is one set of bytes, holding one group's state at a time, fenced by page `i`'s
    /// state word. Otherwise no two groups' bytes may overlap.
    pub aliased: bool,
    /// The cache groups a page holds.
    pub groups: Vec<GroupGeometry>,
}

/// Largest page accepted (a page of one block of every layer of a large model is a few MiB).
pub const MAX_PAGE_BYTES: u64 = 1 << 30;
/// Parts a layer may be split into at most.
pub const MAX_PARTS: u32 = 16;

impl PoolSpec {
    /// Checks the geometry, arithmetically: sizes non-zero, each layer splitting into equal
    /// parts, every run of every group inside the pool's page memory, the runs of one group
    /// disjoint, and the groups disjoint from each other — or, for an aliased pool, each group
    /// placed exactly as the others but for its layer count, so that page `i` of one group
    /// overlaps only page `i` of another.
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
        let memory = u64::from(self.pages).checked_mul(self.page_bytes);
        for g in &self.groups {
            if g.layers == 0 || g.layer_bytes == 0 {
                return bad(format!("group {}: no layers or empty layers", g.group));
            }
            if g.parts == 0 || g.parts > MAX_PARTS || g.layer_bytes % u64::from(g.parts) != 0 {
                return bad(format!(
                    "group {}: {} parts (1..={MAX_PARTS}) do not split a {}-byte layer evenly",
                    g.group, g.parts, g.layer_bytes
                ));
            }
            match (g.end(self.pages), memory) {
                (Some(end), Some(memory)) if end <= memory => {}
                _ => {
                    return bad(format!(
                        "group {}: its last run ends past the pool's {} pages of {} bytes",
                        g.group, self.pages, self.page_bytes
                    ));
                }
            }
            if !g.nests(self.pages, None) {
                return bad(format!(
                    "group {}: its runs overlap (each stride, from the smallest, must be at least the extent of the runs inside it)",
                    g.group
                ));
            }
        }
        for (i, g) in self.groups.iter().enumerate() {
            for h in &self.groups[..i] {
                if h.group == g.group {
                    return bad("a cache group listed twice".to_owned());
                }
                let apart = if self.aliased {
                    g.same_lattice(h) && g.offset == h.offset
                } else {
                    disjoint(g, h, self.pages)
                };
                if !apart {
                    return bad(if self.aliased {
                        format!(
                            "groups {} and {} of an aliased pool are placed differently (aliased groups share offset and strides; only their layer counts may differ)",
                            h.group, g.group
                        )
                    } else {
                        format!("layers of groups {} and {} overlap", h.group, g.group)
                    });
                }
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

/// Whether two groups' runs are disjoint, shown arithmetically: their spans do not meet; or they
/// share a page stride and no page's span of the one meets any page's span of the other; or
/// they are placed alike and the one, shifted onto the other, nests as one more axis.
fn disjoint(a: &GroupGeometry, b: &GroupGeometry, pages: u32) -> bool {
    let (Some(ae), Some(be)) = (a.end(pages), b.end(pages)) else {
        return false;
    };
    if ae <= b.offset || be <= a.offset {
        return true;
    }
    if a.page_stride == b.page_stride
        && a.page_stride > 0
        && let (Some(ap), Some(bp)) = (a.end(1), b.end(1))
        && !page_spans_meet((a.offset, ap), (b.offset, bp), a.page_stride, pages)
    {
        return true;
    }
    let layers = a.layers.max(b.layers);
    let (a, b) = (
        GroupGeometry { layers, ..*a },
        GroupGeometry { layers, ..*b },
    );
    a.same_lattice(&b) && a.nests(pages, Some((2, a.offset.abs_diff(b.offset))))
}

/// Whether `[a0, a1) + i·stride` meets `[b0, b1) + j·stride` for some pages `i`, `j` below
/// `pages`: whether some `d = j − i`, `|d| < pages`, has `b0 + d·stride < a1` and
/// `a0 < b1 + d·stride`.
fn page_spans_meet((a0, a1): (u64, u64), (b0, b1): (u64, u64), stride: u64, pages: u32) -> bool {
    let (a0, a1, b0, b1) = (
        i128::from(a0),
        i128::from(a1),
        i128::from(b0),
        i128::from(b1),
    );
    let (stride, far) = (i128::from(stride), i128::from(pages) - 1);
    // The least d with a0 < b1 + d·stride.
    let least = (a0 - b1).div_euclid(stride) + 1;
    let d = least.max(-far);
    d <= far && b0 + d * stride < a1
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

    /// The generation goes up even while leased: what an engine does after waiting past its
    /// timeout for a lease to end, or one that reallocates without asking. The manager's
    /// re-check after a copy out catches it.
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
            aliased: false,
            groups: vec![
                GroupGeometry {
                    group: 0,
                    layers: 4,
                    offset: 0,
                    layer_stride: 512,
                    layer_bytes: 256,
                    page_stride: 4096,
                    parts: 1,
                    part_stride: 0,
                    layers_inside: false,
                },
                GroupGeometry {
                    group: 1,
                    layers: 4,
                    offset: 256,
                    layer_stride: 512,
                    layer_bytes: 256,
                    page_stride: 4096,
                    parts: 1,
                    part_stride: 0,
                    layers_inside: false,
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

    /// A pool of `n` pages of one group of `layers` layers, each K and V runs of `r` bytes.
    fn placed(n: u32, layers: u32, r: u64, page: u64, layer: u64, part: u64) -> PoolSpec {
        PoolSpec {
            pool: PoolId(2),
            page_bytes: 2 * u64::from(layers) * r,
            pages: n,
            aliased: false,
            groups: vec![GroupGeometry {
                group: 0,
                layers,
                offset: 0,
                page_stride: page,
                layer_stride: layer,
                layer_bytes: 2 * r,
                parts: 2,
                part_stride: part,
                layers_inside: false,
            }],
        }
    }

    #[test]
    fn every_placement_of_the_same_bytes_is_accepted_and_runs_cover_the_memory_once() {
        let (n, l, r) = (5u32, 3u32, 64u64);
        let (nn, ll) = (u64::from(n), u64::from(l));
        for spec in [
            placed(n, l, r, 2 * ll * r, 2 * r, r),   // page-outermost
            placed(n, l, r, r, 2 * nn * r, nn * r),  // layer-outermost (LBNHC)
            placed(n, l, r, r, nn * r, ll * nn * r), // K and V buffers (layer_first)
        ] {
            spec.validate().unwrap_or_else(|e| panic!("{spec:?}: {e}"));
            let g = spec.groups[0];
            let mut seen = vec![0u8; (spec.page_bytes * nn) as usize];
            for i in 0..n {
                for at in g.runs(i, g.all_layers()) {
                    for b in &mut seen[at as usize..(at + g.run_bytes()) as usize] {
                        *b += 1;
                    }
                }
            }
            assert!(seen.iter().all(|c| *c == 1), "{spec:?}");
        }
        // Layers inside each run (page_first): one K and one V run a page.
        let mut inside = placed(n, l, r, ll * r, 0, nn * ll * r);
        inside.groups[0].layers_inside = true;
        inside.validate().unwrap_or_else(|e| panic!("{e}"));
        let g = inside.groups[0];
        assert_eq!(g.run_bytes(), ll * r);
        assert_eq!(
            g.runs(1, g.all_layers()).collect::<Vec<_>>(),
            vec![ll * r, nn * ll * r + ll * r]
        );
        assert!(g.addresses(&g.all_layers()) && !g.addresses(&(1..2)));
        inside.groups[0].page_stride = ll * r - 1;
        assert!(inside.validate().is_err());
        // Strides that make runs collide, or leave the memory, are refused.
        assert!(placed(n, l, r, r, nn * r, nn * r).validate().is_err());
        assert!(
            placed(n, l, r, r, 2 * nn * r, nn * r + 1)
                .validate()
                .is_err()
        );
        assert!(
            placed(n, l, r, r / 2, 2 * nn * r, nn * r)
                .validate()
                .is_err()
        );
        let mut uneven = placed(n, l, r, 2 * ll * r, 2 * r, r);
        uneven.groups[0].layer_bytes += 1;
        assert!(uneven.validate().is_err());
    }

    #[test]
    fn groups_side_by_side_in_a_page_or_aliased_alike_are_accepted() {
        // Two groups one after another in each page (not the same shape).
        let mut s = spec();
        s.groups[0] = GroupGeometry::packed(0, 2, 0, 1024, 1024, 4096);
        s.groups[1] = GroupGeometry::packed(1, 4, 2048, 512, 512, 4096);
        s.validate().unwrap_or_else(|e| panic!("{e}"));
        // Shifted by one page's worth less a byte: group 1 of page i meets group 0 of page i+1.
        s.groups[1].offset = 2049;
        assert!(s.validate().is_err());
        // Aliased: the same placement but for the layer count.
        let mut a = spec();
        a.aliased = true;
        a.groups[1].offset = 0;
        a.groups[1].layers = 2;
        a.validate().unwrap_or_else(|e| panic!("{e}"));
        a.groups[1].layer_stride = 1024;
        assert!(a.validate().is_err());
        assert!(page_spans_meet((0, 10), (5, 8), 100, 1));
        assert!(!page_spans_meet((0, 10), (10, 20), 100, 4));
        assert!(page_spans_meet((0, 10), (95, 105), 100, 2));
        assert!(!page_spans_meet((0, 10), (95, 100), 100, 2));
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
