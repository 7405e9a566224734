//! Leases: an Acquire pins exactly the proven records in the store under a lease with a TTL, so
//! their bytes stay readable until the instance's workers have loaded them. A lease belongs to
//! one epoch of one instance and to one namespace: a request under another epoch naming it is
//! refused (`StaleEpoch`). A lease ends when released, when its TTL passes without use, when the
//! connection that took it closes, when its instance seals a new epoch, or when its namespace is
//! retired — its store pins are given back each time. A lease ended by a new epoch or a
//! retirement is remembered, without pins, until its TTL passes, so a request naming it is told
//! why rather than that it never existed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use orbitkv_protocol::ErrorCode;
use orbitkv_state::Namespace;
use orbitkv_store::{Pin, StateStore};

use crate::query::Located;
use crate::session::{ConnId, Refusal, SealedInstance, Session};

/// Why a lease ended before its holder released it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Its instance sealed this later epoch.
    Resealed {
        /// The new epoch.
        epoch: u64,
    },
    /// Its namespace was retired.
    Retired,
}

/// One lease.
#[derive(Debug)]
pub struct Lease {
    /// The lease id.
    pub id: u64,
    /// The connection that took it.
    pub conn: ConnId,
    /// The instance (its name) whose workers may use it.
    pub instance: String,
    /// The instance's epoch when it was taken: the only epoch it may be used under.
    pub epoch: u64,
    /// The namespace its records belong to.
    pub namespace: Namespace,
    /// Each pinned record with its pin (none once ended).
    pub pins: Vec<(Located, Pin)>,
    /// Idle time after which it ends (or, once ended, is forgotten).
    pub ttl: Duration,
    /// Last use (or the time it ended).
    pub last_used: Instant,
    /// Why it ended early, if it did.
    pub ended: Option<Ended>,
}

/// Every lease the daemon holds.
#[derive(Debug)]
pub struct Leases {
    by_id: HashMap<u64, Lease>,
    /// Leases in `by_id` that ended early (kept without pins until their TTL passes).
    ended: usize,
    next: u64,
    per_conn: usize,
    pins_per_conn: usize,
}

impl Leases {
    /// No leases; at most `per_conn` leases (live, or ended early and not yet forgotten) and
    /// `pins_per_conn` store pins per connection.
    pub fn new(per_conn: usize, pins_per_conn: usize) -> Self {
        Self {
            by_id: HashMap::new(),
            ended: 0,
            next: 1,
            per_conn,
            pins_per_conn,
        }
    }

    /// Pins `records` under a new lease for `session`. Refused over the per-connection limits
    /// (leases, pins), or when a record left the store since it was proven (then nothing stays
    /// pinned).
    pub fn acquire(
        &mut self,
        store: &StateStore,
        session: &Session,
        records: &[Located],
        ttl: Duration,
        now: Instant,
    ) -> Result<u64, Refusal> {
        let conn = session.conn;
        let (mut leases, mut pinned) = (0usize, 0usize);
        for l in self.by_id.values().filter(|l| l.conn == conn) {
            leases += 1;
            pinned += l.pins.len();
        }
        if leases >= self.per_conn {
            return Err(Refusal::new(
                ErrorCode::LimitExceeded,
                format!("at most {} leases per connection", self.per_conn),
            ));
        }
        if pinned + records.len() > self.pins_per_conn {
            return Err(Refusal::new(
                ErrorCode::LimitExceeded,
                format!(
                    "{} more pins would pass the limit of {} per connection ({pinned} held); release leases or acquire less",
                    records.len(),
                    self.pins_per_conn
                ),
            ));
        }
        let mut pins = Vec::with_capacity(records.len());
        for r in records {
            match store.pin(&r.key) {
                Some(p) => pins.push((*r, p)),
                None => {
                    for (_, p) in pins {
                        store.unpin(p);
                    }
                    return Err(Refusal::retry_later(
                        Duration::ZERO,
                        format!(
                            "group {} rank {} block {} left the store after it was proven; query again",
                            r.group, r.rank, r.block
                        ),
                    ));
                }
            }
        }
        let id = self.next;
        self.next += 1;
        let inst = &session.instance;
        self.by_id.insert(
            id,
            Lease {
                id,
                conn,
                instance: inst.name.clone(),
                epoch: inst.epoch,
                namespace: inst.namespace,
                pins,
                ttl,
                last_used: now,
                ended: None,
            },
        );
        Ok(id)
    }

    /// Lease `id`, if `session` may use it now; marks it used. Refused `UnknownLease` when there
    /// is no such lease of the session's instance (or it ended with its namespace's
    /// retirement), `StaleEpoch` when it was taken under another epoch than the session's.
    pub fn get(&mut self, id: u64, session: &Session, now: Instant) -> Result<&Lease, Refusal> {
        let l = self.usable(id, &session.instance)?;
        l.last_used = now;
        Ok(l)
    }

    /// Ends lease `id` of `session`'s instance; refused as [`Leases::get`] refuses, except that
    /// a lease its namespace's retirement ended is simply forgotten.
    pub fn release(
        &mut self,
        store: &StateStore,
        id: u64,
        session: &Session,
    ) -> Result<(), Refusal> {
        let inst = &session.instance;
        let retired = self.by_id.get(&id).is_some_and(|l| {
            l.instance == inst.name && l.epoch == inst.epoch && l.ended == Some(Ended::Retired)
        });
        if !retired {
            self.usable(id, inst)?;
        }
        self.forget(store, id);
        Ok(())
    }

    /// Ends every lease of instance `name` taken under an epoch before `epoch` (it sealed
    /// `epoch`): their pins are given back now. Returns how many.
    pub fn end_epochs_before(
        &mut self,
        store: &StateStore,
        name: &str,
        epoch: u64,
        now: Instant,
    ) -> usize {
        self.end_early(store, now, Ended::Resealed { epoch }, |l| {
            l.instance == name && l.epoch < epoch
        })
    }

    /// Ends every lease on records of `namespace` (it was retired): their pins are given back
    /// now. Returns how many.
    pub fn end_namespace(
        &mut self,
        store: &StateStore,
        namespace: Namespace,
        now: Instant,
    ) -> usize {
        self.end_early(store, now, Ended::Retired, |l| l.namespace == namespace)
    }

    /// Ends the leases idle past their TTL (and forgets those ended early as long ago); returns
    /// how many.
    pub fn expire(&mut self, store: &StateStore, now: Instant) -> usize {
        self.remove_where(store, |l| now.duration_since(l.last_used) >= l.ttl)
    }

    /// Ends the leases `conn` took; returns how many.
    pub fn drop_conn(&mut self, store: &StateStore, conn: ConnId) -> usize {
        self.remove_where(store, |l| l.conn == conn)
    }

    /// Leases held now (not counting those ended early).
    pub fn len(&self) -> usize {
        self.by_id.len() - self.ended
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lease `id` if `inst` may use it now.
    fn usable(&mut self, id: u64, inst: &SealedInstance) -> Result<&mut Lease, Refusal> {
        let Some(l) = self.by_id.get_mut(&id).filter(|l| l.instance == inst.name) else {
            return Err(unknown(id));
        };
        if l.epoch != inst.epoch || l.namespace != inst.namespace {
            return Err(stale(l, inst.epoch));
        }
        match l.ended {
            None => Ok(l),
            Some(Ended::Resealed { .. }) => Err(stale(l, inst.epoch)),
            Some(Ended::Retired) => Err(Refusal::new(
                ErrorCode::UnknownLease,
                format!("lease {id} ended: its namespace was retired; query again"),
            )),
        }
    }

    fn end_early(
        &mut self,
        store: &StateStore,
        now: Instant,
        why: Ended,
        f: impl Fn(&Lease) -> bool,
    ) -> usize {
        let mut n = 0;
        for l in self.by_id.values_mut() {
            if l.ended.is_none() && f(l) {
                for (_, p) in l.pins.drain(..) {
                    store.unpin(p);
                }
                l.ended = Some(why);
                l.last_used = now;
                n += 1;
            }
        }
        self.ended += n;
        n
    }

    fn remove_where(&mut self, store: &StateStore, f: impl Fn(&Lease) -> bool) -> usize {
        let ids: Vec<u64> = self.by_id.values().filter(|l| f(l)).map(|l| l.id).collect();
        for id in &ids {
            self.forget(store, *id);
        }
        ids.len()
    }

    /// Removes lease `id`, giving back its pins.
    fn forget(&mut self, store: &StateStore, id: u64) {
        if let Some(l) = self.by_id.remove(&id) {
            if l.ended.is_some() {
                self.ended -= 1;
            }
            for (_, p) in l.pins {
                store.unpin(p);
            }
        }
    }
}

fn unknown(id: u64) -> Refusal {
    Refusal::new(
        ErrorCode::UnknownLease,
        format!("no lease {id} for this instance (released, expired, or another's)"),
    )
}

fn stale(l: &Lease, epoch: u64) -> Refusal {
    let why = match l.ended {
        Some(Ended::Resealed { epoch: new }) => format!("; it ended when epoch {new} sealed"),
        _ => String::new(),
    };
    Refusal::new(
        ErrorCode::StaleEpoch,
        format!(
            "lease {} was taken under epoch {} of instance {:?}, not this session's epoch {epoch}{why}; acquire again",
            l.id, l.epoch, l.instance
        ),
    )
}
