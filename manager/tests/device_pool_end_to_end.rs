//! The daemon's device path end to end, on a GPU (ignored by default: the prepared device run
//! runs it with `--ignored`). The test re-executes itself as the engine, since the driver
//! refuses to open an IPC handle in the process that exported it. The engine allocates device
//! memory, fills four pages, exports the allocation and registers it with the daemon of this
//! process as a device pool (by the device's UUID). The daemon copies the pages out (Publish),
//! then into four other pages (a staged Load), which the engine reads back on the device
//! byte-exact; a Load naming a page's old generation is refused and the page left alone.

#![cfg(feature = "cuda")]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::pages::{acquire, block_bytes, load, publish};
use common::{Daemon, seal_at};
use orbitkv_gpu_bridge::cuda::{Cuda, DeviceCopier, DeviceRegion};
use orbitkv_gpu_bridge::staging::Item;
use orbitkv_gpu_bridge::{HostPool, PageMemory};
use orbitkv_protocol::PageStatus;
use orbitkv_sim::SimInstance;

/// Set in the engine's environment: the daemon's socket.
const ENGINE: &str = "ORBITKV_DEVICE_TEST_SOCKET";
const PAGES: u32 = 16;
const TEST: &str = "a_device_pool_publishes_and_loads_through_the_daemon";

#[test]
#[ignore = "needs a GPU: the prepared device run runs it"]
fn a_device_pool_publishes_and_loads_through_the_daemon() {
    if let Ok(socket) = std::env::var(ENGINE) {
        engine(std::path::Path::new(&socket));
        return;
    }
    let d = Daemon::start();
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let mut child = Command::new(exe)
        .args(["--exact", TEST, "--ignored", "--nocapture"])
        .env(ENGINE, &d.socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting the engine: {e}"));
    let deadline = Instant::now() + Duration::from_secs(45);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the engine did not finish within 45 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut said = String::new();
    if let Some(mut out) = child.stdout.take() {
        use std::io::Read;
        let _ = out.read_to_string(&mut said);
    }
    println!("{said}");
    assert!(
        status.success() && said.contains("engine: every check held"),
        "{said}"
    );
}

/// The engine's side: device pages registered, published, loaded back, read on the device.
fn engine(socket: &std::path::Path) {
    let cuda = Cuda::open(0).unwrap_or_else(|e| panic!("{e}"));
    let sim = SimInstance::new("device-e2e", 1);
    let spec = sim.pool_spec(1, PAGES);
    let region = DeviceRegion::alloc(&cuda, spec.page_bytes * u64::from(PAGES))
        .unwrap_or_else(|e| panic!("{e}"));
    let states = HostPool::create_states(spec.clone()).unwrap_or_else(|e| panic!("{e}"));
    let mut copier = DeviceCopier::new(&cuda, 16 << 20).unwrap_or_else(|e| panic!("{e}"));
    let item = |index: u32| Item {
        page: states.page_ref(index).unwrap_or_else(|e| panic!("{e}")),
        group: 0,
        layers: 0..spec.groups[0].layers,
    };
    // Blocks 0..4 in pages 0..4, written as the engine's kernels would; page 12 holds other
    // bytes, which a refused Load must leave alone.
    let blocks: Vec<Vec<u8>> = (0..4).map(|b| block_bytes(&sim, b)).collect();
    let sentinel = block_bytes(&sim, 77);
    let mut refs: Vec<&[u8]> = blocks.iter().map(Vec::as_slice).collect();
    refs.push(&sentinel);
    let items: Vec<Item> = [0, 1, 2, 3, 12].into_iter().map(item).collect();
    copier
        .load(&region, &spec, &items, &refs, |_| {})
        .unwrap_or_else(|e| panic!("{e}"));
    let mut s = seal_at(socket, &sim);
    let memory = PageMemory::Device {
        device: cuda.device(),
        uuid: cuda.uuid(),
        ipc_handle: region.export_ipc().unwrap_or_else(|e| panic!("{e}")),
        offset: 0,
    };
    let (worker, token) = &mut s.workers[0];
    worker
        .register_pool(*token, spec.clone(), memory, states.fd())
        .unwrap_or_else(|e| panic!("registering the device pool: {e}"));
    let pages: Vec<_> = (0..4).map(|b| (b, item(b).page)).collect();
    assert_eq!(publish(&mut s, &sim, &pages), vec![PageStatus::Ok; 4]);
    // Loaded into pages 8..12 at new generations; page 12's old generation is refused.
    let (lease, boundary) = acquire(&mut s, 4, 4 * u64::from(sim.block_tokens));
    assert_eq!(boundary, 4 * u64::from(sim.block_tokens));
    let layers = spec.groups[0].layers;
    let dst: Vec<_> = (8..12)
        .map(|i| states.reuse(i).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let old = states.page_ref(12).unwrap_or_else(|e| panic!("{e}"));
    let _new = states.reuse(12).unwrap_or_else(|e| panic!("{e}"));
    let mut wanted: Vec<_> = (0..4).map(|b| (b, dst[b as usize], 0, layers)).collect();
    wanted.push((0, old, 0, layers));
    let st = load(&mut s, lease, &wanted);
    let mut ok = vec![PageStatus::Ok; 4];
    ok.push(PageStatus::StaleGeneration);
    assert_eq!(st, ok);
    let back: Vec<Item> = (8..13).map(item).collect();
    let mut outs = vec![Vec::new(); back.len()];
    copier
        .copy_out(&region, &spec, &back, |i, b| outs[i].extend_from_slice(b))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        outs[..4] == blocks[..],
        "the loaded pages differ from the published ones"
    );
    assert!(outs[4] == sentinel, "a refused Load wrote into the page");
    println!("engine: every check held");
}
