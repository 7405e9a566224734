//! Batching copies through a staging buffer, for backends whose pages are not host memory (the
//! CUDA backend): a Load's or Publish's pages become host↔device copies packed into batches
//! that each fit the pinned staging buffer, adjacent runs coalesced into one copy, a page never
//! split across batches — so a page's lease can end as soon as its batch's event completes.
//! Pure arithmetic, unit-tested without a device.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::pool::{PageRef, PoolSpec};

/// One page (or some of its layers) of a group to move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The page.
    pub page: PageRef,
    /// The cache group.
    pub group: u32,
    /// The layers.
    pub layers: Range<u32>,
}

/// One contiguous copy: `len` bytes between the pool at `device_offset` and the staging buffer
/// at `staging_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy {
    /// Byte offset in the pool's page memory (where the group's placement puts the run).
    pub device_offset: u64,
    /// Byte offset in the staging buffer.
    pub staging_offset: usize,
    /// Bytes.
    pub len: usize,
}

/// Copies that share one staging fill and one completion event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The items (indices into the planned list) the batch completes.
    pub items: Range<usize>,
    /// Where each item's packed bytes start in the staging buffer (parallel to `items`).
    pub item_offsets: Vec<usize>,
    /// The copies, in staging order.
    pub copies: Vec<Copy>,
    /// Staging bytes the batch uses.
    pub staging_bytes: usize,
}

impl Batch {
    /// Where the `j`-th item of the batch lies in the staging buffer.
    pub fn staged(&self, j: usize) -> Range<usize> {
        let start = self
            .item_offsets
            .get(j)
            .copied()
            .unwrap_or(self.staging_bytes);
        let end = self
            .item_offsets
            .get(j + 1)
            .copied()
            .unwrap_or(self.staging_bytes);
        start..end
    }
}

/// Plans `items` of `spec`'s pool through a staging buffer of `staging` bytes: each item's
/// layers are packed in layer order (a record's layout), consecutive copies that are adjacent
/// in both the pool and the staging buffer merge, and a batch ends before an item that would
/// not fit. An item larger than the staging buffer, an index out of range, an unknown group or
/// layers past the group's are refused before anything is planned.
pub fn plan(spec: &PoolSpec, items: &[Item], staging: usize) -> Result<Vec<Batch>> {
    let mut batches: Vec<Batch> = Vec::new();
    let mut current = Batch {
        items: 0..0,
        item_offsets: Vec::new(),
        copies: Vec::new(),
        staging_bytes: 0,
    };
    for (i, it) in items.iter().enumerate() {
        spec.check_index(it.page.index)?;
        let g = spec.group(it.group)?;
        if it.layers.start > it.layers.end || it.layers.end > g.layers {
            return Err(Error::Geometry(format!(
                "layers {:?} of group {}, which has {}",
                it.layers, it.group, g.layers
            )));
        }
        let bytes = usize::try_from(g.bytes_for(&it.layers))
            .map_err(|_| Error::Geometry("item too large".into()))?;
        if bytes > staging {
            return Err(Error::Geometry(format!(
                "{bytes} bytes of group {} exceed the {staging}-byte staging buffer",
                it.group
            )));
        }
        if current.staging_bytes + bytes > staging {
            let next = Batch {
                items: i..i,
                item_offsets: Vec::new(),
                copies: Vec::new(),
                staging_bytes: 0,
            };
            batches.push(std::mem::replace(&mut current, next));
        }
        current.item_offsets.push(current.staging_bytes);
        current.staging_bytes += bytes;
        current.items.end = i + 1;
    }
    if !current.items.is_empty() {
        batches.push(current);
    }
    for b in &mut batches {
        b.copies = copies(
            spec,
            items[b.items.clone()]
                .iter()
                .zip(b.item_offsets.iter().copied()),
        )?;
    }
    Ok(batches)
}

/// The copies of `placed` items, each item's layers packed from its staging offset, in order;
/// consecutive copies adjacent in both the pool and the staging buffer merge into one. A batch's
/// copies are those of all its items; leaving out the items whose bytes could not be staged
/// gives copies that never touch their pages.
pub fn copies<'a>(
    spec: &PoolSpec,
    placed: impl IntoIterator<Item = (&'a Item, usize)>,
) -> Result<Vec<Copy>> {
    let mut out: Vec<Copy> = Vec::new();
    for (it, offset) in placed {
        let g = spec.group(it.group)?;
        if !g.addresses(&it.layers) {
            return Err(Error::Geometry(format!(
                "group {}: its layers lie inside each run, so layers {:?} cannot be placed alone",
                it.group, it.layers
            )));
        }
        let len = usize::try_from(g.run_bytes())
            .map_err(|_| Error::Geometry("a run larger than this machine addresses".into()))?;
        let mut staging_offset = offset;
        for device_offset in g.runs(it.page.index, it.layers.clone()) {
            let c = Copy {
                device_offset,
                staging_offset,
                len,
            };
            staging_offset += c.len;
            match out.last_mut() {
                Some(last)
                    if last.device_offset + last.len as u64 == c.device_offset
                        && last.staging_offset + last.len == c.staging_offset =>
                {
                    last.len += c.len;
                }
                _ => out.push(c),
            }
        }
    }
    Ok(out)
}

/// A 2-D copy: `rows` rows of `len` bytes, row `r` at `device_offset + r · device_pitch` in the
/// pool and at `staging_offset + r · staging_pitch` in the staging buffer. One row is a plain
/// copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strided {
    /// Byte offset of the first row in the pool's page memory.
    pub device_offset: u64,
    /// Bytes from one row's start to the next in the pool.
    pub device_pitch: u64,
    /// Byte offset of the first row in the staging buffer.
    pub staging_offset: usize,
    /// Bytes from one row's start to the next in the staging buffer.
    pub staging_pitch: usize,
    /// Bytes per row.
    pub len: usize,
    /// Rows.
    pub rows: usize,
}

impl Strided {
    /// Pool bytes from the first row's start to the last row's end.
    pub fn device_span(&self) -> u64 {
        self.device_pitch * (self.rows as u64 - 1) + self.len as u64
    }

    /// Staging bytes from the first row's start to the last row's end.
    pub fn staging_span(&self) -> usize {
        self.staging_pitch * (self.rows - 1) + self.len
    }
}

/// The largest pitch a 2-D copy takes (CUDA's maximum pitch on current devices); layers spaced
/// wider are copied a run at a time.
pub const MAX_PITCH: u64 = i32::MAX as u64;

/// The copies of `placed` items as 2-D copies: an item whose layers are runs apart in the pool
/// (a strided geometry: each layer's K and V apart, or layers apart) becomes one copy per part,
/// a row per layer, instead of one copy per run; packed items stay the plain copies of
/// [`copies`], adjacent ones merged.
pub fn strided_copies<'a>(
    spec: &PoolSpec,
    placed: impl IntoIterator<Item = (&'a Item, usize)>,
) -> Result<Vec<Strided>> {
    let mut out: Vec<Strided> = Vec::new();
    for (it, offset) in placed {
        let g = spec.group(it.group)?;
        let len = usize::try_from(g.run_bytes())
            .map_err(|_| Error::Geometry("a run larger than this machine addresses".into()))?;
        let rows = if g.layers_inside { 1 } else { it.layers.len() };
        let parts = g.parts.max(1) as usize;
        let packed = parts == 1 && g.layer_stride == len as u64;
        let regular = g.layer_stride >= len as u64 && g.layer_stride <= MAX_PITCH;
        if rows < 2 || packed || !regular || !g.addresses(&it.layers) {
            for c in copies(spec, [(it, offset)])? {
                let row = Strided {
                    device_offset: c.device_offset,
                    device_pitch: c.len as u64,
                    staging_offset: c.staging_offset,
                    staging_pitch: c.len,
                    len: c.len,
                    rows: 1,
                };
                match out.last_mut() {
                    Some(last)
                        if last.rows == 1
                            && last.device_offset + last.len as u64 == row.device_offset
                            && last.staging_offset + last.len == row.staging_offset =>
                    {
                        last.len += row.len;
                        last.device_pitch = last.len as u64;
                        last.staging_pitch = last.len;
                    }
                    _ => out.push(row),
                }
            }
            continue;
        }
        let first = g.offset
            + u64::from(it.page.index) * g.page_stride
            + u64::from(it.layers.start) * g.layer_stride;
        for p in 0..parts {
            out.push(Strided {
                device_offset: first + p as u64 * g.part_stride,
                device_pitch: g.layer_stride,
                staging_offset: offset + p * len,
                staging_pitch: parts * len,
                len,
                rows,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{GroupGeometry, PoolId};

    #[test]
    fn strided_layers_become_one_2d_copy_per_part() {
        // Group 1: 3 layers of 50 bytes every 100; page 2 then page 3.
        let placed = [
            (&item(2, 0, 0..2), 0),
            (&item(2, 1, 0..3), 200),
            (&item(3, 1, 1..3), 350),
        ];
        let s = strided_copies(&spec(), placed).unwrap_or_else(|e| panic!("{e}"));
        let row = |device_offset, device_pitch, staging_offset, staging_pitch, len, rows| Strided {
            device_offset,
            device_pitch,
            staging_offset,
            staging_pitch,
            len,
            rows,
        };
        assert_eq!(
            s,
            vec![
                row(2000, 200, 0, 200, 200, 1),
                row(2400, 100, 200, 50, 50, 3),
                row(3500, 100, 350, 50, 50, 2),
            ]
        );
        assert_eq!((s[1].device_span(), s[1].staging_span()), (250, 150));
    }

    #[test]
    fn k_and_v_apart_are_one_2d_copy_each() {
        // 2 pages of 4 layers, each layer's K (40 bytes) and V apart: K of page p layer l at
        // p·160 + l·40, V 1000 bytes later. Staging packs a layer's K then V.
        let spec = PoolSpec {
            pool: PoolId(1),
            page_bytes: 320,
            pages: 2,
            aliased: false,
            groups: vec![GroupGeometry {
                group: 0,
                layers: 4,
                offset: 0,
                layer_stride: 40,
                layer_bytes: 80,
                page_stride: 160,
                parts: 2,
                part_stride: 1000,
                layers_inside: false,
            }],
        };
        let s = strided_copies(&spec, [(&item(1, 0, 0..4), 0)]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.len(), 2);
        assert_eq!(
            (
                s[0].device_offset,
                s[0].device_pitch,
                s[0].staging_offset,
                s[0].staging_pitch
            ),
            (160, 40, 0, 80)
        );
        assert_eq!(
            (s[1].device_offset, s[1].staging_offset, s[1].rows),
            (1160, 40, 4)
        );
        // The same bytes as the plain copies, row by row.
        let plain = copies(&spec, [(&item(1, 0, 0..4), 0)]).unwrap_or_else(|e| panic!("{e}"));
        let mut rows: Vec<(u64, usize, usize)> = s
            .iter()
            .flat_map(|c| {
                (0..c.rows).map(move |r| {
                    (
                        c.device_offset + r as u64 * c.device_pitch,
                        c.staging_offset + r * c.staging_pitch,
                        c.len,
                    )
                })
            })
            .collect();
        rows.sort_unstable();
        let mut want: Vec<(u64, usize, usize)> = plain
            .iter()
            .map(|c| (c.device_offset, c.staging_offset, c.len))
            .collect();
        want.sort_unstable();
        assert_eq!(rows, want);
    }

    /// 4 pages of 1000 bytes: group 0 has 2 packed layers of 100 at 0; group 1 has 3 layers of
    /// 50 every 100 bytes from 400.
    fn spec() -> PoolSpec {
        PoolSpec {
            pool: PoolId(1),
            page_bytes: 1000,
            pages: 4,
            aliased: false,
            groups: vec![
                GroupGeometry {
                    group: 0,
                    layers: 2,
                    offset: 0,
                    layer_stride: 100,
                    layer_bytes: 100,
                    page_stride: 1000,
                    parts: 1,
                    part_stride: 0,
                    layers_inside: false,
                },
                GroupGeometry {
                    group: 1,
                    layers: 3,
                    offset: 400,
                    layer_stride: 100,
                    layer_bytes: 50,
                    page_stride: 1000,
                    parts: 1,
                    part_stride: 0,
                    layers_inside: false,
                },
            ],
        }
    }

    fn item(index: u32, group: u32, layers: Range<u32>) -> Item {
        Item {
            page: PageRef {
                pool: PoolId(1),
                index,
                generation: 1,
            },
            group,
            layers,
        }
    }

    #[test]
    fn packed_layers_coalesce_and_strided_ones_do_not() {
        let b = plan(&spec(), &[item(2, 0, 0..2), item(2, 1, 0..3)], 4096)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].item_offsets, vec![0, 200]);
        assert_eq!(
            b[0].copies,
            vec![
                Copy {
                    device_offset: 2000,
                    staging_offset: 0,
                    len: 200
                },
                Copy {
                    device_offset: 2400,
                    staging_offset: 200,
                    len: 50
                },
                Copy {
                    device_offset: 2500,
                    staging_offset: 250,
                    len: 50
                },
                Copy {
                    device_offset: 2600,
                    staging_offset: 300,
                    len: 50
                },
            ]
        );
        assert_eq!(b[0].staging_bytes, 350);
    }

    #[test]
    fn batches_fit_the_staging_buffer_and_never_split_a_page() {
        let items: Vec<Item> = (0..4).map(|i| item(i, 0, 0..2)).collect();
        let b = plan(&spec(), &items, 450).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.len(), 2);
        assert_eq!((b[0].items.clone(), b[1].items.clone()), (0..2, 2..4));
        assert!(b.iter().all(|x| x.staging_bytes <= 450));
        // Every byte of every item is planned exactly once.
        let total: usize = b.iter().flat_map(|x| &x.copies).map(|c| c.len).sum();
        assert_eq!(total, 4 * 200);
        // One layer of a page.
        let b = plan(&spec(), &[item(1, 0, 1..2)], 100).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            b[0].copies,
            vec![Copy {
                device_offset: 1100,
                staging_offset: 0,
                len: 100
            }]
        );
    }

    #[test]
    fn copies_of_a_subset_leave_the_other_pages_alone() {
        // Pages of exactly one group's two packed layers: consecutive pages are adjacent in the
        // pool as in staging, so pages 0, 1, 2 make one copy of 600 bytes.
        let spec = PoolSpec {
            pool: PoolId(1),
            page_bytes: 200,
            pages: 4,
            aliased: false,
            groups: vec![GroupGeometry {
                group: 0,
                layers: 2,
                offset: 0,
                layer_stride: 100,
                layer_bytes: 100,
                page_stride: 200,
                parts: 1,
                part_stride: 0,
                layers_inside: false,
            }],
        };
        let items: Vec<Item> = (0..3).map(|i| item(i, 0, 0..2)).collect();
        let b = plan(&spec, &items, 4096).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            b[0].copies,
            vec![Copy {
                device_offset: 0,
                staging_offset: 0,
                len: 600
            }]
        );
        // Without page 1 (its bytes failed to stage), nothing lands in 200..400.
        let kept = [
            (&items[0], b[0].item_offsets[0]),
            (&items[2], b[0].item_offsets[2]),
        ];
        let c = copies(&spec, kept).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c,
            vec![
                Copy {
                    device_offset: 0,
                    staging_offset: 0,
                    len: 200
                },
                Copy {
                    device_offset: 400,
                    staging_offset: 400,
                    len: 200
                },
            ]
        );
    }

    #[test]
    fn bad_items_are_refused_before_anything_is_planned() {
        assert!(
            plan(&spec(), &[item(0, 0, 0..2)], 199).is_err(),
            "larger than staging"
        );
        assert!(
            plan(&spec(), &[item(4, 0, 0..2)], 4096).is_err(),
            "index out of range"
        );
        assert!(
            plan(&spec(), &[item(0, 7, 0..1)], 4096).is_err(),
            "unknown group"
        );
        assert!(
            plan(&spec(), &[item(0, 1, 2..4)], 4096).is_err(),
            "past the layers"
        );
        assert_eq!(
            plan(&spec(), &[], 4096).unwrap_or_else(|e| panic!("{e}")),
            vec![]
        );
    }
}
