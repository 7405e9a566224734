//! The host backend across real processes: a child process (this test binary, re-run as the
//! "engine") owns a pool in shared memory and passes it over a Unix socket; the parent (the
//! "manager") attaches it, loads bytes into the engine's pages and publishes bytes out of them
//! under the fencing rules, and the engine checks every byte on its side.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use orbitkv_gpu_bridge::fdpass::{recv_with_fd, send_with_fd};
use orbitkv_gpu_bridge::{
    AttachedPool, Bridge, Error, GroupGeometry, HostPool, PagePool, PageRef, PoolId, PoolSpec,
};

const ENGINE_SOCKET: &str = "ORBITKV_TEST_ENGINE_SOCKET";
const EPOCH: u64 = 5;
const LAYERS: u32 = 4;
const LAYER_BYTES: u64 = 8 << 10;

fn spec() -> PoolSpec {
    // Two groups interleaved layer by layer, as a layer-strided KV layout puts them.
    let g = |group: u32, offset: u64| GroupGeometry {
        group,
        layers: LAYERS,
        offset,
        layer_stride: 2 * LAYER_BYTES,
        layer_bytes: LAYER_BYTES,
        page_stride: 2 * LAYER_BYTES * u64::from(LAYERS),
        parts: 1,
        part_stride: 0,
        layers_inside: false,
    };
    PoolSpec {
        pool: PoolId(7),
        page_bytes: 2 * LAYER_BYTES * u64::from(LAYERS),
        pages: 16,
        aliased: false,
        groups: vec![g(0, 0), g(1, LAYER_BYTES)],
    }
}

/// Bytes of layer `layer` of `group` in a page filled with `seed`.
fn layer_pattern(seed: u64, group: u32, layer: u32) -> Vec<u8> {
    orbitkv_testkit::payload(
        orbitkv_testkit::seed_of(seed, u64::from(group * 64 + layer)),
        LAYER_BYTES as usize,
    )
}

/// A record of `group` (its layers packed) for `seed`, layers `from..to`.
fn record(seed: u64, group: u32, from: u32, to: u32) -> Vec<u8> {
    (from..to)
        .flat_map(|l| layer_pattern(seed, group, l))
        .collect()
}

/// The engine: runs only when re-run as a child with [`ENGINE_SOCKET`] set.
#[test]
fn engine_process() {
    let Ok(path) = std::env::var(ENGINE_SOCKET) else {
        return;
    };
    let sock = UnixStream::connect(&path).unwrap_or_else(|e| panic!("connect: {e}"));
    let pool = HostPool::create(spec()).unwrap_or_else(|e| panic!("create: {e}"));
    send_with_fd(&sock, b"pool", pool.fd()).unwrap_or_else(|e| panic!("send: {e}"));
    let mut out = sock.try_clone().unwrap_or_else(|e| panic!("{e}"));
    let geometry = spec();
    for line in BufReader::new(sock).lines() {
        let line = line.unwrap_or_else(|e| panic!("{e}"));
        let w: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap_or_else(|e| panic!("{line}: {e}")))
            .collect();
        let reply = match line.split_whitespace().next() {
            // Reallocate page i and fill it with `seed`: the new generation.
            Some("fill") => match pool.reuse(w[0] as u32) {
                Ok(r) => {
                    for g in &geometry.groups {
                        for l in 0..LAYERS {
                            let at = g.offset + u64::from(l) * g.layer_stride;
                            let bytes = layer_pattern(w[1], g.group, l);
                            pool.write(r.index, at, &bytes)
                                .unwrap_or_else(|e| panic!("{e}"));
                        }
                    }
                    format!("gen {}", r.generation)
                }
                Err(Error::PageLeased { .. }) => "leased".to_owned(),
                Err(e) => panic!("{e}"),
            },
            // Does page i hold, for group g, layers from..to of `seed`?
            Some("check") => {
                let (i, seed, g, from, to) =
                    (w[0] as u32, w[1], w[2] as u32, w[3] as u32, w[4] as u32);
                let geo = geometry.group(g).unwrap_or_else(|e| panic!("{e}"));
                let ok = (from..to).all(|l| {
                    let mut b = vec![0u8; LAYER_BYTES as usize];
                    pool.read(i, geo.offset + u64::from(l) * geo.layer_stride, &mut b)
                        .unwrap_or_else(|e| panic!("{e}"));
                    b == layer_pattern(seed, g, l)
                });
                if ok { "ok" } else { "bad" }.to_owned()
            }
            Some("leases") => format!(
                "leases {}",
                pool.leases(w[0] as u32).unwrap_or_else(|e| panic!("{e}"))
            ),
            Some("exit") | None => break,
            Some(other) => panic!("unknown command {other}"),
        };
        writeln!(out, "{reply}").unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The manager's end of a running engine process.
struct Engine {
    child: Child,
    lines: BufReader<UnixStream>,
    out: UnixStream,
    pool: Arc<AttachedPool>,
    bridge: Bridge,
}

impl Engine {
    fn start(dir: &Path) -> Self {
        let path = dir.join("engine.sock");
        let listener = UnixListener::bind(&path).unwrap_or_else(|e| panic!("bind: {e}"));
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
        let child = Command::new(exe)
            .args([
                "--exact",
                "engine_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ENGINE_SOCKET, &path)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn: {e}"));
        let (sock, _) = listener.accept().unwrap_or_else(|e| panic!("accept: {e}"));
        let mut buf = [0u8; 16];
        let (n, fd) = recv_with_fd(&sock, &mut buf).unwrap_or_else(|e| panic!("recv: {e}"));
        assert_eq!(&buf[..n], b"pool");
        let fd = fd.unwrap_or_else(|| panic!("no descriptor came with the pool"));
        let pool = AttachedPool::attach(fd, spec(), EPOCH).unwrap_or_else(|e| panic!("{e}"));
        let bridge = Bridge::new();
        bridge
            .register(pool.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        let out = sock.try_clone().unwrap_or_else(|e| panic!("{e}"));
        Self {
            child,
            lines: BufReader::new(sock),
            out,
            pool,
            bridge,
        }
    }

    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.out, "{cmd}").unwrap_or_else(|e| panic!("{e}"));
        let mut s = String::new();
        self.lines
            .read_line(&mut s)
            .unwrap_or_else(|e| panic!("{e}"));
        s.trim().to_owned()
    }

    /// Fills page `i` with `seed`; its reference.
    fn fill(&mut self, i: u32, seed: u64) -> PageRef {
        let r = self.ask(&format!("fill {i} {seed}"));
        let generation = r
            .strip_prefix("gen ")
            .and_then(|g| g.parse().ok())
            .unwrap_or_else(|| panic!("fill: {r}"));
        PageRef {
            pool: PoolId(7),
            index: i,
            generation,
        }
    }

    fn check(&mut self, i: u32, seed: u64, group: u32, layers: std::ops::Range<u32>) -> bool {
        self.ask(&format!(
            "check {i} {seed} {group} {} {}",
            layers.start, layers.end
        )) == "ok"
    }

    fn stop(mut self) {
        let _ = writeln!(self.out, "exit");
        let status = self.child.wait().unwrap_or_else(|e| panic!("{e}"));
        assert!(status.success(), "the engine process failed: {status}");
    }
}

#[test]
fn loads_land_in_the_engines_pages_and_publishes_come_back_out() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut e = Engine::start(dir.path());
    // Load: a whole group, then one layer of the other (a layer-by-layer connector).
    let page = e.fill(3, 1);
    let lease = e
        .bridge
        .lease(EPOCH, page)
        .unwrap_or_else(|x| panic!("{x}"));
    e.bridge
        .load(&lease, 0, 0..LAYERS, &record(42, 0, 0, LAYERS))
        .unwrap_or_else(|x| panic!("{x}"));
    e.bridge
        .load(&lease, 1, 2..3, &record(43, 1, 2, 3))
        .unwrap_or_else(|x| panic!("{x}"));
    drop(lease);
    assert!(e.check(3, 42, 0, 0..LAYERS), "group 0 loaded");
    assert!(e.check(3, 43, 1, 2..3), "layer 2 of group 1 loaded");
    assert!(
        e.check(3, 1, 1, 0..2),
        "the other layers of group 1 untouched"
    );
    assert!(e.check(3, 1, 1, 3..4));
    // Publish: the engine's bytes come out packed, group by group.
    let page = e.fill(5, 9);
    let lease = e
        .bridge
        .lease(EPOCH, page)
        .unwrap_or_else(|x| panic!("{x}"));
    for g in 0..2 {
        let mut out = Vec::new();
        e.bridge
            .publish(&lease, g, &mut out)
            .unwrap_or_else(|x| panic!("{x}"));
        assert!(out == record(9, g, 0, LAYERS), "group {g} published");
    }
    // A copy whose length does not match the layers is refused.
    assert!(matches!(
        e.bridge.load(&lease, 0, 0..1, &[0u8; 10]),
        Err(Error::Length { .. })
    ));
    drop(lease);
    e.stop();
}

#[test]
fn stale_references_are_refused_and_the_page_is_untouched() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut e = Engine::start(dir.path());
    // A Load queued against generation g; the engine reuses the page before it runs.
    let queued = e.fill(4, 1);
    let now = e.fill(4, 2);
    assert_eq!(now.generation, queued.generation + 1);
    assert!(matches!(
        e.bridge.lease(EPOCH, queued),
        Err(Error::StaleGeneration { .. })
    ));
    // The other stale forms: old epoch, index out of range, another pool.
    assert!(matches!(
        e.bridge.lease(EPOCH - 1, now),
        Err(Error::StaleEpoch { .. })
    ));
    let out_of_range = PageRef { index: 16, ..now };
    assert!(matches!(
        e.bridge.lease(EPOCH, out_of_range),
        Err(Error::IndexOutOfRange { .. })
    ));
    let other_pool = PageRef {
        pool: PoolId(8),
        ..now
    };
    assert!(matches!(
        e.bridge.lease(EPOCH, other_pool),
        Err(Error::UnknownPool { .. })
    ));
    // Nothing was written: the page holds what the engine put there.
    assert!(e.check(4, 2, 0, 0..LAYERS));
    assert!(e.check(4, 2, 1, 0..LAYERS));
    assert_eq!(e.ask("leases 4"), "leases 0");
    e.stop();
}

#[test]
fn the_engine_cannot_reuse_a_leased_page_until_the_lease_ends() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut e = Engine::start(dir.path());
    let page = e.fill(2, 1);
    let lease = e
        .bridge
        .lease(EPOCH, page)
        .unwrap_or_else(|x| panic!("{x}"));
    assert_eq!(e.ask("leases 2"), "leases 1", "the engine sees the lease");
    assert_eq!(
        e.ask("fill 2 5"),
        "leased",
        "a leased page cannot be reallocated"
    );
    drop(lease);
    assert_eq!(
        e.ask("leases 2"),
        "leases 0",
        "the engine sees the copy is done"
    );
    let next = e.fill(2, 5);
    assert_eq!(next.generation, page.generation + 1);
    e.stop();
}

#[test]
fn a_killed_engine_leaves_a_pool_that_is_detached_and_never_written() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut e = Engine::start(dir.path());
    let page = e.fill(1, 1);
    let lease = e
        .bridge
        .lease(EPOCH, page)
        .unwrap_or_else(|x| panic!("{x}"));
    // kill -9 mid-load: the mapping stays valid on this side (a copy cannot fault) ...
    e.child.kill().unwrap_or_else(|x| panic!("{x}"));
    let _ = e.child.wait();
    e.bridge
        .load(&lease, 0, 0..1, &record(3, 0, 0, 1))
        .unwrap_or_else(|x| panic!("{x}"));
    // ... and once the manager sees the disconnect, the pool is detached: no copy after that.
    e.bridge.unregister(PoolId(7));
    assert!(matches!(
        e.bridge.load(&lease, 0, 0..1, &record(3, 0, 0, 1)),
        Err(Error::Detached { .. })
    ));
    assert!(matches!(
        e.bridge.lease(EPOCH, page),
        Err(Error::UnknownPool { .. })
    ));
    drop(lease);
    assert!(e.pool.generation(1).is_ok());
}
