//! `orbitkv serve`: the cache manager daemon on this node. With no arguments it runs with embedded
//! defaults — the data directory `./orbitkv-data`, the socket in it, metrics on a free loopback
//! port, capacities from the machine — and prints where it listens. SIGTERM or SIGINT stops it
//! cleanly: no new connections, every connection closed, the store synced and closed (its lock
//! released), exit 0.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Args;
use orbitkv_manager::metrics::Exporter;
use orbitkv_manager::server::{Server, ServerConfig};
use orbitkv_segments::Alignment;
use orbitkv_store::{Durability, StateStore, StoreConfig};

use crate::Failure;
use crate::output::Output;

/// `serve` arguments.
#[derive(Args)]
pub struct ServeArgs {
    /// The data directory (created if missing).
    #[arg(long, value_name = "DIR", default_value = "./orbitkv-data")]
    data_dir: PathBuf,
    /// The control socket [default: DIR/orbitkv.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Where the Prometheus exporter listens (`127.0.0.1:0` picks a free port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    metrics: String,
    /// DRAM-tier budget [default: a quarter of the memory available at start].
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    dram_bytes: Option<u64>,
    /// SSD-tier budget [default: 80 % of the free space under the data directory, plus what
    /// the store already holds].
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    ssd_bytes: Option<u64>,
}

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
    let socket = a
        .socket
        .clone()
        .unwrap_or_else(|| a.data_dir.join("orbitkv.sock"));
    let refused = |e: String| Failure::refused(e);
    std::fs::create_dir_all(&a.data_dir)
        .map_err(|e| refused(format!("{}: {e}", a.data_dir.display())))?;
    let (io, direct) = orbitkv_store::io::default_for(&a.data_dir);
    let mut cfg = StoreConfig::new(&a.data_dir);
    cfg.durability = Durability::EveryPut;
    if direct {
        cfg.alignment = Alignment::Direct;
    }
    cfg.dram_bytes = a
        .dram_bytes
        .unwrap_or_else(|| mem_available().map_or(256 << 20, |m| m / 4));
    let ssd = match a.ssd_bytes {
        Some(b) => b,
        None => {
            let used = dir_bytes(&a.data_dir);
            free_bytes(&a.data_dir).map_or(1 << 30, |f| f / 5 * 4) + used
        }
    };
    cfg.ssd_bytes = Some(ssd.max(orbitkv_store::MIN_SSD_BYTES));
    let store = Arc::new(StateStore::open(io, cfg.clone()).map_err(|e| refused(e.to_string()))?);
    let server = Server::bind(ServerConfig::new(&socket), store.clone())
        .map_err(|e| refused(e.to_string()))?;
    let exporter = Exporter::start(&a.metrics, server.metrics_source())
        .map_err(|e| refused(format!("--metrics {}: {e}", a.metrics)))?;
    install_signal_handlers();
    let backend = if direct {
        "io_uring + O_DIRECT"
    } else {
        "buffered"
    };
    let gpu = "host (no GPU backend in this build)";
    out.emit(
        &format!(
            "orbitkv serve: listening on {}\nmetrics: http://{}/metrics\ndata: {} ({backend}; DRAM tier {} bytes, SSD tier {} bytes)\npages: {gpu}\n",
            socket.display(),
            exporter.addr(),
            a.data_dir.display(),
            cfg.dram_bytes,
            ssd
        ),
        || {
            serde_json::json!({
            "socket": socket.display().to_string(),
            "metrics": format!("http://{}/metrics", exporter.addr()),
            "data_dir": a.data_dir.display().to_string(),
            "io": backend,
            "dram_bytes": cfg.dram_bytes,
            "ssd_bytes": ssd,
            "pages": "host",
            })
        },
    )?;
    let _ = std::io::stdout().flush();
    let stopper = server.stopper();
    let watcher = std::thread::spawn(move || {
        while !STOP.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(20));
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
