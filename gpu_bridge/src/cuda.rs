//! The CUDA backend (feature `cuda`): engine KV tensors in device memory, opened from CUDA IPC
//! handles, filled and read through pinned host staging buffers with asynchronous copies on a
//! stream, one event per batch ([`crate::staging`] plans the batches), the leases of a batch's
//! pages ended when its event completes.
//!
//! The driver library is loaded at run time. [`Cuda::open`] first checks that it is present
//! (`is_culib_present`: cudarc panics on a missing libcuda otherwise) and returns
//! [`Error::Device`] when it is not, so callers fall back to the host backend and say why.
//! Every driver call goes through [`call`], which turns a failure into [`Error::Device`]
//! naming the call.

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::sys::{self, CUcontext, CUdeviceptr, CUevent, CUresult, CUstream};

use crate::backend::{PageLease, PagePool, StagedLoad};
use crate::error::{Error, Result};
use crate::host::SharedStates;
use crate::pool::{PageRef, PageState, PoolSpec, generation_of};
use crate::staging::{Item, copies, plan};

/// Turns a driver result into [`Error::Device`] naming `what`.
pub fn call(what: &'static str, r: CUresult) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Device {
            call: what,
            detail: format!("{r:?}"),
        })
    }
}

/// Marks a type holding CUDA driver handles or device addresses `Send` (and `Sync` with
/// `sync`): the driver lets any thread use them once the context is current there
/// ([`Cuda::bind`] makes it so before each use) and synchronizes its own state.
macro_rules! driver_handle {
    ($t:ty) => {
        // SAFETY: see the macro's doc: a handle or device address is valid on any thread with
        // the context current; nothing in the value is thread-local.
        #[expect(
            unsafe_code,
            reason = "CUDA handles are raw pointers the driver lets any thread use"
        )]
        unsafe impl Send for $t {}
    };
    ($t:ty, sync) => {
        driver_handle!($t);
        // SAFETY: a shared reference only hands the handle or address to the driver.
        #[expect(
            unsafe_code,
            reason = "CUDA handles are raw pointers the driver lets any thread use"
        )]
        unsafe impl Sync for $t {}
    };
}

/// The driver, initialized, with one device's primary context.
#[derive(Debug)]
pub struct Cuda {
    ctx: CUcontext,
    device: i32,
}

driver_handle!(Cuda, sync);

impl Cuda {
    /// Whether the CUDA driver library can be loaded on this machine.
    #[expect(unsafe_code, reason = "cudarc's library probe is an unsafe fn")]
    pub fn driver_present() -> bool {
        // SAFETY: only tries to load the library by its known names; nothing is called in it.
        unsafe { sys::is_culib_present() }
    }

    /// Initializes the driver and retains `device`'s primary context, current on this thread.
    /// Without a driver library, or without that device, an [`Error::Device`] says so.
    #[expect(unsafe_code, reason = "CUDA driver calls")]
    pub fn open(device: i32) -> Result<Self> {
        if !Self::driver_present() {
            return Err(Error::Device {
                call: "load libcuda",
                detail: "no CUDA driver library on this machine".into(),
            });
        }
        let mut count = 0;
        let mut dev = 0;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: the library is present (checked); each call gets valid out-pointers to locals.
        unsafe {
            call("cuInit", sys::cuInit(0))?;
            call("cuDeviceGetCount", sys::cuDeviceGetCount(&mut count))?;
            if device < 0 || device >= count {
                return Err(Error::Device {
                    call: "cuDeviceGet",
                    detail: format!("device {device} of {count}"),
                });
            }
            call("cuDeviceGet", sys::cuDeviceGet(&mut dev, device))?;
            call(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
            )?;
            call("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx))?;
        }
        Ok(Self { ctx, device })
    }

    /// Makes the context current on the calling thread.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is the primary context retained in `open` and not released before drop.
        call("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }

    /// The device ordinal.
    pub fn device(&self) -> i32 {
        self.device
    }
}

/// Pinned (page-locked) host memory the device copies from and to without another copy.
pub struct Pinned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the allocation is owned by this value alone; `&mut` access is required to write.
#[expect(unsafe_code, reason = "a raw allocation owned by the value")]
unsafe impl Send for Pinned {}

impl Pinned {
    /// `len` bytes of pinned memory (the context must be current).
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn new(len: usize) -> Result<Self> {
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the driver allocates `len.max(1)` bytes or fails. The
        // bytes are then zeroed, so every view of them is of initialized memory.
        unsafe {
            call(
                "cuMemHostAlloc",
                sys::cuMemHostAlloc(&mut p, len.max(1), sys::CU_MEMHOSTALLOC_PORTABLE),
            )?;
            std::ptr::write_bytes(p.cast::<u8>(), 0, len);
        }
        Ok(Self { ptr: p.cast(), len })
    }

    /// The bytes.
    #[expect(unsafe_code, reason = "a view of the owned allocation")]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` bytes owned by `self`, zeroed at allocation.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, writable.
    #[expect(unsafe_code, reason = "a view of the owned allocation")]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` makes the view unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Pinned {
    #[expect(unsafe_code, reason = "CUDA driver call")]
    fn drop(&mut self) {
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed once, here.
        unsafe {
            let _ = sys::cuMemFreeHost(self.ptr.cast());
        }
    }
}

/// A stream the copies are queued on.
pub struct Stream(CUstream);

driver_handle!(Stream);

/// A recorded point in a stream: done when every copy queued before it is.
pub struct Event(CUevent);

driver_handle!(Event);

impl Stream {
    /// A non-blocking stream (the context must be current).
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn new() -> Result<Self> {
        let mut s: CUstream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe {
            call(
                "cuStreamCreate",
                sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32),
            )?;
        }
        Ok(Self(s))
    }

    /// Queues a copy of `src[range]` to device address `dst`.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn htod(&self, dst: CUdeviceptr, src: &Pinned, range: Range<usize>) -> Result<()> {
        check_range(&range, src.len)?;
        // SAFETY: the source range lies in the pinned allocation (checked), which the caller
        // keeps alive and unmodified until the event recorded after this copy completes.
        call("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.ptr.add(range.start).cast(), range.len(), self.0)
        })
    }

    /// Queues a copy from device address `src` into `dst[range]`.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn dtoh(&self, dst: &mut Pinned, range: Range<usize>, src: CUdeviceptr) -> Result<()> {
        check_range(&range, dst.len)?;
        // SAFETY: the destination range lies in the pinned allocation (checked), which the
        // caller keeps alive and does not read until the event recorded after this completes.
        call("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.ptr.add(range.start).cast(), src, range.len(), self.0)
        })
    }

    /// Waits for everything queued so far.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream is live.
        call("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.0)
        })
    }

    /// Records an event after everything queued so far.
    #[expect(unsafe_code, reason = "CUDA driver calls")]
    pub fn record(&self) -> Result<Event> {
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the stream is live.
        unsafe {
            call(
                "cuEventCreate",
                sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32),
            )?;
            let ev = Event(e);
            call("cuEventRecord", sys::cuEventRecord(ev.0, self.0))?;
            Ok(ev)
        }
    }
}

impl Drop for Stream {
    #[expect(unsafe_code, reason = "CUDA driver call")]
    fn drop(&mut self) {
        // SAFETY: the stream was created in `new` and is destroyed once, here.
        unsafe {
            let _ = sys::cuStreamDestroy_v2(self.0);
        }
    }
}

impl Event {
    /// Waits until the event completes.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn wait(&self) -> Result<()> {
        // SAFETY: the event was created and recorded in `Stream::record`.
        call("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.0)
        })
    }
}

impl Drop for Event {
    #[expect(unsafe_code, reason = "CUDA driver call")]
    fn drop(&mut self) {
        // SAFETY: created in `Stream::record`, destroyed once, here.
        unsafe {
            let _ = sys::cuEventDestroy_v2(self.0);
        }
    }
}

fn check_range(r: &Range<usize>, len: usize) -> Result<()> {
    if r.start > r.end || r.end > len {
        return Err(Error::Length {
            expected: len as u64,
            got: r.end as u64,
        });
    }
    Ok(())
}

/// Device memory holding a pool's pages: an engine tensor opened from its IPC handle, or an
/// allocation of this process (the device check plays the engine with one).
pub struct DeviceRegion {
    /// The allocation (released on drop).
    base: CUdeviceptr,
    /// Where the pool's bytes start in it.
    offset: u64,
    /// The pool's bytes.
    len: u64,
    ipc: bool,
}

driver_handle!(DeviceRegion, sync);

impl DeviceRegion {
    /// Opens the memory another process exported with `cuIpcGetMemHandle`: the region is the
    /// `len` bytes (the registration's pages × page bytes) from byte `offset` of the
    /// allocation, which must hold them all (the driver says how large it is; an engine's
    /// claim is not trusted).
    #[expect(unsafe_code, reason = "CUDA driver calls")]
    pub fn open_ipc(handle: [u8; 64], offset: u64, len: u64) -> Result<Self> {
        let mut h = sys::CUipcMemHandle_st { reserved: [0; 64] };
        for (d, s) in h.reserved.iter_mut().zip(handle) {
            *d = s as std::ffi::c_char;
        }
        let mut base: CUdeviceptr = 0;
        // SAFETY: a valid out-pointer and a handle by value; the driver validates the handle.
        unsafe {
            call(
                "cuIpcOpenMemHandle",
                sys::cuIpcOpenMemHandle_v2(
                    &mut base,
                    h,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                ),
            )?;
        }
        // From here on dropping `region` closes the handle, whatever is refused.
        let mut region = Self {
            base,
            offset: 0,
            len: 0,
            ipc: true,
        };
        let (mut start, mut size): (CUdeviceptr, usize) = (0, 0);
        // SAFETY: valid out-pointers and an address inside the allocation just opened.
        unsafe {
            call(
                "cuMemGetAddressRange",
                sys::cuMemGetAddressRange_v2(&mut start, &mut size, base),
            )?;
        }
        // Bytes from the opened address to the allocation's end.
        let end = start.saturating_add(size as u64).saturating_sub(base);
        if offset.checked_add(len).is_none_or(|e| e > end) {
            return Err(Error::Geometry(format!(
                "the exported allocation holds {end} bytes; the pool needs {len} from byte {offset}"
            )));
        }
        (region.offset, region.len) = (offset, len);
        Ok(region)
    }

    /// `len` bytes of device memory of this process.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn alloc(len: u64) -> Result<Self> {
        let mut base: CUdeviceptr = 0;
        let bytes = usize::try_from(len).map_err(|_| Error::Geometry("region too large".into()))?;
        // SAFETY: a valid out-pointer.
        unsafe {
            call("cuMemAlloc", sys::cuMemAlloc_v2(&mut base, bytes.max(1)))?;
        }
        Ok(Self {
            base,
            offset: 0,
            len,
            ipc: false,
        })
    }

    /// The IPC handle another process opens this allocation with (`cuIpcGetMemHandle`): what
    /// an engine sends in a device pool's registration.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn export_ipc(&self) -> Result<[u8; 64]> {
        let mut h = sys::CUipcMemHandle_st { reserved: [0; 64] };
        // SAFETY: a valid out-pointer and the base of an allocation this value holds.
        unsafe {
            call(
                "cuIpcGetMemHandle",
                sys::cuIpcGetMemHandle(&mut h, self.base),
            )?
        };
        let mut out = [0u8; 64];
        for (d, s) in out.iter_mut().zip(h.reserved) {
            *d = s as u8;
        }
        Ok(out)
    }

    /// The device address of byte `offset`, if `offset + len` lies in the region.
    pub fn at(&self, offset: u64, len: usize) -> Result<CUdeviceptr> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(self.base + self.offset + offset),
            _ => Err(Error::Region(format!(
                "{len} bytes at {offset} lie outside the {}-byte device region",
                self.len
            ))),
        }
    }
}

impl Drop for DeviceRegion {
    #[expect(unsafe_code, reason = "CUDA driver calls")]
    fn drop(&mut self) {
        // SAFETY: `base` was opened or allocated by this value and is released once, here.
        unsafe {
            let _ = if self.ipc {
                sys::cuIpcCloseMemHandle(self.base)
            } else {
                sys::cuMemFree_v2(self.base)
            };
        }
    }
}

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
        self.halves[0].len
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

    /// Copies `items` out of `region` into `outs[i]` (item `i`'s layers, packed), in batches.
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
                out.clear();
                out.extend_from_slice(&staged[b.staged(j)]);
            }
        }
        Ok(())
    }
}

/// A pool of engine pages in device memory, fenced by page state words like the host backend's
/// (generation and lease count in one atomic). Copies go through a [`DeviceCopier`].
pub struct CudaPool {
    spec: PoolSpec,
    epoch: u64,
    cuda: Cuda,
    region: DeviceRegion,
    states: SharedStates,
    copier: Mutex<DeviceCopier>,
    detached: AtomicBool,
}

impl CudaPool {
    /// A pool of `spec`'s pages in `region`, fenced by the state words the engine shares in
    /// `states`, copying through `staging` bytes of pinned memory.
    pub fn new(
        cuda: Cuda,
        spec: PoolSpec,
        epoch: u64,
        region: DeviceRegion,
        states: SharedStates,
        staging: usize,
    ) -> Result<Self> {
        spec.validate()?;
        region.at(
            0,
            usize::try_from(spec.page_bytes * u64::from(spec.pages)).unwrap_or(usize::MAX),
        )?;
        cuda.bind()?;
        let copier = DeviceCopier::new(staging)?;
        Ok(Self {
            states,
            spec,
            epoch,
            cuda,
            region,
            copier: Mutex::new(copier),
            detached: AtomicBool::new(false),
        })
    }

    fn state(&self, index: u32) -> Result<PageState<'_>> {
        self.states.state(index)
    }

    /// The device region.
    pub fn region(&self) -> &DeviceRegion {
        &self.region
    }

    fn check_attached(&self) -> Result<()> {
        if self.detached.load(Ordering::Acquire) {
            return Err(Error::Detached {
                pool: self.spec.pool,
            });
        }
        Ok(())
    }

    fn copier(&self) -> Result<std::sync::MutexGuard<'_, DeviceCopier>> {
        self.cuda.bind()?;
        Ok(self.copier.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl PagePool for CudaPool {
    fn spec(&self) -> &PoolSpec {
        &self.spec
    }

    fn epoch(&self) -> u64 {
        self.epoch
    }

    fn take_lease(&self, page: PageRef) -> Result<()> {
        self.check_attached()?;
        self.state(page.index)?.lease(page)
    }

    fn release(&self, index: u32) {
        if let Ok(s) = self.state(index) {
            s.release();
        }
    }

    fn generation(&self, index: u32) -> Result<u64> {
        Ok(generation_of(self.state(index)?.load()))
    }

    fn copy_in(
        &self,
        lease: &PageLease,
        group: u32,
        layers: Range<u32>,
        bytes: &[u8],
    ) -> Result<()> {
        self.check_attached()?;
        self.states.check(lease.page())?;
        let item = Item {
            page: lease.page(),
            group,
            layers,
        };
        self.copier()?
            .load(&self.region, &self.spec, &[item], &[bytes], |_| {})
    }

    fn copy_out(&self, lease: &PageLease, group: u32, out: &mut Vec<u8>) -> Result<()> {
        out.clear();
        self.check_attached()?;
        let page = lease.page();
        let before = self.states.check(page)?;
        let g = self.spec.group(group)?;
        let item = Item {
            page,
            group,
            layers: g.all_layers(),
        };
        let mut outs = [std::mem::take(out)];
        self.copier()?
            .copy_out(&self.region, &self.spec, &[item], &mut outs)?;
        let [copied] = outs;
        // Seqlock-style, as the host backend: a page reused during the copy is not kept.
        let after = generation_of(self.state(page.index)?.load());
        if after != generation_of(before) {
            return Err(Error::ChangedDuringCopy {
                pool: self.spec.pool,
                index: page.index,
                before: generation_of(before),
                after,
            });
        }
        *out = copied;
        Ok(())
    }

    fn detach(&self) {
        // Copies hold the copier's lock: taking it waits for one in progress.
        self.detached.store(true, Ordering::Release);
        drop(self.copier.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn staged(&self) -> Option<&dyn StagedLoad> {
        Some(self)
    }
}

impl StagedLoad for CudaPool {
    fn load_staged(
        &self,
        items: &[Item],
        fill: &mut dyn FnMut(usize, &mut [u8]) -> bool,
        done: &mut dyn FnMut(usize, Result<()>),
    ) -> Result<()> {
        self.check_attached()?;
        let mut copier = self.copier()?;
        // Fenced before anything is filled: each page at the generation its item names.
        let mut fenced = vec![true; items.len()];
        for (i, it) in items.iter().enumerate() {
            if let Err(e) = self.states.check(it.page) {
                fenced[i] = false;
                done(i, Err(e));
            }
        }
        copier.load_with(
            &self.region,
            &self.spec,
            items,
            |i, dst| fenced[i] && fill(i, dst),
            |i| done(i, Ok(())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_open_says_so_instead_of_panicking() {
        if Cuda::driver_present() {
            // A machine with a driver: opening a device that does not exist is refused.
            let e = Cuda::open(i32::MAX).map(|_| ()).unwrap_err();
            assert!(matches!(e, Error::Device { .. }), "{e}");
            return;
        }
        let e = Cuda::open(0).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains("no CUDA driver library"), "{e}");
    }
}
