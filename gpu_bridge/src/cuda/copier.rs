//! Copies between host bytes and a device region through two pinned staging halves.
//! While the device drains one half, the host fills the other; each batch ends with an event.
//! A batch's items are reported done only once its event completes.
//! The driver work is in [`super::driver`]; this file holds no `unsafe`.

#![forbid(unsafe_code)]

use super::driver::{Cuda, DeviceRegion, Event, Pinned, Stream};
use crate::error::{Error, Result};
use crate::pool::PoolSpec;
use crate::staging::{Batch, Item, Strided, plan, strided_copies};

/// Copies pages between host bytes and a device region through two pinned staging halves:
/// while the device drains one, the host fills the other; each batch ends with an event, and
/// the batch's items are reported done (their leases may end) once it completes.
pub struct DeviceCopier {
    stream: Stream,
    halves: [Pinned; 2],
}

/// Drains the stream when a copy panics: the copies queued so far read staging memory and
/// write pages whose leases end as the panic unwinds, so they must finish first.
struct DrainOnUnwind<'a>(&'a Stream);

impl Drop for DrainOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.0.synchronize();
        }
    }
}

impl DeviceCopier {
    /// A copier in `cuda`'s context with `staging` bytes of pinned memory (two halves).
    pub fn new(cuda: &Cuda, staging: usize) -> Result<Self> {
        let half = (staging / 2).max(1);
        Ok(Self {
            stream: Stream::new(cuda)?,
            halves: [Pinned::new(cuda, half)?, Pinned::new(cuda, half)?],
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
            |_| true,
            done,
        )
    }

    /// Copies `items` into `region` in batches: `fill(i, dst)` writes item `i`'s packed bytes
    /// straight into the staging half (or returns `false`: the item's page is then not
    /// touched); once the batch is filled, `claim(i)` is asked for each filled item (`false`:
    /// not copied); each batch is queued as coalesced copies and an event, and while the device
    /// drains it the other half is filled; `done(i)` follows each claimed item's completion, in
    /// batch order. On an error the stream is drained before returning, so no copy is still in
    /// flight into a page whose lease the caller then ends.
    pub fn load_with(
        &mut self,
        region: &DeviceRegion,
        spec: &PoolSpec,
        items: &[Item],
        mut fill: impl FnMut(usize, &mut [u8]) -> bool,
        mut claim: impl FnMut(usize) -> bool,
        mut done: impl FnMut(usize),
    ) -> Result<()> {
        let Self { stream, halves } = self;
        let _drain = DrainOnUnwind(stream);
        let r = load_batches(
            stream, halves, region, spec, items, &mut fill, &mut claim, &mut done,
        );
        if r.is_err() {
            let _ = stream.synchronize();
        }
        r
    }

    /// The baseline of the bridge's batched copy: the first `bytes` of `region` written from this
    /// copier's own staging halves, in turn, with plain async copies on its own stream and one
    /// event at the end. What a batched load costs beyond this is the bridge's.
    pub fn copy_staged_raw(&mut self, region: &DeviceRegion, bytes: usize) -> Result<()> {
        let _drain = DrainOnUnwind(&self.stream);
        let half = self.batch_bytes();
        let (mut at, mut k) = (0, 0);
        while at < bytes {
            let len = half.min(bytes - at);
            let dst = region.at(at as u64, len)?;
            self.stream.htod(dst, &self.halves[k], 0..len)?;
            (at, k) = (at + len, 1 - k);
        }
        self.stream.record()?.wait()
    }

    /// Copies `items` out of `region` in batches, through both staging halves: while the CPU
    /// hands one batch's bytes to `out(i, bytes)` (item `i`'s layers, packed), the device
    /// fills the other half with the next batch. Items come out in order. On an error the stream
    /// is drained before returning, and items not yet handed out never will be.
    pub fn copy_out(
        &mut self,
        region: &DeviceRegion,
        spec: &PoolSpec,
        items: &[Item],
        mut out: impl FnMut(usize, &[u8]),
    ) -> Result<()> {
        let Self { stream, halves } = self;
        let _drain = DrainOnUnwind(stream);
        let r = out_batches(stream, halves, region, spec, items, &mut out);
        if r.is_err() {
            let _ = stream.synchronize();
        }
        r
    }
}

/// [`DeviceCopier::copy_out`]'s batches, on the copier's two parts borrowed apart.
fn out_batches(
    stream: &Stream,
    halves: &mut [Pinned; 2],
    region: &DeviceRegion,
    spec: &PoolSpec,
    items: &[Item],
    out: &mut impl FnMut(usize, &[u8]),
) -> Result<()> {
    let batches = plan(spec, items, halves[0].as_slice().len())?;
    // The batch queued last, not yet handed out: its event, its index, its half.
    let mut pending: Option<(Event, usize, usize)> = None;
    for (n, b) in batches.iter().enumerate() {
        let k = n % 2;
        // Half `k` was last filled by batch `n - 2`, handed out in the previous round.
        let placed = b.items.clone().zip(b.item_offsets.iter().copied());
        for c in strided_copies(spec, placed.map(|(i, at)| (&items[i], at)))? {
            let src = region.at(c.device_offset, span(&c)?)?;
            if c.rows == 1 {
                stream.dtoh(
                    &mut halves[k],
                    c.staging_offset..c.staging_offset + c.len,
                    src,
                )?;
            } else {
                stream.dtoh_2d(&mut halves[k], src, pitch(&c)?, &c)?;
            }
        }
        let queued = (stream.record()?, n, k);
        if let Some((ev, m, h)) = pending.replace(queued) {
            ev.wait()?;
            hand_out(&batches[m], &halves[h], out)?;
        }
    }
    if let Some((ev, m, h)) = pending {
        ev.wait()?;
        hand_out(&batches[m], &halves[h], out)?;
    }
    Ok(())
}

/// Hands each item of `b`, copied into `half`, to `out`.
fn hand_out(b: &Batch, half: &Pinned, out: &mut impl FnMut(usize, &[u8])) -> Result<()> {
    let staged = half.as_slice();
    for (j, i) in b.items.clone().enumerate() {
        let bytes = staged
            .get(b.staged(j))
            .ok_or_else(|| Error::Geometry(format!("item {i} outside the staging half")))?;
        out(i, bytes);
    }
    Ok(())
}

/// [`DeviceCopier::load_with`]'s batches, on the copier's two parts borrowed apart (a guard
/// holds the stream meanwhile).
#[expect(
    clippy::too_many_arguments,
    reason = "the copier's two parts borrowed apart, the batch's geometry and its three callbacks"
)]
fn load_batches(
    stream: &Stream,
    halves: &mut [Pinned; 2],
    region: &DeviceRegion,
    spec: &PoolSpec,
    items: &[Item],
    fill: &mut impl FnMut(usize, &mut [u8]) -> bool,
    claim: &mut impl FnMut(usize) -> bool,
    done: &mut impl FnMut(usize),
) -> Result<()> {
    let batches = plan(spec, items, halves[0].as_slice().len())?;
    let mut pending: [Option<(Event, Vec<usize>)>; 2] = [None, None];
    for (n, b) in batches.iter().enumerate() {
        let k = n % 2;
        // The half is free once the batch that used it before has completed.
        if let Some((ev, filled)) = pending[k].take() {
            ev.wait()?;
            filled.into_iter().for_each(&mut *done);
        }
        let half = halves[k].as_mut_slice();
        let mut filled = Vec::with_capacity(b.items.len());
        for (j, i) in b.items.clone().enumerate() {
            let dst = half
                .get_mut(b.staged(j))
                .ok_or_else(|| Error::Geometry(format!("item {i} outside the staging half")))?;
            if fill(i, dst) {
                filled.push((i, b.item_offsets[j]));
            }
        }
        // Claimed once the whole batch is filled: no page is held while another is read.
        filled.retain(|&(i, _)| claim(i));
        for c in strided_copies(spec, filled.iter().map(|&(i, at)| (&items[i], at)))? {
            let dst = region.at(c.device_offset, span(&c)?)?;
            if c.rows == 1 {
                stream.htod(dst, &halves[k], c.staging_offset..c.staging_offset + c.len)?;
            } else {
                stream.htod_2d(dst, pitch(&c)?, &halves[k], &c)?;
            }
        }
        let filled = filled.into_iter().map(|(i, _)| i).collect();
        pending[k] = Some((stream.record()?, filled));
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

/// The device bytes a strided copy spans.
fn span(c: &Strided) -> Result<usize> {
    usize::try_from(c.device_span()).map_err(|_| Error::Geometry("a copy too large".into()))
}

/// A strided copy's pitch.
fn pitch(c: &Strided) -> Result<usize> {
    usize::try_from(c.device_pitch).map_err(|_| Error::Geometry("a pitch too large".into()))
}
