//! `orbitkv bench replay`: replays a Mooncake-format request trace against a store. Each
//! `hash_ids` entry is one chained prefix block; for each request the longest present prefix is
//! probed, its blocks counted as hits and read back (verified, and checked against the bytes the
//! block was written with), and the rest of the request's blocks are put as one bundle, synced.
//!
//! Two per-block references run without a store on the same access sequence — `lru` (least
//! recently used, blocks touched in request order) and `min` (Belady: evict the block reused
//! furthest in the future; an upper reference, not an exact optimum for prefix hits) — with the
//! capacity in blocks the store's SSD budget holds (`ssd_bytes / (block_bytes + 512)`: a frame
//! header and a footer entry per record). `--compare` runs both and every store policy.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use orbitkv_segments::{Alignment, RecordMeta};
use orbitkv_state::{FormatDigest, Namespace, StateKey, TokenRange};
use orbitkv_store::{
    Admission, Durability, Policy, StateStore, StoreConfig, ssd_bytes_holding, ssd_records_held,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::Failure;
use crate::output::Output;
use crate::size::parse_size;

/// Tokens per trace block (the trace's block size).
const BLOCK_TOKENS: u64 = 512;
/// Bundles are cut at this many payload bytes.
const MAX_BUNDLE: u64 = 64 << 20;

/// `bench replay`.
#[derive(Args)]
pub struct ReplayArgs {
    /// The trace (JSON lines with `hash_ids`).
    #[arg(long, value_name = "FILE")]
    trace: PathBuf,
    /// The data directory (must not hold a store yet; `--compare` uses one subdirectory per
    /// policy and removes each after its run).
    #[arg(long, value_name = "DIR", default_value = "./orbitkv-replay")]
    data_dir: PathBuf,
    /// The DRAM tier's budget (units allowed; 0 disables it).
    #[arg(long, value_name = "X", value_parser = parse_size)]
    dram_bytes: u64,
    /// The SSD tier's budget (units allowed).
    #[arg(long, value_name = "Y", value_parser = parse_size)]
    ssd_bytes: u64,
    /// Payload bytes per block.
    #[arg(long, value_name = "B", default_value = "16KiB", value_parser = parse_size)]
    block_bytes: u64,
    /// `record-lru`, `s3-fifo`, `fifo` or `fifo-reinsert` (the store's policies), or `lru` or
    /// `min` (per-block references, simulated without a store).
    #[arg(long, value_name = "NAME", default_value = "record-lru")]
    policy: String,
    /// Replay only the first N requests.
    #[arg(long, value_name = "N")]
    requests: Option<usize>,
    /// Run `lru`, `min` and every store policy, and print how each compares with LRU.
    #[arg(long)]
    compare: bool,
    /// Adaptive SSD admission under `record-lru`, with a waiting room of a tenth of the SSD
    /// budget (first-time records may wait there instead of being written).
    #[arg(long)]
    admission: bool,
}

/// The budgets a replay runs under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    /// The DRAM tier's bytes (0: none).
    pub dram_bytes: u64,
    /// The SSD tier's bytes.
    pub ssd_bytes: u64,
    /// Payload bytes per block.
    pub block_bytes: u64,
    /// The SSD admission waiting room's bytes (0: no admission).
    pub waiting_bytes: u64,
}

impl Budget {
    /// An SSD tier whose segments hold `blocks` blocks of `block_bytes` (their frames, footer
    /// entries and each segment's fixed bytes counted apart), and no DRAM tier.
    pub(crate) fn ssd_blocks(blocks: u64, block_bytes: u64) -> Self {
        Self {
            dram_bytes: 0,
            ssd_bytes: ssd_bytes_holding(blocks, block_bytes, Alignment::Direct),
            block_bytes,
            waiting_bytes: 0,
        }
    }

    /// With adaptive SSD admission, its waiting room a tenth of the SSD budget.
    pub(crate) fn admitting(self) -> Self {
        Self {
            waiting_bytes: self.ssd_bytes / 10,
            ..self
        }
    }

    /// The blocks the SSD budget's segments hold, for the simulated references: LRU and MIN
    /// get as many payload blocks as the store.
    pub(crate) fn capacity(&self) -> usize {
        let held = ssd_records_held(self.ssd_bytes, self.block_bytes.max(1), Alignment::Direct);
        usize::try_from(held).unwrap_or(usize::MAX)
    }
}

/// What one replay measured.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub policy: String,
    simulated: bool,
    requests: u64,
    pub block_refs: u64,
    pub hits: u64,
    dram_hits: u64,
    pub bytes_written: u64,
    bytes_read: u64,
    seconds: f64,
    reinserted: u64,
    evicted: u64,
    /// Blocks put that waited in DRAM (SSD admission), and those written once read there.
    held: u64,
    admitted: u64,
    admission: bool,
    pub mismatched: u64,
}

impl Outcome {
    pub(crate) fn hit_ratio(&self) -> f64 {
        if self.block_refs == 0 {
            0.0
        } else {
            self.hits as f64 / self.block_refs as f64
        }
    }

    fn json(&self) -> Value {
        json!({
            "requests": self.requests,
            "block_refs": self.block_refs,
            "hits": self.hits,
            "hit_ratio": self.hit_ratio(),
            "bytes_written": self.bytes_written,
            "bytes_read": self.bytes_read,
            "seconds": self.seconds,
            "policy": self.policy,
            "simulated": self.simulated,
            "dram_hits": self.dram_hits,
            "reinserted": self.reinserted,
            "evicted": self.evicted,
            "admission": if self.admission { "adaptive" } else { "off" },
            "held": self.held,
            "admitted": self.admitted,
            "mismatched": self.mismatched,
        })
    }
}

fn namespace() -> Namespace {
    Namespace(Sha256::digest(b"orbitkv-replay-namespace").into())
}

fn block_key(id: u64) -> Result<StateKey, Failure> {
    let mut h = Sha256::new();
    h.update(b"orbitkv-replay-block");
    h.update(id.to_le_bytes());
    let native: [u8; 32] = h.finalize().into();
    super::bench_records::bench_state_key(namespace(), &native)
}

/// Block `id`'s bytes: a function of the id and the length.
fn block_payload(id: u64, len: usize) -> Vec<u8> {
    orbitkv_testkit::payload(id.wrapping_mul(0x9E37_79B9_7F4A_7C15), len)
}

fn parse_policy(name: &str) -> Result<Option<Policy>, Failure> {
    if name == "lru" || name == "min" {
        return Ok(None);
    }
    Policy::ALL
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, p)| Some(*p))
        .ok_or_else(|| {
            Failure::refused(format!(
                "--policy {name}: one of record-lru, s3-fifo, fifo, fifo-reinsert, lru, min"
            ))
        })
}

fn bar(total: u64, label: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let template = format!("{label} {{pos}}/{{len}} requests {{wide_bar}} eta {{eta}}");
    bar.set_style(
        ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// Replays `trace` against a fresh store in `dir`.
pub(crate) fn replay_store(
    trace: &[Vec<u64>],
    a: Budget,
    policy: Policy,
    dir: &Path,
) -> Result<Outcome, Failure> {
    if dir.join("orbitkv.dir").exists() {
        return Err(Failure::refused(format!(
            "{}: already holds a store; replay needs a fresh data directory",
            dir.display()
        )));
    }
    let block = usize::try_from(a.block_bytes)
        .ok()
        .filter(|b| *b > 0 && *b <= orbitkv_segments::MAX_PAYLOAD_LEN)
        .ok_or_else(|| Failure::refused("--block-bytes: between 1 byte and 2 GiB"))?;
    let mut cfg = StoreConfig::new(dir);
    // Direct frames, as `orbitkv serve` writes where the disk takes O_DIRECT.
    cfg.alignment = Alignment::Direct;
    cfg.durability = Durability::Manual;
    cfg.ssd_bytes = Some(a.ssd_bytes);
    cfg.dram_bytes = a.dram_bytes;
    cfg.policy = policy;
    cfg.admission = match a.waiting_bytes {
        0 => Admission::Off,
        waiting_bytes => Admission::Adaptive { waiting_bytes },
    };
    let refused = |e: orbitkv_store::Error| Failure::refused(e.to_string());
    let store = StateStore::open(orbitkv_store::io::offline_backend(), cfg).map_err(refused)?;
    store
        .register_namespace(
            namespace(),
            super::bench_records::bench_namespace_info("orbitkv-replay", format!("block-{block}")),
        )
        .map_err(refused)?;
    let format = FormatDigest([0x5e; 32]);
    let progress = bar(trace.len() as u64, policy.name());
    let mut o = Outcome {
        policy: policy.name().to_owned(),
        simulated: false,
        requests: 0,
        block_refs: 0,
        hits: 0,
        dram_hits: 0,
        bytes_written: 0,
        bytes_read: 0,
        seconds: 0.0,
        reinserted: 0,
        evicted: 0,
        held: 0,
        admitted: 0,
        admission: a.waiting_bytes > 0,
        mismatched: 0,
    };
    let start = Instant::now();
    let mut buf = Vec::new();
    for ids in trace {
        let chain = ids
            .iter()
            .map(|id| block_key(*id))
            .collect::<Result<Vec<_>, _>>()?;
        let k = store.probe(&chain);
        o.requests += 1;
        o.block_refs += ids.len() as u64;
        o.hits += k as u64;
        for (key, id) in chain.iter().zip(ids).take(k) {
            match store.get(key, &mut buf).map_err(refused)? {
                Some(_) => {
                    o.bytes_read += buf.len() as u64;
                    if buf != block_payload(*id, block) {
                        o.mismatched += 1;
                    }
                }
                // Probed present, then gone: not a hit after all.
                None => o.hits -= 1,
            }
        }
        let mut bundle: Vec<(RecordMeta, Vec<u8>)> = Vec::new();
        let mut bundle_bytes = 0u64;
        for (i, (key, id)) in chain.iter().zip(ids).enumerate().skip(k) {
            if store.index().contains(key) {
                continue;
            }
            let i = i as u64;
            let range = TokenRange::new(i * BLOCK_TOKENS, (i + 1) * BLOCK_TOKENS)
                .map_err(|e| Failure::internal(e.to_string()))?;
            let parent = (i > 0).then(|| chain[i as usize - 1]);
            bundle.push((
                RecordMeta {
                    key: *key,
                    parent,
                    range,
                    format,
                },
                block_payload(*id, block),
            ));
            bundle_bytes += a.block_bytes;
            if bundle_bytes >= MAX_BUNDLE {
                o.bytes_written += put(&store, &mut bundle)?;
                bundle_bytes = 0;
            }
        }
        o.bytes_written += put(&store, &mut bundle)?;
        store.sync().map_err(refused)?;
        progress.inc(1);
    }
    progress.finish_and_clear();
    o.seconds = start.elapsed().as_secs_f64();
    let s = store.stats();
    o.dram_hits = s.dram_hits;
    o.reinserted = s.reinserted_records;
    o.evicted = s.evicted_records;
    o.held = s.held_records;
    o.admitted = s.admitted_records;
    o.bytes_written += (s.reinserted_records + s.admitted_records) * a.block_bytes;
    store.close().map_err(refused)?;
    Ok(o)
}

/// Puts `bundle` (emptying it); returns the payload bytes written.
fn put(store: &StateStore, bundle: &mut Vec<(RecordMeta, Vec<u8>)>) -> Result<u64, Failure> {
    if bundle.is_empty() {
        return Ok(0);
    }
    let records: Vec<(RecordMeta, &[u8])> = bundle
        .iter()
        .map(|(m, p)| (m.clone(), p.as_slice()))
        .collect();
    let receipt = store
        .put(&records)
        .map_err(|e| Failure::refused(format!("put: {e}")))?;
    // Blocks are one size: the records written are those not held back.
    let bytes: u64 = bundle.iter().map(|(_, p)| p.len() as u64).sum();
    let written = bytes / records.len() as u64 * (records.len() - receipt.held) as u64;
    bundle.clear();
    Ok(written)
}

/// Per-block LRU on the trace: hits are the present prefix; then every block of the request
/// is touched in order (inserted when absent).
fn simulate_lru(trace: &[Vec<u64>], capacity: usize) -> u64 {
    let mut last_use: HashMap<u64, u64> = HashMap::new();
    let mut order: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut tick = 0u64;
    let mut hits = 0u64;
    for ids in trace {
        hits += ids
            .iter()
            .take_while(|id| last_use.contains_key(id))
            .count() as u64;
        for &id in ids {
            tick += 1;
            if let Some(t) = last_use.insert(id, tick) {
                order.remove(&(t, id));
            }
            order.insert((tick, id));
            while last_use.len() > capacity {
                let Some((_, old)) = order.pop_first() else {
                    break;
                };
                last_use.remove(&old);
            }
        }
    }
    hits
}

/// Per-block Belady MIN on the same access sequence: when full, the block whose next use is
/// furthest away (or never) goes.
fn simulate_min(trace: &[Vec<u64>], capacity: usize) -> u64 {
    let seq: Vec<u64> = trace.iter().flatten().copied().collect();
    let mut next = vec![u64::MAX; seq.len()];
    let mut seen: HashMap<u64, u64> = HashMap::new();
    for (i, id) in seq.iter().enumerate().rev() {
        next[i] = seen.get(id).copied().unwrap_or(u64::MAX);
        seen.insert(*id, i as u64);
    }
    let mut cached: HashMap<u64, u64> = HashMap::new(); // id -> its next use
    let mut by_next: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut hits = 0u64;
    let mut pos = 0usize;
    for ids in trace {
        hits += ids.iter().take_while(|id| cached.contains_key(id)).count() as u64;
        for &id in ids {
            let n = next[pos];
            pos += 1;
            if let Some(old) = cached.insert(id, n) {
                by_next.remove(&(old, id));
            }
            by_next.insert((n, id));
            while cached.len() > capacity {
                let Some((_, far)) = by_next.pop_last() else {
                    break;
                };
                cached.remove(&far);
            }
        }
    }
    hits
}

pub(crate) fn simulated(trace: &[Vec<u64>], name: &str, capacity: usize) -> Outcome {
    let start = Instant::now();
    let hits = if name == "min" {
        simulate_min(trace, capacity)
    } else {
        simulate_lru(trace, capacity)
    };
    Outcome {
        policy: name.to_owned(),
        simulated: true,
        requests: trace.len() as u64,
        block_refs: trace.iter().map(|r| r.len() as u64).sum(),
        hits,
        dram_hits: 0,
        bytes_written: 0,
        bytes_read: 0,
        seconds: start.elapsed().as_secs_f64(),
        reinserted: 0,
        evicted: 0,
        held: 0,
        admitted: 0,
        admission: false,
        mismatched: 0,
    }
}

fn text(o: &Outcome) -> String {
    format!(
        "{}{}: {} requests, {} block refs, {} hits, hit ratio {:.4}, {} DRAM hits, {} copied forward, {} evicted, {} mismatched, {:.1} s{}\n",
        o.policy,
        if o.simulated { " (simulated)" } else { "" },
        o.requests,
        o.block_refs,
        o.hits,
        o.hit_ratio(),
        o.dram_hits,
        o.reinserted,
        o.evicted,
        o.mismatched,
        o.seconds,
        if o.admission {
            format!(
                "; admission: {} blocks held back, {} written once read, {} SSD bytes written",
                o.held, o.admitted, o.bytes_written
            )
        } else {
            String::new()
        }
    )
}

/// Runs `bench replay`.
pub fn run(a: &ReplayArgs, out: &Output) -> Result<(), Failure> {
    let trace: Vec<Vec<u64>> = crate::trace::load(&a.trace, a.requests)?
        .into_iter()
        .map(|r| r.hash_ids)
        .collect();
    let budget = Budget {
        dram_bytes: a.dram_bytes,
        ssd_bytes: a.ssd_bytes,
        block_bytes: a.block_bytes,
        waiting_bytes: 0,
    };
    let budget = if a.admission {
        budget.admitting()
    } else {
        budget
    };
    let capacity = budget.capacity();
    let outcomes = if a.compare {
        let mut v = vec![
            simulated(&trace, "lru", capacity),
            simulated(&trace, "min", capacity),
        ];
        for (name, policy) in Policy::ALL {
            let dir = a.data_dir.join(name);
            if dir.exists() {
                return Err(Failure::refused(format!(
                    "{}: exists; --compare needs fresh subdirectories",
                    dir.display()
                )));
            }
            let o = replay_store(&trace, budget, policy, &dir);
            let _ = std::fs::remove_dir_all(&dir);
            v.push(o?);
        }
        v
    } else {
        match parse_policy(&a.policy)? {
            None => vec![simulated(&trace, &a.policy, capacity)],
            Some(p) => vec![replay_store(&trace, budget, p, &a.data_dir)?],
        }
    };
    let mismatched: u64 = outcomes.iter().map(|o| o.mismatched).sum();
    if a.compare {
        let lru = outcomes[0].hit_ratio();
        let min = outcomes[1].hit_ratio();
        let mut t = format!(
            "capacity {capacity} blocks of {} bytes ({} SSD bytes)\n{:<16} {:>9} {:>8} {:>11}\n",
            a.block_bytes, a.ssd_bytes, "policy", "hit ratio", "vs lru", "gap closed"
        );
        let mut rows = Vec::new();
        for o in &outcomes {
            let vs = if lru > 0.0 { o.hit_ratio() / lru } else { 0.0 };
            let gap = if min > lru {
                (o.hit_ratio() - lru) / (min - lru)
            } else {
                0.0
            };
            let name = format!("{}{}", o.policy, if o.simulated { " (sim)" } else { "" });
            t.push_str(&format!(
                "{name:<16} {:>9.4} {vs:>8.3} {:>10.1}%\n",
                o.hit_ratio(),
                gap * 100.0
            ));
            let mut doc = o.json();
            doc["vs_lru"] = json!(vs);
            doc["gap_closed"] = json!(gap);
            rows.push(doc);
        }
        out.emit(&t, || {
            json!({ "capacity_blocks": capacity, "ssd_bytes": a.ssd_bytes, "block_bytes": a.block_bytes, "results": rows })
        })?;
    } else if let Some(o) = outcomes.first() {
        out.emit(&text(o), || o.json())?;
    }
    no_mismatch(mismatched)
}

/// Fails with the mismatch exit code when `mismatched` blocks came back with other bytes.
pub(crate) fn no_mismatch(mismatched: u64) -> Result<(), Failure> {
    if mismatched > 0 {
        return Err(Failure::with_code(
            crate::cmd::bench_records::EXIT_MISMATCH,
            format!("{mismatched} blocks came back with different bytes"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_agree_on_a_trace_small_enough_to_check_by_hand() {
        // Capacity 2. LRU: [1,2] misses, [1,2] hits both, [3] evicts 1, so the last [1,2] is a
        // miss at its first block (a prefix hit of 0). MIN admits 3 and drops it at once (never
        // reused), keeping 1 and 2 for the last request.
        let trace = vec![vec![1, 2], vec![1, 2], vec![3], vec![1, 2]];
        assert_eq!(simulate_lru(&trace, 2), 2);
        assert_eq!(simulate_min(&trace, 2), 4);
        assert!(simulate_min(&trace, 2) >= simulate_lru(&trace, 2));
    }

    #[test]
    fn min_is_never_below_lru() {
        let trace: Vec<Vec<u64>> = (0..200u64)
            .map(|r| (0..(r % 7 + 1)).map(|b| (r % 13) * 100 + b).collect())
            .collect();
        for cap in [1, 3, 10, 50] {
            assert!(
                simulate_min(&trace, cap) >= simulate_lru(&trace, cap),
                "{cap}"
            );
        }
    }
}
