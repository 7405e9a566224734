//! The CUDA driver calls: every `unsafe` of the CUDA backend lives in this file.
//! Each call goes through [`call`], which turns a failure into [`Error::Device`] naming the call.
//! The driver library is loaded at run time; [`Cuda::open`] refuses, not panics, without it.
//! Handles here are the context, pinned host memory, streams, events and device regions.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::sys::{self, CUcontext, CUdevice, CUdeviceptr, CUevent, CUresult, CUstream};

use crate::error::{Error, Result};
use crate::staging::Strided;

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

/// Driver calls that released a handle (`cuMemFreeHost`, `cuStreamDestroy`, `cuEventDestroy`,
/// `cuIpcCloseMemHandle`, `cuMemFree`, `cuDevicePrimaryCtxRelease`) and failed, in this
/// process. A drop cannot return an error; this count is how a failure shows.
static RELEASE_FAILURES: AtomicU64 = AtomicU64::new(0);

/// Counts a failed release.
fn released(r: CUresult) {
    if r != CUresult::CUDA_SUCCESS {
        RELEASE_FAILURES.fetch_add(1, Ordering::Relaxed);
    }
}

/// Driver calls that released a handle and failed, in this process: a drop cannot return an
/// error, so this count is how a failure shows.
pub fn release_failures() -> u64 {
    RELEASE_FAILURES.load(Ordering::Relaxed)
}

/// One device as the driver describes it, without a context on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Its ordinal in this process (after `CUDA_VISIBLE_DEVICES`).
    pub ordinal: i32,
    /// Its name.
    pub name: String,
    /// Its UUID: the same in every process, whatever the ordinals there.
    pub uuid: [u8; 16],
}

/// The retained primary context of one device; released when the last [`Cuda`] goes.
#[derive(Debug)]
struct Context {
    ctx: CUcontext,
    dev: CUdevice,
    device: i32,
    uuid: [u8; 16],
}

driver_handle!(Context, sync);

impl Drop for Context {
    #[expect(unsafe_code, reason = "CUDA driver call")]
    fn drop(&mut self) {
        // SAFETY: the primary context was retained once in `Cuda::open` and is released once.
        released(unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) });
    }
}

/// The driver, initialized, with one device's primary context. Clones share the context; every
/// handle made with it holds a clone, so the context outlives them and each binds it before it
/// calls the driver (in its drop too).
#[derive(Debug, Clone)]
pub struct Cuda(Arc<Context>);

/// Initializes the driver, or says why not (no library, no device, a driver error).
#[expect(unsafe_code, reason = "CUDA driver calls")]
fn init() -> Result<i32> {
    if !Cuda::driver_present() {
        return Err(Error::Device {
            call: "load libcuda",
            detail: "no CUDA driver library on this machine".into(),
        });
    }
    let mut count = 0;
    // SAFETY: the library is present (checked); a valid out-pointer to a local.
    unsafe {
        call("cuInit", sys::cuInit(0))?;
        call("cuDeviceGetCount", sys::cuDeviceGetCount(&mut count))?;
    }
    Ok(count)
}

/// The UUID of `dev`.
#[expect(unsafe_code, reason = "CUDA driver call")]
fn uuid_of(dev: CUdevice) -> Result<[u8; 16]> {
    let mut u = sys::CUuuid_st { bytes: [0; 16] };
    // SAFETY: a valid out-pointer; `dev` came from cuDeviceGet.
    call("cuDeviceGetUuid", unsafe {
        sys::cuDeviceGetUuid_v2(&mut u, dev)
    })?;
    Ok(u.bytes.map(|b| b as u8))
}

/// The device handle of ordinal `device`.
#[expect(unsafe_code, reason = "CUDA driver call")]
fn device_of(device: i32, count: i32) -> Result<CUdevice> {
    if device < 0 || device >= count {
        return Err(Error::Device {
            call: "cuDeviceGet",
            detail: format!("device {device} of {count}"),
        });
    }
    let mut dev = 0;
    // SAFETY: a valid out-pointer; the ordinal is in range.
    call("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, device) })?;
    Ok(dev)
}

impl Cuda {
    /// Whether the CUDA driver library can be loaded on this machine.
    #[expect(unsafe_code, reason = "cudarc's library probe is an unsafe fn")]
    pub fn driver_present() -> bool {
        // SAFETY: only tries to load the library by its known names; nothing is called in it.
        unsafe { sys::is_culib_present() }
    }

    /// The devices this process sees, named, without creating a context on any.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn probe() -> Result<Vec<DeviceInfo>> {
        let count = init()?;
        let mut out = Vec::new();
        for ordinal in 0..count {
            let dev = device_of(ordinal, count)?;
            let mut name = [0 as std::ffi::c_char; 256];
            // SAFETY: the buffer's length is passed; the driver writes a NUL-terminated name.
            call("cuDeviceGetName", unsafe {
                sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev)
            })?;
            let bytes: Vec<u8> = name
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            out.push(DeviceInfo {
                ordinal,
                name: String::from_utf8_lossy(&bytes).into_owned(),
                uuid: uuid_of(dev)?,
            });
        }
        Ok(out)
    }

    /// Initializes the driver and retains `device`'s primary context, current on this thread.
    /// Without a driver library, or without that device, an [`Error::Device`] says so.
    #[expect(unsafe_code, reason = "CUDA driver calls")]
    pub fn open(device: i32) -> Result<Self> {
        let count = init()?;
        let dev = device_of(device, count)?;
        let uuid = uuid_of(dev)?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer and a device handle from cuDeviceGet.
        call("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        // From here on dropping `cuda` releases the context.
        let cuda = Self(Arc::new(Context {
            ctx,
            dev,
            device,
            uuid,
        }));
        cuda.bind()?;
        Ok(cuda)
    }

    /// Opens the device whose UUID is `uuid` (an engine's device, whatever its ordinal there).
    pub fn open_uuid(uuid: [u8; 16]) -> Result<Self> {
        let found = Self::probe()?.into_iter().find(|d| d.uuid == uuid);
        let Some(d) = found else {
            return Err(Error::Device {
                call: "cuDeviceGetUuid",
                detail: format!("no device with UUID {}", uuid_text(&uuid)),
            });
        };
        Self::open(d.ordinal)
    }

    /// Makes the context current on the calling thread.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is the primary context retained in `open`, released only when the last
        // clone of this value goes.
        call("cuCtxSetCurrent", unsafe {
            sys::cuCtxSetCurrent(self.0.ctx)
        })
    }

    /// The device ordinal.
    pub fn device(&self) -> i32 {
        self.0.device
    }

    /// The device's UUID.
    pub fn uuid(&self) -> [u8; 16] {
        self.0.uuid
    }
}

/// A UUID as CUDA prints it (`GPU-` and hex groups 8-4-4-4-12).
pub fn uuid_text(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Pinned (page-locked) host memory the device copies from and to without another copy.
pub struct Pinned {
    cuda: Cuda,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the allocation is owned by this value alone; `&mut` access is required to write.
#[expect(unsafe_code, reason = "a raw allocation owned by the value")]
unsafe impl Send for Pinned {}

impl Pinned {
    /// `len` bytes of pinned memory in `cuda`'s context.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn new(cuda: &Cuda, len: usize) -> Result<Self> {
        cuda.bind()?;
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
        Ok(Self {
            cuda: cuda.clone(),
            ptr: p.cast(),
            len,
        })
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
        // The context current, or the free fails with CUDA_ERROR_INVALID_CONTEXT.
        if self.cuda.bind().is_err() {
            released(CUresult::CUDA_ERROR_INVALID_CONTEXT);
            return;
        }
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed once, here.
        released(unsafe { sys::cuMemFreeHost(self.ptr.cast()) });
    }
}

/// A stream the copies are queued on.
pub struct Stream {
    cuda: Cuda,
    s: CUstream,
}

driver_handle!(Stream);

/// A recorded point in a stream: done when every copy queued before it is.
pub struct Event {
    cuda: Cuda,
    e: CUevent,
}

driver_handle!(Event);

impl Stream {
    /// A non-blocking stream in `cuda`'s context.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn new(cuda: &Cuda) -> Result<Self> {
        cuda.bind()?;
        let mut s: CUstream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe {
            call(
                "cuStreamCreate",
                sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32),
            )?;
        }
        Ok(Self {
            cuda: cuda.clone(),
            s,
        })
    }

    /// Queues a copy of `src[range]` to device address `dst`.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn htod(&self, dst: CUdeviceptr, src: &Pinned, range: Range<usize>) -> Result<()> {
        check_range(&range, src.len)?;
        // SAFETY: the source range lies in the pinned allocation (checked), which the caller
        // keeps alive and unmodified until the event recorded after this copy completes.
        call("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.ptr.add(range.start).cast(), range.len(), self.s)
        })
    }

    /// Queues a copy from device address `src` into `dst[range]`.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn dtoh(&self, dst: &mut Pinned, range: Range<usize>, src: CUdeviceptr) -> Result<()> {
        check_range(&range, dst.len)?;
        // SAFETY: the destination range lies in the pinned allocation (checked), which the
        // caller keeps alive and does not read until the event recorded after this completes.
        call("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.ptr.add(range.start).cast(), src, range.len(), self.s)
        })
    }

    /// Queues the 2-D copy `c` from `src` to the device: row `r` from
    /// `src[c.staging_offset + r · c.staging_pitch..]` to `dst + r · dst_pitch`.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn htod_2d(
        &self,
        dst: CUdeviceptr,
        dst_pitch: usize,
        src: &Pinned,
        c: &Strided,
    ) -> Result<()> {
        let start = c.staging_offset;
        check_range(&(start..start.saturating_add(c.staging_span())), src.len)?;
        let copy = memcpy_2d(
            Side::Host(src.ptr.wrapping_add(start)),
            c.staging_pitch,
            Side::Device(dst),
            dst_pitch,
            c,
        );
        // SAFETY: the source rows lie in the pinned allocation (checked); the caller keeps it
        // alive and unmodified until the event recorded after this copy completes, and the
        // destination rows lie in a device region (the caller checked their span).
        call("cuMemcpy2DAsync", unsafe {
            sys::cuMemcpy2DAsync_v2(&copy, self.s)
        })
    }

    /// Queues the 2-D copy `c` from the device into `dst`: row `r` from `src + r · src_pitch`
    /// to `dst[c.staging_offset + r · c.staging_pitch..]`.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn dtoh_2d(
        &self,
        dst: &mut Pinned,
        src: CUdeviceptr,
        src_pitch: usize,
        c: &Strided,
    ) -> Result<()> {
        let start = c.staging_offset;
        check_range(&(start..start.saturating_add(c.staging_span())), dst.len)?;
        let copy = memcpy_2d(
            Side::Device(src),
            src_pitch,
            Side::Host(dst.ptr.wrapping_add(start)),
            c.staging_pitch,
            c,
        );
        // SAFETY: the destination rows lie in the pinned allocation (checked), which the caller
        // keeps alive and does not read until the event recorded after this completes; the
        // source rows lie in a device region (the caller checked their span).
        call("cuMemcpy2DAsync", unsafe {
            sys::cuMemcpy2DAsync_v2(&copy, self.s)
        })
    }

    /// Waits for everything queued so far.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream is live.
        call("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.s)
        })
    }

    /// Records an event after everything queued so far. A wait on it sleeps until the device
    /// signals it (blocking sync), rather than spinning a core.
    #[expect(unsafe_code, reason = "CUDA driver calls")]
    pub fn record(&self) -> Result<Event> {
        let mut e: CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
            | sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
        // SAFETY: a valid out-pointer; the stream is live.
        unsafe {
            call("cuEventCreate", sys::cuEventCreate(&mut e, flags))?;
            let ev = Event {
                cuda: self.cuda.clone(),
                e,
            };
            call("cuEventRecord", sys::cuEventRecord(ev.e, self.s))?;
            Ok(ev)
        }
    }
}

impl Drop for Stream {
    #[expect(unsafe_code, reason = "CUDA driver calls")]
    fn drop(&mut self) {
        if self.cuda.bind().is_err() {
            released(CUresult::CUDA_ERROR_INVALID_CONTEXT);
            return;
        }
        // SAFETY: the stream was created in `new` and is destroyed once, here, after the
        // copies queued on it have finished (their memory may be released next).
        unsafe {
            released(sys::cuStreamSynchronize(self.s));
            released(sys::cuStreamDestroy_v2(self.s));
        }
    }
}

impl Event {
    /// Waits until the event completes.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn wait(&self) -> Result<()> {
        // SAFETY: the event was created and recorded in `Stream::record`.
        call("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.e)
        })
    }
}

impl Drop for Event {
    #[expect(unsafe_code, reason = "CUDA driver call")]
    fn drop(&mut self) {
        if self.cuda.bind().is_err() {
            released(CUresult::CUDA_ERROR_INVALID_CONTEXT);
            return;
        }
        // SAFETY: created in `Stream::record`, destroyed once, here.
        released(unsafe { sys::cuEventDestroy_v2(self.e) });
    }
}

/// One side of a 2-D copy.
enum Side {
    Host(*mut u8),
    Device(CUdeviceptr),
}

/// The driver's description of the 2-D copy `c` from `src` to `dst`.
fn memcpy_2d(
    src: Side,
    src_pitch: usize,
    dst: Side,
    dst_pitch: usize,
    c: &Strided,
) -> sys::CUDA_MEMCPY2D_st {
    let host = sys::CUmemorytype::CU_MEMORYTYPE_HOST;
    let device = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE;
    let (src_type, src_host, src_device) = match src {
        Side::Host(p) => (host, p.cast_const().cast(), 0),
        Side::Device(d) => (device, std::ptr::null(), d),
    };
    let (dst_type, dst_host, dst_device) = match dst {
        Side::Host(p) => (host, p.cast(), 0),
        Side::Device(d) => (device, std::ptr::null_mut(), d),
    };
    sys::CUDA_MEMCPY2D_st {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: src_type,
        srcHost: src_host,
        srcDevice: src_device,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: dst_type,
        dstHost: dst_host,
        dstDevice: dst_device,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: c.len,
        Height: c.rows,
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
    cuda: Cuda,
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
    /// Opens the memory another process exported with `cuIpcGetMemHandle`, in `cuda`'s
    /// context: the region is the `len` bytes (the registration's pages × page bytes) from
    /// byte `offset` of the allocation, which must hold them all (the driver says how large it
    /// is; an engine's claim is not trusted) and lie on `cuda`'s device (peer access would
    /// otherwise map another device's memory here without a word).
    #[expect(unsafe_code, reason = "CUDA driver calls")]
    pub fn open_ipc(cuda: &Cuda, handle: [u8; 64], offset: u64, len: u64) -> Result<Self> {
        cuda.bind()?;
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
            cuda: cuda.clone(),
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
        let mut ordinal: i32 = -1;
        // SAFETY: a valid out-pointer of the attribute's type (an int) and an opened address.
        unsafe {
            call(
                "cuPointerGetAttribute",
                sys::cuPointerGetAttribute(
                    (&raw mut ordinal).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                    base,
                ),
            )?;
        }
        if ordinal != cuda.device() {
            return Err(Error::Geometry(format!(
                "the exported memory lies on CUDA device {ordinal}, not on device {} ({})",
                cuda.device(),
                uuid_text(&cuda.uuid())
            )));
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

    /// `len` bytes of device memory of this process, on `cuda`'s device.
    #[expect(unsafe_code, reason = "CUDA driver call")]
    pub fn alloc(cuda: &Cuda, len: u64) -> Result<Self> {
        cuda.bind()?;
        let mut base: CUdeviceptr = 0;
        let bytes = usize::try_from(len).map_err(|_| Error::Geometry("region too large".into()))?;
        // SAFETY: a valid out-pointer.
        unsafe {
            call("cuMemAlloc", sys::cuMemAlloc_v2(&mut base, bytes.max(1)))?;
        }
        Ok(Self {
            cuda: cuda.clone(),
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
        if self.cuda.bind().is_err() {
            released(CUresult::CUDA_ERROR_INVALID_CONTEXT);
            return;
        }
        // SAFETY: `base` was opened or allocated by this value and is released once, here.
        // Whoever copies into it drains their stream first (a pool's copier goes before it).
        released(unsafe {
            if self.ipc {
                sys::cuIpcCloseMemHandle(self.base)
            } else {
                sys::cuMemFree_v2(self.base)
            }
        });
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
