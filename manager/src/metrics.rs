//! The daemon's metrics, rendered in the Prometheus text exposition format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use orbitkv_store::stats::StatsSnapshot;

/// Counters and gauges the daemon keeps.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections refused by peer credentials.
    pub refused_peers: AtomicU64,
    /// Frames refused as malformed.
    pub malformed: AtomicU64,
    /// Instances sealed.
    pub seals: AtomicU64,
    /// Registrations refused (disagreement, timeout, bad rank).
    pub seal_refusals: AtomicU64,
    /// Requests refused for a bad token or a stale epoch.
    pub refused_tokens: AtomicU64,
    /// Queries and acquires answered.
    pub queries: AtomicU64,
    /// Of them, proofs.
    pub hits: AtomicU64,
    /// Tokens proven restorable beyond the engines' origins.
    pub proven_tokens: AtomicU64,
    /// Misses by reason code (index = code; 0 unused).
    pub misses: [AtomicU64; MISS_REASONS.len() + 1],
    /// Pages loaded into engine pages.
    pub loaded_pages: AtomicU64,
    /// Pages published into the store.
    pub published_pages: AtomicU64,
    /// Bytes copied into engine pages (out of the store's DRAM or SSD tier).
    pub loaded_bytes: AtomicU64,
    /// Bytes copied out of engine pages for publishing (into the store).
    pub published_bytes: AtomicU64,
    /// Pages of a Load or Publish that failed (stale, out of range, bad record, ...).
    pub failed_pages: AtomicU64,
    /// Records the validator treated as absent, by reason ([`REJECTION_REASONS`]).
    pub rejections: [AtomicU64; REJECTION_REASONS.len()],
    /// Time the daemon took to answer each hot-path request, by kind ([`LATENCY_KINDS`]).
    pub latency: [Histogram; LATENCY_KINDS.len()],
}

/// Why the validator treated a record as absent, by `crate::query::rejection_code`.
pub const REJECTION_REASONS: [&str; 10] = [
    "namespace",
    "domain",
    "unknown_group",
    "component",
    "rank",
    "key_fields",
    "format",
    "misaligned",
    "overlap",
    "duplicate",
];

/// The hot-path requests whose service time is kept, in [`Metrics::latency`] order: a
/// Publish is timed to its first reply (the pages are free) and to its second (durable).
pub const LATENCY_KINDS: [&str; 6] = [
    "query",
    "acquire",
    "load",
    "publish_copied",
    "publish_durable",
    "release",
];

/// A hot-path request's latency histogram: its index in [`Metrics::latency`] and
/// [`LATENCY_KINDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timed {
    /// A Query.
    Query = 0,
    /// An Acquire.
    Acquire = 1,
    /// A Load.
    Load = 2,
    /// A Publish, to its first reply.
    PublishCopied = 3,
    /// A Publish, to its second reply.
    PublishDurable = 4,
    /// A Release.
    Release = 5,
}

impl Metrics {
    /// Counts a `kind` request that took `d`.
    pub fn observe(&self, kind: Timed, d: std::time::Duration) {
        self.latency[kind as usize].observe(d);
    }
}

/// Upper bounds of the latency buckets, in microseconds.
pub const LATENCY_BUCKETS_US: [u64; 14] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 1_000_000,
];

/// A latency histogram: counts per bucket (not cumulative), the sum and the count.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len()],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// Counts one request that took `d`.
    pub fn observe(&self, d: std::time::Duration) {
        let us = d.as_micros() as u64;
        if let Some(i) = LATENCY_BUCKETS_US.iter().position(|b| us <= *b) {
            inc(&self.buckets[i]);
        }
        self.sum_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        inc(&self.count);
    }

    /// Requests counted.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// Miss reason names, by code from 1 (docs/protocol.md, "Miss reasons").
pub const MISS_REASONS: [&str; 10] = [
    "nothing_beyond_origin",
    "unsupported_component",
    "gap",
    "overlap",
    "duplicate",
    "past_end",
    "missing_rank",
    "window_incomplete",
    "no_checkpoint",
    "no_common_boundary",
];

impl Metrics {
    /// Counts a Load's (`load`) or Publish's page statuses.
    pub fn pages(&self, statuses: &[crate::protocol::PageStatus], load: bool) {
        for s in statuses {
            if *s == crate::protocol::PageStatus::Ok {
                inc(if load {
                    &self.loaded_pages
                } else {
                    &self.published_pages
                });
            } else {
                inc(&self.failed_pages);
            }
        }
    }

    /// Counts a record the validator treated as absent.
    pub fn rejection(&self, d: &orbitkv_state::Disagreement) {
        if let Some(c) = self.rejections.get(crate::query::rejection_code(d)) {
            inc(c);
        }
    }

    /// Counts a miss of reason `code`.
    pub fn miss(&self, code: u16) {
        if let Some(c) = self.misses.get(code as usize) {
            inc(c);
        }
    }
}

/// The values of the daemon's gauges at one moment.
#[derive(Debug, Clone)]
pub struct Gauges {
    /// Sessions of sealed instances.
    pub sessions: u64,
    /// Leases held.
    pub leases: u64,
    /// The store's tiers, pins and records.
    pub usage: orbitkv_store::Usage,
}

/// Adds one to a counter.
pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
    );
}

fn gauge(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

impl Metrics {
    /// The text exposition of every metric, the store's included.
    pub fn render(&self, now: &Gauges, store: &StatsSnapshot) -> String {
        let sessions = now.sessions;
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut o = String::new();
        counter(
            &mut o,
            "orbitkv_connections_total",
            "Connections accepted.",
            g(&self.connections),
        );
        counter(
            &mut o,
            "orbitkv_refused_peers_total",
            "Connections refused by peer credentials.",
            g(&self.refused_peers),
        );
        counter(
            &mut o,
            "orbitkv_malformed_messages_total",
            "Messages refused as malformed.",
            g(&self.malformed),
        );
        counter(
            &mut o,
            "orbitkv_seals_total",
            "Engine instances sealed.",
            g(&self.seals),
        );
        counter(
            &mut o,
            "orbitkv_seal_refusals_total",
            "Registrations refused (disagreement, timeout, bad rank).",
            g(&self.seal_refusals),
        );
        counter(
            &mut o,
            "orbitkv_refused_tokens_total",
            "Requests refused for an unknown token or a stale epoch.",
            g(&self.refused_tokens),
        );
        gauge(
            &mut o,
            "orbitkv_sessions",
            "Sessions of sealed instances.",
            sessions,
        );
        counter(
            &mut o,
            "orbitkv_queries_total",
            "Queries and acquires answered.",
            g(&self.queries),
        );
        counter(
            &mut o,
            "orbitkv_hits_total",
            "Queries answered with a proof.",
            g(&self.hits),
        );
        counter(
            &mut o,
            "orbitkv_proven_tokens_total",
            "Tokens proven restorable beyond the engines' origins.",
            g(&self.proven_tokens),
        );
        counter(
            &mut o,
            "orbitkv_loaded_pages_total",
            "Pages copied into engine pages.",
            g(&self.loaded_pages),
        );
        counter(
            &mut o,
            "orbitkv_published_pages_total",
            "Pages copied out of engine pages into the store.",
            g(&self.published_pages),
        );
        counter(
            &mut o,
            "orbitkv_failed_pages_total",
            "Pages of a Load or Publish that failed (the engine recomputes them).",
            g(&self.failed_pages),
        );
        let _ = writeln!(
            o,
            "# HELP orbitkv_misses_total Queries answered with a miss, by reason.\n# TYPE orbitkv_misses_total counter"
        );
        for (i, name) in MISS_REASONS.iter().enumerate() {
            let _ = writeln!(
                o,
                "orbitkv_misses_total{{reason=\"{name}\"}} {}",
                g(&self.misses[i + 1])
            );
        }
        counter(
            &mut o,
            "orbitkv_loaded_bytes_total",
            "Bytes copied from the store into engine pages.",
            g(&self.loaded_bytes),
        );
        counter(
            &mut o,
            "orbitkv_published_bytes_total",
            "Bytes copied out of engine pages to be stored.",
            g(&self.published_bytes),
        );
        counter(
            &mut o,
            "orbitkv_store_puts_total",
            "Bundles put.",
            store.puts,
        );
        counter(
            &mut o,
            "orbitkv_store_put_bytes_total",
            "Payload bytes put.",
            store.put_bytes,
        );
        counter(
            &mut o,
            "orbitkv_store_gets_total",
            "Verified reads of stored records (loads included).",
            store.gets,
        );
        counter(
            &mut o,
            "orbitkv_store_dram_hits_total",
            "Reads served from the DRAM tier (the rest came from SSD).",
            store.dram_hits,
        );
        counter(
            &mut o,
            "orbitkv_store_repaired_tails_total",
            "Torn segment tails truncated when the store was opened.",
            store.torn_tails_truncated,
        );
        counter(
            &mut o,
            "orbitkv_store_checksum_failures_total",
            "Records that failed verification on read (each a miss).",
            store.checksum_failures,
        );
        counter(
            &mut o,
            "orbitkv_store_refused_puts_total",
            "Puts refused (no space, failed disk, capacity).",
            store.refused_puts,
        );
        counter(
            &mut o,
            "orbitkv_store_lost_records_total",
            "Accepted records lost to a failed write or fsync before they were durable.",
            store.lost_records,
        );
        counter(
            &mut o,
            "orbitkv_store_failed_deletes_total",
            "Segment files the store could not delete (counted in the SSD budget until removed).",
            store.failed_deletes,
        );
        counter(
            &mut o,
            "orbitkv_store_failed_dir_syncs_total",
            "Directory fsyncs after segment deletions that failed.",
            store.failed_dir_syncs,
        );
        counter(
            &mut o,
            "orbitkv_store_failed_stats_total",
            "Segment file size queries that failed (the budget counted a known size instead).",
            store.failed_stats,
        );
        gauge(
            &mut o,
            "orbitkv_store_quarantined_segments",
            "Segments quarantined after read errors.",
            store.quarantined_segments,
        );
        let _ = writeln!(
            o,
            "# HELP orbitkv_validator_rejections_total Records the validator treated as absent, by reason.\n# TYPE orbitkv_validator_rejections_total counter"
        );
        for (name, c) in REJECTION_REASONS.iter().zip(&self.rejections) {
            let _ = writeln!(
                o,
                "orbitkv_validator_rejections_total{{reason=\"{name}\"}} {}",
                g(c)
            );
        }
        let _ = writeln!(
            o,
            "# HELP orbitkv_request_seconds Time the daemon took to answer hot-path requests, by kind.\n# TYPE orbitkv_request_seconds histogram"
        );
        for (kind, h) in LATENCY_KINDS.iter().zip(&self.latency) {
            let mut cumulative = 0;
            for (b, c) in LATENCY_BUCKETS_US.iter().zip(&h.buckets) {
                cumulative += g(c);
                let _ = writeln!(
                    o,
                    "orbitkv_request_seconds_bucket{{kind=\"{kind}\",le=\"{}\"}} {cumulative}",
                    *b as f64 / 1e6
                );
            }
            let count = g(&h.count);
            let _ = writeln!(
                o,
                "orbitkv_request_seconds_bucket{{kind=\"{kind}\",le=\"+Inf\"}} {count}\norbitkv_request_seconds_sum{{kind=\"{kind}\"}} {}\norbitkv_request_seconds_count{{kind=\"{kind}\"}} {count}",
                g(&h.sum_ns) as f64 / 1e9
            );
        }
        gauge(
            &mut o,
            "orbitkv_leases",
            "Leases held by engine instances (proven records pinned for their loads).",
            now.leases,
        );
        gauge(
            &mut o,
            "orbitkv_store_pins",
            "Store pins held (records kept readable for pending loads).",
            now.usage.pins as u64,
        );
        gauge(
            &mut o,
            "orbitkv_store_records",
            "Records the store's index holds.",
            now.usage.records as u64,
        );
        gauge(
            &mut o,
            "orbitkv_store_ssd_bytes",
            "Bytes of the SSD tier in use.",
            now.usage.ssd_used,
        );
        gauge(
            &mut o,
            "orbitkv_store_ssd_budget_bytes",
            "The SSD tier's budget (0: none).",
            now.usage.ssd_budget.unwrap_or(0),
        );
        gauge(
            &mut o,
            "orbitkv_store_dram_bytes",
            "Bytes of the DRAM tier in use.",
            now.usage.dram_used,
        );
        o
    }
}

/// A minimal HTTP exporter: `GET /metrics` answers the text of `source()`; anything else 404.
pub struct Exporter {
    addr: std::net::SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Exporter {
    /// Listens on `addr` (`127.0.0.1:0` picks a free port) and serves until dropped.
    pub fn start(
        addr: &str,
        source: impl Fn() -> String + Send + 'static,
    ) -> std::io::Result<Self> {
        use std::io::{BufRead, BufReader, Write as _};
        let listener = std::net::TcpListener::bind(addr)?;
        let local = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Acquire) {
                let Ok((mut s, _)) = listener.accept() else {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    continue;
                };
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                let mut line = String::new();
                let ok = BufReader::new(&s).read_line(&mut line).is_ok();
                let path = line.split_whitespace().nth(1).unwrap_or("");
                let response = if ok && line.starts_with("GET ") && path == "/metrics" {
                    let body = source();
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                } else {
                    "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_owned()
                };
                let _ = s.write_all(response.as_bytes());
            }
        });
        Ok(Self {
            addr: local,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
