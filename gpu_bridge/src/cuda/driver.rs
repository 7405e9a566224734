//! The CUDA driver calls: every `unsafe` of the CUDA backend lives in this file.
//! Each call goes through [`call`], which turns a failure into [`Error::Device`] naming the call.
//! The driver library is loaded at run time; [`Cuda::open`] refuses, not panics, without it.
//! Handles here are the context, pinned host memory, streams, events and device regions.

use std::ops::Range;

use cudarc::driver::sys::{self, CUcontext, CUdeviceptr, CUevent, CUresult, CUstream};

use crate::error::{Error, Result};

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
