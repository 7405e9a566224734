//! `orbitkv serve`: the cache manager daemon on this node. With no arguments it runs with embedded
//! defaults — the data directory `./orbitkv-data`, the socket in it, metrics on a free loopback
//! port, capacities from the machine — and prints where it listens. SIGTERM or SIGINT stops it
//! cleanly: no new connections, every connection closed, the store synced and closed (its lock
//! released), exit 0. `--config FILE` reads every option from a TOML file (`deploy/orbitkv.toml`
//! documents each); a flag overrides the file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use orbitkv_manager::metrics::Exporter;
use orbitkv_manager::peer::PeerPolicy;
use orbitkv_manager::server::{Server, ServerConfig};
use orbitkv_segments::Alignment;
use orbitkv_store::{Durability, StateStore, StoreConfig};

use crate::Failure;
use crate::config::ServeConfig;
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
    /// The control socket [default: DIR/orbitkv.sock].
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
}

/// Without a DRAM budget, the tier gets this fraction of the memory available at start.
pub const DRAM_FRACTION: f64 = 0.25;
/// Without an SSD budget, the tier gets this fraction of the free space (plus what it holds).
pub const SSD_FRACTION: f64 = 0.8;

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
        match orbitkv_gpu_bridge::cuda::Cuda::open(0) {
            Ok(c) => format!(
                "host, and CUDA device pools registered through the protocol (CUDA device {} found)",
                c.device()
            ),
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
    cfg.durability = Durability::EveryPut;
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
    server_cfg.peers = PeerPolicy {
        uids: file.peers.uids.clone(),
        gids: file.peers.gids.clone(),
    };
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
    out.emit(
        &format!(
            "orbitkv serve: listening on {}\nmetrics: http://{}/metrics\ndata: {} ({backend}; DRAM tier {} bytes, SSD tier {} bytes)\npages: {gpu}\n",
            socket.display(),
            exporter.addr(),
            data_dir.display(),
            cfg.dram_bytes,
            ssd
        ),
        || {
            serde_json::json!({
            "socket": socket.display().to_string(),
            "metrics": format!("http://{}/metrics", exporter.addr()),
            "data_dir": data_dir.display().to_string(),
            "io": backend,
            "dram_bytes": cfg.dram_bytes,
            "ssd_bytes": ssd,
            "pages": gpu,
            })
        },
    )?;
    let _ = std::io::stdout().flush();
    let stopper = server.stopper();
    let watcher = std::thread::spawn(move || {
        while !STOP.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(20));
        }
        stopper.stop();
    });
    server
        .run()
        .map_err(|e| Failure::internal(format!("serving: {e}")))?;
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
