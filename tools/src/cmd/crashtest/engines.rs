//! The simulated engines of a crash test: which instances run (dense and hybrid, pages of 64 KiB
//! to 512 KiB, one two ranks wide, two of one computation, one a computation of its own whose
//! namespace is retired now and then), what each records of its publishes, and the threads that
//! drive them until the daemon dies.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use orbitkv_protocol::ErrorCode;
use orbitkv_protocol::client::ClientError;
use orbitkv_sim::workload::Synthetic;
use orbitkv_sim::{
    Acked, AckedPage, EngineOptions, Observer, PublishObserver, SimContract, SimEngine, SimError,
    SimInstance,
};

use super::daemon::Activity;

/// Bytes of one Publish at most (a worker's pool holds this much): a kill aimed at a byte count
/// overshoots it by little.
const BATCH_BYTES: u64 = 1 << 20;
/// Requests in each workload: 1024 families of documents, so blocks are shared and reused.
const WORKLOAD_REQUESTS: u64 = 4096;
/// The cache scope of the retired computation.
pub const CHURN_SCOPE: &str = "crashtest-churn";

/// One simulated instance.
#[derive(Debug, Clone)]
pub struct Spec {
    /// What it is.
    pub inst: SimInstance,
    /// The seed of its workload.
    pub seed: u64,
    /// Its first request's index (two instances of one computation take different requests).
    pub first_request: u64,
    /// Its namespace is retired now and then; no other instance shares it.
    pub churn: bool,
}

impl Spec {
    /// Bytes of one page of `group`, per rank (0 for a group it does not have).
    pub fn page_bytes(&self, group: u32) -> u64 {
        self.inst
            .groups()
            .iter()
            .find(|g| g.id == group)
            .map_or(0, |g| self.inst.group_page_bytes(g))
    }
}

#[expect(
    clippy::too_many_arguments,
    reason = "one instance's whole description"
)]
fn instance(
    name: &str,
    contract: SimContract,
    ranks: u32,
    layers: u32,
    kv_heads: u32,
    head_size: u32,
    scope: &str,
    identity: u8,
) -> Result<SimInstance, String> {
    let mut i = SimInstance::new(name, ranks);
    i.contract = contract;
    i.layers = layers;
    i.kv_heads = kv_heads;
    i.head_size = head_size;
    i.scope = scope.to_owned();
    i.identity = [identity; 32];
    i.layout().map_err(|e| format!("instance {name}: {e}"))?;
    Ok(i)
}

/// The instances, seeded by `seed`. Page bytes per rank: 64 KiB (dense-a1, dense-a2, the
/// hybrid's window group), 128 KiB (dense-tp2, the hybrid's recurrent state) and 512 KiB
/// (dense-big, churn: its records, a large share of the whole, die at each Retire, which gives
/// compaction work).
pub fn specs(seed: u64) -> Result<Vec<Spec>, String> {
    use SimContract::{Dense, Hybrid};
    let spec = |inst, salt: u64, first_request, churn| Spec {
        inst,
        seed: seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        first_request,
        churn,
    };
    Ok(vec![
        // Two instances of one computation, on different requests of one workload.
        spec(
            instance("dense-a1", Dense, 1, 4, 4, 64, "", 0x11)?,
            1,
            0,
            false,
        ),
        spec(
            instance("dense-a2", Dense, 1, 4, 4, 64, "", 0x11)?,
            1,
            2048,
            false,
        ),
        spec(
            instance("dense-tp2", Dense, 2, 8, 4, 64, "", 0x22)?,
            2,
            0,
            false,
        ),
        spec(
            instance("hybrid", Hybrid, 1, 4, 4, 64, "", 0x33)?,
            3,
            0,
            false,
        ),
        spec(
            instance("dense-big", Dense, 1, 8, 8, 128, "", 0x44)?,
            4,
            0,
            false,
        ),
        spec(
            instance("churn", Dense, 1, 8, 8, 128, CHURN_SCOPE, 0x55)?,
            5,
            0,
            true,
        ),
    ])
}

/// Everything the engines of one cycle did that the checks need.
#[derive(Debug, Default)]
pub struct CycleLog {
    /// Each PublishDurable reply: the instance (index into the specs) and its acknowledged pages.
    pub acks: Mutex<Vec<(usize, Acked)>>,
    /// Each Publish of the retired computation, when it was sent: rank and pages.
    pub churn_sends: Mutex<Vec<(Instant, u32, Vec<AckedPage>)>>,
    /// The retired computation's Publishes in flight, per rank.
    pub churn_flying: Mutex<BTreeMap<u32, Vec<AckedPage>>>,
    /// Page bytes acknowledged.
    pub acked_bytes: AtomicU64,
    /// Page bytes of the retired computation acknowledged.
    pub churn_bytes: AtomicU64,
    /// Publishes in flight, seen by whoever kills the daemon.
    pub activity: Arc<Activity>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records one instance's publishes into the cycle's log.
struct Recorder {
    spec: usize,
    churn: bool,
    /// Page bytes per group id.
    page_bytes: Vec<u64>,
    log: Arc<CycleLog>,
}

impl PublishObserver for Recorder {
    fn sending(&self, rank: u32, pages: &[AckedPage]) {
        self.log.activity.publishing.fetch_add(1, Ordering::AcqRel);
        if self.churn {
            lock(&self.log.churn_flying).insert(rank, pages.to_vec());
            lock(&self.log.churn_sends).push((Instant::now(), rank, pages.to_vec()));
        }
    }

    fn durable(&self, acked: Acked) {
        let bytes: u64 = acked
            .pages
            .iter()
            .map(|p| self.page_bytes.get(p.group as usize).copied().unwrap_or(0))
            .sum();
        self.log.acked_bytes.fetch_add(bytes, Ordering::AcqRel);
        if self.churn {
            self.log.churn_bytes.fetch_add(bytes, Ordering::AcqRel);
            lock(&self.log.churn_flying).remove(&acked.rank);
        }
        lock(&self.log.acks).push((self.spec, acked));
        self.log.activity.publishing.fetch_sub(1, Ordering::AcqRel);
    }

    fn failed(&self, rank: u32) {
        if self.churn {
            lock(&self.log.churn_flying).remove(&rank);
        }
        self.log.activity.publishing.fetch_sub(1, Ordering::AcqRel);
    }
}

fn retry_later(e: &SimError) -> Option<Duration> {
    match e {
        SimError::Client(ClientError::Refused {
            code: ErrorCode::RetryLater,
            retry_after,
            ..
        }) => Some((*retry_after).clamp(Duration::from_millis(1), Duration::from_millis(100))),
        _ => None,
    }
}

/// Whether `e` says a lease ended (as a Retire of its namespace ends it).
fn lease_ended(e: &SimError) -> bool {
    matches!(
        e,
        SimError::Client(ClientError::Refused {
            code: ErrorCode::UnknownLease,
            ..
        })
    )
}

/// Starts instance `i` of `specs` against `socket`, recording into `log` (retrying a seal the
/// daemon asks to retry).
pub fn start(
    specs: &[Spec],
    i: usize,
    socket: &Path,
    log: &Arc<CycleLog>,
) -> Result<SimEngine, String> {
    let spec = &specs[i];
    let mut o = EngineOptions::new(socket.to_path_buf(), spec.inst.clone());
    let pool_page: u64 = spec
        .inst
        .groups()
        .iter()
        .map(|g| spec.inst.group_page_bytes(g))
        .sum();
    o.pool_pages = u32::try_from(BATCH_BYTES / pool_page.max(1))
        .unwrap_or(1)
        .max(1);
    let max_group = spec.inst.groups().iter().map(|g| g.id).max().unwrap_or(0);
    o.observer = Some(Observer(Arc::new(Recorder {
        spec: i,
        churn: spec.churn,
        page_bytes: (0..=max_group).map(|g| spec.page_bytes(g)).collect(),
        log: log.clone(),
    })));
    let mut tries = 0;
    loop {
        match SimEngine::start(o.clone()) {
            Ok(e) => return Ok(e),
            Err(e) => match retry_later(&e) {
                Some(wait) if tries < 50 => {
                    tries += 1;
                    std::thread::sleep(wait);
                }
                _ => return Err(format!("starting {}: {e}", spec.inst.name)),
            },
        }
    }
}

/// How the harness steers the engines of a cycle.
#[derive(Debug, Default)]
pub struct Control {
    /// Stop sending requests.
    pub stop: AtomicBool,
    /// Instances other than the retired computation may start.
    pub go: AtomicBool,
}

/// Sends `spec`'s requests from `*cursor` on (once told to go, unless it is the retired
/// computation) until told to stop or a request fails; returns when and why it failed.
pub fn drive(
    engine: &mut SimEngine,
    spec: &Spec,
    cursor: &mut u64,
    ctl: &Control,
) -> Option<(Instant, String)> {
    let w = Synthetic::new(spec.seed, WORKLOAD_REQUESTS, spec.inst.block_tokens);
    while !spec.churn && !ctl.go.load(Ordering::Acquire) {
        if ctl.stop.load(Ordering::Acquire) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    loop {
        if ctl.stop.load(Ordering::Acquire) {
            return None;
        }
        let i = spec.first_request + *cursor;
        *cursor += 1;
        if let Err(e) = engine.run(&w.request(i)) {
            match retry_later(&e) {
                Some(wait) => std::thread::sleep(wait),
                // A Retire ends the leases of its namespace: the request is over, not the engine.
                None if spec.churn && lease_ended(&e) => {}
                None => return Some((Instant::now(), format!("{}: {e}", spec.inst.name))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_span_64_to_512_kib_and_only_churn_has_its_scope() {
        let s = specs(7).unwrap_or_else(|e| panic!("{e}"));
        let sizes: Vec<u64> = s
            .iter()
            .flat_map(|x| x.inst.groups().into_iter().map(move |g| x.page_bytes(g.id)))
            .collect();
        assert_eq!(sizes.iter().min(), Some(&(64 << 10)));
        assert_eq!(sizes.iter().max(), Some(&(512 << 10)));
        assert!(s.iter().any(|x| x.inst.contract == SimContract::Hybrid));
        assert!(s.iter().any(|x| x.inst.workers == 2));
        let churn: Vec<&Spec> = s.iter().filter(|x| x.churn).collect();
        assert_eq!(churn.len(), 1);
        assert!(
            s.iter()
                .filter(|x| !x.churn)
                .all(|x| x.inst.scope.is_empty())
        );
        // The two instances of one computation share a layout (so a namespace).
        let (a1, a2) = (&s[0].inst, &s[1].inst);
        assert_eq!(
            a1.layout().map(|l| l.digest()).ok(),
            a2.layout().map(|l| l.digest()).ok()
        );
        assert_eq!(a1.identity, a2.identity);
    }
}
