//! End-to-end store numbers, each a ratio against a baseline measured in the same run, rounds
//! interleaved (A B A B …) and medians reported, since this disk's throughput varies ±50%:
//!
//! - `append`: `put` of 2 MiB and 256 KiB bundles (O_DIRECT backend, direct segments, a sync
//!   every 64 MiB) vs the fastest raw sequential write of the same bytes with the same syncs:
//!   buffered, O_DIRECT one write at a time, or O_DIRECT through io_uring with as many writes
//!   in flight as the store keeps;
//! - `ssd-get`: verified `get` of every bundle in a seeded random order, cold, vs a raw O_DIRECT
//!   `pread` of the same frames at the same offsets;
//! - `dram-get`: DRAM-tier `get` into a caller buffer vs `memcpy` of the same bytes;
//! - `open`: reopening a store of 10,000 records of 64 KiB: time and bytes read vs data size;
//! - `peers`: a file-per-bundle store (two-level directories, the layout LMCache's and SGLang's
//!   file backends use) inserting and reading back the same bundles, a CRC check on every read.
//!
//! Run: `cargo bench -p orbitkv-benches --bench store` (environment: `ORBITKV_BENCH_MIB` bytes
//! per phase, default 1024; `ORBITKV_BENCH_ROUNDS`, default 3; `ORBITKV_BENCH_ONLY`, a comma
//! list of phases; `ORBITKV_BENCH_DIR`, default a temporary directory under `target/`;
//! `ORBITKV_BENCH_SEGMENT_MIB`, the store's segment size, default the store's). Not a CI gate:
//! docs/performance.md records results and commands.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark harness: a failed setup step ends the run"
)]

use orbitkv_benches::raw_uring::RawUring;
use orbitkv_testkit::Xorshift;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use orbitkv_benches::{env_u64, median_of as median};
use orbitkv_segments::{Alignment, FRAME_HEADER_LEN, RecordMeta};
use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, HashDomain, Namespace, RankSpec, StateKey, TokenRange,
};
use orbitkv_store::io::Io;
use orbitkv_store::io::aligned::{DIRECT_ALIGN, aligned_buffer};
use orbitkv_store::io::uring::UringIo;
use orbitkv_store::{Durability, StateStore, StoreConfig};

const NS: Namespace = Namespace([0x77; 32]);
const SYNC_EVERY: u64 = 64 << 20;
const SOURCES: usize = 8;

fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

fn key(i: u64) -> StateKey {
    let mut native = [0u8; 32];
    native[..8].copy_from_slice(&i.to_le_bytes());
    native[8..16].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
    StateKey::new(
        NS,
        HashDomain::VllmSha256Cbor,
        &native,
        CacheGroupId(0),
        Component::DenseKv,
        RankSpec::Rank(0),
    )
    .unwrap()
}

fn meta(i: u64) -> RecordMeta {
    RecordMeta {
        key: key(i),
        parent: None,
        range: TokenRange::new(i * 16, i * 16 + 16).unwrap(),
        format: FormatDigest([3; 32]),
    }
}

/// Aligned payload buffers of `size` pseudo-random bytes (bundle i uses buffer i mod count).
struct Sources {
    bufs: Vec<(Vec<u8>, usize)>,
    size: usize,
}

impl Sources {
    fn new(size: usize) -> Self {
        Self::with_count(size, SOURCES)
    }
    fn with_count(size: usize, count: usize) -> Self {
        let bufs = (0..count)
            .map(|s| {
                let (mut b, pad) = aligned_buffer(size);
                Xorshift::new((s as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d))
                    .fill(&mut b[pad..]);
                (b, pad)
            })
            .collect();
        Self { bufs, size }
    }
    fn get(&self, i: u64) -> &[u8] {
        let (b, pad) = &self.bufs[i as usize % self.bufs.len()];
        &b[*pad..*pad + self.size]
    }
}

fn order(n: u64, seed: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    let mut x = Xorshift::new(seed);
    for i in (1..v.len()).rev() {
        v.swap(i, x.below(i as u64 + 1) as usize);
    }
    v
}

fn drop_cache(path: &Path) {
    if let Ok(f) = File::open(path) {
        let _ = f.sync_all();
        let _ = fadvise_dontneed(&f);
    }
}

#[expect(unsafe_code, reason = "posix_fadvise has no safe wrapper in std")]
fn fadvise_dontneed(f: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open for the
    // duration of the call.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(r))
    }
}

fn drop_dir_cache(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            drop_dir_cache(&p);
        } else {
            drop_cache(&p);
        }
    }
}

fn store_config(dir: &Path, dram: u64) -> StoreConfig {
    let mut c = StoreConfig::new(dir);
    if let Some(mib) = std::env::var("ORBITKV_BENCH_SEGMENT_MIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        c.segment_bytes = mib << 20;
    }
    c.alignment = Alignment::Direct;
    c.durability = Durability::Manual;
    c.dram_bytes = dram;
    c
}

fn open_store(dir: &Path, dram: u64) -> StateStore {
    let io: Arc<dyn Io> = Arc::new(UringIo::probe(dir).expect("O_DIRECT on the bench directory"));
    let s = StateStore::open(io, store_config(dir, dram)).unwrap();
    let _ = s.register_namespace(NS, orbitkv_testkit::fixtures::info());
    s
}

/// Puts `n` bundles from one thread; returns seconds.
fn store_append(dir: &Path, src: &Sources, n: u64) -> f64 {
    store_append_threads(dir, src, n, 1)
}

/// Puts `n` bundles from `threads` threads (bundle i from thread i mod threads), each syncing
/// after every 64 MiB of its own; returns seconds.
fn store_append_threads(dir: &Path, src: &Sources, n: u64, threads: u64) -> f64 {
    let store = open_store(dir, 0);
    let t = Instant::now();
    std::thread::scope(|s| {
        for th in 0..threads {
            let store = &store;
            s.spawn(move || {
                let mut since = 0u64;
                for i in (th..n).step_by(threads as usize) {
                    store.put(&[(meta(i), src.get(i))]).unwrap();
                    since += src.size as u64;
                    if since >= SYNC_EVERY {
                        store.sync().unwrap();
                        since = 0;
                    }
                }
                store.sync().unwrap();
            });
        }
    });
    let secs = t.elapsed().as_secs_f64();
    store.close().unwrap();
    secs
}

/// Writes `n` bundles sequentially to one file (O_DIRECT or buffered), fdatasync every 64 MiB.
fn raw_append(path: &Path, src: &Sources, n: u64, direct: bool) -> f64 {
    let mut o = OpenOptions::new();
    o.write(true).create(true).truncate(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    let f = o.open(path).unwrap();
    let t = Instant::now();
    let mut at = 0u64;
    let mut since = 0u64;
    for i in 0..n {
        f.write_all_at(src.get(i), at).unwrap();
        at += src.size as u64;
        since += src.size as u64;
        if since >= SYNC_EVERY {
            f.sync_data().unwrap();
            since = 0;
        }
    }
    f.sync_data().unwrap();
    t.elapsed().as_secs_f64()
}

/// Writes in flight in the io_uring baseline: as many as the store keeps per segment.
const RAW_URING_DEPTH: usize = 4;

/// As [`raw_append`] with O_DIRECT, through io_uring with [`RAW_URING_DEPTH`] writes in flight
/// (each sync waits for them first).
fn raw_append_uring(path: &Path, src: &Sources, n: u64) -> f64 {
    let mut w = RawUring::create(path, RAW_URING_DEPTH);
    let t = Instant::now();
    let (mut at, mut since) = (0u64, 0u64);
    for i in 0..n {
        w.write(src.get(i), at);
        at += src.size as u64;
        since += src.size as u64;
        if since >= SYNC_EVERY {
            w.sync();
            since = 0;
        }
    }
    w.sync();
    t.elapsed().as_secs_f64()
}

fn phase_append(root: &Path, total: u64, rounds: u64) {
    for size in [2usize << 20, 256 << 10] {
        let src = Sources::new(size);
        let n = total / size as u64;
        let (mut s, mut s2, mut rb, mut rd, mut ru) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for r in 0..rounds {
            let raw = root.join("raw.bin");
            rb.push(raw_append(&raw, &src, n, false));
            let _ = std::fs::remove_file(&raw);
            rd.push(raw_append(&raw, &src, n, true));
            let _ = std::fs::remove_file(&raw);
            ru.push(raw_append_uring(&raw, &src, n));
            let _ = std::fs::remove_file(&raw);
            let d = root.join(format!("append-{r}"));
            s.push(store_append(&d, &src, n));
            let _ = std::fs::remove_dir_all(&d);
            s2.push(store_append_threads(&d, &src, n, 2));
            let _ = std::fs::remove_dir_all(&d);
        }
        let bytes = n * size as u64;
        // Each round's store time against that round's fastest raw write (the disk's speed
        // drifts between rounds), then the median of those ratios.
        let best_of = |r: usize| rb[r].min(rd[r]).min(ru[r]);
        let ratio = median((0..s.len()).map(|r| best_of(r) / s[r]).collect());
        let ratio2 = median((0..s2.len()).map(|r| best_of(r) / s2[r]).collect());
        let (s, s2, rb, rd, ru) = (median(s), median(s2), median(rb), median(rd), median(ru));
        println!(
            "append {} KiB x {n}: store {:.2} GB/s (2 putters {:.2} GB/s), raw buffered {:.2} GB/s, raw O_DIRECT {:.2} GB/s, raw io_uring x{RAW_URING_DEPTH} {:.2} GB/s; store / fastest raw = {:.3}, 2 putters / fastest raw = {:.3} (medians of per-round ratios; target >= 0.9)",
            size >> 10,
            gbps(bytes, s),
            gbps(bytes, s2),
            gbps(bytes, rb),
            gbps(bytes, rd),
            gbps(bytes, ru),
            ratio,
            ratio2
        );
    }
}

fn phase_ssd_get(root: &Path, total: u64, rounds: u64) {
    let size = 2usize << 20;
    let src = Sources::new(size);
    let n = total / size as u64;
    let dir = root.join("get");
    store_append(&dir, &src, n);
    let store = open_store(&dir, 0);
    let locs: Vec<(PathBuf, u64, usize)> = (0..n)
        .map(|i| {
            let r = store.index().get(&key(i)).unwrap();
            (
                dir.join(format!("segments/{:08x}.seg", r.segment)),
                r.offset,
                (FRAME_HEADER_LEN + r.stored_len as usize).next_multiple_of(DIRECT_ALIGN),
            )
        })
        .collect();
    let files: std::collections::HashMap<PathBuf, File> = locs
        .iter()
        .map(|(p, _, _)| p.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|p| {
            let f = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(&p)
                .unwrap();
            (p, f)
        })
        .collect();
    let (mut s, mut raw) = (Vec::new(), Vec::new());
    let mut out = Vec::with_capacity(size);
    let (mut buf, pad) = aligned_buffer(size + 2 * DIRECT_ALIGN);
    for r in 0..rounds {
        let ord = order(n, 7 + r);
        drop_dir_cache(&dir);
        let t = Instant::now();
        for &i in &ord {
            let (p, off, len) = &locs[i as usize];
            files[p]
                .read_exact_at(&mut buf[pad..pad + len], *off)
                .unwrap();
        }
        raw.push(t.elapsed().as_secs_f64());
        drop_dir_cache(&dir);
        let t = Instant::now();
        for &i in &ord {
            store.get(&key(i), &mut out).unwrap().expect("stored");
        }
        s.push(t.elapsed().as_secs_f64());
        assert_eq!(out.as_slice(), src.get(*ord.last().unwrap()));
    }
    let st = store.stats();
    assert_eq!(st.checksum_failures, 0);
    let bytes = n * size as u64;
    let (s, raw) = (median(s), median(raw));
    println!(
        "ssd-get 2 MiB x {n} (random order, cold, verified): store {:.2} GB/s, raw O_DIRECT pread {:.2} GB/s; store / raw = {:.3} (target >= 0.85)",
        gbps(bytes, s),
        gbps(bytes, raw),
        raw / s
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

fn phase_dram_get(root: &Path, rounds: u64) {
    let size = 1usize << 20;
    let n = 256u64;
    // As many distinct sources as stored copies: both sides stream the same working set.
    let src = Sources::with_count(size, n as usize);
    let dir = root.join("dram");
    let store = open_store(&dir, 2 * n * size as u64);
    for i in 0..n {
        store.put(&[(meta(i), src.get(i))]).unwrap();
    }
    store.sync().unwrap();
    let mut out = Vec::with_capacity(size);
    let mut dst = vec![0u8; size];
    let (mut s, mut m) = (Vec::new(), Vec::new());
    let passes = 8;
    for r in 0..rounds {
        let ord = order(n, 11 + r);
        let t = Instant::now();
        for _ in 0..passes {
            for &i in &ord {
                dst.copy_from_slice(std::hint::black_box(src.get(i)));
                std::hint::black_box(&dst);
            }
        }
        m.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        for _ in 0..passes {
            for &i in &ord {
                store.get(&key(i), &mut out).unwrap().expect("stored");
                std::hint::black_box(&out);
            }
        }
        s.push(t.elapsed().as_secs_f64());
    }
    let st = store.stats();
    assert!(st.dram_hits >= passes * n * rounds, "{st:?}");
    let bytes = passes * n * size as u64;
    let (s, m) = (median(s), median(m));
    println!(
        "dram-get 1 MiB x {n} x {passes}: store {:.2} GB/s, memcpy {:.2} GB/s; store / memcpy = {:.3} (target >= 0.8)",
        gbps(bytes, s),
        gbps(bytes, m),
        m / s
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

fn phase_open(root: &Path) {
    let size = 64usize << 10;
    let n = 10_000u64;
    let src = Sources::new(size);
    let dir = root.join("open");
    store_append(&dir, &src, n);
    drop_dir_cache(&dir);
    let t = Instant::now();
    let store = open_store(&dir, 0);
    let secs = t.elapsed().as_secs_f64();
    let r = store.recovery_report();
    println!(
        "open {n} x 64 KiB ({} MiB of payload): {:.1} ms, {} bytes read = {:.4}% of payload (target <= 1%), {} records indexed",
        r.payload_bytes >> 20,
        secs * 1e3,
        r.bytes_read,
        100.0 * r.bytes_read as f64 / r.payload_bytes.max(1) as f64,
        r.indexed
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One file per bundle in `root/xx/yy/<key>`; an fdatasync of every file written in each 64 MiB
/// window (the store's group commit); returns seconds.
fn files_insert(root: &Path, src: &Sources, n: u64) -> f64 {
    let t = Instant::now();
    let mut pending: Vec<File> = Vec::new();
    let mut since = 0u64;
    for i in 0..n {
        let p = file_of(root, i);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).unwrap();
        }
        let f = File::create(&p).unwrap();
        f.write_all_at(src.get(i), 0).unwrap();
        pending.push(f);
        since += src.size as u64;
        if since >= SYNC_EVERY {
            for f in pending.drain(..) {
                f.sync_data().unwrap();
            }
            since = 0;
        }
    }
    for f in pending.drain(..) {
        f.sync_data().unwrap();
    }
    t.elapsed().as_secs_f64()
}

fn file_of(root: &Path, i: u64) -> PathBuf {
    let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    root.join(format!("{:02x}", h >> 56))
        .join(format!("{:02x}", (h >> 48) & 0xff))
        .join(format!("{h:016x}.bin"))
}

fn files_read(root: &Path, src: &Sources, ord: &[u64], crcs: &[u32]) -> f64 {
    let mut buf = Vec::with_capacity(src.size);
    let t = Instant::now();
    for &i in ord {
        buf.clear();
        let mut f = File::open(file_of(root, i)).unwrap();
        std::io::Read::read_to_end(&mut f, &mut buf).unwrap();
        assert_eq!(crc32c::crc32c(&buf), crcs[i as usize], "bundle {i}");
    }
    t.elapsed().as_secs_f64()
}

fn phase_peers(root: &Path, total: u64, rounds: u64) {
    for size in [2usize << 20, 256 << 10] {
        let src = Sources::new(size);
        let n = total / size as u64;
        let crcs: Vec<u32> = (0..n).map(|i| crc32c::crc32c(src.get(i))).collect();
        let (mut si, mut sr, mut fi, mut fr) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut ydi, mut ydr, mut yti, mut ytr) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut y_default_dropped, mut y_tuned_dropped, mut y_mismatched) = (0, 0, 0);
        // foyer's times are scaled to what it kept (goodput), so dropping bundles earns nothing.
        let keep = |dropped: u64| (n - dropped.min(n)).max(1) as f64 / n as f64;
        let mut out = Vec::with_capacity(size);
        for r in 0..rounds {
            let ord = order(n, 21 + r);
            let fdir = root.join(format!("files-{r}"));
            fi.push(files_insert(&fdir, &src, n));
            drop_dir_cache(&fdir);
            fr.push(files_read(&fdir, &src, &ord, &crcs));
            let _ = std::fs::remove_dir_all(&fdir);

            for tuned in [false, true] {
                let ydir = root.join(format!("foyer-{r}-{tuned}"));
                let y = foyer_peer::run(&ydir, &src, n, &ord, &crcs, tuned);
                let _ = std::fs::remove_dir_all(&ydir);
                y_mismatched += y.mismatched;
                let (yi, yr) = (
                    y.insert_secs / keep(y.dropped),
                    y.read_secs / keep(y.dropped),
                );
                if tuned {
                    yti.push(yi);
                    ytr.push(yr);
                    y_tuned_dropped = y_tuned_dropped.max(y.dropped);
                } else {
                    ydi.push(yi);
                    ydr.push(yr);
                    y_default_dropped = y_default_dropped.max(y.dropped);
                }
            }

            let sdir = root.join(format!("peer-store-{r}"));
            si.push(store_append(&sdir, &src, n));
            let store = open_store(&sdir, 0);
            drop_dir_cache(&sdir);
            let t = Instant::now();
            let mut missing = 0u64;
            for &i in &ord {
                if store.get(&key(i), &mut out).unwrap().is_none() {
                    missing += 1;
                }
            }
            sr.push(t.elapsed().as_secs_f64());
            assert_eq!(missing, 0, "the store dropped accepted bundles");
            drop(store);
            let _ = std::fs::remove_dir_all(&sdir);
        }
        let bytes = n * size as u64;
        let (si, sr, fi, fr) = (median(si), median(sr), median(fi), median(fr));
        let (ydi, ydr, yti, ytr) = (median(ydi), median(ydr), median(yti), median(ytr));
        // The faster peer in each phase, by goodput (bytes it kept and returned per second).
        let best_insert = fi.min(ydi).min(yti);
        let best_read = fr.min(ydr).min(ytr);
        println!(
            "peers {} KiB x {n} ({} MiB): insert goodput GB/s store {:.2}, file-per-bundle {:.2}, foyer default {:.2}, foyer tuned {:.2}; store / faster peer = {:.3} (target >= 1.0)",
            size >> 10,
            bytes >> 20,
            gbps(bytes, si),
            gbps(bytes, fi),
            gbps(bytes, ydi),
            gbps(bytes, yti),
            best_insert / si
        );
        println!(
            "peers {} KiB x {n}: cold random read goodput GB/s store {:.2}, file-per-bundle {:.2}, foyer default {:.2}, foyer tuned {:.2}; store / faster peer = {:.3} (target >= 1.0)",
            size >> 10,
            gbps(bytes, sr),
            gbps(bytes, fr),
            gbps(bytes, ydr),
            gbps(bytes, ytr),
            best_read / sr
        );
        println!(
            "peers {} KiB x {n}: bundles dropped (worst round of {rounds}): store 0, file-per-bundle 0, foyer default {y_default_dropped}, foyer tuned {y_tuned_dropped}; foyer bundles with other bytes: {y_mismatched}",
            size >> 10
        );
    }
}

fn main() {
    let total = env_u64("ORBITKV_BENCH_MIB", 1024) << 20;
    let rounds = env_u64("ORBITKV_BENCH_ROUNDS", 3).max(1);
    let only = std::env::var("ORBITKV_BENCH_ONLY").unwrap_or_default();
    let run = |p: &str| only.is_empty() || only.split(',').any(|o| o == p);
    let base = std::env::var("ORBITKV_BENCH_DIR").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&base).unwrap();
    let tmp = tempfile::tempdir_in(&base).unwrap();
    let root = tmp.path();
    if UringIo::probe(root).is_err() {
        println!(
            "O_DIRECT is not supported on {}: set ORBITKV_BENCH_DIR",
            root.display()
        );
        return;
    }
    println!(
        "store bench: {} MiB per phase, {rounds} interleaved rounds, medians",
        total >> 20
    );
    if run("append") {
        phase_append(root, total, rounds);
    }
    if run("ssd-get") {
        phase_ssd_get(root, total, rounds);
    }
    if run("dram-get") {
        phase_dram_get(root, rounds);
    }
    if run("open") {
        phase_open(root);
    }
    if run("peers") {
        phase_peers(root, total, rounds);
    }
}

/// foyer's hybrid cache (64 MiB of memory, a block-engine disk cache big enough for every
/// bundle), written on insertion. `tuned`: O_DIRECT, io_uring, a 256 MiB buffer pool, two
/// flushers, and paced (it waits for its flushers every 8 MiB); otherwise its defaults at full
/// speed. A bundle `insert` accepted but `get` cannot return is counted as dropped.
mod foyer_peer {
    use std::path::Path;
    use std::time::Instant;

    use foyer::{
        BlockEngineConfig, DeviceBuilder, FsDeviceBuilder, HybridCache, HybridCacheBuilder,
        HybridCachePolicy, IoEngineConfig, UringIoEngineConfig,
    };

    use super::{Sources, drop_dir_cache};

    /// The tuned run waits for its flushers after this many bytes (at 64 MiB, as the store
    /// syncs, its flush queue still overflowed and dropped most bundles).
    const PACE: u64 = 8 << 20;

    /// What one run measured.
    pub struct Run {
        pub insert_secs: f64,
        pub read_secs: f64,
        pub dropped: u64,
        pub mismatched: u64,
    }

    pub fn run(dir: &Path, src: &Sources, n: u64, ord: &[u64], crcs: &[u32], tuned: bool) -> Run {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            std::fs::create_dir_all(dir).unwrap();
            let capacity = (n as usize * src.size) * 3 / 2 + (256 << 20);
            let device = FsDeviceBuilder::new(dir)
                .with_capacity(capacity)
                .with_direct(tuned)
                .build()
                .unwrap();
            let builder = HybridCacheBuilder::new()
                .with_policy(HybridCachePolicy::WriteOnInsertion)
                .memory(64 << 20)
                .with_weighter(|_, v: &Vec<u8>| v.len())
                .storage();
            let builder = if tuned {
                builder.with_io_engine_config(
                    Box::new(UringIoEngineConfig::new()) as Box<dyn IoEngineConfig>
                )
            } else {
                builder
            };
            let hybrid: HybridCache<u64, Vec<u8>> = builder
                .with_engine_config(if tuned {
                    BlockEngineConfig::new(device)
                        .with_buffer_pool_size(256 << 20)
                        .with_flushers(2)
                } else {
                    BlockEngineConfig::new(device)
                })
                .build()
                .await
                .unwrap();
            let t = Instant::now();
            let mut since = 0u64;
            for i in 0..n {
                hybrid.insert(i, src.get(i).to_vec());
                since += src.size as u64;
                if tuned && since >= PACE {
                    hybrid.storage().wait().await;
                    since = 0;
                }
            }
            hybrid.storage().wait().await;
            let insert_secs = t.elapsed().as_secs_f64();
            hybrid.memory().clear();
            drop_dir_cache(dir);
            let (mut dropped, mut mismatched) = (0, 0);
            let t = Instant::now();
            for &i in ord {
                match hybrid.get(&i).await {
                    Ok(Some(e)) => {
                        if crc32c::crc32c(e.value()) != crcs[i as usize] {
                            mismatched += 1;
                        }
                    }
                    _ => dropped += 1,
                }
            }
            let read_secs = t.elapsed().as_secs_f64();
            let _ = hybrid.close().await;
            Run {
                insert_secs,
                read_secs,
                dropped,
                mismatched,
            }
        })
    }
}
