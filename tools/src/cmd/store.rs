//! The offline store commands: `fsck`, `inspect`, `compact`, `retire`. Each locks the data
//! directory, so it refuses a store a running process has open.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use orbitkv_state::{Namespace, hex};
use orbitkv_store::fsck::{FsckReport, check, discard_incompatible, repair};
use orbitkv_store::io::Io;
use orbitkv_store::{StateStore, StoreConfig};
use serde_json::json;

use crate::Failure;
use crate::output::Output;

/// `fsck`: problems found, all repaired (no problems: 0).
pub const FSCK_REPAIRED: u8 = 1;
/// `fsck`: problems found and left (no `--repair`, or not repairable).
pub const FSCK_LEFT: u8 = 4;
/// `fsck`: operational error (the store is in use, cannot be read, ...).
pub const FSCK_OPERATIONAL: u8 = 8;

/// `fsck` arguments.
#[derive(Args)]
pub struct FsckArgs {
    /// The data directory.
    #[arg(long, value_name = "DIR", default_value = "./orbitkv-data")]
    data_dir: PathBuf,
    /// Repair what can be repaired: truncate torn tails, drop bad records (rewriting their
    /// segments), salvage segments with unreadable footers, remove orphan files.
    #[arg(long)]
    repair: bool,
    /// Start a store of an incompatible format version over, empty.
    #[arg(long)]
    discard_incompatible: bool,
}

/// `inspect` arguments.
#[derive(Args)]
pub struct InspectArgs {
    /// The data directory.
    #[arg(long, value_name = "DIR", default_value = "./orbitkv-data")]
    data_dir: PathBuf,
}

/// `compact` arguments.
#[derive(Args)]
pub struct CompactArgs {
    /// The data directory.
    #[arg(long, value_name = "DIR", default_value = "./orbitkv-data")]
    data_dir: PathBuf,
    /// Rewrite sealed segments whose live fraction is below this.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.5)]
    threshold: f64,
}

/// `retire` arguments.
#[derive(Args)]
pub struct RetireArgs {
    /// The data directory.
    #[arg(long, value_name = "DIR", default_value = "./orbitkv-data")]
    data_dir: PathBuf,
    /// The namespace to retire (64 hex digits, as `inspect` shows it).
    #[arg(long, value_name = "HEX")]
    namespace: String,
}

fn io() -> Arc<dyn Io> {
    orbitkv_store::io::offline_backend()
}

fn open(data_dir: &Path, read_only: bool) -> Result<StateStore, Failure> {
    let mut cfg = StoreConfig::new(data_dir);
    cfg.read_only = read_only;
    StateStore::open(io(), cfg).map_err(|e| Failure::refused(e.to_string()))
}

fn report_json(r: &FsckReport) -> serde_json::Value {
    json!({
        "data_dir": r.data_dir.display().to_string(),
        "clean": r.is_clean(),
        "problems": r.problems(),
        "manifest_records": r.manifest_records,
        "segments": r.segments.len(),
        "records": r.records,
        "retired_records": r.retired_records,
        "punched_records": r.segments.iter().map(|s| s.punched).sum::<u64>(),
        "orphans": r.orphans,
        "bytes_read": r.bytes_read,
    })
}

fn summary(r: &FsckReport) -> String {
    let punched: u64 = r.segments.iter().map(|s| s.punched).sum();
    let mut t = format!(
        "{}: {} segments, {} records ({} of retired namespaces), {punched} punched out, {} \
         manifest records\n",
        r.data_dir.display(),
        r.segments.len(),
        r.records,
        r.retired_records,
        r.manifest_records
    );
    let problems = r.problems();
    if problems.is_empty() {
        t.push_str("clean\n");
    }
    for p in problems {
        t.push_str(&format!("problem: {p}\n"));
    }
    t
}

/// Runs `fsck`.
pub fn fsck(a: &FsckArgs, out: &Output) -> Result<(), Failure> {
    let op = |e: orbitkv_store::Error| Failure::with_code(FSCK_OPERATIONAL, e.to_string());
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("checking {bytes}/{total_bytes} {wide_bar} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let first = check(io().as_ref(), &a.data_dir, &progress).map_err(op)?;
    bar.finish_and_clear();
    if first.is_clean() {
        out.emit(
            &summary(&first),
            || json!({ "before": report_json(&first), "repaired": false }),
        )?;
        return Ok(());
    }
    if first.incompatible.is_some() && a.discard_incompatible {
        discard_incompatible(io().as_ref(), &a.data_dir).map_err(op)?;
        let text = format!(
            "{}discarded the incompatible store: it starts empty\n",
            summary(&first)
        );
        out.emit(
            &text,
            || json!({ "before": report_json(&first), "repaired": true, "discarded": true }),
        )?;
        return Err(Failure::with_code(
            FSCK_REPAIRED,
            "problems found and repaired",
        ));
    }
    if !a.repair || !first.repairable() {
        out.emit(
            &summary(&first),
            || json!({ "before": report_json(&first), "repaired": false }),
        )?;
        let why = if first.repairable() {
            "problems found (run with --repair to fix them)".to_owned()
        } else if first.incompatible.is_some() {
            "incompatible store format (--discard-incompatible starts it empty)".to_owned()
        } else {
            "problems found that cannot be repaired in place".to_owned()
        };
        return Err(Failure::with_code(FSCK_LEFT, why));
    }
    let done = repair(io(), StoreConfig::new(&a.data_dir), &first).map_err(op)?;
    let after = check(io().as_ref(), &a.data_dir, &|_, _| {}).map_err(op)?;
    let mut left = String::new();
    for (name, why) in &done.orphans_not_removed {
        left.push_str(&format!("orphan {name} could not be removed: {why}\n"));
    }
    if let Some(why) = &done.dir_sync_failed {
        left.push_str(&format!(
            "the segments directory could not be synced ({why}): removed files may come back after a power loss\n"
        ));
    }
    // Clean only when nothing is left now and nothing removed can come back.
    let clean = after.is_clean() && done.dir_sync_failed.is_none();
    let text = format!(
        "{}repaired: {} torn tails truncated, {} segments rewritten, {} bad records dropped, {} orphans removed\n{left}{}",
        summary(&first),
        done.torn_tails_truncated,
        done.segments_rewritten.len(),
        done.bad_records_dropped,
        done.orphans_removed.len(),
        if clean {
            "now clean\n"
        } else {
            "problems remain\n"
        }
    );
    out.emit(&text, || {
        json!({
            "before": report_json(&first),
            "repaired": true,
            "after": report_json(&after),
            "torn_tails_truncated": done.torn_tails_truncated,
            "segments_rewritten": done.segments_rewritten,
            "bad_records_dropped": done.bad_records_dropped,
            "orphans_removed": done.orphans_removed,
            "orphans_not_removed": done
                .orphans_not_removed
                .iter()
                .map(|(name, why)| json!({ "name": name, "why": why }))
                .collect::<Vec<_>>(),
            "dir_sync_failed": done.dir_sync_failed,
        })
    })?;
    if clean {
        Err(Failure::with_code(
            FSCK_REPAIRED,
            "problems found and repaired",
        ))
    } else {
        Err(Failure::with_code(
            FSCK_LEFT,
            "problems remain after repair",
        ))
    }
}

/// Runs `inspect` (read-only: nothing on disk changes).
pub fn inspect(a: &InspectArgs, out: &Output) -> Result<(), Failure> {
    let store = open(&a.data_dir, true)?;
    let usage = store
        .namespace_usage()
        .map_err(|e| Failure::refused(e.to_string()))?;
    let stats = store
        .segment_stats()
        .map_err(|e| Failure::refused(e.to_string()))?;
    let namespaces = store.namespaces();
    let report = store.recovery_report().clone();
    let mut text = format!("{}\nnamespaces:\n", store.data_dir().display());
    let mut ns_json = Vec::new();
    for (ns, info, retired) in &namespaces {
        let (records, bytes) = usage
            .iter()
            .find(|(n, _, _)| n == ns)
            .map_or((0, 0), |(_, r, b)| (*r, *b));
        text.push_str(&format!(
            "  {ns}  {} @ {}  {} {} {}  tp{} pp{} cp{}  {records} live records, {bytes} bytes{}\n",
            info.model,
            info.revision,
            info.engine,
            info.engine_release,
            info.dtype,
            info.parallel.tensor,
            info.parallel.pipeline,
            info.parallel.context,
            retired.map_or(String::new(), |w| format!("  retired below sequence {w}"))
        ));
        ns_json.push(json!({
            "namespace": ns.to_string(),
            "model": info.model,
            "revision": info.revision,
            "engine": info.engine,
            "engine_release": info.engine_release,
            "dtype": info.dtype,
            "parallel": [info.parallel.tensor, info.parallel.pipeline, info.parallel.context],
            "identity": hex::encode(&info.identity),
            "layout_digest": hex::encode(&info.layout_digest),
            "retired_below": retired,
            "live_records": records,
            "live_bytes": bytes,
        }));
    }
    text.push_str("segments:\n");
    let mut seg_json = Vec::new();
    for (id, sealed) in store.segments() {
        let st = stats.iter().find(|s| s.id == id);
        match st {
            Some(s) => text.push_str(&format!(
                "  {id:08x}  sealed  {} entries, {} live ({:.0}% of {} bytes)\n",
                s.entries,
                s.live_records,
                s.live_fraction() * 100.0,
                s.stored_bytes
            )),
            None => text.push_str(&format!(
                "  {id:08x}  {}\n",
                if sealed {
                    "sealed (unreadable)"
                } else {
                    "active"
                }
            )),
        }
        seg_json.push(json!({
            "id": id,
            "sealed": sealed,
            "entries": st.map(|s| s.entries),
            "live_records": st.map(|s| s.live_records),
            "stored_bytes": st.map(|s| s.stored_bytes),
            "live_bytes": st.map(|s| s.live_bytes),
            "live_fraction": st.map(|s| s.live_fraction()),
        }));
    }
    text.push_str(&format!(
        "manifest: {} bytes; index: {} records; quarantined segments: {}\n",
        store.manifest_len(),
        store.index().len(),
        report.quarantined.len()
    ));
    out.emit(&text, || {
        json!({
            "data_dir": store.data_dir().display().to_string(),
            "namespaces": ns_json,
            "segments": seg_json,
            "manifest_bytes": store.manifest_len(),
            "indexed_records": store.index().len(),
            "quarantined": report.quarantined.iter().map(|(id, why)| json!({"id": id, "why": why})).collect::<Vec<_>>(),
            "torn_tails": report.torn_tails.len(),
        })
    })
}

/// Runs `compact`.
pub fn compact(a: &CompactArgs, out: &Output) -> Result<(), Failure> {
    if !(0.0..=1.0).contains(&a.threshold) {
        return Err(Failure::refused("--threshold must lie between 0 and 1"));
    }
    let store = open(&a.data_dir, false)?;
    let r = store
        .compact_below(a.threshold)
        .map_err(|e| Failure::refused(e.to_string()))?;
    store.close().map_err(|e| Failure::refused(e.to_string()))?;
    let text = format!(
        "compacted {} segments into {}: {} records kept, {} dead and {} bad dropped, {} -> {} bytes\n",
        r.inputs.len(),
        r.outputs.len(),
        r.copied,
        r.dropped_dead,
        r.dropped_bad,
        r.input_bytes,
        r.output_bytes
    );
    out.emit(&text, || {
        json!({
            "inputs": r.inputs,
            "outputs": r.outputs,
            "copied": r.copied,
            "dropped_dead": r.dropped_dead,
            "dropped_bad": r.dropped_bad,
            "input_bytes": r.input_bytes,
            "output_bytes": r.output_bytes,
        })
    })
}

/// Runs `retire`.
pub fn retire(a: &RetireArgs, out: &Output) -> Result<(), Failure> {
    let ns = Namespace(
        hex::decode_array(&a.namespace, "--namespace")
            .map_err(|e| Failure::refused(e.to_string()))?,
    );
    let store = open(&a.data_dir, false)?;
    if !store.namespaces().iter().any(|(n, _, _)| *n == ns) {
        return Err(Failure::refused(format!(
            "--namespace {ns}: not registered in this store"
        )));
    }
    let watermark = store
        .retire_namespace(ns)
        .map_err(|e| Failure::refused(e.to_string()))?;
    store.close().map_err(|e| Failure::refused(e.to_string()))?;
    out.emit(
        &format!("retired {ns}: records below sequence {watermark} are dead\n"),
        || json!({ "namespace": ns.to_string(), "watermark": watermark }),
    )
}
