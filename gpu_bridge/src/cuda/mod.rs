//! The CUDA backend (feature `cuda`): engine KV tensors in device memory, opened by IPC handle.
//! Pages are filled and read through pinned host staging buffers, copied on a stream.
//! Each batch ends with an event ([`crate::staging`] plans the batches).
//! A batch's leases end when its event completes.
//!
//! The driver library is loaded at run time.
//! [`Cuda::open`] first checks that it is present (cudarc panics on a missing libcuda).
//! Without it, [`Cuda::open`] returns [`crate::Error::Device`]: callers fall back to the host
//! backend and say why.
//! Every driver call goes through [`call`], which names the failing call in its error.
//!
//! The files split by role: `driver` holds every driver call and so all the `unsafe`;
//! `copier` (the staged batches) and `pool` ([`CudaPool`]) hold none.

mod copier;
mod driver;
mod pool;

pub use copier::DeviceCopier;
pub use driver::{
    Cuda, DeviceInfo, DeviceRegion, Event, Pinned, Stream, call, release_failures, uuid_text,
};
pub use pool::CudaPool;
