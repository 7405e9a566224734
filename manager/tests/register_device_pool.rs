//! A device pool — pages in CUDA device memory, registered with the allocation's IPC handle and
//! a region holding only the pages' state words — on a daemon that cannot open it (built
//! without the CUDA backend, or with it on a machine without the driver) is refused with
//! `Unsupported` and a detail saying why; a region that is not a states-only one is refused as
//! malformed; nothing is registered either way, and the same worker then registers a host pool
//! under the same pool id.

mod common;

use common::{Daemon, seal};
use orbitkv_gpu_bridge::{HostPool, PageMemory};
use orbitkv_protocol::ErrorCode;
use orbitkv_protocol::client::ClientError;
use orbitkv_sim::SimInstance;

/// What the refusal may name on this build and machine (one of these).
fn expected_reasons() -> &'static [&'static str] {
    #[cfg(feature = "cuda")]
    {
        if orbitkv_gpu_bridge::cuda::Cuda::driver_present() {
            // A driver and a GPU: a handle no process exported. A driver and no GPU: cuInit says
            // there is no device, or there are none to choose from.
            &["cuIpcOpenMemHandle", "cuInit", "device 0 of 0"]
        } else {
            &["no CUDA driver library"]
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        &["built without the CUDA backend"]
    }
}

#[test]
fn a_device_pool_the_daemon_cannot_open_is_refused_saying_why() {
    let d = Daemon::start();
    let sim = SimInstance::new("device", 1);
    let mut s = seal(&d, &sim);
    let (worker, token) = &mut s.workers[0];
    let token = *token;
    let device = PageMemory::Device {
        device: 0,
        uuid: [0; 16],
        ipc_handle: [7; 64],
        offset: 0,
    };
    let states = HostPool::create_states(sim.pool_spec(1, 4)).unwrap_or_else(|e| panic!("{e}"));
    match worker.register_pool(token, sim.pool_spec(1, 4), device, states.fd()) {
        Err(ClientError::Refused {
            code: ErrorCode::Unsupported,
            detail,
            ..
        }) => {
            assert!(detail.contains("device pool 1"), "{detail}");
            assert!(
                expected_reasons().iter().any(|r| detail.contains(r)),
                "{detail}"
            );
        }
        other => panic!("a device pool registered without a device: {other:?}"),
    }
    // A host pool's region is not a device pool's state words.
    let host = HostPool::create(sim.pool_spec(1, 4)).unwrap_or_else(|e| panic!("{e}"));
    match worker.register_pool(token, sim.pool_spec(1, 4), device, host.fd()) {
        Err(ClientError::Refused {
            code: ErrorCode::Malformed,
            detail,
            ..
        }) => assert!(detail.contains("registration implies"), "{detail}"),
        other => panic!("a host region taken as a device pool's states: {other:?}"),
    }
    // Nothing was registered (a second registration of a pool id under the same epoch is
    // refused): the same pool id now registers as a host pool, and the connection still serves.
    worker
        .register_pool(token, sim.pool_spec(1, 4), PageMemory::Host, host.fd())
        .unwrap_or_else(|e| panic!("{e}"));
    let stats = worker.stats().unwrap_or_else(|e| panic!("{e}"));
    assert!(stats.contains("orbitkv_sessions"), "{stats}");
}
