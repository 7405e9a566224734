//! On a machine with an NVIDIA GPU (the prepared device run, never CI): the CUDA backend checked
//! on device 0, each check on its own, printing `PASS <name>` or `FAIL <name>: <why>`, and a
//! last line `N passed, M failed`:
//!
//! - `bandwidth`: the bridge's batched, double-buffered copy out of pinned staging already
//!   filled, against raw `cuMemcpyHtoDAsync`s of the same pinned bytes on the same stream, after
//!   a discarded warm-up round (target >= 0.9). Beside it, not gated: the end-to-end figure from pageable
//!   memory and its own ceiling (a timed single-thread pageable -> pinned copy);
//! - `strided`: a geometry with K and V apart in every layer (one 2-D copy per page), byte-exact
//!   both ways, its bandwidth printed beside the packed one;
//! - the fencing of device pages through state words shared as an engine shares them: a round
//!   trip byte-exact, reuse refused while leased, a stale generation and an old epoch refused
//!   with the page untouched, a Publish's batched copy-out byte-exact (its rate printed beside
//!   page by page's; a page of no group refused alone), a staged Load whose unfilled page is
//!   left alone;
//! - `ipc`, last: a pool opened from an IPC handle in another process (a child of this one: the
//!   driver refuses a handle in the process that exported it), byte-exact, a region past the
//!   allocation refused; the child is killed after a deadline.
//!
//! Exit 0: every check passed; 1: one failed; 2: no device could be opened.

use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orbitkv_gpu_bridge::cuda::{Cuda, CudaPool, DeviceCopier, DeviceRegion, Pinned, Stream};
use orbitkv_gpu_bridge::staging::Item;
use orbitkv_gpu_bridge::{
    Bridge, CopyOut, Error, FencedStates, GroupGeometry, HostPool, PageRef, PoolId, PoolSpec,
    StagedLoad,
};

const PAGES: u32 = 64;
const LAYERS: u32 = 32;
const LAYER_BYTES: u64 = 64 << 10;
const ROUNDS: usize = 7;
const STAGING: usize = 64 << 20;
/// How long the IPC child may take.
const CHILD_DEADLINE: Duration = Duration::from_secs(20);

type Outcome = Result<(), String>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn err(e: Error) -> String {
    e.to_string()
}

/// Pages of every layer packed (`parts` 1), or each layer's K and V apart (`parts` 2: the K
/// halves of every page first, then the V halves).
fn spec(parts: u32) -> PoolSpec {
    let page_bytes = u64::from(LAYERS) * LAYER_BYTES;
    let run = LAYER_BYTES / u64::from(parts);
    PoolSpec {
        pool: PoolId(1),
        page_bytes,
        pages: PAGES,
        aliased: false,
        groups: vec![GroupGeometry {
            group: 0,
            layers: LAYERS,
            offset: 0,
            layer_stride: run,
            layer_bytes: LAYER_BYTES,
            page_stride: u64::from(LAYERS) * run,
            parts,
            part_stride: if parts > 1 {
                page_bytes * u64::from(PAGES) / 2
            } else {
                0
            },
            layers_inside: false,
        }],
    }
}

fn items(engine: Option<&HostPool>) -> Result<Vec<Item>, Error> {
    (0..PAGES)
        .map(|index| {
            Ok(Item {
                page: match engine {
                    Some(e) => e.page_ref(index)?,
                    None => PageRef {
                        pool: PoolId(1),
                        index,
                        generation: 1,
                    },
                },
                group: 0,
                layers: 0..LAYERS,
            })
        })
        .collect()
}

fn sources(page: usize, salt: u32) -> Vec<Vec<u8>> {
    (0..PAGES)
        .map(|p| {
            (0..page)
                .map(|i| (i as u32 ^ p.wrapping_mul(2_654_435_761) ^ salt) as u8)
                .collect()
        })
        .collect()
}

/// The checks' tally.
#[derive(Default)]
struct Tally {
    passed: u32,
    failed: u32,
}

impl Tally {
    fn record(&mut self, name: &str, outcome: Outcome) {
        match outcome {
            Ok(()) => {
                self.passed += 1;
                println!("PASS {name}");
            }
            Err(why) => {
                self.failed += 1;
                println!("FAIL {name}: {why}");
            }
        }
    }
}

/// The bridge's batched copy out of filled pinned staging against raw copies of the same pinned
/// bytes; then, not gated, the copy from pageable memory beside its ceiling.
fn bandwidth(cuda: &Cuda) -> Outcome {
    let spec = spec(1);
    let page = spec.page_bytes as usize;
    let total = page * PAGES as usize;
    let gb = |secs: f64| total as f64 / secs / 1e9;
    let region = DeviceRegion::alloc(cuda, total as u64).map_err(err)?;
    let items = items(None).map_err(err)?;
    let mut copier = DeviceCopier::new(cuda, STAGING).map_err(err)?;
    let (mut raw, mut batched) = (Vec::new(), Vec::new());
    // Round 0 is a warm-up, discarded. The raw copy sends the copier's own staging halves on its
    // own stream.
    for round in 0..=ROUNDS {
        let t = Instant::now();
        copier.copy_staged_raw(&region, total).map_err(err)?;
        let raw_secs = t.elapsed().as_secs_f64();
        let t = Instant::now();
        // The staging is filled already: the fill writes nothing.
        copier
            .load_with(&region, &spec, &items, |_, _| true, |_| true, |_| {})
            .map_err(err)?;
        let batched_secs = t.elapsed().as_secs_f64();
        if round > 0 {
            raw.push(raw_secs);
            batched.push(batched_secs);
        }
    }
    let (r, b) = (median(raw), median(batched));
    println!(
        "  {PAGES} pages x {} MiB out of filled pinned staging: raw cuMemcpyHtoDAsync {:.2} GB/s, bridge batched {:.2} GB/s; bridge / raw = {:.3} (target >= 0.9)",
        page >> 20,
        gb(r),
        gb(b),
        r / b
    );
    // Not gated: from pageable memory, as a Load from the store fills the staging.
    let srcs = sources(page, 0);
    let refs: Vec<&[u8]> = srcs.iter().map(Vec::as_slice).collect();
    let mut pinned = Pinned::new(cuda, total).map_err(err)?;
    let (mut e2e, mut ceiling) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let t = Instant::now();
        copier
            .load(&region, &spec, &items, &refs, |_| {})
            .map_err(err)?;
        e2e.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        for (p, s) in srcs.iter().enumerate() {
            pinned.as_mut_slice()[p * page..][..page].copy_from_slice(s);
        }
        ceiling.push(t.elapsed().as_secs_f64());
    }
    println!(
        "  from pageable memory (not gated): bridge {:.2} GB/s; its ceiling, one thread copying pageable -> pinned, {:.2} GB/s",
        gb(median(e2e)),
        gb(median(ceiling))
    );
    if r / b >= 0.9 {
        Ok(())
    } else {
        Err(format!("bridge / raw = {:.3}, under 0.9", r / b))
    }
}

/// K and V apart in every layer: each page is 2 × 32 runs, one 2-D copy per part and page.
fn strided(cuda: &Cuda) -> Outcome {
    let (packed, split) = (spec(1), spec(2));
    let page = packed.page_bytes as usize;
    let total = page * PAGES as usize;
    let gb = |secs: f64| total as f64 / secs / 1e9;
    let items = items(None).map_err(err)?;
    let srcs = sources(page, 7);
    let refs: Vec<&[u8]> = srcs.iter().map(Vec::as_slice).collect();
    let mut copier = DeviceCopier::new(cuda, STAGING).map_err(err)?;
    let mut secs = [Vec::new(), Vec::new()];
    for (k, spec) in [&packed, &split].into_iter().enumerate() {
        let region = DeviceRegion::alloc(cuda, total as u64).map_err(err)?;
        for _ in 0..3 {
            let t = Instant::now();
            copier
                .load(&region, spec, &items, &refs, |_| {})
                .map_err(err)?;
            secs[k].push(t.elapsed().as_secs_f64());
        }
        let mut outs = vec![Vec::new(); items.len()];
        copier
            .copy_out(&region, spec, &items, |i, b| outs[i].extend_from_slice(b))
            .map_err(err)?;
        if outs != srcs {
            return Err(format!(
                "{} pages read back differ",
                ["packed", "strided"][k]
            ));
        }
    }
    let [p, s] = secs.map(median);
    println!(
        "  Load from pageable memory: packed {:.2} GB/s, K and V apart {:.2} GB/s; strided / packed = {:.3}",
        gb(p),
        gb(s),
        p / s
    );
    Ok(())
}

/// A pool registered as the daemon registers one: device pages, state words the engine shares.
struct Fenced {
    engine: HostPool,
    pool: Arc<CudaPool>,
    bridge: Bridge,
    sources: Vec<Vec<u8>>,
}

impl Fenced {
    fn new(cuda: &Cuda) -> Result<Self, Error> {
        let spec = spec(1);
        let total = spec.page_bytes * u64::from(PAGES);
        let engine = HostPool::create_states(spec.clone())?;
        let dup = engine
            .fd()
            .try_clone_to_owned()
            .map_err(|source| Error::Io {
                what: "duplicating the state region's descriptor",
                source,
            })?;
        let states = FencedStates::attach(dup, &spec)?;
        let region = DeviceRegion::alloc(cuda, total)?;
        let pool = Arc::new(CudaPool::new(
            cuda.clone(),
            spec.clone(),
            7,
            region,
            states,
            16 << 20,
        )?);
        let bridge = Bridge::new();
        bridge.register(pool.clone())?;
        let sources = sources(spec.page_bytes as usize, 3);
        for (i, s) in sources.iter().enumerate() {
            let lease = bridge.lease(7, engine.page_ref(i as u32)?)?;
            bridge.load(&lease, 0, 0..LAYERS, s)?;
        }
        Ok(Self {
            engine,
            pool,
            bridge,
            sources,
        })
    }

    fn read(&self, index: u32) -> Result<Vec<u8>, Error> {
        let lease = self.bridge.lease(7, self.engine.page_ref(index)?)?;
        let mut out = Vec::new();
        self.bridge.publish(&lease, 0, &mut out)?;
        Ok(out)
    }

    fn round_trip(&self) -> Outcome {
        let exact = (0..PAGES).all(|i| self.read(i).is_ok_and(|b| b == self.sources[i as usize]));
        exact.then_some(()).ok_or("a page read back differs".into())
    }

    fn reuse_refused_while_leased(&self) -> Outcome {
        let lease = self
            .bridge
            .lease(7, self.engine.page_ref(0).map_err(err)?)
            .map_err(err)?;
        let r = self.engine.reuse(0);
        drop(lease);
        match r {
            Err(Error::PageLeased { .. }) => Ok(()),
            other => Err(format!("reuse while leased gave {other:?}")),
        }
    }

    fn stale_refused(&self) -> Outcome {
        let old = self.engine.page_ref(1).map_err(err)?;
        let new = self.engine.reuse(1).map_err(err)?;
        let refused = match self.bridge.lease(7, old) {
            Err(Error::StaleGeneration { .. }) => true,
            Ok(l) => self
                .bridge
                .load(&l, 0, 0..LAYERS, &self.sources[0])
                .is_err(),
            Err(_) => false,
        };
        let untouched = self.read(1).map_err(err)? == self.sources[1];
        let epoch = self.bridge.lease(8, new).is_err();
        match (refused, untouched, epoch) {
            (true, true, true) => Ok(()),
            _ => Err(format!(
                "stale refused {refused}, page untouched {untouched}, old epoch refused {epoch}"
            )),
        }
    }

    /// A Publish's copy-out of every page in one batched call, beside page by page: byte-exact,
    /// a page naming no group of the pool refused alone, and both rates (not gated).
    fn batched_copy_out(&self) -> Outcome {
        let leases = (0..PAGES)
            .map(|i| self.bridge.lease(7, self.engine.page_ref(i)?))
            .collect::<Result<Vec<_>, Error>>()
            .map_err(err)?;
        let page = self.sources[0].len();
        let mut best = [f64::MAX; 2];
        // The first round touches the buffers' memory; the best round reuses it.
        let mut outs = vec![Vec::new(); PAGES as usize];
        for _ in 0..3 {
            for o in &mut outs {
                o.clear();
            }
            let t = Instant::now();
            for (l, o) in leases.iter().zip(&mut outs) {
                self.bridge.publish_appending(l, 0, o).map_err(err)?;
            }
            best[0] = best[0].min(t.elapsed().as_secs_f64());
            for o in &mut outs {
                o.clear();
            }
            let mut pages: Vec<CopyOut<'_>> = leases
                .iter()
                .zip(&mut outs)
                .map(|(lease, out)| CopyOut {
                    lease,
                    group: 0,
                    out,
                })
                .collect();
            let t = Instant::now();
            let results = self.bridge.publish_appending_many(&mut pages);
            best[1] = best[1].min(t.elapsed().as_secs_f64());
            if let Some((i, e)) = results
                .into_iter()
                .enumerate()
                .find_map(|(i, r)| Some((i, r.err()?)))
            {
                return Err(format!("page {i} refused: {e}"));
            }
        }
        if outs != self.sources {
            return Err("a page copied out in a batch differs".into());
        }
        let (mut first, mut other, mut third) = (Vec::new(), Vec::new(), Vec::new());
        let mut pages: Vec<CopyOut<'_>> = leases
            .iter()
            .zip([0, 9, 0])
            .zip([&mut first, &mut other, &mut third])
            .map(|((lease, group), out)| CopyOut { lease, group, out })
            .collect();
        let results = self.bridge.publish_appending_many(&mut pages);
        let refused_alone = matches!(
            results.as_slice(),
            [Ok(()), Err(Error::Geometry(_)), Ok(())]
        ) && other.is_empty()
            && first == self.sources[0]
            && third == self.sources[2];
        let gb = |secs: f64| (page * PAGES as usize) as f64 / secs / 1e9;
        println!(
            "  Publish copy-out of {PAGES} pages: page by page {:.2} GB/s, batched {:.2} GB/s; batched / page by page = {:.3}",
            gb(best[0]),
            gb(best[1]),
            best[0] / best[1]
        );
        refused_alone.then_some(()).ok_or_else(|| {
            format!(
                "a page of no group gave {results:?}, its buffer {} bytes",
                other.len()
            )
        })
    }

    /// A staged Load (a daemon Load into a device pool) of new bytes into every page, page 5's
    /// fill failing: the others hold their new bytes, page 5 its old ones.
    fn staged_load(&self) -> Outcome {
        let fresh: Vec<Vec<u8>> = self
            .sources
            .iter()
            .map(|s| s.iter().map(|b| !b).collect())
            .collect();
        let items = items(Some(&self.engine)).map_err(err)?;
        let mut completed = 0;
        self.pool
            .load_staged(
                &items,
                &mut |i, dst| {
                    if i == 5 {
                        return false;
                    }
                    dst.copy_from_slice(&fresh[i]);
                    true
                },
                &mut |_| true,
                &mut |_, r| completed += usize::from(r.is_ok()),
            )
            .map_err(err)?;
        let others =
            self.read(4).map_err(err)? == fresh[4] && self.read(6).map_err(err)? == fresh[6];
        let skipped = self.read(5).map_err(err)? == self.sources[5];
        if completed == PAGES as usize - 1 && others && skipped {
            Ok(())
        } else {
            Err(format!(
                "{completed} of {} completed, others new {others}, the unfilled page old {skipped}",
                PAGES - 1
            ))
        }
    }
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

/// Exports a region holding known pages and has a child process open page 1 of it from the
/// handle (offset one page, one page long), copy it out and print its digest, and try a region
/// past the allocation, which must be refused. The child is killed after [`CHILD_DEADLINE`].
fn ipc(cuda: &Cuda) -> Outcome {
    let spec = spec(1);
    let page = spec.page_bytes as usize;
    let region = DeviceRegion::alloc(cuda, page as u64 * u64::from(PAGES)).map_err(err)?;
    let srcs = sources(page, 11);
    let refs: Vec<&[u8]> = srcs.iter().map(Vec::as_slice).collect();
    let items = items(None).map_err(err)?;
    DeviceCopier::new(cuda, STAGING)
        .and_then(|mut c| c.load(&region, &spec, &items, &refs, |_| {}))
        .map_err(err)?;
    let handle = region.export_ipc().map_err(err)?;
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let mut child = std::process::Command::new(exe)
        .args(["--open-ipc", &hex(&handle), &page.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting the child: {e}"))?;
    let deadline = Instant::now() + CHILD_DEADLINE;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "the child did not finish within {} s; killed",
                    CHILD_DEADLINE.as_secs()
                ));
            }
            Err(e) => return Err(format!("waiting for the child: {e}")),
        }
    };
    let mut said = String::new();
    if let Some(mut out) = child.stdout.take() {
        use std::io::Read;
        out.read_to_string(&mut said)
            .map_err(|e| format!("reading the child: {e}"))?;
    }
    let exact = said.contains(&format!("digest {:016x}", digest(&srcs[1])));
    let oversize = said.contains("oversize refused: true");
    match (status.success(), exact, oversize) {
        (true, true, true) => Ok(()),
        _ => Err(format!(
            "child {status}, page byte-exact {exact}, a region past the allocation refused {oversize}"
        )),
    }
}

/// The child's side of [`ipc`].
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
    let cuda = Cuda::open(0)?;
    let total = page as u64 * u64::from(PAGES);
    // One byte past the allocation: refused, and the handle closed again.
    let oversize = matches!(
        DeviceRegion::open_ipc(&cuda, handle, page as u64, total),
        Err(Error::Geometry(_))
    );
    let region = DeviceRegion::open_ipc(&cuda, handle, page as u64, page as u64)?;
    let stream = Stream::new(&cuda)?;
    let mut pinned = Pinned::new(&cuda, page)?;
    stream.dtoh(&mut pinned, 0..page, region.at(0, page)?)?;
    stream.record()?.wait()?;
    println!("digest {:016x}", digest(pinned.as_slice()));
    println!("oversize refused: {oversize}");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, handle, page] = args.as_slice()
        && flag == "--open-ipc"
    {
        return match open_ipc_child(handle, page) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("device check (IPC child): {e}");
                ExitCode::from(1)
            }
        };
    }
    let cuda = match Cuda::open(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("device check: no usable device: {e}");
            return ExitCode::from(2);
        }
    };
    let mut tally = Tally::default();
    tally.record("bandwidth", bandwidth(&cuda));
    tally.record("strided", strided(&cuda));
    match Fenced::new(&cuda) {
        Ok(f) => {
            tally.record("round trip", f.round_trip());
            tally.record("reuse refused while leased", f.reuse_refused_while_leased());
            tally.record("stale generation and old epoch refused", f.stale_refused());
            tally.record("batched copy-out", f.batched_copy_out());
            tally.record("staged load", f.staged_load());
        }
        Err(e) => tally.record("fenced pool", Err(format!("setting it up: {e}"))),
    }
    tally.record("ipc", ipc(&cuda));
    println!(
        "{} passed, {} failed; driver releases that failed: {}",
        tally.passed,
        tally.failed,
        orbitkv_gpu_bridge::cuda::release_failures()
    );
    if tally.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
