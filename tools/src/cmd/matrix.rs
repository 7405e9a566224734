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
use orbitkv_store::Policy;
use serde_json::{Value, json};

use crate::Failure;
use crate::cmd::replay::{Budget, Outcome, replay_store, simulated};
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

/// Runs every cell of `w`.
fn cells(w: &Workload, a: &MatrixArgs) -> Result<Vec<Cell>, Failure> {
    let distinct = stats(&w.trace).distinct;
    let mut out = Vec::new();
    for &percent in &a.capacities {
        let blocks = (distinct * percent / 100).max(1);
        let budget = Budget::ssd_blocks(blocks, a.block_bytes);
        let capacity = budget.capacity();
        let mut policies = Vec::new();
        for (name, policy) in Policy::ALL {
            let dir = a.data_dir.join(name);
            if dir.exists() {
                return Err(Failure::refused(format!(
                    "{}: exists; the matrix needs fresh subdirectories",
                    dir.display()
                )));
            }
            let o = replay_store(&w.trace, budget, policy, &dir);
            let _ = std::fs::remove_dir_all(&dir);
            policies.push(o?);
        }
        out.push(Cell {
            workload: w.name.clone(),
            seed: w.seed,
            percent,
            capacity,
            lru: simulated(&w.trace, "lru", capacity),
            min: simulated(&w.trace, "min", capacity),
            policies,
        });
    }
    Ok(out)
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

/// The table: a row per cell, then each policy's worst cell.
fn table(cells: &[Cell]) -> String {
    let mut t = String::from("| workload | seed | capacity | LRU | MIN |");
    let names: Vec<&str> = Policy::ALL.iter().map(|(n, _)| *n).collect();
    for n in &names {
        let _ = write!(t, " {n} |");
    }
    t.push_str("\n|---|---|---|---|---|");
    t.push_str(&"---|".repeat(names.len()));
    t.push('\n');
    // Per policy: the worst ratio and the worst points, with their cells.
    let mut worst: Vec<[Option<(f64, String)>; 2]> = vec![[None, None]; names.len()];
    for c in cells {
        let lru = c.lru.hit_ratio();
        let seed = c.seed.map_or_else(|| "—".to_owned(), |s| s.to_string());
        let _ = write!(
            t,
            "| {} | {seed} | {} % | {lru:.4} | {:.4} |",
            c.workload,
            c.percent,
            c.min.hit_ratio()
        );
        for (i, o) in c.policies.iter().enumerate() {
            let (v, ratio) = versus(lru, o.hit_ratio());
            let shown = if ratio {
                format!("{:.4} ({v:.3})", o.hit_ratio())
            } else {
                format!("{:.4} ({v:+.2} pt)", o.hit_ratio())
            };
            let _ = write!(t, " {shown} |");
            let slot = &mut worst[i][usize::from(!ratio)];
            if slot.as_ref().is_none_or(|(w, _)| v < *w) {
                *slot = Some((v, format!("{} seed {seed} at {} %", c.workload, c.percent)));
            }
        }
        t.push('\n');
    }
    for (n, [ratio, points]) in names.iter().zip(&worst) {
        let _ = write!(t, "\n{n}: worst ratio to LRU ");
        match ratio {
            Some((v, at)) => {
                let _ = write!(t, "{v:.3} ({at})");
            }
            None => t.push('—'),
        }
        if let Some((v, at)) = points {
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
    // Each replay draws its own bar; this line counts the traces done.
    let progress =
        ProgressBar::with_draw_target(Some(workloads.len() as u64), ProgressDrawTarget::stderr());
    progress.set_style(
        ProgressStyle::with_template("matrix {pos}/{len} traces {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut all = Vec::new();
    for w in &workloads {
        progress.set_message(w.name.clone());
        all.extend(cells(w, a)?);
        progress.inc(1);
    }
    progress.finish_and_clear();
    let mismatched: u64 = all
        .iter()
        .flat_map(|c| &c.policies)
        .map(|o| o.mismatched)
        .sum();
    out.emit(&table(&all), || {
        json!({
            "block_bytes": a.block_bytes,
            "cells": all.iter().map(cell_json).collect::<Vec<_>>(),
        })
    })?;
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
        };
        let ws = workloads(&a).expect("workloads");
        assert_eq!(
            ws.len(),
            2,
            "multi-turn at its defaults and at the shared trace's scale"
        );
        let cells = cells(&ws[0], &a).expect("the cell runs");
        assert_eq!(cells.len(), 1);
        let c = &cells[0];
        assert_eq!(c.policies.len(), Policy::ALL.len());
        assert!(c.min.hits >= c.lru.hits, "MIN is never below LRU");
        for o in &c.policies {
            assert_eq!(o.mismatched, 0, "{}", o.policy);
            assert_eq!(o.block_refs, c.lru.block_refs, "{}", o.policy);
        }
        let t = table(&cells);
        for (n, _) in Policy::ALL {
            assert!(t.contains(&format!("{n}: worst ratio to LRU ")), "{t}");
        }
    }

    #[test]
    fn one_shot_traffic_compares_points() {
        let (v, ratio) = versus(0.005, 0.003);
        assert!(!ratio && (v + 0.2).abs() < 1e-9);
        let (v, ratio) = versus(0.5, 0.55);
        assert!(ratio && (v - 1.1).abs() < 1e-9);
    }
}
