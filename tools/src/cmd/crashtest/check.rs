//! The checks after each kill. Every page acknowledged durable in the cycle is looked up by its
//! key on disk, in the data directory opened read-only while the daemon is dead (the same
//! recovery the daemon runs), and its bytes compared with what the computation produces. Then,
//! through the restarted daemon, every block whose proof needs only acknowledged pages is
//! acquired and loaded, and every byte compared again: a dense block for every rank, a hybrid
//! instance's recurrent-state checkpoint with the window block that ends at it.
//!
//! Nothing is excused there: a cycle's pages are checked right after its kill, before anything
//! else is written, and a cycle never writes enough for FIFO reclaim to reach its own segments
//! (the report counts any reclaim that did). After every later kill they are looked up on disk
//! again, through compactions, reclaims and restarts, until one is gone: then the manifest
//! decides — evicted when the segment it was last seen in (or one its records were compacted
//! into) has a `SegmentDeleted` record since, lost otherwise. The retired computation's pages
//! are checked once; they are expected gone when
//! acknowledged before its Retire was sent and that Retire took effect (its reply came, or the
//! manifest holds its record) — unless a Publish of the same page was in flight when the Retire
//! was sent, or sent after it — and present when sent after the reply.
//! It is long because each check (on disk, through the daemon, against the retirements) is
//! its own pass over the same expectations.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use orbitkv_protocol::PageStatus;
use orbitkv_protocol::message::GroupHashes;
use orbitkv_sim::{Acked, AckedPage, CheckedPage, SimContract, SimEngine, payload};
use orbitkv_state::{CacheGroupId, HashDomain, Namespace, RankSpec, StateKey, hex};
use orbitkv_store::{StateStore, StoreConfig};
use orbitkv_wal::{ManifestRecord, decode_record};

use super::engines::{CycleLog, Spec, lock};

/// Problems described word for word in the report.
const KEPT_PROBLEMS: usize = 20;

/// One page: its computation's namespace, group, rank and block hash.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageKey {
    /// The namespace.
    pub namespace: [u8; 32],
    /// The cache group.
    pub group: u32,
    /// The rank.
    pub rank: u32,
    /// The block's native hash.
    pub hash: Vec<u8>,
}

/// What a page should be after the kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Stored, byte for byte.
    Present,
    /// Retired: never served again.
    Gone,
}

/// One page to check.
#[derive(Debug, Clone)]
pub struct Expect {
    /// The instance (index into the specs) that published it.
    pub spec: usize,
    /// Its token range.
    pub start: u64,
    /// One past its last token.
    pub end: u64,
    /// What it should be.
    pub want: Want,
    /// Lost: acknowledged, missing after the kill.
    pub lost: bool,
    /// Wrong: a byte read back differs.
    pub wrong: bool,
    /// Checked on disk.
    pub on_disk: bool,
    /// Checked through the restarted daemon.
    pub served: bool,
    /// The segment it was last seen in.
    pub segment: Option<u64>,
    /// Its frame's offset there.
    pub offset: Option<u64>,
}

/// The Retire of a cycle, seen from the harness.
#[derive(Debug, Clone, Default)]
pub struct RetireInfo {
    /// When it was sent.
    pub sent: Option<Instant>,
    /// When its reply came.
    pub done: Option<Instant>,
    /// The retired computation's pages in Publishes in flight when it was sent, per rank.
    pub flying: Vec<(u32, AckedPage)>,
}

/// What pages came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Pages acknowledged durable and expected present (distinct keys).
    pub acknowledged: u64,
    /// Their bytes.
    pub acknowledged_bytes: u64,
    /// Pages checked on disk (present, gone or missing).
    pub checked: u64,
    /// Pages checked through the restarted daemon.
    pub served: u64,
    /// Pages of earlier cycles looked up again.
    pub rechecked: u64,
    /// Of those, pages gone with a segment the manifest says was reclaimed.
    pub evicted: u64,
    /// Of those, pages gone with a segment whose history a manifest checkpoint took.
    pub unjudged: u64,
    /// Acknowledged pages missing after a kill.
    pub lost: u64,
    /// Pages with a byte that differs.
    pub wrong: u64,
    /// Retired pages (acknowledged before a Retire that took effect).
    pub retired: u64,
    /// Retired pages found after the kill.
    pub resurrected: u64,
    /// The first problems, described.
    pub problems: Vec<String>,
}

impl Tally {
    /// Adds `other`.
    pub fn add(&mut self, other: &Tally) {
        self.acknowledged += other.acknowledged;
        self.acknowledged_bytes += other.acknowledged_bytes;
        self.checked += other.checked;
        self.served += other.served;
        self.rechecked += other.rechecked;
        self.evicted += other.evicted;
        self.unjudged += other.unjudged;
        self.lost += other.lost;
        self.wrong += other.wrong;
        self.retired += other.retired;
        self.resurrected += other.resurrected;
        for p in &other.problems {
            if self.problems.len() < KEPT_PROBLEMS {
                self.problems.push(p.clone());
            }
        }
    }
}

/// One cycle's pages between its kill and the checks through the restarted daemon.
#[derive(Debug, Default)]
pub struct Pending {
    /// The cycle.
    pub cycle: u64,
    /// How the kill landed, for problem reports.
    pub landed: String,
    /// The cycle's PublishDurable replies.
    pub acks: Vec<(usize, Acked)>,
    /// Every page to check.
    pub pages: BTreeMap<PageKey, Expect>,
    /// Problems found so far.
    pub problems: Vec<String>,
}

fn key_of(namespace: [u8; 32], rank: u32, p: &AckedPage) -> PageKey {
    PageKey {
        namespace,
        group: p.group,
        rank,
        hash: p.hash.clone(),
    }
}

/// The pages to check after cycle `cycle`: every acknowledged page, expected present — those of
/// the retired computation acknowledged before a Retire that took effect (`retired`) expected
/// gone instead, left out when a Publish of the same page was in flight when the Retire was sent
/// or sent after it; those of it sent before the reply and acknowledged after it left out.
pub fn expectations(
    specs: &[Spec],
    namespaces: &[Option<[u8; 32]>],
    cycle: u64,
    log: &CycleLog,
    retire: &RetireInfo,
    retired: bool,
) -> Pending {
    let acks = std::mem::take(&mut *lock(&log.acks));
    let mut pages: BTreeMap<PageKey, Expect> = BTreeMap::new();
    let mut ambiguous: BTreeSet<PageKey> = BTreeSet::new();
    let churn_ns = specs
        .iter()
        .position(|s| s.churn)
        .and_then(|i| namespaces.get(i).copied().flatten());
    if let (Some(sent), Some(ns)) = (retire.sent, churn_ns) {
        ambiguous.extend(retire.flying.iter().map(|(rank, p)| PageKey {
            namespace: ns,
            group: p.group,
            rank: *rank,
            hash: p.hash.clone(),
        }));
        for (at, rank, ps) in lock(&log.churn_sends).iter() {
            if *at >= sent {
                ambiguous.extend(ps.iter().map(|p| PageKey {
                    namespace: ns,
                    group: p.group,
                    rank: *rank,
                    hash: p.hash.clone(),
                }));
            }
        }
    }
    for (i, a) in &acks {
        let (Some(spec), Some(Some(ns))) = (specs.get(*i), namespaces.get(*i)) else {
            continue;
        };
        for p in &a.pages {
            let key = key_of(*ns, a.rank, p);
            let want = match (spec.churn, retire.sent) {
                (true, Some(sent)) if retired => {
                    if a.durable < sent {
                        Some(Want::Gone)
                    } else if retire.done.is_some_and(|d| a.sent > d) {
                        Some(Want::Present)
                    } else {
                        None
                    }
                }
                _ => Some(Want::Present),
            };
            let Some(want) = want else {
                continue;
            };
            if want == Want::Gone && ambiguous.contains(&key) {
                continue;
            }
            let e = pages.entry(key).or_insert(Expect {
                spec: *i,
                start: p.start,
                end: p.end,
                want,
                lost: false,
                wrong: false,
                on_disk: false,
                served: false,
                segment: None,
                offset: None,
            });
            // Present once acknowledged after the Retire, whatever came before.
            if want == Want::Present {
                e.want = Want::Present;
            }
        }
    }
    Pending {
        cycle,
        landed: String::new(),
        acks,
        pages,
        problems: Vec::new(),
    }
}

fn describe(specs: &[Spec], k: &PageKey, e: &Expect) -> String {
    let name = specs.get(e.spec).map_or("?", |s| s.inst.name.as_str());
    let hash = hex::encode(&k.hash);
    format!(
        "{name} group {} rank {} tokens [{}, {}) hash {}…",
        k.group,
        k.rank,
        e.start,
        e.end,
        &hash[..hash.len().min(16)]
    )
}

/// The data directory opened read-only while no daemon runs.
pub struct Offline {
    store: StateStore,
}

impl Offline {
    /// Opens `dir` read-only (it recovers exactly as the daemon does, changing nothing).
    pub fn open(dir: &Path) -> Result<Self, String> {
        let mut cfg = StoreConfig::new(dir);
        cfg.read_only = true;
        StateStore::open(orbitkv_store::io::offline_backend(), cfg)
            .map(|store| Offline { store })
            .map_err(|e| format!("opening {} read-only: {e}", dir.display()))
    }

    /// The segment ids it names.
    pub fn segments(&self) -> Vec<u64> {
        self.store.segments().iter().map(|(id, _)| *id).collect()
    }

    /// The largest segment id it names (0 for none).
    pub fn max_segment(&self) -> u64 {
        self.segments().into_iter().max().unwrap_or(0)
    }

    /// `namespace`'s retirement watermark, if it was ever retired.
    pub fn watermark(&self, namespace: [u8; 32]) -> Option<u64> {
        self.store
            .namespaces()
            .into_iter()
            .find(|(ns, _, _)| ns.0 == namespace)
            .and_then(|(_, _, w)| w)
    }

    /// Looks page `k` up by its key and compares it with what `e` expects: `Ok(segment)` when
    /// it is there (`None`: absent), `Err` with why when its bytes or range differ or it cannot
    /// be read.
    fn look(
        &self,
        specs: &[Spec],
        k: &PageKey,
        e: &Expect,
        buf: &mut Vec<u8>,
    ) -> Result<Option<(u64, u64)>, Found> {
        let Some(spec) = specs.get(e.spec) else {
            return Err(Found::Unreadable("no such instance".to_owned()));
        };
        let Some(g) = spec.inst.groups().into_iter().find(|g| g.id == k.group) else {
            return Err(Found::Unreadable(format!("no group {}", k.group)));
        };
        let key = StateKey::new(
            Namespace(k.namespace),
            HashDomain::VllmSha256Cbor,
            &k.hash,
            CacheGroupId(k.group),
            g.component,
            RankSpec::Rank(k.rank),
        )
        .map_err(|e| Found::Unreadable(e.to_string()))?;
        let rec = match self.store.get(&key, buf) {
            Ok(Some(rec)) => rec,
            Ok(None) => return Ok(None),
            Err(e) => return Err(Found::Unreadable(e.to_string())),
        };
        let len = spec.inst.group_page_bytes(&g) as usize;
        let differ = payload::wrong_bytes(&spec.inst.identity, k.group, k.rank, &k.hash, buf);
        if buf.len() != len
            || differ > 0
            || rec.range.start() != e.start
            || rec.range.end() != e.end
        {
            return Err(Found::Wrong(format!(
                "{differ} of {} bytes differ (want {len}), range [{}, {})",
                buf.len(),
                rec.range.start(),
                rec.range.end()
            )));
        }
        Ok(Some((u64::from(rec.segment), rec.offset)))
    }

    /// Whether the frame at `offset` of `segment` was punched out (evicted by `record-lru`): a
    /// hole over its first byte.
    fn punched(&self, segment: u64, offset: u64) -> bool {
        let path = orbitkv_store::Layout::new(self.store.data_dir()).segment(segment);
        orbitkv_store::io::offline_backend()
            .open(&path, orbitkv_store::io::OpenMode::Read)
            .and_then(|f| f.holes())
            .is_ok_and(|holes| holes.iter().any(|&(a, b)| a <= offset && offset < b))
    }

    /// Looks every page of `p` up by its key and compares its bytes.
    pub fn check(&self, specs: &[Spec], p: &mut Pending) {
        let mut buf = Vec::new();
        for (k, e) in p.pages.iter_mut() {
            let found = self.look(specs, k, e, &mut buf);
            e.on_disk = true;
            let what = describe(specs, k, e);
            let problem = match (e.want, found) {
                (Want::Present, Ok(Some((segment, offset)))) => {
                    e.segment = Some(segment);
                    e.offset = Some(offset);
                    None
                }
                (Want::Present, Err(Found::Wrong(why))) => {
                    e.wrong = true;
                    Some(format!("wrong on disk: {what}: {why}"))
                }
                (Want::Present, Ok(None)) => {
                    e.lost = true;
                    Some(format!("lost: {what}: missing on disk after the kill"))
                }
                (Want::Present, Err(Found::Unreadable(why))) => {
                    e.lost = true;
                    Some(format!("lost: {what}: unreadable after the kill: {why}"))
                }
                (Want::Gone, Ok(Some(_)) | Err(Found::Wrong(_))) => {
                    e.wrong = true;
                    Some(format!(
                        "resurrected: {what}: retired, yet found after the kill"
                    ))
                }
                (Want::Gone, _) => None,
            };
            if let Some(pr) = problem {
                p.problems.push(pr);
            }
        }
    }

    /// Looks every page of earlier cycles up again (`tracked`, each with the segment it was last
    /// seen in), after cycle `cycle` (`landed`: how it ended). A page still there is compared
    /// again and stays tracked. A missing one is evicted when the manifest says its segment was
    /// reclaimed since (`h`), or a segment its records were compacted into was, or (`punches`:
    /// under record-lru) its frame is a hole; unjudged when a checkpoint took that history and
    /// its segment is gone, or when it was punched out of a segment it was compacted into (its
    /// offset there unknown); lost otherwise.
    pub fn recheck(
        &self,
        specs: &[Spec],
        tracked: &mut BTreeMap<PageKey, Expect>,
        h: &History,
        (cycle, landed): (u64, &str),
        punches: bool,
    ) -> Tally {
        let mut t = Tally::default();
        let mut buf = Vec::new();
        let alive: BTreeSet<u64> = self.segments().into_iter().collect();
        let mut problems = Vec::new();
        tracked.retain(|k, e| {
            t.rechecked += 1;
            let what = describe(specs, k, e);
            match self.look(specs, k, e, &mut buf) {
                Ok(Some((segment, offset))) => {
                    e.segment = Some(segment);
                    e.offset = Some(offset);
                    true
                }
                Err(Found::Wrong(why)) => {
                    t.wrong += 1;
                    problems.push(format!("wrong on disk, cycles after it was stored: {what}: {why}"));
                    false
                }
                found => {
                    let seg = e.segment.unwrap_or(0);
                    let punched = punches && e.offset.is_some_and(|o| self.punched(seg, o));
                    if h.evicted(seg) || punched {
                        t.evicted += 1;
                    } else if (punches && h.compacted.contains_key(&seg))
                        || (!h.complete && !alive.contains(&seg))
                    {
                        t.unjudged += 1;
                    } else {
                        t.lost += 1;
                        let why = match found {
                            Err(Found::Unreadable(why)) => format!("unreadable ({why})"),
                            _ => "missing".to_owned(),
                        };
                        problems.push(format!(
                            "lost: {what}: {why} on disk; its segment {seg} was {} per the manifest",
                            if h.compacted.contains_key(&seg) {
                                "compacted, and none of the segments it went to reclaimed,"
                            } else {
                                "not reclaimed"
                            }
                        ));
                    }
                    false
                }
            }
        });
        for pr in problems {
            if t.problems.len() < KEPT_PROBLEMS {
                t.problems.push(format!("cycle {cycle} ({landed}): {pr}"));
            }
        }
        t
    }
}

/// Why a page is not as expected.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Found {
    /// Its bytes or range differ.
    Wrong(String),
    /// It cannot be read.
    Unreadable(String),
}

/// What the manifest says happened to segments since a sequence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// Segments deleted (`SegmentDeleted`: reclaimed, or an empty active one at open).
    pub reclaimed: BTreeSet<u64>,
    /// Segments compacted (`CompactionCommitted`), each with the segments its records went to.
    pub compacted: BTreeMap<u64, Vec<u64>>,
    /// False when a checkpoint replaced part of that history.
    pub complete: bool,
    /// The last sequence read.
    pub last: u64,
}

impl History {
    /// Reads the manifest of `dir` (no daemon running) for what happened after sequence `after`.
    pub fn read(dir: &Path, after: u64) -> Result<History, String> {
        let path = orbitkv_store::Layout::new(dir).manifest();
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut h = History {
            complete: true,
            last: after,
            ..History::default()
        };
        let mut pos = 0usize;
        // A torn tail ends the valid records, as it ends replay.
        while let Some(rest) = bytes.get(pos..).filter(|r| !r.is_empty())
            && let Ok(d) = decode_record(rest, pos as u64)
        {
            pos += d.len;
            h.last = h.last.max(d.sequence);
            if d.sequence <= after {
                continue;
            }
            match d.record {
                ManifestRecord::Checkpoint(_) if after > 0 => h.complete = false,
                ManifestRecord::SegmentDeleted { segment_id } => {
                    h.reclaimed.insert(segment_id);
                }
                ManifestRecord::CompactionCommitted { inputs, outputs } => {
                    for i in inputs {
                        h.compacted.insert(i, outputs.clone());
                    }
                }
                _ => {}
            }
        }
        Ok(h)
    }

    /// Whether a record last seen in `segment` may have left the store by reclaim: the segment,
    /// or one its records were compacted into (transitively), was reclaimed.
    pub fn evicted(&self, segment: u64) -> bool {
        let mut todo = vec![segment];
        let mut seen = BTreeSet::new();
        while let Some(s) = todo.pop() {
            if !seen.insert(s) {
                continue;
            }
            if self.reclaimed.contains(&s) {
                return true;
            }
            if let Some(out) = self.compacted.get(&s) {
                todo.extend(out);
            }
        }
        false
    }
}

/// The blocks of one request of one instance, in token order: (group, start, hash) → the page
/// and the ranks that were acknowledged.
type Blocks = BTreeMap<(u32, u64, Vec<u8>), (AckedPage, BTreeSet<u32>)>;

/// Records the outcome of `got` for the pages `named` (block index → page key).
/// Marks lost the pages of `named` the restarted daemon did not serve (not in `seen`).
fn mark_unproven(
    specs: &[Spec],
    p: &mut Pending,
    named: &BTreeMap<(u32, u32, u32), PageKey>,
    seen: &BTreeSet<(u32, u32, u32)>,
    miss: Option<u16>,
) {
    let mut notes = Vec::new();
    for (at, k) in named {
        if seen.contains(at) {
            continue;
        }
        if let Some(e) = p.pages.get_mut(k) {
            e.served = true;
            e.lost = true;
            notes.push(format!(
                "lost: {}: not proven by the restarted daemon (miss reason {miss:?})",
                describe(specs, k, e)
            ));
        }
    }
    p.problems.extend(notes);
}

fn take_checked(
    specs: &[Spec],
    p: &mut Pending,
    named: &BTreeMap<(u32, u32, u32), PageKey>,
    got: &[CheckedPage],
) -> BTreeSet<(u32, u32, u32)> {
    let mut seen = BTreeSet::new();
    for c in got {
        let Some(k) = named.get(&(c.group, c.block, c.rank)) else {
            continue;
        };
        seen.insert((c.group, c.block, c.rank));
        let Some(e) = p.pages.get_mut(k) else {
            continue;
        };
        e.served = true;
        let what = describe(specs, k, e);
        if c.status == PageStatus::Ok && c.wrong_bytes > 0 {
            e.wrong = true;
            p.problems.push(format!(
                "wrong through the daemon: {what}: {} bytes differ",
                c.wrong_bytes
            ));
        } else if c.status != PageStatus::Ok {
            e.lost = true;
            p.problems.push(format!(
                "lost: {what}: proven but not loaded by the restarted daemon ({:?})",
                c.status
            ));
        }
    }
    seen
}

/// Checks, through the restarted daemon, every block of `p` whose proof needs only pages
/// acknowledged and expected present; `engines[i]` is an engine of `specs[i]` (`None`: its
/// pages are checked on disk only).
pub fn through_daemon(
    specs: &[Spec],
    engines: &mut [Option<SimEngine>],
    p: &mut Pending,
) -> Result<(), String> {
    let mut units: BTreeMap<(usize, u64), Blocks> = BTreeMap::new();
    for (i, a) in &p.acks {
        let u = units.entry((*i, a.request)).or_default();
        for pg in &a.pages {
            u.entry((pg.group, pg.start, pg.hash.clone()))
                .or_insert_with(|| (pg.clone(), BTreeSet::new()))
                .1
                .insert(a.rank);
        }
    }
    for ((i, _), blocks) in units {
        let (Some(spec), Some(Some(engine))) = (specs.get(i), engines.get_mut(i)) else {
            continue;
        };
        let ns = engine.namespace();
        let workers = spec.inst.workers;
        // Blocks every rank acknowledged, every rank's page expected present, in token order.
        let whole: Vec<AckedPage> = blocks
            .into_values()
            .filter(|(pg, ranks)| {
                ranks.len() == workers as usize
                    && ranks.iter().all(|r| {
                        p.pages
                            .get(&key_of(ns, *r, pg))
                            .is_some_and(|e| e.want == Want::Present)
                    })
            })
            .map(|(pg, _)| pg)
            .collect();
        match spec.inst.contract {
            SimContract::Dense => {
                let mut runs: Vec<Vec<AckedPage>> = Vec::new();
                for pg in whole.iter().filter(|pg| pg.group == 0) {
                    match runs.last_mut() {
                        Some(run)
                            if run
                                .last()
                                .is_some_and(|l| l.end == pg.start && pg.parent == l.hash) =>
                        {
                            run.push(pg.clone());
                        }
                        _ => runs.push(vec![pg.clone()]),
                    }
                }
                for run in runs {
                    let (Some(first), Some(last)) = (run.first(), run.last()) else {
                        continue;
                    };
                    let named = named_pages(ns, workers, &run, 0);
                    let got = engine
                        .check(
                            first.start,
                            last.end,
                            vec![GroupHashes {
                                group: 0,
                                hashes: run.iter().map(|b| b.hash.clone()).collect(),
                            }],
                        )
                        .map_err(|e| format!("checking {}: {e}", spec.inst.name))?;
                    let seen = take_checked(specs, p, &named, &got.pages);
                    // Blocks past the proof: each on its own, to say which are missing.
                    for (j, b) in run.iter().enumerate() {
                        if (0..workers).all(|r| seen.contains(&(0, j as u32, r))) {
                            continue;
                        }
                        single(specs, engine, p, (i, ns), b)?;
                    }
                }
            }
            SimContract::Hybrid => {
                for pg in whole.iter().filter(|pg| pg.group == 1) {
                    // The window block that ends at the checkpoint.
                    let window = whole
                        .iter()
                        .find(|w| w.group == 0 && w.hash == pg.hash && w.end == pg.end);
                    let Some(w) = window else {
                        continue;
                    };
                    let mut named = named_pages(ns, workers, std::slice::from_ref(w), 0);
                    named.extend(named_pages(ns, workers, std::slice::from_ref(pg), 1));
                    let got = engine
                        .check(
                            w.start,
                            w.end,
                            vec![
                                GroupHashes {
                                    group: 0,
                                    hashes: vec![w.hash.clone()],
                                },
                                GroupHashes {
                                    group: 1,
                                    hashes: vec![pg.hash.clone()],
                                },
                            ],
                        )
                        .map_err(|e| format!("checking {}: {e}", spec.inst.name))?;
                    let seen = take_checked(specs, p, &named, &got.pages);
                    mark_unproven(specs, p, &named, &seen, got.miss);
                }
            }
        }
    }
    Ok(())
}

/// Block index → page key, for the pages of `blocks` (group `group`) of every rank.
fn named_pages(
    ns: [u8; 32],
    workers: u32,
    blocks: &[AckedPage],
    group: u32,
) -> BTreeMap<(u32, u32, u32), PageKey> {
    let mut m = BTreeMap::new();
    for (j, b) in blocks.iter().enumerate() {
        for r in 0..workers {
            m.insert(
                (group, j as u32, r),
                PageKey {
                    namespace: ns,
                    group,
                    rank: r,
                    hash: b.hash.clone(),
                },
            );
        }
    }
    m
}

/// Checks dense block `b` of instance `i` (namespace `ns`) alone, its origin at its start.
fn single(
    specs: &[Spec],
    engine: &mut SimEngine,
    p: &mut Pending,
    (i, ns): (usize, [u8; 32]),
    b: &AckedPage,
) -> Result<(), String> {
    let Some(spec) = specs.get(i) else {
        return Ok(());
    };
    let workers = spec.inst.workers;
    let named = named_pages(ns, workers, std::slice::from_ref(b), 0);
    let got = engine
        .check(
            b.start,
            b.end,
            vec![GroupHashes {
                group: 0,
                hashes: vec![b.hash.clone()],
            }],
        )
        .map_err(|e| format!("checking {}: {e}", spec.inst.name))?;
    let seen = take_checked(specs, p, &named, &got.pages);
    mark_unproven(specs, p, &named, &seen, got.miss);
    Ok(())
}

/// What `p` came to.
pub fn tally(specs: &[Spec], p: &Pending) -> Tally {
    let mut t = Tally::default();
    for (k, e) in &p.pages {
        let bytes = specs.get(e.spec).map_or(0, |s| s.page_bytes(k.group));
        match e.want {
            Want::Present => {
                t.acknowledged += 1;
                t.acknowledged_bytes += bytes;
                t.lost += u64::from(e.lost);
                t.wrong += u64::from(e.wrong);
            }
            Want::Gone => {
                t.retired += 1;
                t.resurrected += u64::from(e.wrong);
            }
        }
        t.checked += u64::from(e.on_disk);
        t.served += u64::from(e.served && !e.lost && !e.wrong);
    }
    for pr in &p.problems {
        if t.problems.len() >= KEPT_PROBLEMS {
            break;
        }
        let mut line = String::new();
        let _ = write!(line, "cycle {} ({}): {pr}", p.cycle, p.landed);
        t.problems.push(line);
    }
    t
}
