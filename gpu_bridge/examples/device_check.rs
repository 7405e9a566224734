//! On a machine with an NVIDIA GPU (run by `gpu_bridge/device-check.sh`, never by CI): the CUDA
//! backend's copy bandwidth into device pages against a raw `cuMemcpyHtoDAsync` of the same
//! bytes from pinned memory, in the same run; its fencing on device memory through state words
//! shared as an engine shares them; and a pool opened from an IPC handle in another process (a
//! child of this one: the driver refuses to open a handle in the process that exported it),
//! byte-exact, with a region larger than the exported allocation refused. Exits 0 when every
//! check holds and the batched ratio reaches 0.9, 1 otherwise, 2 without a usable device.

use std::sync::Arc;
use std::time::Instant;

use orbitkv_gpu_bridge::cuda::{Cuda, CudaPool, DeviceCopier, DeviceRegion, Pinned, Stream};
use orbitkv_gpu_bridge::staging::Item;
use orbitkv_gpu_bridge::{
    Bridge, Error, FencedStates, GroupGeometry, HostPool, PoolId, PoolSpec, StagedLoad,
};

const PAGES: u32 = 64;
const LAYERS: u32 = 32;
const LAYER_BYTES: u64 = 64 << 10;
const ROUNDS: usize = 7;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn spec() -> PoolSpec {
    PoolSpec {
        pool: PoolId(1),
        page_bytes: u64::from(LAYERS) * LAYER_BYTES,
        pages: PAGES,
        aliased: false,
        groups: vec![GroupGeometry {
            group: 0,
            layers: LAYERS,
            offset: 0,
            layer_stride: LAYER_BYTES,
            layer_bytes: LAYER_BYTES,
            page_stride: u64::from(LAYERS) * LAYER_BYTES,
            parts: 1,
            part_stride: 0,
            layers_inside: false,
        }],
    }
}

fn run() -> Result<bool, Error> {
    let cuda = Cuda::open(0)?;
    let spec = spec();
    let page = spec.page_bytes as usize;
    let total = page * PAGES as usize;
    let region = DeviceRegion::alloc(total as u64)?;
    let sources: Vec<Vec<u8>> = (0..PAGES)
        .map(|p| {
            (0..page)
                .map(|i| (i as u32 ^ p.wrapping_mul(2_654_435_761)) as u8)
                .collect()
        })
        .collect();
    let gb = |secs: f64| total as f64 / secs / 1e9;

    // Baseline: one raw async copy of the same bytes from pinned memory.
    let mut pinned = Pinned::new(total)?;
    for (p, s) in sources.iter().enumerate() {
        pinned.as_mut_slice()[p * page..][..page].copy_from_slice(s);
    }
    let stream = Stream::new()?;
    // Batched bridge copies: host bytes staged through 64 MiB of pinned memory.
    let mut copier = DeviceCopier::new(64 << 20)?;
    let items: Vec<Item> = (0..PAGES)
        .map(|i| Item {
            page: orbitkv_gpu_bridge::PageRef {
                pool: PoolId(1),
                index: i,
                generation: 1,
            },
            group: 0,
            layers: 0..LAYERS,
        })
        .collect();
    let srcs: Vec<&[u8]> = sources.iter().map(Vec::as_slice).collect();
    let (mut raw, mut batched) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        stream.htod(region.at(0, total)?, &pinned, 0..total)?;
        stream.record()?.wait()?;
        raw.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut done = 0;
        copier.load(&region, &spec, &items, &srcs, |_| done += 1)?;
        batched.push(t.elapsed().as_secs_f64());
        assert_eq!(done, items.len());
    }
    let (r, b) = (median(raw), median(batched));
    println!(
        "copy {PAGES} pages x {} MiB: raw cuMemcpyHtoDAsync from pinned {:.2} GB/s, bridge batched (pageable -> pinned staging -> device) {:.2} GB/s; bridge / raw = {:.3} (target >= 0.9)",
        page >> 20,
        gb(r),
        gb(b),
        r / b
    );
    let mut ok = r / b >= 0.9;

    // Round trip through the bridge, page by page, and fencing on device memory.
    // The engine's side keeps the page state words in shared memory; the manager's side maps
    // them, as a registration through the daemon does.
    let engine = HostPool::create_states(spec.clone())?;
    let dup = engine
        .fd()
        .try_clone_to_owned()
        .map_err(|source| Error::Io {
            what: "duplicating the state region's descriptor",
            source,
        })?;
    let states = FencedStates::attach(dup, &spec)?;
    let ipc_ok = check_ipc(&region, &sources[1], page)?;
    ok &= ipc_ok;
    let pool = Arc::new(CudaPool::new(
        cuda,
        spec.clone(),
        7,
        region,
        states,
        16 << 20,
    )?);
    let bridge = Bridge::new();
    bridge.register(pool.clone())?;
    let mut per_page = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        for (i, s) in sources.iter().enumerate() {
            let lease = bridge.lease(7, engine.page_ref(i as u32)?)?;
            bridge.load(&lease, 0, 0..LAYERS, s)?;
        }
        per_page.push(t.elapsed().as_secs_f64());
    }
    println!(
        "bridge Load page by page (one event per page): {:.2} GB/s; / raw = {:.3}",
        gb(median(per_page.clone())),
        r / median(per_page)
    );
    let mut out = Vec::new();
    let p0 = engine.page_ref(0)?;
    let lease = bridge.lease(7, p0)?;
    bridge.publish(&lease, 0, &mut out)?;
    let round_trip = out == sources[0];
    println!("round trip of page 0 byte-exact: {round_trip}");
    ok &= round_trip;
    let refused_while_leased = matches!(engine.reuse(0), Err(Error::PageLeased { .. }));
    println!("reuse refused while leased: {refused_while_leased}");
    ok &= refused_while_leased;
    drop(lease);
    let p0_new = engine.reuse(0)?;
    let stale = match bridge.lease(7, p0) {
        Err(Error::StaleGeneration { .. }) => true,
        Ok(l) => bridge.load(&l, 0, 0..LAYERS, &sources[1]).is_err(),
        Err(_) => false,
    };
    let lease = bridge.lease(7, p0_new)?;
    bridge.publish(&lease, 0, &mut out)?;
    let untouched = out == sources[0];
    println!("stale reference refused: {stale}; device page untouched: {untouched}");
    ok &= stale && untouched;
    let wrong_epoch = bridge.lease(8, p0_new).is_err();
    println!("old epoch refused: {wrong_epoch}");
    ok &= wrong_epoch;
    drop(lease);

    // A staged Load (what a daemon Load into a device pool runs: the store fills the staging
    // halves) of new bytes into every page, page 5's fill failing: every other page completes
    // with its new bytes, page 5 keeps its old ones.
    let fresh: Vec<Vec<u8>> = sources
        .iter()
        .map(|s| s.iter().map(|b| !b).collect())
        .collect();
    let items = (0..PAGES)
        .map(|i| {
            Ok(Item {
                page: engine.page_ref(i)?,
                group: 0,
                layers: 0..LAYERS,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let mut completed = 0;
    let t = Instant::now();
    pool.load_staged(
        &items,
        &mut |i, dst| {
            if i == 5 {
                return false;
            }
            dst.copy_from_slice(&fresh[i]);
            true
        },
        &mut |_, r| completed += usize::from(r.is_ok()),
    )?;
    let staged_secs = t.elapsed().as_secs_f64();
    let read_back = |i: u32| -> Result<Vec<u8>, Error> {
        let lease = bridge.lease(7, engine.page_ref(i)?)?;
        let mut out = Vec::new();
        bridge.publish(&lease, 0, &mut out)?;
        Ok(out)
    };
    let others_new = read_back(4)? == fresh[4] && read_back(6)? == fresh[6];
    let skipped_old = read_back(5)? == sources[5];
    println!(
        "staged Load: {completed} of {} pages completed ({:.2} GB/s), the others hold their new bytes {others_new}, the unfilled page its old ones {skipped_old}",
        PAGES - 1,
        gb(staged_secs)
    );
    ok &= completed == PAGES as usize - 1 && others_new && skipped_old;
    Ok(ok)
}

/// A cheap digest of bytes, computed alike in both processes.
fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Exports `region` and has a child process open page 1 of it from the handle (offset one
/// page, one page long), copy it out and print its digest; and try a region one byte longer
/// than the allocation, which must be refused.
fn check_ipc(region: &DeviceRegion, page1: &[u8], page: usize) -> Result<bool, Error> {
    let handle = region.export_ipc()?;
    let exe = std::env::current_exe().map_err(|source| Error::Io {
        what: "finding this program",
        source,
    })?;
    let out = std::process::Command::new(exe)
        .args(["--open-ipc", &hex(&handle), &page.to_string()])
        .output()
        .map_err(|source| Error::Io {
            what: "running the IPC child",
            source,
        })?;
    let said = String::from_utf8_lossy(&out.stdout);
    let exact = said.contains(&format!("digest {:016x}", digest(page1)));
    let oversize = said.contains("oversize refused: true");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    println!(
        "pool opened from an IPC handle in another process: page byte-exact {exact}; a region past the allocation refused {oversize}"
    );
    Ok(out.status.success() && exact && oversize)
}

/// The child's side of [`check_ipc`].
fn open_ipc_child(handle_hex: &str, page: &str) -> Result<(), Error> {
    let bad = |what: &str| Error::Geometry(format!("bad {what} argument"));
    let page: usize = page.parse().map_err(|_| bad("page size"))?;
    let mut handle = [0u8; 64];
    for (i, b) in handle.iter_mut().enumerate() {
        *b = handle_hex
            .get(2 * i..2 * i + 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .ok_or_else(|| bad("handle"))?;
    }
    let _cuda = Cuda::open(0)?;
    let total = page as u64 * u64::from(PAGES);
    // One byte past the allocation: refused, and the handle closed again.
    let oversize = matches!(
        DeviceRegion::open_ipc(handle, page as u64, total),
        Err(Error::Geometry(_))
    );
    let region = DeviceRegion::open_ipc(handle, page as u64, page as u64)?;
    let stream = Stream::new()?;
    let mut pinned = Pinned::new(page)?;
    stream.dtoh(&mut pinned, 0..page, region.at(0, page)?)?;
    stream.record()?.wait()?;
    println!("digest {:016x}", digest(pinned.as_slice()));
    println!("oversize refused: {oversize}");
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, handle, page] = args.as_slice()
        && flag == "--open-ipc"
    {
        return match open_ipc_child(handle, page) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("device check (IPC child): {e}");
                std::process::ExitCode::from(1)
            }
        };
    }
    match run() {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("device check: {e}");
            std::process::ExitCode::from(if matches!(e, Error::Device { .. }) {
                2
            } else {
                1
            })
        }
    }
}
