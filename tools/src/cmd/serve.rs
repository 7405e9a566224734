//! `orbitkv serve`: the cache manager daemon on this node. With no arguments it runs with embedded
//! defaults — the data directory `./orbitkv-data`, the socket in it, metrics on a free loopback
//! port, capacities from the machine — and prints where it listens. SIGTERM or SIGINT stops it
//! cleanly: no new connections, every connection closed, the store synced and closed (its lock
//! released), exit 0. `--config FILE` reads every option from a TOML file (`deploy/orbitkv.toml`
//! documents each); a flag overrides the file. A background thread compacts sealed segments
//! whose live fraction fell below a threshold, at a fixed interval.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Args;
use orbitkv_manager::metrics::Exporter;
use orbitkv_manager::peer::PeerPolicy;
use orbitkv_manager::server::{Server, ServerConfig};
use orbitkv_segments::Alignment;
use orbitkv_store::{Admission, Durability, Policy, StateStore, StoreConfig};

use crate::Failure;
use crate::config::{ServeConfig, parse_admission, parse_fraction, parse_interval, parse_policy};
use crate::output::Output;

/// `serve` arguments.
#[derive(Args)]
pub struct ServeArgs {
    /// A TOML configuration file (every key optional; flags override it).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The data directory (created if missing) [default: ./orbitkv-data].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The control socket [default: ORBITKV_SOCKET, else the config file's, else
    /// DIR/orbitkv.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Where the Prometheus exporter listens (`127.0.0.1:0` picks a free port)
    /// [default: 127.0.0.1:0].
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Log level on stderr: error, warn, info, debug, trace [default: ORBITKV_LOG, then the
    /// file's log_level, then warn].
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
    /// DRAM-tier budget [default: a quarter of the memory available at start].
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    dram_bytes: Option<u64>,
    /// SSD-tier budget [default: 80 % of the free space under the data directory, plus what
    /// the store already holds].
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    ssd_bytes: Option<u64>,
    /// Segment size: a segment is sealed once it would pass it (at most a 16th of the SSD
    /// budget under record-lru, a 64th under the others) [default: 256MiB].
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    segment_bytes: Option<u64>,
    /// What the SSD tier evicts when full: record-lru, s3-fifo, fifo, fifo-reinsert
    /// [default: record-lru].
    #[arg(long, value_name = "POLICY", value_parser = parse_policy)]
    policy: Option<Policy>,
    /// SSD admission under record-lru: adaptive (while the tier is full, a page published for
    /// the first time may wait in DRAM, readable and not durable, where holding it back loses
    /// no hit) or off [default: adaptive].
    #[arg(long, value_name = "MODE", value_parser = parse_admission)]
    admission: Option<bool>,
    /// The admission waiting room, taken from the DRAM tier's budget [default: a tenth of the
    /// SSD budget, at most half the DRAM budget].
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    waiting_bytes: Option<u64>,
    /// How often sealed segments are compacted in the background (`30s`, `500ms`; `0` or `off`
    /// disables it) [default: 30s].
    #[arg(long, value_name = "INTERVAL", value_parser = parse_interval)]
    compact_interval: Option<Duration>,
    /// Compact sealed segments whose live fraction is below this (`0` or `off`: none)
    /// [default: 0.5].
    #[arg(long, value_name = "FRACTION", value_parser = parse_fraction)]
    compact_threshold: Option<f64>,
}

/// Without a DRAM budget, the tier gets this fraction of the memory available at start.
pub const DRAM_FRACTION: f64 = 0.25;
/// Without an SSD budget, the tier gets this fraction of the free space (plus what it holds).
pub const SSD_FRACTION: f64 = 0.8;
/// Background compaction runs this often by default.
pub const COMPACT_INTERVAL: Duration = Duration::from_secs(30);
/// By default, sealed segments less live than this are compacted.
pub const COMPACT_THRESHOLD: f64 = 0.5;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Async-signal-safe: one atomic store.
    STOP.store(true, Ordering::Release);
}

#[expect(
    unsafe_code,
    reason = "installing signal handlers has no safe wrapper in std"
)]
fn install_signal_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: `on_signal` only stores to an atomic, which is async-signal-safe; `signal`
        // replaces the disposition of a catchable signal.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

/// Which page backend serves engines, and why not CUDA when it is not.
fn page_backend() -> String {
    #[cfg(feature = "cuda")]
    {
        // A probe only: a context held here would take device memory on GPU 0 for life.
        match orbitkv_gpu_bridge::cuda::Cuda::probe() {
            Ok(devices) if !devices.is_empty() => format!(
                "host, and CUDA device pools registered through the protocol (CUDA devices: {})",
                devices
                    .iter()
                    .map(|d| format!("{} {}", d.ordinal, d.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Ok(_) => "host (no CUDA device; device pools are refused as unsupported)".to_owned(),
            Err(e) => {
                format!("host (CUDA unavailable: {e}; device pools are refused as unsupported)")
            }
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        "host (built without the cuda feature; device pools are refused as unsupported)".to_owned()
    }
}

/// Bytes of memory available now (`MemAvailable` of /proc/meminfo).
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Free bytes on the file system holding `dir`.
#[expect(unsafe_code, reason = "statvfs has no safe wrapper in std")]
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statvfs is a valid value to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a live, writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Descriptors the daemon keeps beside its connections: segment files, the manifest, the
/// socket, the metrics listener, the random source.
const FILES_BESIDE_CONNECTIONS: u64 = 256;

/// Descriptors of engine memory under which `serve` warns that the open-files limit is low: an
/// engine rank keeps one per pool it registers unsealed.
const MIN_KEPT_FILES: u64 = 1024;

/// Descriptors of engine memory kept however low the open-files limit is.
const FEWEST_KEPT_FILES: u64 = 64;

/// Raises the soft limit of open files to the hard one. Returns the limit in force after.
#[expect(
    unsafe_code,
    reason = "getrlimit and setrlimit have no safe wrapper in std"
)]
fn raise_open_files_limit() -> Option<u64> {
    // SAFETY: an all-zero rlimit is a valid value to be overwritten.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `lim` is a live, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit that only raises the soft limit to the hard one.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    Some(lim.rlim_cur)
}

/// Starts the background compactor: every `every`, the sealed segments of `store` whose live
/// fraction is below `threshold` are compacted, until [`STOP`] is set.
fn start_compactor(
    store: Arc<StateStore>,
    every: Duration,
    threshold: f64,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("orbitkv-compact".to_owned())
        .spawn(move || {
            let mut next = Instant::now() + every;
            while !STOP.load(Ordering::Acquire) {
                let now = Instant::now();
                if now < next {
                    std::thread::sleep((next - now).min(Duration::from_millis(20)));
                    continue;
                }
                let started = Instant::now();
                match store.compact_below(threshold) {
                    Ok(r) if !r.inputs.is_empty() => tracing::info!(
                        inputs = r.inputs.len(),
                        outputs = r.outputs.len(),
                        copied = r.copied,
                        dropped = r.dropped_dead + r.dropped_bad,
                        freed_bytes = r.input_bytes.saturating_sub(r.output_bytes),
                        ms = started.elapsed().as_millis() as u64,
                        "background compaction: {} segments below {threshold} live rewritten into {}",
                        r.inputs.len(),
                        r.outputs.len()
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::warn!("background compaction failed: {e}"),
                }
                next = Instant::now() + every;
            }
        })
}

/// Runs the daemon until a signal stops it.
pub fn run(a: &ServeArgs, out: &Output) -> Result<(), Failure> {
    let file = match &a.config {
        Some(p) => ServeConfig::load(p)?,
        None => ServeConfig::default(),
    };
    crate::init_logging(a.log_level.as_deref(), file.log_level.as_deref())?;
    let data_dir = a
        .data_dir
        .clone()
        .or_else(|| file.data_dir.clone())
        .unwrap_or_else(|| PathBuf::from("./orbitkv-data"));
    let socket = a
        .socket
        .clone()
        .or_else(|| {
            std::env::var_os(orbitkv_protocol::discover::SOCKET_VAR)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .or_else(|| file.socket.clone())
        .unwrap_or_else(|| data_dir.join("orbitkv.sock"));
    let metrics = a
        .metrics
        .clone()
        .or_else(|| file.metrics.clone())
        .unwrap_or_else(|| "127.0.0.1:0".to_owned());
    let refused = |e: String| Failure::refused(e);
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| refused(format!("{}: {e}", data_dir.display())))?;
    let (io, direct) = orbitkv_store::io::default_for(&data_dir);
    let mut cfg = StoreConfig::new(&data_dir);
    // Records are readable only once durable; the daemon's committer makes every Publish
    // waiting durable with one sync.
    cfg.durability = Durability::Group;
    if direct {
        cfg.alignment = Alignment::Direct;
    }
    let cap = &file.capacity;
    let dram_fraction = cap.dram_fraction.unwrap_or(DRAM_FRACTION);
    let ssd_fraction = cap.ssd_fraction.unwrap_or(SSD_FRACTION);
    cfg.dram_bytes = a
        .dram_bytes
        .or(cap.dram_bytes.map(|s| s.0))
        .unwrap_or_else(|| {
            mem_available().map_or(256 << 20, |m| (m as f64 * dram_fraction) as u64)
        });
    let ssd = match a.ssd_bytes.or(cap.ssd_bytes.map(|s| s.0)) {
        Some(b) => b,
        None => {
            let used = dir_bytes(&data_dir);
            free_bytes(&data_dir).map_or(1 << 30, |f| (f as f64 * ssd_fraction) as u64) + used
        }
    };
    cfg.ssd_bytes = Some(ssd.max(orbitkv_store::MIN_SSD_BYTES));
    if let Some(b) = a.segment_bytes.or(cap.segment_bytes.map(|s| s.0)) {
        cfg.segment_bytes = b;
    }
    if let Some(p) = a.policy {
        cfg.policy = p;
    } else if let Some(name) = &cap.policy {
        cfg.policy = parse_policy(name).map_err(|e| refused(format!("capacity.policy = {e}")))?;
    }
    let admission = match (a.admission, &cap.admission) {
        (Some(on), _) => on,
        (None, Some(text)) => {
            parse_admission(text).map_err(|e| refused(format!("capacity.admission = {e}")))?
        }
        (None, None) => true,
    };
    // The DRAM budget as configured: the DRAM tier's copies and the admission waiting room.
    let dram_total = cfg.dram_bytes;
    if admission && cfg.policy == Policy::RecordLru {
        let ssd = cfg.ssd_bytes.unwrap_or(0);
        let waiting = match a.waiting_bytes.or(cap.waiting_bytes.map(|s| s.0)) {
            Some(w) if w > cfg.dram_bytes => {
                return Err(refused(format!(
                    "waiting_bytes = {w}: the admission waiting room is taken from the DRAM \
                     budget ({} bytes); ask for less, or for more DRAM",
                    cfg.dram_bytes
                )));
            }
            Some(w) => w,
            None => (ssd / 10).min(cfg.dram_bytes / 2),
        };
        // The waiting room is the DRAM tier's memory too: the two share its budget.
        if waiting > 0 {
            cfg.dram_bytes -= waiting;
            cfg.admission = Admission::Adaptive {
                waiting_bytes: waiting,
            };
        }
    }
    let compact_every = a
        .compact_interval
        .or(cap.compact_interval.map(|i| i.0))
        .unwrap_or(COMPACT_INTERVAL);
    let compact_threshold = a
        .compact_threshold
        .or(cap.compact_threshold)
        .unwrap_or(COMPACT_THRESHOLD);
    let compaction = (!compact_every.is_zero() && compact_threshold > 0.0)
        .then_some((compact_every, compact_threshold));
    let mut server_cfg = ServerConfig::new(&socket);
    let l = &file.limits;
    if let Some(b) = l.max_message_bytes {
        server_cfg.max_body = u32::try_from(b.0).map_err(|_| {
            refused(format!(
                "limits.max_message_bytes = {}: at most {} (4 GiB - 1)",
                b.0,
                u32::MAX
            ))
        })?;
    }
    if let Some(ms) = l.frame_timeout_ms {
        server_cfg.frame_timeout = Duration::from_millis(ms.max(1));
    }
    if let Some(ms) = l.lease_ttl_ms {
        server_cfg.lease_ttl = Duration::from_millis(ms.max(1));
    }
    if let Some(n) = l.max_leases_per_client {
        server_cfg.max_leases_per_client = n;
    }
    if let Some(n) = l.max_pins_per_client {
        server_cfg.max_pins_per_client = n;
    }
    if let Some(b) = l.max_request_bytes {
        server_cfg.max_request_bytes = b.0;
    }
    if let Some(n) = l.max_connections {
        server_cfg.max_connections = n;
    }
    if let Some(b) = l.max_connection_bytes {
        server_cfg.max_connection_bytes = b.0;
    }
    // Publish copies over every connection: as set, else a quarter of the memory available now
    // (at least one request's).
    server_cfg.max_publish_bytes = match l.max_publish_bytes {
        Some(b) => b.0,
        None => mem_available()
            .map_or(server_cfg.max_publish_bytes, |m| m / 4)
            .max(server_cfg.max_request_bytes),
    };
    if let Some(ms) = l.send_timeout_ms {
        server_cfg.send_timeout = Duration::from_millis(ms.max(1));
    }
    server_cfg.peers = PeerPolicy {
        uids: file.peers.uids.clone(),
        gids: file.peers.gids.clone(),
    };
    // Each connection holds two descriptors; what is left beside the daemon's own files is
    // for pools of engine memory that keep one (bounded over every connection).
    if let Some(files) = raise_open_files_limit() {
        let fixed = server_cfg.max_connections as u64 * 2 + FILES_BESIDE_CONNECTIONS;
        // At least a few, so that engines registering such pools are served where the limit
        // is low; the connections rarely all run at once.
        let kept = files.saturating_sub(fixed).max(FEWEST_KEPT_FILES);
        server_cfg.max_kept_files = usize::try_from(kept).unwrap_or(usize::MAX);
        if kept < MIN_KEPT_FILES {
            tracing::warn!(
                open_files = files,
                max_connections = server_cfg.max_connections,
                kept_files = kept,
                "the open-files limit leaves {kept} descriptors for pools of engine memory \
                 beside the connections; raise it (ulimit -n) or lower limits.max_connections"
            );
        }
    }
    let store = Arc::new(StateStore::open(io, cfg.clone()).map_err(|e| refused(e.to_string()))?);
    let server = Server::bind(server_cfg, store.clone()).map_err(|e| refused(e.to_string()))?;
    let exporter = Exporter::start(&metrics, server.metrics_source())
        .map_err(|e| refused(format!("metrics address {metrics}: {e}")))?;
    install_signal_handlers();
    let backend = if direct {
        "io_uring + O_DIRECT"
    } else {
        "buffered"
    };
    let gpu = page_backend();
    let compaction_text = match compaction {
        Some((every, threshold)) => format!(
            "every {:.3} s, segments below {threshold} live",
            every.as_secs_f64()
        ),
        None => "off".to_owned(),
    };
    out.emit(
        &format!(
            "orbitkv serve: listening on {}\nmetrics: http://{}/metrics\ndata: {} ({backend}; DRAM tier {} bytes, SSD tier {} bytes, {} reclaim)\nadmission: {}\ncompaction: {compaction_text}\npages: {gpu}\n",
            socket.display(),
            exporter.addr(),
            data_dir.display(),
            dram_total,
            ssd,
            cfg.policy.name(),
            match cfg.admission {
                Admission::Off => "off".to_owned(),
                Admission::Adaptive { waiting_bytes } => format!(
                    "adaptive, a waiting room of {waiting_bytes} bytes taken from the DRAM budget"
                ),
            },
        ),
        || {
            serde_json::json!({
            "socket": socket.display().to_string(),
            "metrics": format!("http://{}/metrics", exporter.addr()),
            "data_dir": data_dir.display().to_string(),
            "io": backend,
            "dram_bytes": dram_total,
            "ssd_bytes": ssd,
            "policy": cfg.policy.name(),
            "admission": if cfg.admission == Admission::Off { "off" } else { "adaptive" },
            "waiting_bytes": cfg.admission.waiting_bytes().unwrap_or(0),
            "compact_interval_ms": compaction.map(|(e, _)| e.as_millis() as u64),
            "compact_threshold": compaction.map(|(_, t)| t),
            "pages": gpu,
            })
        },
    )?;
    let _ = std::io::stdout().flush();
    let compactor = match compaction {
        Some((every, threshold)) => Some(
            start_compactor(store.clone(), every, threshold)
                .map_err(|e| Failure::internal(format!("starting the compactor: {e}")))?,
        ),
        None => None,
    };
    let stopper = server.stopper();
    let watcher = std::thread::spawn(move || {
        while !STOP.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(20));
        }
        stopper.stop();
    });
    let served = server.run();
    // Whatever ended the server also ends the watcher and the compactor.
    STOP.store(true, Ordering::Release);
    if let Some(c) = compactor {
        let _ = c.join();
    }
    served.map_err(|e| Failure::internal(format!("serving: {e}")))?;
    let _ = watcher.join();
    drop(exporter);
    tracing::info!("stopping: syncing and closing the store");
    let store = Arc::try_unwrap(store)
        .map_err(|_| Failure::internal("the store is still in use at shutdown"))?;
    store
        .close()
        .map_err(|e| Failure::internal(format!("closing the store: {e}")))?;
    Ok(())
}

/// Bytes the files under `dir` take (the store's own data counts towards its budget).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                dir_bytes(&p)
            } else {
                e.metadata().map(|m| m.len()).unwrap_or(0)
            }
        })
        .sum()
}
