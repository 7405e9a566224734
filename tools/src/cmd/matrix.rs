//! `orbitkv bench matrix`: every store reclaim policy on every workload shape, against per-block
//! LRU and Belady MIN on the same sequence. A cell is one trace (a generated shape and seed, or
//! a trace file) at one capacity, a share of the trace's distinct blocks. Each policy replays
//! against a real store (`bench replay`); a cell compares its hit ratio with LRU's, as a ratio,
//! or in points where LRU hits less than 1 % of references (one-shot traffic). The worst cell of
//! each policy is the matrix's answer.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use orbitkv_segments::Alignment;
use orbitkv_store::{MIN_SSD_BYTES, Policy, ssd_records_held};
use serde_json::{Value, json};

use crate::Failure;
use crate::cmd::policy_model::{
    Admit, Modelled, arc, clock, fifo_reinsert, lru_deepest_first, punched_lru, record_lru,
};
use crate::cmd::replay::{Budget, Outcome, no_mismatch, replay_store, simulated};
use crate::output::Output;
use crate::size::parse_size;
use crate::tracegen::{Params, Shape, generate, stats};

/// Below this LRU hit ratio a cell compares absolute hit ratios, not their ratio.
const RATIO_FLOOR: f64 = 0.01;

/// `bench matrix`.
#[derive(Args)]
pub struct MatrixArgs {
    /// Shapes generated (default: every shape, and multi-turn also at the shared trace's scale).
    #[arg(long, value_enum, value_delimiter = ',')]
    shapes: Vec<Shape>,
    /// Seeds per shape (1 to N), each its own cell.
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// Requests per generated trace.
    #[arg(long, default_value_t = 4000)]
    requests: usize,
    /// Capacities, in percent of a trace's distinct blocks.
    #[arg(long, value_delimiter = ',', default_values_t = [5, 10, 25, 50])]
    capacities: Vec<u64>,
    /// Traces replayed beside the generated shapes (JSON lines with `hash_ids`).
    #[arg(long = "trace", value_name = "FILE")]
    traces: Vec<PathBuf>,
    /// Payload bytes per block.
    #[arg(long, value_name = "B", default_value = "4KiB", value_parser = parse_size)]
    block_bytes: u64,
    /// Where the stores go (one subdirectory per replay, removed after it).
    #[arg(long, value_name = "DIR", default_value = "./orbitkv-matrix")]
    data_dir: PathBuf,
    /// Instead of the store replays: the store-free model of `record-lru` without and with SSD
    /// admission (first-time blocks wait in a DRAM tier of a tenth of the capacity), by the
    /// simple rule and by the store's adaptive one, with SSD blocks written per block hit.
    #[arg(long)]
    admission_model: bool,
    /// Instead of the store replays: per-block reference policies beside LRU (CLOCK, ARC, and
    /// LRU dropping a chain's deepest blocks first) and the store-free model of
    /// `fifo-reinsert`, to show how close any online policy gets to LRU in each cell.
    #[arg(long, conflicts_with = "admission_model")]
    reference_models: bool,
    /// Store policies replayed (default: every one).
    #[arg(long, value_delimiter = ',', value_parser = crate::config::parse_policy)]
    policies: Vec<Policy>,
    /// Also replay `record-lru` with adaptive SSD admission (a waiting room of a tenth of the
    /// SSD budget), in a column of its own.
    #[arg(long, conflicts_with_all = ["admission_model", "reference_models"])]
    admission: bool,
}

/// One workload: its name and its block references.
struct Workload {
    name: String,
    seed: Option<u64>,
    trace: Vec<Vec<u64>>,
}

/// One cell's outcomes: LRU, MIN, then each store policy.
struct Cell {
    workload: String,
    seed: Option<u64>,
    percent: u64,
    capacity: usize,
    lru: Outcome,
    min: Outcome,
    policies: Vec<Outcome>,
}

/// How a policy compares with LRU in a cell: a ratio, or points where LRU is near 0.
fn versus(lru: f64, hit: f64) -> (f64, bool) {
    if lru < RATIO_FLOOR {
        ((hit - lru) * 100.0, false)
    } else {
        (hit / lru, true)
    }
}

fn workloads(a: &MatrixArgs) -> Result<Vec<Workload>, Failure> {
    let mut out = Vec::new();
    for path in &a.traces {
        let trace = crate::trace::load(path, None)?
            .into_iter()
            .map(|r| r.hash_ids)
            .collect();
        let name = path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into(),
        );
        out.push(Workload {
            name,
            seed: None,
            trace,
        });
    }
    let shapes = if a.shapes.is_empty() {
        vec![
            Shape::MultiTurn,
            Shape::Agent,
            Shape::SharedPrompt,
            Shape::Documents,
            Shape::OneShot,
        ]
    } else {
        a.shapes.clone()
    };
    for shape in shapes {
        let mut variants = vec![(shape_name(shape).to_owned(), None)];
        if shape == Shape::MultiTurn {
            // The scale the shared trace has (docs/performance.md): long messages, 600 users.
            variants.push(("multi-turn-600u".to_owned(), Some((600, 16, 4))));
        }
        for (name, scale) in variants {
            for seed in 1..=a.seeds {
                let mut p = Params::new(shape, seed, a.requests);
                if let Some((users, message, turns)) = scale {
                    (p.users, p.message_blocks, p.turns) = (users, message, turns);
                }
                let trace = generate(&p).into_iter().map(|r| r.hash_ids).collect();
                out.push(Workload {
                    name: name.clone(),
                    seed: Some(seed),
                    trace,
                });
            }
        }
    }
    Ok(out)
}

fn shape_name(shape: Shape) -> &'static str {
    match shape {
        Shape::MultiTurn => "multi-turn",
        Shape::Agent => "agent",
        Shape::SharedPrompt => "shared-prompt",
        Shape::Documents => "documents",
        Shape::OneShot => "one-shot",
    }
}

/// The block size of a cell of `blocks` blocks: `block_bytes`, or larger (whole KiB) where the
/// budget would fall below the store's smallest SSD budget. The hit ratio depends on the
/// capacity in blocks, not on their size.
fn cell_block_bytes(blocks: u64, block_bytes: u64) -> u64 {
    let fits = |b: u64| ssd_records_held(MIN_SSD_BYTES, b, Alignment::Direct) <= blocks;
    if fits(block_bytes) {
        return block_bytes;
    }
    let mut b = block_bytes.div_ceil(1024) * 1024;
    while !fits(b) && b < MIN_SSD_BYTES {
        b += 1024;
    }
    b
}

/// Runs every cell of `w`, each row printed as it is done (text output).
fn cells(w: &Workload, a: &MatrixArgs, out: &Output) -> Result<Vec<Cell>, Failure> {
    let distinct = stats(&w.trace).distinct;
    let mut done = Vec::new();
    for &percent in &a.capacities {
        let blocks = (distinct * percent / 100).max(1);
        let budget = Budget::ssd_blocks(blocks, cell_block_bytes(blocks, a.block_bytes));
        let capacity = budget.capacity();
        let mut policies = Vec::new();
        let admitting = a
            .admission
            .then_some((ADMITTING, Policy::RecordLru, budget.admitting()));
        let runs = replayed(a).map(|(n, p)| (n, p, budget));
        for (name, policy, budget) in runs.chain(admitting) {
            let dir = a.data_dir.join(name.replace(" + ", "-"));
            if dir.exists() {
                return Err(Failure::refused(format!(
                    "{}: exists; the matrix needs fresh subdirectories",
                    dir.display()
                )));
            }
            let o = replay_store(&w.trace, budget, policy, &dir);
            let _ = std::fs::remove_dir_all(&dir);
            let mut o = o?;
            o.policy = name.to_owned();
            policies.push(o);
        }
        let cell = Cell {
            workload: w.name.clone(),
            seed: w.seed,
            percent,
            capacity,
            lru: simulated(&w.trace, "lru", capacity),
            min: simulated(&w.trace, "min", capacity),
            policies,
        };
        if !out.json() {
            println!("{}", row(&cell));
        }
        done.push(cell);
    }
    Ok(done)
}

fn cell_json(c: &Cell) -> Value {
    let lru = c.lru.hit_ratio();
    let policies: Vec<Value> = c
        .policies
        .iter()
        .map(|o| {
            let (v, ratio) = versus(lru, o.hit_ratio());
            json!({
                "policy": o.policy,
                "hit_ratio": o.hit_ratio(),
                "bytes_written": o.bytes_written,
                "mismatched": o.mismatched,
                if ratio { "vs_lru" } else { "vs_lru_points" }: v,
            })
        })
        .collect();
    json!({
        "workload": c.workload,
        "seed": c.seed,
        "capacity_percent": c.percent,
        "capacity_blocks": c.capacity,
        "lru": lru,
        "min": c.min.hit_ratio(),
        "policies": policies,
    })
}

/// The store policies `a` replays, in the table's order.
fn replayed(a: &MatrixArgs) -> impl Iterator<Item = (&'static str, Policy)> + '_ {
    Policy::ALL
        .iter()
        .copied()
        .filter(|(_, p)| a.policies.is_empty() || a.policies.contains(p))
}

/// The name of the column `--admission` adds.
const ADMITTING: &str = "record-lru + admission";

/// The table's header.
fn header(a: &MatrixArgs) -> String {
    let mut t = String::from("| workload | seed | capacity | LRU | MIN |");
    let names: Vec<&str> = replayed(a)
        .map(|(n, _)| n)
        .chain(a.admission.then_some(ADMITTING))
        .collect();
    for n in &names {
        let _ = write!(t, " {n} |");
    }
    t.push_str("\n|---|---|---|---|---|");
    t.push_str(&"---|".repeat(names.len()));
    t
}

fn seed_text(seed: Option<u64>) -> String {
    seed.map_or_else(|| "—".to_owned(), |s| s.to_string())
}

/// A cell's row: LRU and MIN, then each policy's hit ratio and how it compares with LRU.
fn row(c: &Cell) -> String {
    let lru = c.lru.hit_ratio();
    let mut t = format!(
        "| {} | {} | {} % | {lru:.4} | {:.4} |",
        c.workload,
        seed_text(c.seed),
        c.percent,
        c.min.hit_ratio()
    );
    for o in &c.policies {
        let _ = write!(t, " {} |", against_lru(lru, o.hit_ratio()));
    }
    t
}

/// Each policy's worst cell: its lowest ratio to LRU, and its lowest difference in points
/// where LRU hits under 1 %.
fn summary(cells: &[Cell], a: &MatrixArgs) -> String {
    let mut t = String::new();
    let extra = a.admission.then_some(ADMITTING);
    for (i, n) in replayed(a).map(|(n, _)| n).chain(extra).enumerate() {
        let mut worst: [Option<(f64, String)>; 2] = [None, None];
        for c in cells {
            let Some(o) = c.policies.get(i) else { continue };
            let (v, ratio) = versus(c.lru.hit_ratio(), o.hit_ratio());
            let slot = &mut worst[usize::from(!ratio)];
            if slot.as_ref().is_none_or(|(w, _)| v < *w) {
                let at = format!(
                    "{} seed {} at {} %",
                    c.workload,
                    seed_text(c.seed),
                    c.percent
                );
                *slot = Some((v, at));
            }
        }
        let _ = write!(t, "\n{n}: worst ratio to LRU ");
        match &worst[0] {
            Some((v, at)) => {
                let _ = write!(t, "{v:.3} ({at})");
            }
            None => t.push('—'),
        }
        if let Some((v, at)) = &worst[1] {
            let _ = write!(t, "; where LRU < 1 %, worst {v:+.2} points ({at})");
        }
    }
    t.push('\n');
    t
}

/// Runs `bench matrix`.
pub fn run(a: &MatrixArgs, out: &Output) -> Result<(), Failure> {
    if a.capacities.iter().any(|p| *p == 0 || *p > 100) {
        return Err(Failure::refused("--capacities: percents from 1 to 100"));
    }
    let workloads = workloads(a)?;
    if a.admission_model {
        return admission_table(&workloads, &a.capacities, a.block_bytes, out);
    }
    if a.reference_models {
        return reference_table(&workloads, &a.capacities, a.block_bytes, out);
    }
    // Each replay draws its own bar; this line counts the traces done.
    let progress =
        ProgressBar::with_draw_target(Some(workloads.len() as u64), ProgressDrawTarget::stderr());
    progress.set_style(
        ProgressStyle::with_template("matrix {pos}/{len} traces {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    if !out.json() {
        println!("{}", header(a));
    }
    let mut all = Vec::new();
    for w in &workloads {
        progress.set_message(w.name.clone());
        all.extend(cells(w, a, out)?);
        progress.inc(1);
    }
    progress.finish_and_clear();
    let mismatched: u64 = all
        .iter()
        .flat_map(|c| &c.policies)
        .map(|o| o.mismatched)
        .sum();
    out.emit(&summary(&all, a), || {
        json!({
            "block_bytes": a.block_bytes,
            "cells": all.iter().map(cell_json).collect::<Vec<_>>(),
        })
    })?;
    no_mismatch(mismatched)
}

/// One cell of a model table: LRU's hit ratio and each model's outcome, in the table's order.
struct ModelCell {
    at: String,
    lru: f64,
    models: Vec<Modelled>,
}

/// Runs `models` on every cell, as the policy matrix sizes them: each workload at each
/// capacity, in the blocks the store's budget holds (so the columns compare with it). Prints
/// each row (text output) as `row` writes it.
fn model_cells(
    workloads: &[Workload],
    capacities: &[u64],
    block_bytes: u64,
    models: &[Model],
    row: fn(&ModelCell, &str, &str, u64) -> String,
    out: &Output,
) -> Vec<ModelCell> {
    let mut cells = Vec::new();
    for w in workloads {
        let distinct = stats(&w.trace).distinct;
        for &percent in capacities {
            let blocks = (distinct * percent / 100).max(1);
            let capacity =
                Budget::ssd_blocks(blocks, cell_block_bytes(blocks, block_bytes)).capacity();
            let seed = seed_text(w.seed);
            let c = ModelCell {
                at: format!("{} seed {seed} at {percent} %", w.name),
                lru: simulated(&w.trace, "lru", capacity).hit_ratio(),
                models: models.iter().map(|m| m(&w.trace, capacity)).collect(),
            };
            if !out.json() {
                println!("{}", row(&c, &w.name, &seed, percent));
            }
            cells.push(c);
        }
    }
    cells
}

/// The worst ratio to LRU of model `i` over `cells` (cells where LRU is near 0 left out), with
/// the cell.
fn worst_model(cells: &[ModelCell], i: usize) -> String {
    cells
        .iter()
        .filter_map(|c| Some((versus(c.lru, c.models.get(i)?.hit_ratio()), &c.at)))
        .filter(|((_, ratio), _)| *ratio)
        .min_by(|a, b| a.0.0.total_cmp(&b.0.0))
        .map_or_else(|| "—".to_owned(), |((v, _), at)| format!("{v:.3} ({at})"))
}

/// Model `i`'s SSD blocks written per block hit over the cells with hits: the median and the
/// most, with its cell.
fn writes_per_hit(cells: &[ModelCell], i: usize) -> String {
    let mut w: Vec<(f64, &str)> = cells
        .iter()
        .filter_map(|c| Some((c.models.get(i)?.writes_per_hit()?, c.at.as_str())))
        .collect();
    w.sort_by(|a, b| a.0.total_cmp(&b.0));
    match (w.get(w.len() / 2), w.last()) {
        (Some((median, _)), Some((most, at))) => {
            format!("median {median:.2}, at most {most:.2} ({at})")
        }
        _ => "—".to_owned(),
    }
}

/// A hit ratio and how it compares with LRU, as the policy matrix shows it.
fn against_lru(lru: f64, hit: f64) -> String {
    match versus(lru, hit) {
        (v, true) => format!("{hit:.4} ({v:.3})"),
        (v, false) => format!("{hit:.4} ({v:+.2} pt)"),
    }
}

/// SSD blocks written per block hit, as a table shows it.
fn per_hit(m: &Modelled) -> String {
    m.writes_per_hit()
        .map_or("—".to_owned(), |w| format!("{w:.2}"))
}

/// How many times fewer SSD blocks per block hit `on` writes than `off`.
fn fewer_writes(off: &Modelled, on: &Modelled) -> String {
    match (off.writes_per_hit(), on.writes_per_hit()) {
        (Some(off), Some(on)) if on > 0.0 => format!("{:.2}×", off / on),
        (Some(_), Some(_)) => "no writes".to_owned(),
        _ => "—".to_owned(),
    }
}

/// A row of the admission table: LRU, then the model without admission, with the simple rule
/// and with the adaptive one (hit ratios and ratios to LRU), the SSD blocks each writes per
/// block hit, and how many times fewer each rule writes.
fn admission_row(c: &ModelCell, workload: &str, seed: &str, percent: u64) -> String {
    let mut row = format!("| {workload} | {seed} | {percent} % | {:.4} |", c.lru);
    if let [off, simple, adaptive] = c.models.as_slice() {
        let _ = write!(
            row,
            " {} | {} | {} | {} | {} | {} | {} | {} |",
            against_lru(c.lru, off.hit_ratio()),
            against_lru(c.lru, simple.hit_ratio()),
            against_lru(c.lru, adaptive.hit_ratio()),
            per_hit(off),
            per_hit(simple),
            per_hit(adaptive),
            fewer_writes(off, simple),
            fewer_writes(off, adaptive),
        );
    }
    row
}

/// The admission models, in their columns' order: JSON key, model.
const ADMISSION_MODELS: [(&str, Model); 3] = [
    ("record_lru", |t, c| record_lru(t, c, Admit::Never)),
    ("record_lru_simple_admission", |t, c| {
        record_lru(t, c, Admit::Always)
    }),
    ("record_lru_adaptive_admission", |t, c| {
        record_lru(t, c, Admit::Chosen)
    }),
];

/// The admission table: for the model of `record-lru`, each cell's hit ratio (and ratio to
/// LRU) without admission, with the simple rule (every first-time block waits) and with the
/// adaptive one (the store's), the SSD blocks each writes per block hit, and how many times
/// fewer each rule writes.
fn admission_table(
    workloads: &[Workload],
    capacities: &[u64],
    block_bytes: u64,
    out: &Output,
) -> Result<(), Failure> {
    if !out.json() {
        println!(
            "| workload | seed | capacity | LRU | record-lru | + simple admission | + adaptive admission | written per hit | simple | adaptive | fewer writes, simple | adaptive |"
        );
        println!("|---|---|---|---|{}", "---|".repeat(8));
    }
    let models = ADMISSION_MODELS.map(|(_, m)| m);
    let cells = model_cells(
        workloads,
        capacities,
        block_bytes,
        &models,
        admission_row,
        out,
    );
    let mut text = String::from("\n");
    for (i, (name, _)) in ADMISSION_MODELS.iter().enumerate() {
        let _ = writeln!(
            text,
            "{name}: worst ratio to LRU {}",
            worst_model(&cells, i)
        );
    }
    out.emit(&text, || {
        let m = |m: &Modelled| json!({"hit_ratio": m.hit_ratio(), "ssd_writes": m.ssd_writes, "hits": m.hits});
        json!({
            "cells": cells.iter().map(|c| {
                let mut o = json!({"cell": c.at, "lru": c.lru});
                for ((name, _), model) in ADMISSION_MODELS.iter().zip(&c.models) {
                    o[*name] = m(model);
                }
                o
            }).collect::<Vec<_>>(),
        })
    })
}

/// A store-free model: a trace and a capacity in blocks in, what it measured out.
type Model = fn(&[Vec<u64>], usize) -> Modelled;

/// The reference models, in their columns' order: column name, JSON key, model.
const REFERENCE_MODELS: [(&str, &str, Model); 5] = [
    ("fifo-reinsert model", "fifo_reinsert_model", fifo_reinsert),
    ("CLOCK", "clock", clock),
    ("ARC", "arc", arc),
    ("LRU, deepest first", "lru_deepest_first", lru_deepest_first),
    ("the same over punched segments", "punched_lru", punched_lru),
];

fn reference_row(c: &ModelCell, workload: &str, seed: &str, percent: u64) -> String {
    let mut row = format!("| {workload} | {seed} | {percent} % | {:.4} |", c.lru);
    for m in &c.models {
        let _ = write!(row, " {} |", against_lru(c.lru, m.hit_ratio()));
    }
    row
}

/// The reference table: each cell's LRU hit ratio beside the store's one-log model (segments
/// of a 64th of the capacity) and per-block CLOCK, ARC and deepest-first LRU, each with its
/// ratio to LRU, and each column's worst cell.
fn reference_table(
    workloads: &[Workload],
    capacities: &[u64],
    block_bytes: u64,
    out: &Output,
) -> Result<(), Failure> {
    if !out.json() {
        let names: Vec<&str> = REFERENCE_MODELS.iter().map(|(n, _, _)| *n).collect();
        println!(
            "| workload | seed | capacity | LRU | {} |",
            names.join(" | ")
        );
        println!("|---|---|---|---|{}", "---|".repeat(names.len()));
    }
    let models = REFERENCE_MODELS.map(|(_, _, m)| m);
    let cells = model_cells(
        workloads,
        capacities,
        block_bytes,
        &models,
        reference_row,
        out,
    );
    let mut text = String::from("\n");
    for (i, (name, _, _)) in REFERENCE_MODELS.iter().enumerate() {
        let _ = writeln!(
            text,
            "{name}: worst ratio to LRU {}; SSD blocks written per block hit {}",
            worst_model(&cells, i),
            writes_per_hit(&cells, i)
        );
    }
    out.emit(&text, || {
        json!({
            "cells": cells.iter().map(|c| {
                let mut o = json!({"cell": c.at, "lru": c.lru});
                for ((_, key, _), m) in REFERENCE_MODELS.iter().zip(&c.models) {
                    o[*key] = json!(m.hit_ratio());
                    o[format!("{key}_writes_per_hit")] = json!(m.writes_per_hit());
                }
                o
            }).collect::<Vec<_>>(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The small cell CI runs: one shape, one seed, one capacity; every policy replays against
    /// a real store with every byte checked, and the table names each policy's worst cell.
    #[test]
    fn a_small_cell_replays_every_policy_with_every_byte_checked() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let a = MatrixArgs {
            shapes: vec![Shape::MultiTurn],
            seeds: 1,
            requests: 500,
            capacities: vec![10],
            traces: Vec::new(),
            // The store's smallest SSD budget (1 MiB) holds 10 % of the trace's blocks.
            block_bytes: 16 << 10,
            data_dir: dir.path().join("m"),
            admission_model: false,
            reference_models: false,
            policies: Vec::new(),
            admission: true,
        };
        let ws = workloads(&a).expect("workloads");
        assert_eq!(
            ws.len(),
            2,
            "multi-turn at its defaults and at the shared trace's scale"
        );
        let cells = cells(&ws[0], &a, &Output::new(true)).expect("the cell runs");
        assert_eq!(cells.len(), 1);
        let c = &cells[0];
        assert_eq!(
            c.policies.len(),
            Policy::ALL.len() + 1,
            "and record-lru + admission"
        );
        assert!(c.min.hits >= c.lru.hits, "MIN is never below LRU");
        for o in &c.policies {
            assert_eq!(o.mismatched, 0, "{}", o.policy);
            assert_eq!(o.block_refs, c.lru.block_refs, "{}", o.policy);
        }
        assert!(row(&cells[0]).starts_with("| multi-turn | 1 | 10 % |"));
        let t = summary(&cells, &a);
        for (n, _) in Policy::ALL {
            assert!(t.contains(&format!("{n}: worst ratio to LRU ")), "{t}");
        }
    }

    #[test]
    fn the_reference_table_runs_every_model_on_a_cell() {
        let trace: Vec<Vec<u64>> = generate(&Params::new(Shape::MultiTurn, 1, 500))
            .into_iter()
            .map(|r| r.hash_ids)
            .collect();
        let refs: u64 = trace.iter().map(|r| r.len() as u64).sum();
        let ws = [Workload {
            name: "multi-turn".into(),
            seed: Some(1),
            trace,
        }];
        let models = REFERENCE_MODELS.map(|(_, _, m)| m);
        let out = Output::new(true);
        let cells = model_cells(&ws, &[10, 50], 4096, &models, reference_row, &out);
        assert_eq!(cells.len(), 2);
        for c in &cells {
            assert_eq!(c.models.len(), REFERENCE_MODELS.len());
            assert!(c.models.iter().all(|m| m.block_refs == refs && m.hits > 0));
            assert!(c.lru > 0.0);
        }
        let row = reference_row(&cells[0], "multi-turn", "1", 10);
        assert!(row.starts_with("| multi-turn | 1 | 10 % |"), "{row}");
        assert_eq!(
            row.matches(" | ").count(),
            3 + REFERENCE_MODELS.len(),
            "{row}"
        );
        assert!(worst_model(&cells, 3).contains("multi-turn seed 1 at "));
        assert_eq!(worst_model(&cells, 9), "—");
    }

    #[test]
    fn a_small_cell_takes_larger_blocks_to_reach_the_smallest_budget() {
        assert_eq!(cell_block_bytes(10_000, 4096), 4096);
        let b = cell_block_bytes(40, 4096);
        assert!(b > 4096 && b.is_multiple_of(1024));
        assert!(Budget::ssd_blocks(40, b).ssd_bytes >= MIN_SSD_BYTES);
        let held = Budget::ssd_blocks(40, b).capacity();
        assert!((40..=42).contains(&held), "{held}");
    }

    #[test]
    fn one_shot_traffic_compares_points() {
        let (v, ratio) = versus(0.005, 0.003);
        assert!(!ratio && (v + 0.2).abs() < 1e-9);
        let (v, ratio) = versus(0.5, 0.55);
        assert!(ratio && (v - 1.1).abs() < 1e-9);
    }
}
