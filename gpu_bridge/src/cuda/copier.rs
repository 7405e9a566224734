//! Copies between host bytes and a device region through two pinned staging halves.
//! While the device drains one half, the host fills the other; each batch ends with an event.
//! A batch's items are reported done only once its event completes.
//! The driver work is in [`super::driver`]; this file holds no `unsafe`.

#![forbid(unsafe_code)]

use super::driver::{DeviceRegion, Event, Pinned, Stream};
use crate::error::{Error, Result};
use crate::pool::PoolSpec;
use crate::staging::{Item, copies, plan};

/// Copies pages between host bytes and a device region through two pinned staging halves:
/// while the device drains one, the host fills the other; each batch ends with an event, and
/// the batch's items are reported done (their leases may end) once it completes.
pub struct DeviceCopier {
    stream: Stream,
    halves: [Pinned; 2],
}

impl DeviceCopier {
    /// A copier with `staging` bytes of pinned memory (two halves).
    pub fn new(staging: usize) -> Result<Self> {
        let half = (staging / 2).max(1);
        Ok(Self {
            stream: Stream::new()?,
            halves: [Pinned::new(half)?, Pinned::new(half)?],
        })
    }

    /// Bytes one batch may stage.
    pub fn batch_bytes(&self) -> usize {
        self.halves[0].as_slice().len()
    }

    /// Copies `sources[i]` (item `i`'s layers, packed) into `region` as `items` say, in batches;
    /// calls `done(i)` for each item once its batch's copies have completed.
    pub fn load(
        &mut self,
        region: &DeviceRegion,
        spec: &PoolSpec,
        items: &[Item],
        sources: &[&[u8]],
        done: impl FnMut(usize),
    ) -> Result<()> {
        for (i, it) in items.iter().enumerate() {
            let want = spec.group(it.group)?.bytes_for(&it.layers);
            let got = sources.get(i).map_or(0, |s| s.len() as u64);
            if got != want {
                return Err(Error::Length {
                    expected: want,
                    got,
                });
            }
        }
        self.load_with(
            region,
            spec,
            items,
            |i, dst| {
                dst.copy_from_slice(sources[i]);
                true
            },
            done,
        )
    }

    /// Copies `items` into `region` in batches: `fill(i, dst)` writes item `i`'s packed bytes
    /// straight into the staging half (or returns `false`: the item's page is then not
    /// touched); each batch is queued as coalesced copies and an event, and while the device
    /// drains it the other half is filled; `done(i)` follows each filled item's completion, in
    /// batch order. On an error the stream is drained before returning, so no copy is still in
    /// flight into a page whose lease the caller then ends.
    pub fn load_with(
        &mut self,
        region: &DeviceRegion,
        spec: &PoolSpec,
        items: &[Item],
        mut fill: impl FnMut(usize, &mut [u8]) -> bool,
        mut done: impl FnMut(usize),
    ) -> Result<()> {
        let r = self.load_batches(region, spec, items, &mut fill, &mut done);
        if r.is_err() {
            let _ = self.stream.synchronize();
        }
        r
    }

    fn load_batches(
        &mut self,
        region: &DeviceRegion,
        spec: &PoolSpec,
        items: &[Item],
        fill: &mut impl FnMut(usize, &mut [u8]) -> bool,
        done: &mut impl FnMut(usize),
    ) -> Result<()> {
        let batches = plan(spec, items, self.batch_bytes())?;
        let mut pending: [Option<(Event, Vec<usize>)>; 2] = [None, None];
        for (n, b) in batches.iter().enumerate() {
            let k = n % 2;
            // The half is free once the batch that used it before has completed.
            if let Some((ev, filled)) = pending[k].take() {
                ev.wait()?;
                filled.into_iter().for_each(&mut *done);
            }
            let half = self.halves[k].as_mut_slice();
            let mut filled = Vec::with_capacity(b.items.len());
            for (j, i) in b.items.clone().enumerate() {
                let dst = half
                    .get_mut(b.staged(j))
                    .ok_or_else(|| Error::Geometry(format!("item {i} outside the staging half")))?;
                if fill(i, dst) {
                    filled.push((i, b.item_offsets[j]));
                }
            }
            for c in copies(spec, filled.iter().map(|&(i, at)| (&items[i], at)))? {
                let dst = region.at(c.device_offset, c.len)?;
                self.stream.htod(
                    dst,
                    &self.halves[k],
                    c.staging_offset..c.staging_offset + c.len,
                )?;
            }
            let filled = filled.into_iter().map(|(i, _)| i).collect();
            pending[k] = Some((self.stream.record()?, filled));
        }
        // Complete in batch order.
        let order = if batches.len() % 2 == 0 {
            [0, 1]
        } else {
            [1, 0]
        };
        for k in order {
            if let Some((ev, filled)) = pending[k].take() {
                ev.wait()?;
                filled.into_iter().for_each(&mut *done);
            }
        }
        Ok(())
    }

    /// Copies `items` out of `region`, appending item `i`'s layers (packed) to `outs[i]`, in
    /// batches.
    pub fn copy_out(
        &mut self,
        region: &DeviceRegion,
        spec: &PoolSpec,
        items: &[Item],
        outs: &mut [Vec<u8>],
    ) -> Result<()> {
        for b in plan(spec, items, self.batch_bytes())? {
            for c in &b.copies {
                let src = region.at(c.device_offset, c.len)?;
                self.stream.dtoh(
                    &mut self.halves[0],
                    c.staging_offset..c.staging_offset + c.len,
                    src,
                )?;
            }
            self.stream.record()?.wait()?;
            let staged = self.halves[0].as_slice();
            for (j, i) in b.items.clone().enumerate() {
                let out = outs
                    .get_mut(i)
                    .ok_or_else(|| Error::Geometry(format!("no output for item {i}")))?;
                out.extend_from_slice(&staged[b.staged(j)]);
            }
        }
        Ok(())
    }
}
