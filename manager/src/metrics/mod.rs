//! The daemon's metrics; [`Exporter`] (in `exporter.rs`) serves them over HTTP.
//! This file is long because [`Metrics::render`] names each exposed family on its own lines,
//! and its tests list every family and series once more.
//!
//! The hot path bumps atomics in [`Metrics`].
//! A scrape reads them into a `prometheus-client` collector, encoded in the Prometheus text
//! format (version 0.0.4).
//! Names, label names and values, and HELP lines are those of the hand-written text before.
//! Only three `le` bounds are spelled differently, as Go clients spell them (`1e-05`, not
//! `0.00001`); Prometheus reads the same number.
//!
//! To add a counter:
//! 1. add a `pub` [`AtomicU64`] field to [`Metrics`] and bump it with [`inc`];
//! 2. add one line to [`Metrics::render`]:
//!    `x.counter("orbitkv_<what>_total", "<Help.>", g(&self.<field>));`
//!    (the exposed name, `_total` included; a gauge uses `x.gauge` and no `_total`);
//! 3. add its `# TYPE` line to `TYPES` in this file's tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use orbitkv_protocol::miss::MISS_REASONS;
use orbitkv_store::stats::StatsSnapshot;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet, prometheus_text};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

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
    /// Connections refused because the daemon served its limit of them.
    pub refused_connections: AtomicU64,
    /// Connections closed because the peer did not take its replies.
    pub slow_peers: AtomicU64,
    /// Publishes made durable by the committer.
    pub committed_publishes: AtomicU64,
    /// Group commits: the committer's syncs, each making every Publish appended before it
    /// durable together.
    pub commits: AtomicU64,
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
    pub fn observe(&self, kind: Timed, d: Duration) {
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
    pub fn observe(&self, d: Duration) {
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

    /// The values at one moment: bucket bounds in seconds with their own counts.
    fn values(&self) -> HistogramValues {
        let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS_US
            .iter()
            .zip(&self.buckets)
            .map(|(b, c)| (*b as f64 / 1e6, c.load(Ordering::Relaxed)))
            .collect();
        let bucketed = buckets.iter().fold(0u64, |n, (_, c)| n.saturating_add(*c));
        // An observation bumps its bucket before the count: the count read after the buckets
        // is raised to them so that `+Inf` is never below a finite bucket.
        let count = self.count.load(Ordering::Relaxed).max(bucketed);
        HistogramValues {
            sum: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
            count,
            buckets,
        }
    }
}

impl Metrics {
    /// Counts a Load's (`load`) or Publish's page statuses.
    pub fn pages(&self, statuses: &[orbitkv_protocol::PageStatus], load: bool) {
        for s in statuses {
            if matches!(
                s,
                orbitkv_protocol::PageStatus::Ok | orbitkv_protocol::PageStatus::Held
            ) {
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

/// The HTTP `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// One scrape's values, encoded by `prometheus-client` as a collector.
#[derive(Debug, Default)]
struct Scrape {
    families: Vec<Family>,
}

/// One metric family of a scrape.
#[derive(Debug)]
struct Family {
    /// The name the encoder is given: a counter's without `_total` (the encoder adds it).
    name: &'static str,
    help: &'static str,
    values: Values,
}

/// A family's values.
#[derive(Debug)]
enum Values {
    Counter(u64),
    Gauge(u64),
    /// Counters by the value of one label.
    Counters(&'static str, Vec<(&'static str, u64)>),
    /// Histograms by the value of one label.
    Histograms(&'static str, Vec<(&'static str, HistogramValues)>),
}

/// A histogram's values: the sum in seconds, the count, and per bucket its upper bound in
/// seconds and its own (not cumulative) count.
#[derive(Debug)]
struct HistogramValues {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

/// A counter's name as the encoder takes it: without the `_total` it adds.
fn counter_name(exposed: &'static str) -> &'static str {
    exposed.strip_suffix("_total").unwrap_or(exposed)
}

impl Scrape {
    /// A counter, by its exposed name (`_total` included).
    fn counter(&mut self, name: &'static str, help: &'static str, v: u64) {
        self.push(counter_name(name), help, Values::Counter(v));
    }

    /// A gauge.
    fn gauge(&mut self, name: &'static str, help: &'static str, v: u64) {
        self.push(name, help, Values::Gauge(v));
    }

    /// Counters by the value of `label`, by their exposed name (`_total` included).
    fn counters(
        &mut self,
        name: &'static str,
        help: &'static str,
        label: &'static str,
        vs: Vec<(&'static str, u64)>,
    ) {
        self.push(counter_name(name), help, Values::Counters(label, vs));
    }

    fn push(&mut self, name: &'static str, help: &'static str, values: Values) {
        self.families.push(Family { name, help, values });
    }

    /// The text exposition.
    fn encode(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::new();
        if let Err(e) = prometheus_text::encode(&mut out, &registry) {
            tracing::warn!("metrics: encoding failed: {e}");
        }
        out
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.families {
            let kind = match f.values {
                Values::Counter(_) | Values::Counters(..) => MetricType::Counter,
                Values::Gauge(_) => MetricType::Gauge,
                Values::Histograms(..) => MetricType::Histogram,
            };
            let mut m = encoder.encode_descriptor(f.name, f.help, None, kind)?;
            match &f.values {
                Values::Counter(v) => m.encode_counter::<NoLabelSet, _, u64>(v, None)?,
                Values::Gauge(v) => m.encode_gauge(v)?,
                Values::Counters(label, vs) => {
                    for (value, v) in vs {
                        let labels = [(*label, *value)];
                        m.encode_family(&labels)?
                            .encode_counter::<NoLabelSet, _, u64>(v, None)?;
                    }
                }
                Values::Histograms(label, hs) => {
                    for (value, h) in hs {
                        let labels = [(*label, *value)];
                        m.encode_family(&labels)?
                            .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl Metrics {
    /// The text exposition of every metric, the store's included.
    pub fn render(&self, now: &Gauges, store: &StatsSnapshot) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut x = Scrape::default();
        x.counter(
            "orbitkv_connections_total",
            "Connections accepted.",
            g(&self.connections),
        );
        x.counter(
            "orbitkv_refused_peers_total",
            "Connections refused by peer credentials.",
            g(&self.refused_peers),
        );
        x.counter(
            "orbitkv_refused_connections_total",
            "Connections refused because the daemon served its limit of them.",
            g(&self.refused_connections),
        );
        x.counter(
            "orbitkv_slow_peers_total",
            "Connections closed because the peer did not take its replies.",
            g(&self.slow_peers),
        );
        x.counter(
            "orbitkv_malformed_messages_total",
            "Messages refused as malformed.",
            g(&self.malformed),
        );
        x.counter(
            "orbitkv_committed_publishes_total",
            "Publishes made durable by the group committer.",
            g(&self.committed_publishes),
        );
        x.counter(
            "orbitkv_commits_total",
            "Group commits: syncs, each making every Publish appended before it durable together.",
            g(&self.commits),
        );
        x.counter(
            "orbitkv_seals_total",
            "Engine instances sealed.",
            g(&self.seals),
        );
        x.counter(
            "orbitkv_seal_refusals_total",
            "Registrations refused (disagreement, timeout, bad rank).",
            g(&self.seal_refusals),
        );
        x.counter(
            "orbitkv_refused_tokens_total",
            "Requests refused for an unknown token or a stale epoch.",
            g(&self.refused_tokens),
        );
        x.gauge(
            "orbitkv_sessions",
            "Sessions of sealed instances.",
            now.sessions,
        );
        x.counter(
            "orbitkv_queries_total",
            "Queries and acquires answered.",
            g(&self.queries),
        );
        x.counter(
            "orbitkv_hits_total",
            "Queries answered with a proof.",
            g(&self.hits),
        );
        x.counter(
            "orbitkv_proven_tokens_total",
            "Tokens proven restorable beyond the engines' origins.",
            g(&self.proven_tokens),
        );
        x.counter(
            "orbitkv_loaded_pages_total",
            "Pages copied into engine pages.",
            g(&self.loaded_pages),
        );
        x.counter(
            "orbitkv_published_pages_total",
            "Pages copied out of engine pages into the store.",
            g(&self.published_pages),
        );
        x.counter(
            "orbitkv_failed_pages_total",
            "Pages of a Load or Publish that failed (the engine recomputes them).",
            g(&self.failed_pages),
        );
        // Code 0 is no reason: the names start at code 1.
        x.counters(
            "orbitkv_misses_total",
            "Queries answered with a miss, by reason.",
            "reason",
            MISS_REASONS
                .iter()
                .zip(self.misses.iter().skip(1))
                .map(|(name, c)| (*name, g(c)))
                .collect(),
        );
        x.counter(
            "orbitkv_loaded_bytes_total",
            "Bytes copied from the store into engine pages.",
            g(&self.loaded_bytes),
        );
        x.counter(
            "orbitkv_published_bytes_total",
            "Bytes copied out of engine pages to be stored.",
            g(&self.published_bytes),
        );
        x.counter("orbitkv_store_puts_total", "Bundles put.", store.puts);
        x.counter(
            "orbitkv_store_put_bytes_total",
            "Payload bytes put.",
            store.put_bytes,
        );
        x.counter(
            "orbitkv_store_gets_total",
            "Verified reads of stored records (loads included).",
            store.gets,
        );
        x.counter(
            "orbitkv_store_dram_hits_total",
            "Reads served from the DRAM tier (the rest came from SSD).",
            store.dram_hits,
        );
        x.counter(
            "orbitkv_store_repaired_tails_total",
            "Torn segment tails truncated when the store was opened.",
            store.torn_tails_truncated,
        );
        x.counter(
            "orbitkv_store_checksum_failures_total",
            "Records that failed verification on read (each a miss).",
            store.checksum_failures,
        );
        x.counter(
            "orbitkv_store_refused_puts_total",
            "Puts refused (no space, failed disk, capacity).",
            store.refused_puts,
        );
        x.counter(
            "orbitkv_store_capacity_refusals_total",
            "Puts refused because the SSD budget could not be freed (everything left pinned).",
            store.capacity_refusals,
        );
        x.counter(
            "orbitkv_store_evicted_records_total",
            "Records the SSD tier's policy evicted to keep its budget.",
            store.evicted_records,
        );
        x.counter(
            "orbitkv_store_punched_bytes_total",
            "File bytes given back by punching evicted records out of their segments.",
            store.punched_bytes,
        );
        x.counter(
            "orbitkv_store_failed_punches_total",
            "Punches that failed (the record's bytes stay counted until its segment goes).",
            store.failed_punches,
        );
        x.counter(
            "orbitkv_store_held_records_total",
            "Records published that waited in DRAM for SSD admission instead of being written.",
            store.held_records,
        );
        x.counter(
            "orbitkv_store_admitted_records_total",
            "Waiting records written to SSD once read.",
            store.admitted_records,
        );
        x.counter(
            "orbitkv_store_read_errors_total",
            "Reads that failed with an I/O error (each a miss; the segment is quarantined).",
            store.read_errors,
        );
        x.counter(
            "orbitkv_store_lost_records_total",
            "Accepted records lost to a failed write or fsync before they were durable.",
            store.lost_records,
        );
        x.counter(
            "orbitkv_store_failed_deletes_total",
            "Segment files the store could not delete (counted in the SSD budget until removed).",
            store.failed_deletes,
        );
        x.counter(
            "orbitkv_store_failed_dir_syncs_total",
            "Directory fsyncs after segment deletions that failed.",
            store.failed_dir_syncs,
        );
        x.counter(
            "orbitkv_store_failed_stats_total",
            "Segment file size queries that failed (the budget counted a known size instead).",
            store.failed_stats,
        );
        x.gauge(
            "orbitkv_store_quarantined_segments",
            "Segments quarantined after read errors.",
            store.quarantined_segments,
        );
        x.counters(
            "orbitkv_validator_rejections_total",
            "Records the validator treated as absent, by reason.",
            "reason",
            REJECTION_REASONS
                .iter()
                .zip(&self.rejections)
                .map(|(name, c)| (*name, g(c)))
                .collect(),
        );
        x.push(
            "orbitkv_request_seconds",
            "Time the daemon took to answer hot-path requests, by kind.",
            Values::Histograms(
                "kind",
                LATENCY_KINDS
                    .iter()
                    .zip(&self.latency)
                    .map(|(kind, h)| (*kind, h.values()))
                    .collect(),
            ),
        );
        x.gauge(
            "orbitkv_leases",
            "Leases held by engine instances (proven records pinned for their loads).",
            now.leases,
        );
        x.gauge(
            "orbitkv_store_pins",
            "Store pins held (records kept readable for pending loads).",
            now.usage.pins as u64,
        );
        x.gauge(
            "orbitkv_store_records",
            "Records the store's index holds.",
            now.usage.records as u64,
        );
        x.gauge(
            "orbitkv_store_waiting_bytes",
            "Payload bytes waiting in DRAM for SSD admission (not durable).",
            now.usage.waiting_bytes,
        );
        x.gauge(
            "orbitkv_store_ssd_bytes",
            "Bytes of the SSD tier in use.",
            now.usage.ssd_used,
        );
        x.gauge(
            "orbitkv_store_ssd_budget_bytes",
            "The SSD tier's budget (0: none).",
            now.usage.ssd_budget.unwrap_or(0),
        );
        x.gauge(
            "orbitkv_store_dram_bytes",
            "Bytes of the DRAM tier in use.",
            now.usage.dram_used,
        );
        x.gauge(
            "orbitkv_store_writes_refused",
            "1 while the store refuses puts: for good until a restart (the log says why), or for \
             a second after the disk reported no space.",
            u64::from(now.usage.writes_refused),
        );
        x.encode()
    }
}

/// Bytes of a request head (request line and headers) read at most; a longer one gets 431.
mod exporter;

pub use exporter::{Exporter, MAX_REQUEST_HEAD, MAX_SCRAPES};

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family's `# TYPE` line, in the order of the hand-written exposition this
    /// crate's encoding replaced; a new metric adds its line here.
    const TYPES: [&str; 49] = [
        "orbitkv_connections_total counter",
        "orbitkv_refused_peers_total counter",
        "orbitkv_refused_connections_total counter",
        "orbitkv_slow_peers_total counter",
        "orbitkv_malformed_messages_total counter",
        "orbitkv_committed_publishes_total counter",
        "orbitkv_commits_total counter",
        "orbitkv_seals_total counter",
        "orbitkv_seal_refusals_total counter",
        "orbitkv_refused_tokens_total counter",
        "orbitkv_sessions gauge",
        "orbitkv_queries_total counter",
        "orbitkv_hits_total counter",
        "orbitkv_proven_tokens_total counter",
        "orbitkv_loaded_pages_total counter",
        "orbitkv_published_pages_total counter",
        "orbitkv_failed_pages_total counter",
        "orbitkv_misses_total counter",
        "orbitkv_loaded_bytes_total counter",
        "orbitkv_published_bytes_total counter",
        "orbitkv_store_puts_total counter",
        "orbitkv_store_put_bytes_total counter",
        "orbitkv_store_gets_total counter",
        "orbitkv_store_dram_hits_total counter",
        "orbitkv_store_repaired_tails_total counter",
        "orbitkv_store_checksum_failures_total counter",
        "orbitkv_store_refused_puts_total counter",
        "orbitkv_store_capacity_refusals_total counter",
        "orbitkv_store_evicted_records_total counter",
        "orbitkv_store_punched_bytes_total counter",
        "orbitkv_store_failed_punches_total counter",
        "orbitkv_store_held_records_total counter",
        "orbitkv_store_admitted_records_total counter",
        "orbitkv_store_read_errors_total counter",
        "orbitkv_store_lost_records_total counter",
        "orbitkv_store_failed_deletes_total counter",
        "orbitkv_store_failed_dir_syncs_total counter",
        "orbitkv_store_failed_stats_total counter",
        "orbitkv_store_quarantined_segments gauge",
        "orbitkv_validator_rejections_total counter",
        "orbitkv_request_seconds histogram",
        "orbitkv_leases gauge",
        "orbitkv_store_pins gauge",
        "orbitkv_store_records gauge",
        "orbitkv_store_waiting_bytes gauge",
        "orbitkv_store_ssd_bytes gauge",
        "orbitkv_store_ssd_budget_bytes gauge",
        "orbitkv_store_dram_bytes gauge",
        "orbitkv_store_writes_refused gauge",
    ];

    fn render(m: &Metrics) -> String {
        let now = Gauges {
            sessions: 2,
            leases: 1,
            usage: orbitkv_store::Usage {
                ssd_used: 10,
                ssd_budget: None,
                probation_segments: 0,
                dram_used: 20,
                dram_budget: 40,
                dram_entries: 1,
                pins: 3,
                records: 4,
                waiting_records: 0,
                waiting_bytes: 0,
                writes_refused: true,
            },
        };
        let store = StatsSnapshot {
            puts: 5,
            ..StatsSnapshot::default()
        };
        m.render(&now, &store)
    }

    #[test]
    fn render_has_every_family_of_the_hand_written_exposition() {
        let text = render(&Metrics::default());
        let types: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .collect();
        assert_eq!(types, TYPES, "{text}");
        // Each family has its HELP line, under the same name as its TYPE line.
        let helps: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# HELP "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let names: Vec<&str> = types.iter().filter_map(|t| t.split(' ').next()).collect();
        assert_eq!(helps, names);
    }

    #[test]
    fn render_has_every_series_of_the_hand_written_exposition() {
        let text = render(&Metrics::default());
        let names: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split([' ', '{']).next())
            .collect();
        for t in TYPES {
            let (name, kind) = t.split_once(' ').unwrap();
            let expected = match kind {
                "histogram" => 0,
                _ if name == "orbitkv_misses_total" => MISS_REASONS.len(),
                _ if name == "orbitkv_validator_rejections_total" => REJECTION_REASONS.len(),
                _ => 1,
            };
            let n = names.iter().filter(|n| **n == name).count();
            assert_eq!(n, expected, "{name} in:\n{text}");
        }
        for suffix in ["_bucket", "_sum", "_count"] {
            let name = format!("orbitkv_request_seconds{suffix}");
            let per_kind = if suffix == "_bucket" {
                LATENCY_BUCKETS_US.len() + 1
            } else {
                1
            };
            let n = names.iter().filter(|n| **n == name).count();
            assert_eq!(n, per_kind * LATENCY_KINDS.len(), "{name} in:\n{text}");
        }
        for r in MISS_REASONS {
            let line = format!("orbitkv_misses_total{{reason=\"{r}\"}} 0\n");
            assert!(text.contains(&line), "{line}");
        }
        for r in REJECTION_REASONS {
            let line = format!("orbitkv_validator_rejections_total{{reason=\"{r}\"}} 0\n");
            assert!(text.contains(&line), "{line}");
        }
        for k in LATENCY_KINDS {
            let line = format!("orbitkv_request_seconds_count{{kind=\"{k}\"}} 0\n");
            assert!(text.contains(&line), "{line}");
            let line = format!("orbitkv_request_seconds_bucket{{kind=\"{k}\",le=\"+Inf\"}} 0\n");
            assert!(text.contains(&line), "{line}");
        }
    }

    #[test]
    fn render_writes_the_values() {
        let m = Metrics::default();
        inc(&m.queries);
        inc(&m.queries);
        m.miss(1);
        m.miss(0);
        m.miss(99);
        m.observe(Timed::Release, Duration::from_micros(30));
        let text = render(&m);
        for line in [
            "orbitkv_queries_total 2\n",
            "orbitkv_sessions 2\n",
            "orbitkv_leases 1\n",
            "orbitkv_store_pins 3\n",
            "orbitkv_store_records 4\n",
            "orbitkv_store_ssd_budget_bytes 0\n",
            "orbitkv_store_writes_refused 1\n",
            "orbitkv_store_puts_total 5\n",
            "orbitkv_misses_total{reason=\"nothing_beyond_origin\"} 1\n",
            "orbitkv_request_seconds_bucket{kind=\"release\",le=\"2.5e-05\"} 0\n",
            "orbitkv_request_seconds_bucket{kind=\"release\",le=\"5e-05\"} 1\n",
            "orbitkv_request_seconds_bucket{kind=\"release\",le=\"1\"} 1\n",
            "orbitkv_request_seconds_bucket{kind=\"release\",le=\"+Inf\"} 1\n",
            "orbitkv_request_seconds_count{kind=\"release\"} 1\n",
            "orbitkv_request_seconds_sum{kind=\"release\"} 0.00003\n",
        ] {
            assert!(text.contains(line), "no {line:?} in:\n{text}");
        }
    }
}
