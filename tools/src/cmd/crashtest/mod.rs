//! `orbitkv crashtest`: the crash harness through the real daemon. Cycle after cycle, `orbitkv
//! serve` (this binary, as a child) runs on one data directory with a small SSD budget, small
//! segments, FIFO reclaim and frequent background compaction, while simulated engines publish
//! under load; each engine records the pages its PublishDurable replies acknowledged. At a
//! seeded random point — a byte count reached, or the moment a seal, compaction, reclaim or
//! Retire begins — the daemon is killed with SIGKILL. Then every page acknowledged in the cycle
//! is checked on disk and, after a restart on the same directory, through the daemon; after
//! every later kill it is looked up on disk again until the manifest says it was reclaimed
//! ([`check`]). Where each kill landed is read from the store's phase markers in the daemon's
//! log (a phase whose last `begin` has no `end`) and from the harness (a Publish or Retire
//! outstanding). A first, uncounted cycle fills most of the budget (and ends with SIGTERM under
//! load), so reclaim runs in the counted ones.
//! It is long because one harness drives every phase of a cycle (start, load, kill, restart,
//! check) over state the phases share.

mod check;
mod daemon;
mod engines;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use orbitkv_protocol::Message;
use orbitkv_protocol::client::Client;
use orbitkv_sim::payload::splitmix64;
use orbitkv_sim::{Report, SimEngine};
use orbitkv_store::Policy;
use serde_json::json;

use self::check::{Expect, History, Offline, PageKey, Pending, RetireInfo, Tally, Want};
use self::daemon::{
    COMPACT, Daemon, DaemonOptions, KillSnapshot, LogState, PHASES, RECLAIM, RETIRE, SEAL, Trigger,
};
use self::engines::{Control, CycleLog, Spec, lock};
use crate::Failure;
use crate::config::{parse_fraction, parse_interval};
use crate::output::Output;
use crate::size::parse_size;

/// Exit code when an acknowledged page was lost, a byte was wrong, or a retired page came back.
pub const EXIT_LOST: u8 = 3;
/// The other engines start after the churn computation's burst, or this long after the cycle.
const BURST_LIMIT: Duration = Duration::from_millis(500);

/// `crashtest` arguments.
#[derive(Args)]
pub struct CrashtestArgs {
    /// Crash cycles: each starts the daemon, loads it, kills it with SIGKILL and checks.
    #[arg(long, value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..))]
    cycles: u64,
    /// The data directory: absent or empty; removed after a passing run unless --keep.
    #[arg(long, value_name = "DIR", default_value = "./orbitkv-crashtest")]
    data_dir: PathBuf,
    /// Seed of the workloads and of where each kill lands.
    #[arg(long, value_name = "S", default_value_t = 0)]
    seed: u64,
    /// The daemon's SSD budget.
    #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = parse_size)]
    ssd_bytes: u64,
    /// The daemon's segment size [default: a 64th of the SSD budget].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    segment_bytes: Option<u64>,
    /// The daemon's SSD policy.
    #[arg(long, value_name = "POLICY", default_value = "record-lru", value_parser = crate::config::parse_policy)]
    policy: Policy,
    /// Run the daemon with adaptive SSD admission (under record-lru), its waiting room a tenth
    /// of the SSD budget: pages it holds back (`held`) are stored, never acknowledged durable.
    #[arg(long)]
    admission: bool,
    /// Most page bytes acknowledged in one cycle before the kill, at most a quarter of the SSD
    /// budget [default: an eighth of it].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    cycle_bytes: Option<u64>,
    /// The daemon's background compaction interval.
    #[arg(long, value_name = "INTERVAL", default_value = "100ms", value_parser = parse_interval)]
    compact_interval: Duration,
    /// The daemon's compaction threshold (live fraction).
    #[arg(long, value_name = "FRACTION", default_value_t = 0.5, value_parser = parse_fraction)]
    compact_threshold: f64,
    /// Retire the churn computation's namespace every N cycles (and in cycles whose kill is
    /// aimed at a Retire).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..))]
    retire_every: u64,
    /// Longest load of one cycle: the kill comes then at the latest.
    #[arg(long, value_name = "INTERVAL", default_value = "30s", value_parser = parse_interval)]
    max_cycle: Duration,
    /// Keep the data directory after a passing run.
    #[arg(long)]
    keep: bool,
    /// A self-test of the harness: after each kill, delete the segment files the cycle wrote,
    /// so the checks must report lost pages.
    #[arg(long, hide = true)]
    sabotage: bool,
}

/// Where the kills landed; one kill can land in several phases.
#[derive(Debug, Clone, Copy, Default)]
struct Kills {
    publish: u64,
    seal: u64,
    compaction: u64,
    reclaim: u64,
    retire: u64,
    idle: u64,
}

impl Kills {
    /// Counts one kill; returns where it landed, for problem reports.
    fn add(&mut self, snap: &KillSnapshot, log: &LogState) -> String {
        let mut at = Vec::new();
        if snap.publishing {
            self.publish += 1;
            at.push("publish");
        }
        for (phase, n) in [
            (SEAL, &mut self.seal),
            (COMPACT, &mut self.compaction),
            (RECLAIM, &mut self.reclaim),
        ] {
            if log.open[phase] {
                *n += 1;
                at.push(PHASES[phase]);
            }
        }
        if snap.retiring || log.open[RETIRE] {
            self.retire += 1;
            at.push("retire");
        }
        if at.is_empty() {
            self.idle += 1;
            at.push("idle");
        }
        format!("killed mid-{}", at.join(", mid-"))
    }
}

/// A Retire in a cycle: once this many bytes are acknowledged; with a kill this long after it
/// is sent, if any.
#[derive(Debug, Clone, Copy)]
struct RetirePlan {
    at: u64,
    kill_after: Option<Duration>,
}

/// Where one cycle's kill comes.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// The churn computation publishes alone until this many of its bytes are acknowledged
    /// (segments mostly its own, which its Retire leaves for compaction).
    burst: u64,
    /// Kill once this many page bytes are acknowledged.
    kill_at: u64,
    /// The filling cycle: stop once the SSD tier holds this many bytes.
    fill_to: Option<u64>,
    /// Arm the trigger once this many are.
    arm_at: u64,
    /// Kill when a phase begins.
    trigger: Option<Trigger>,
    /// A Retire of the churn computation.
    retire: Option<RetirePlan>,
}

/// The value of metric `name` (no labels) in Prometheus text (0 when absent).
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

/// Uniform in `[lo, hi]`.
fn between(rng: &mut u64, lo: u64, hi: u64) -> u64 {
    lo + splitmix64(rng) % (hi.saturating_sub(lo) + 1)
}

impl Plan {
    fn draw(rng: &mut u64, cycle: u64, cap: u64, retire_every: u64) -> Plan {
        let micros = |rng: &mut u64, max: u64| Duration::from_micros(between(rng, 0, max));
        let mut plan = Plan {
            burst: cap / 8,
            kill_at: cap,
            fill_to: None,
            arm_at: between(rng, cap / 16, cap / 2),
            trigger: None,
            retire: None,
        };
        match splitmix64(rng) % 100 {
            0..40 => plan.kill_at = between(rng, cap / 8, cap),
            r @ 40..85 => {
                let phase = match r {
                    40..55 => SEAL,
                    55..70 => COMPACT,
                    _ => RECLAIM,
                };
                plan.trigger = Some(Trigger {
                    phase,
                    delay: micros(rng, 300),
                });
            }
            _ => {
                plan.retire = Some(RetirePlan {
                    at: between(rng, cap / 8, cap / 2),
                    kill_after: Some(micros(rng, 500)),
                });
            }
        }
        // Early, so compaction finds the burst dead while the cycle lasts.
        if plan.retire.is_none() && cycle.is_multiple_of(retire_every) {
            plan.retire = Some(RetirePlan {
                at: between(rng, cap / 8, cap / 4),
                kill_after: None,
            });
        }
        plan
    }
}

/// Everything a run adds up.
#[derive(Debug, Default)]
struct Totals {
    kills: Kills,
    pages: Tally,
    seals: u64,
    reclaimed: u64,
    recycled: u64,
    compactions: u64,
    compacted_segments: u64,
    retires: u64,
    own_cycle_reclaims: u64,
    cycles_reclaiming: u64,
    cycles_compacting: u64,
    engines: Report,
    engine_errors: Vec<String>,
    warnings: u64,
    first_warnings: Vec<String>,
}

impl Totals {
    fn add_log(&mut self, log: &LogState) {
        self.seals += log.ends[SEAL];
        self.reclaimed += log.ends[RECLAIM];
        self.recycled += log.recycled;
        self.compactions += log.compactions;
        self.compacted_segments += log.compacted_segments;
        self.retires += log.ends[RETIRE];
        self.warnings += log.warnings;
        for w in &log.first_warnings {
            if self.first_warnings.len() < 8 {
                self.first_warnings.push(w.clone());
            }
        }
    }

    fn failed(&self) -> bool {
        self.pages.lost + self.pages.wrong + self.pages.resurrected > 0
            || self.engines.pages.wrong_bytes > 0
            || self.engines.unproven > 0
    }
}

/// The harness's state across cycles.
struct Harness<'a> {
    a: &'a CrashtestArgs,
    dopts: DaemonOptions,
    specs: Vec<Spec>,
    namespaces: Vec<Option<[u8; 32]>>,
    cursors: Vec<u64>,
    totals: Totals,
    /// The previous cycle's pages, checked on disk, to check through the restarted daemon.
    pending: Option<Pending>,
    /// The largest segment id before this cycle.
    max_segment: u64,
    /// The churn namespace's watermark before this cycle.
    churn_watermark: Option<u64>,
    /// Pages of earlier cycles, looked up again after every kill, with the segment each was
    /// last seen in.
    tracked: BTreeMap<PageKey, Expect>,
    /// The last manifest sequence read.
    manifest_seq: u64,
}

/// How a cycle ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// SIGKILL at the plan's point.
    Kill,
    /// SIGTERM under load at the plan's point (the filling cycle).
    Stop,
}

fn internal(e: String) -> Failure {
    Failure::internal(e)
}

impl Harness<'_> {
    /// Starts the daemon and an engine per instance; checks the previous cycle's pages through
    /// it.
    fn start(&mut self, log: &Arc<CycleLog>) -> Result<(Daemon, Vec<Option<SimEngine>>), Failure> {
        let daemon = Daemon::start(&self.dopts, log.activity.clone()).map_err(internal)?;
        let mut engines = Vec::with_capacity(self.specs.len());
        for i in 0..self.specs.len() {
            let e = engines::start(&self.specs, i, daemon.socket(), log).map_err(internal)?;
            let ns = e.namespace();
            match self.namespaces[i] {
                Some(old) if old != ns => {
                    return Err(internal(format!(
                        "{}: the namespace changed across restarts",
                        self.specs[i].inst.name
                    )));
                }
                _ => self.namespaces[i] = Some(ns),
            }
            engines.push(Some(e));
        }
        if let Some(mut p) = self.pending.take() {
            check::through_daemon(&self.specs, &mut engines, &mut p).map_err(internal)?;
            let t = check::tally(&self.specs, &p);
            self.totals.pages.add(&t);
            // Pages of the computations that are never retired are looked up again later.
            for (k, e) in p.pages {
                let churn = self.specs.get(e.spec).is_none_or(|s| s.churn);
                if e.want == Want::Present && !e.lost && !e.wrong && e.segment.is_some() && !churn {
                    self.tracked.insert(k, e);
                }
            }
        }
        Ok((daemon, engines))
    }

    /// Runs cycle `cycle` under `plan`, ending it as `ending` says; checks its pages on disk.
    fn cycle(
        &mut self,
        cycle: u64,
        plan: Plan,
        ending: Ending,
        rng: &mut u64,
    ) -> Result<(), Failure> {
        let log = Arc::new(CycleLog::default());
        let (daemon, mut engines) = self.start(&log)?;
        let ctl = Control::default();
        let killer = daemon.killer();
        let retire = Mutex::new(RetireInfo::default());
        let churn = self.specs.iter().position(|s| s.churn);
        let churn_ns = churn.and_then(|i| self.namespaces[i]);
        let finished = AtomicUsize::new(0);
        let stopped: Mutex<Option<Instant>> = Mutex::new(None);
        let running = engines.iter().filter(|e| e.is_some()).count();
        let started = Instant::now();
        let max_cycle = self.a.max_cycle;
        let errors: Vec<(Instant, String)> = std::thread::scope(|s| {
            let mut handles = Vec::new();
            for ((e, spec), cursor) in engines
                .iter_mut()
                .zip(&self.specs)
                .zip(self.cursors.iter_mut())
            {
                let Some(engine) = e.as_mut() else {
                    continue;
                };
                let (ctl, finished) = (&ctl, &finished);
                handles.push(s.spawn(move || {
                    let r = engines::drive(engine, spec, cursor, ctl);
                    finished.fetch_add(1, Ordering::AcqRel);
                    r
                }));
            }
            if let (Some(rp), Some(ns)) = (plan.retire.filter(|_| ending == Ending::Kill), churn_ns)
            {
                let (ctl, killer, log, retire) = (&ctl, &killer, &log, &retire);
                let socket = daemon.socket().to_path_buf();
                s.spawn(move || {
                    run_retire(rp, ns, &socket, ctl, killer, log, retire);
                });
            }
            let mut armed = false;
            let mut stats = plan.fill_to.and_then(|_| {
                let mut c = Client::connect(daemon.socket()).ok()?;
                c.hello("orbitkv crashtest stats").ok()?;
                Some(c)
            });
            let mut full = false;
            loop {
                if killer.killed() {
                    break;
                }
                if !ctl.go.load(Ordering::Acquire)
                    && (log.churn_bytes.load(Ordering::Acquire) >= plan.burst
                        || started.elapsed() >= BURST_LIMIT)
                {
                    ctl.go.store(true, Ordering::Release);
                }
                let acked = log.acked_bytes.load(Ordering::Acquire);
                let all_done = finished.load(Ordering::Acquire) >= running;
                if ending == Ending::Kill && !armed && acked >= plan.arm_at {
                    daemon.arm(plan.trigger);
                    armed = true;
                }
                if let (Some(c), Some(to)) = (stats.as_mut(), plan.fill_to) {
                    full = c
                        .stats()
                        .is_ok_and(|t| metric(&t, "orbitkv_store_ssd_bytes") >= to);
                }
                if acked >= plan.kill_at || full || started.elapsed() >= max_cycle || all_done {
                    match ending {
                        Ending::Kill => {
                            killer.kill();
                        }
                        // A clean stop under load: the Publishes in flight fail.
                        Ending::Stop => *lock(&stopped) = Some(daemon.terminate()),
                    }
                    break;
                }
                std::thread::sleep(Duration::from_micros(between(rng, 100, 2000)));
            }
            ctl.stop.store(true, Ordering::Release);
            handles
                .into_iter()
                .filter_map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Some((Instant::now(), "an engine thread panicked".to_owned()))
                    })
                })
                .collect()
        });
        for e in engines.iter_mut() {
            if let Some(e) = e.take() {
                self.totals.engines.merge(e.report());
            }
        }
        let (landed, logs, cut) = match ending {
            Ending::Kill => {
                let (snap, logs) = daemon.kill();
                let landed = self.totals.kills.add(&snap, &logs);
                (landed, logs, Some(snap.at))
            }
            Ending::Stop => {
                let (clean, logs) = daemon.stop(Duration::from_secs(60));
                if !clean {
                    self.totals.engine_errors.push(format!(
                        "cycle {cycle}: the daemon did not stop cleanly on SIGTERM"
                    ));
                }
                let at = *lock(&stopped);
                ("stopped with SIGTERM".to_owned(), logs, at)
            }
        };
        for (at, e) in errors {
            if cut.is_none_or(|k| at < k) {
                self.totals
                    .engine_errors
                    .push(format!("cycle {cycle}: before the kill: {e}"));
            }
        }
        self.totals.add_log(&logs);
        if ending == Ending::Kill {
            self.totals.cycles_reclaiming += u64::from(logs.ends[RECLAIM] > 0);
            self.totals.cycles_compacting += u64::from(logs.compactions > 0);
        }
        let max_before = self.max_segment;
        let own = logs.reclaimed.iter().filter(|id| **id > max_before).count() as u64;
        self.totals.own_cycle_reclaims += own;
        let landed = if own > 0 {
            format!("{landed}; {own} segments written in this cycle were reclaimed in it")
        } else {
            landed
        };
        if self.a.sabotage && ending == Ending::Kill {
            sabotage(&self.a.data_dir, max_before).map_err(internal)?;
        }
        // On disk, while no daemon runs.
        let off = self.recheck(cycle, &landed)?;
        let info = std::mem::take(&mut *lock(&retire));
        let retired = info.sent.is_some()
            && (info.done.is_some()
                || churn_ns.is_some_and(|ns| off.watermark(ns) != self.churn_watermark));
        let mut p = check::expectations(&self.specs, &self.namespaces, cycle, &log, &info, retired);
        p.landed = landed;
        off.check(&self.specs, &mut p);
        self.max_segment = off.max_segment();
        self.churn_watermark = churn_ns.and_then(|ns| off.watermark(ns));
        drop(off);
        self.pending = Some(p);
        Ok(())
    }

    /// Opens the data directory read-only and looks every tracked page up again.
    fn recheck(&mut self, cycle: u64, landed: &str) -> Result<Offline, Failure> {
        let h = History::read(&self.a.data_dir, self.manifest_seq).map_err(internal)?;
        self.manifest_seq = h.last;
        let off = Offline::open(&self.a.data_dir).map_err(internal)?;
        let punches = self.a.policy == Policy::RecordLru;
        let t = off.recheck(&self.specs, &mut self.tracked, &h, (cycle, landed), punches);
        self.totals.pages.add(&t);
        Ok(off)
    }

    /// Restarts the daemon once more to check the last cycle's pages, stops it cleanly, and
    /// looks every tracked page up once more.
    fn finish(&mut self) -> Result<bool, Failure> {
        let log = Arc::new(CycleLog::default());
        let (daemon, engines) = self.start(&log)?;
        drop(engines);
        let (clean, logs) = daemon.stop(Duration::from_secs(60));
        self.totals.add_log(&logs);
        self.recheck(self.a.cycles + 1, "the final clean stop")?;
        Ok(clean)
    }
}

/// Deletes the segment files of `dir` with ids above `after` (the harness's self-test).
fn sabotage(dir: &std::path::Path, after: u64) -> Result<(), String> {
    let layout = orbitkv_store::Layout::new(dir);
    let off = Offline::open(dir)?;
    let ids: Vec<u64> = off
        .segments()
        .into_iter()
        .filter(|id| *id > after)
        .collect();
    drop(off);
    for id in ids {
        let path = layout.segment(id);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("{}: {e}", path.display()));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Retires the churn namespace `ns` once `rp.at` bytes are acknowledged, noting which of its
/// Publishes were in flight then; kills the daemon `rp.kill_after` after sending it, if set.
fn run_retire(
    rp: RetirePlan,
    ns: [u8; 32],
    socket: &std::path::Path,
    ctl: &Control,
    killer: &daemon::Killer,
    log: &CycleLog,
    retire: &Mutex<RetireInfo>,
) {
    let gone = || killer.killed() || ctl.stop.load(Ordering::Acquire);
    while log.acked_bytes.load(Ordering::Acquire) < rp.at {
        if gone() {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let Ok(mut client) = Client::connect(socket) else {
        return;
    };
    if client.hello("orbitkv crashtest retire").is_err() {
        return;
    }
    log.activity.retiring.store(true, Ordering::Release);
    {
        // The churn Publishes in flight now may be stored before or after the Retire.
        let flying = lock(&log.churn_flying);
        let mut r = lock(retire);
        r.sent = Some(Instant::now());
        r.flying = flying
            .iter()
            .flat_map(|(rank, ps)| ps.iter().map(|p| (*rank, p.clone())))
            .collect();
    }
    match rp.kill_after {
        Some(after) => {
            if client.send(&Message::Retire { namespace: ns }).is_ok() {
                std::thread::sleep(after);
                killer.kill();
            }
        }
        None => {
            if client.retire(ns).is_ok() {
                lock(retire).done = Some(Instant::now());
                log.activity.retiring.store(false, Ordering::Release);
            }
        }
    }
}

/// Runs `crashtest`.
pub fn run(a: &CrashtestArgs, out: &Output) -> Result<(), Failure> {
    let refused = |e: String| Failure::refused(e);
    let cap = a.cycle_bytes.unwrap_or(a.ssd_bytes / 8);
    if cap == 0 || cap > a.ssd_bytes / 4 {
        return Err(refused(format!(
            "--cycle-bytes {cap}: at most a quarter of --ssd-bytes ({}), so FIFO reclaim never reaches a cycle's own pages before they are checked",
            a.ssd_bytes / 4
        )));
    }
    if a.compact_interval.is_zero() {
        return Err(refused(
            "--compact-interval: compaction must run".to_owned(),
        ));
    }
    match std::fs::read_dir(&a.data_dir) {
        Ok(mut d) => {
            if d.next().is_some() {
                return Err(refused(format!(
                    "{}: not empty (the harness starts on an empty data directory)",
                    a.data_dir.display()
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(refused(format!("{}: {e}", a.data_dir.display()))),
    }
    std::fs::create_dir_all(&a.data_dir)
        .map_err(|e| refused(format!("{}: {e}", a.data_dir.display())))?;
    let exe = std::env::current_exe()
        .map_err(|e| Failure::internal(format!("finding this binary: {e}")))?;
    let specs = engines::specs(a.seed).map_err(Failure::internal)?;
    let n = specs.len();
    let mut h = Harness {
        a,
        dopts: DaemonOptions {
            exe,
            data_dir: a.data_dir.clone(),
            ssd_bytes: a.ssd_bytes,
            segment_bytes: a.segment_bytes.unwrap_or(a.ssd_bytes / 64).max(8 << 10),
            compact_interval: a.compact_interval,
            compact_threshold: a.compact_threshold,
            policy: a.policy,
            waiting_bytes: if a.admission { a.ssd_bytes / 10 } else { 0 },
        },
        specs,
        namespaces: vec![None; n],
        cursors: vec![0; n],
        totals: Totals::default(),
        pending: None,
        max_segment: 0,
        churn_watermark: None,
        tracked: BTreeMap::new(),
        manifest_seq: 0,
    };
    let bar = ProgressBar::with_draw_target(Some(a.cycles), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("crashtest {pos}/{len} cycles {wide_bar} {msg} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let started = Instant::now();
    let mut rng = a.seed ^ 0xC4A5_7E57;
    // The filling cycle: 85 % of the budget on disk, so reclaim runs in every counted cycle.
    let fill = Plan {
        burst: 0,
        kill_at: u64::MAX,
        fill_to: Some(a.ssd_bytes * 85 / 100),
        arm_at: u64::MAX,
        trigger: None,
        retire: None,
    };
    bar.set_message("filling");
    h.cycle(0, fill, Ending::Stop, &mut rng)?;
    for cycle in 1..=a.cycles {
        let plan = Plan::draw(&mut rng, cycle, cap, a.retire_every);
        h.cycle(cycle, plan, Ending::Kill, &mut rng)?;
        bar.inc(1);
        bar.set_message(format!(
            "{} lost, {} wrong",
            h.totals.pages.lost, h.totals.pages.wrong
        ));
    }
    let clean = h.finish()?;
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    let t = &h.totals;
    let k = t.kills;
    let mut text = format!(
        "crashtest: {} cycles (seed {}) in {seconds:.1} s on {}\n\
         kills: {} mid-publish, {} mid-seal, {} mid-compaction, {} mid-reclaim, {} mid-retire, {} idle (a kill can land in several)\n\
         acknowledged: {} pages ({:.1} MiB); checked on disk after each kill: {}, through the restarted daemon: {}\n\
         looked up again after later kills: {} times ({} gone with a segment the manifest says was reclaimed, {} whose history a checkpoint took); tracked at the end: {}\n\
         lost: {}\nwrong: {}\n\
         retired: {} pages acknowledged before a Retire that took effect; found after the kill: {}\n\
         store: {} segments sealed, {} reclaimed, {} new ones over a reclaimed file, {} compactions of {} segments, {} retires; cycles with a reclaim: {}, with a compaction: {}; segments reclaimed in the cycle that wrote them: {}\n\
         engines: {} requests, {} pages loaded and checked ({} wrong bytes, {} unproven proofs), {} errors before a kill\n\
         daemon: {} warnings logged; stopped cleanly at the end: {}\n",
        a.cycles,
        a.seed,
        a.data_dir.display(),
        k.publish,
        k.seal,
        k.compaction,
        k.reclaim,
        k.retire,
        k.idle,
        t.pages.acknowledged,
        t.pages.acknowledged_bytes as f64 / f64::from(1 << 20),
        t.pages.checked,
        t.pages.served,
        t.pages.rechecked,
        t.pages.evicted,
        t.pages.unjudged,
        h.tracked.len(),
        t.pages.lost,
        t.pages.wrong,
        t.pages.retired,
        t.pages.resurrected,
        t.seals,
        t.reclaimed,
        t.recycled,
        t.compactions,
        t.compacted_segments,
        t.retires,
        t.cycles_reclaiming,
        t.cycles_compacting,
        t.own_cycle_reclaims,
        t.engines.requests,
        t.engines.pages.loaded,
        t.engines.pages.wrong_bytes,
        t.engines.unproven,
        t.engine_errors.len(),
        t.warnings,
        if clean { "yes" } else { "no" },
    );
    for p in t.pages.problems.iter().chain(&t.engine_errors) {
        text.push_str(&format!("problem: {p}\n"));
    }
    for w in &t.first_warnings {
        text.push_str(&format!("daemon warning: {w}\n"));
    }
    out.emit(&text, || {
        json!({
            "cycles": a.cycles,
            "seed": a.seed,
            "seconds": seconds,
            "data_dir": a.data_dir.display().to_string(),
            "kills": {
                "publish": k.publish,
                "seal": k.seal,
                "compaction": k.compaction,
                "reclaim": k.reclaim,
                "retire": k.retire,
                "idle": k.idle,
            },
            "acknowledged": t.pages.acknowledged,
            "acknowledged_bytes": t.pages.acknowledged_bytes,
            "checked": t.pages.checked,
            "served": t.pages.served,
            "rechecked": t.pages.rechecked,
            "evicted": t.pages.evicted,
            "unjudged": t.pages.unjudged,
            "tracked": h.tracked.len(),
            "lost": t.pages.lost,
            "wrong": t.pages.wrong,
            "retired": t.pages.retired,
            "resurrected": t.pages.resurrected,
            "seals": t.seals,
            "reclaimed_segments": t.reclaimed,
            "recycled_segments": t.recycled,
            "compactions": t.compactions,
            "compacted_segments": t.compacted_segments,
            "retires": t.retires,
            "own_cycle_reclaims": t.own_cycle_reclaims,
            "cycles_reclaiming": t.cycles_reclaiming,
            "cycles_compacting": t.cycles_compacting,
            "requests": t.engines.requests,
            "loaded_pages": t.engines.pages.loaded,
            "held_pages": t.engines.pages.held,
            "load_wrong_bytes": t.engines.pages.wrong_bytes,
            "unproven": t.engines.unproven,
            "engine_errors": t.engine_errors,
            "daemon_warnings": t.warnings,
            "clean_stop": clean,
            "problems": t.pages.problems,
            "warnings": t.first_warnings,
        })
    })?;
    if t.failed() {
        return Err(Failure::with_code(
            EXIT_LOST,
            format!(
                "{} acknowledged pages lost, {} wrong, {} retired pages found, {} wrong bytes loaded, {} unproven proofs (data kept in {})",
                t.pages.lost,
                t.pages.wrong,
                t.pages.resurrected,
                t.engines.pages.wrong_bytes,
                t.engines.unproven,
                a.data_dir.display()
            ),
        ));
    }
    if !t.engine_errors.is_empty() || !clean {
        return Err(Failure::internal(format!(
            "{} engine errors before a kill; daemon stopped cleanly: {clean} (data kept in {})",
            t.engine_errors.len(),
            a.data_dir.display()
        )));
    }
    if !a.keep {
        let _ = std::fs::remove_dir_all(&a.data_dir);
    }
    Ok(())
}
