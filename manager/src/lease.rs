//! Leases: an Acquire pins exactly the proven records in the store under a lease with a TTL, so
//! their bytes stay readable until the instance's workers have loaded them. A lease ends when
//! released, when its TTL passes without use, or when the connection that took it closes — its
//! store pins are given back each time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use orbitkv_store::{Pin, StateStore};

use crate::protocol::ErrorCode;
use crate::query::Located;
use crate::session::{ConnId, Refusal, Session};

/// One lease.
#[derive(Debug)]
pub struct Lease {
    /// The lease id.
    pub id: u64,
    /// The connection that took it.
    pub conn: ConnId,
    /// The instance (its name) whose workers may use it.
    pub instance: String,
    /// The instance's epoch when it was taken.
    pub epoch: u64,
    /// Each pinned record with its pin.
    pub pins: Vec<(Located, Pin)>,
    /// Idle time after which it ends.
    pub ttl: Duration,
    /// Last use.
    pub last_used: Instant,
}

/// Every lease the daemon holds.
#[derive(Debug)]
pub struct Leases {
    by_id: HashMap<u64, Lease>,
    next: u64,
    per_conn: usize,
    pins_per_conn: usize,
}

impl Leases {
    /// No leases; at most `per_conn` leases and `pins_per_conn` store pins per connection.
    pub fn new(per_conn: usize, pins_per_conn: usize) -> Self {
        Self {
            by_id: HashMap::new(),
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
            return Err(Refusal {
                code: ErrorCode::LimitExceeded,
                detail: format!("at most {} leases per connection", self.per_conn),
            });
        }
        if pinned + records.len() > self.pins_per_conn {
            return Err(Refusal {
                code: ErrorCode::LimitExceeded,
                detail: format!(
                    "{} more pins would pass the limit of {} per connection ({pinned} held); release leases or acquire less",
                    records.len(),
                    self.pins_per_conn
                ),
            });
        }
        let mut pins = Vec::with_capacity(records.len());
        for r in records {
            match store.pin(&r.key) {
                Some(p) => pins.push((*r, p)),
                None => {
                    for (_, p) in pins {
                        store.unpin(p);
                    }
                    return Err(Refusal {
                        code: ErrorCode::Refused,
                        detail: format!(
                            "group {} rank {} block {} left the store after it was proven; query again",
                            r.group, r.rank, r.block
                        ),
                    });
                }
            }
        }
        let id = self.next;
        self.next += 1;
        self.by_id.insert(
            id,
            Lease {
                id,
                conn,
                instance: session.instance.name.clone(),
                epoch: session.instance.epoch,
                pins,
                ttl,
                last_used: now,
            },
        );
        Ok(id)
    }

    /// Lease `id`, if `instance` may use it; marks it used.
    pub fn get(&mut self, id: u64, instance: &str, now: Instant) -> Result<&Lease, Refusal> {
        match self.by_id.get_mut(&id) {
            Some(l) if l.instance == instance => {
                l.last_used = now;
                Ok(l)
            }
            _ => Err(unknown(id)),
        }
    }

    /// Ends lease `id` of `instance`.
    pub fn release(&mut self, store: &StateStore, id: u64, instance: &str) -> Result<(), Refusal> {
        match self.by_id.get(&id) {
            Some(l) if l.instance == instance => {}
            _ => return Err(unknown(id)),
        }
        if let Some(l) = self.by_id.remove(&id) {
            unpin_all(store, l);
        }
        Ok(())
    }

    /// Ends the leases idle past their TTL; returns how many.
    pub fn expire(&mut self, store: &StateStore, now: Instant) -> usize {
        self.end_where(store, |l| now.duration_since(l.last_used) >= l.ttl)
    }

    /// Ends the leases `conn` took; returns how many.
    pub fn drop_conn(&mut self, store: &StateStore, conn: ConnId) -> usize {
        self.end_where(store, |l| l.conn == conn)
    }

    /// Leases held now.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    fn end_where(&mut self, store: &StateStore, f: impl Fn(&Lease) -> bool) -> usize {
        let ids: Vec<u64> = self.by_id.values().filter(|l| f(l)).map(|l| l.id).collect();
        for id in &ids {
            if let Some(l) = self.by_id.remove(id) {
                unpin_all(store, l);
            }
        }
        ids.len()
    }
}

fn unknown(id: u64) -> Refusal {
    Refusal {
        code: ErrorCode::UnknownLease,
        detail: format!("no lease {id} for this instance (released, expired, or another's)"),
    }
}

fn unpin_all(store: &StateStore, l: Lease) {
    for (_, p) in l.pins {
        store.unpin(p);
    }
}
