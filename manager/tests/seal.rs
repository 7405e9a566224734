//! The seal: an instance seals only when its scheduler and every declared worker registered and
//! agree; any one differing field refuses every rank with a reason naming it; a missing rank
//! times the seal out; re-registering gives a new epoch and the old one is refused.

use std::time::{Duration, Instant};

use orbitkv_manager::session::{
    Event, MAX_HELD_PER_CONNECTION, MAX_WORKERS, Sessions, TokenSource,
};
use orbitkv_protocol::message::{Register, Token};
use orbitkv_protocol::{ErrorCode, Message, Role};
use orbitkv_sim::SimInstance;
use orbitkv_state::{HashDomain, Rule, StateFormat, StorageLayout};

/// Deterministic distinct tokens.
struct Counter(u8);

impl TokenSource for Counter {
    fn token(&mut self) -> std::io::Result<Token> {
        self.0 += 1;
        Ok([self.0; 32])
    }
}

fn sim() -> SimInstance {
    let mut s = SimInstance::new("engine-a", 2);
    s.seal_timeout_ms = 1000;
    s
}

fn format(rank: u32, dtype: &str) -> StateFormat {
    let mut s = sim();
    s.dtype = dtype.to_owned();
    s.format(rank).unwrap_or_else(|e| panic!("{e}"))
}

fn layout(block_tokens: u32) -> StorageLayout {
    let mut s = sim();
    s.block_tokens = block_tokens;
    s.layout().unwrap_or_else(|e| panic!("{e}"))
}

fn reg(role: Role, rank: u32) -> Register {
    sim()
        .registration(role, rank)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A change made to one rank's registration.
type Change = Box<dyn Fn(&mut Register)>;

fn sessions() -> Sessions {
    Sessions::new(Box::new(Counter(0)))
}

/// Registers the scheduler and both workers (connections 1, 2, 3), `change` applied to the one
/// `which` names; returns the events of the last registration.
fn round(
    s: &mut Sessions,
    now: Instant,
    change: impl Fn(&mut Register),
    which: usize,
) -> Vec<Event> {
    let mut regs = vec![
        reg(Role::Scheduler, 0),
        reg(Role::Worker, 0),
        reg(Role::Worker, 1),
    ];
    change(&mut regs[which]);
    let mut last = Vec::new();
    for (i, r) in regs.into_iter().enumerate() {
        last = s.register(i as u64 + 1, r, now);
        if i < 2 {
            assert!(last.is_empty(), "sealed before every rank registered");
        }
    }
    last
}

fn sealed(events: &[Event]) -> Vec<(u64, u64, [u8; 32], Token)> {
    events
        .iter()
        .map(|e| match e {
            Event::Sealed {
                conn,
                reply:
                    Message::Sealed {
                        epoch,
                        namespace,
                        token,
                        ..
                    },
                ..
            } => (*conn, *epoch, *namespace, *token),
            other => panic!("not sealed: {other:?}"),
        })
        .collect()
}

fn refused(events: &[Event]) -> Vec<(u64, ErrorCode, String)> {
    events
        .iter()
        .map(|e| match e {
            Event::Refused { conn, refusal, .. } => (*conn, refusal.code, refusal.detail.clone()),
            other => panic!("not refused: {other:?}"),
        })
        .collect()
}

#[test]
fn agreeing_ranks_seal_together() {
    let mut s = sessions();
    let now = Instant::now();
    let out = sealed(&round(&mut s, now, |_| {}, 0));
    assert_eq!(out.len(), 3);
    let (epoch, ns) = (out[0].1, out[0].2);
    assert!(
        out.iter().all(|x| x.1 == epoch && x.2 == ns),
        "one epoch and namespace"
    );
    let mut tokens: Vec<Token> = out.iter().map(|x| x.3).collect();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "a token per rank");
    for (conn, _, _, token) in &out {
        let sess = s.check(token, epoch).unwrap_or_else(|r| panic!("{r:?}"));
        assert_eq!(sess.conn, *conn);
    }
    // A forged token, and the right token with another epoch, are refused.
    assert_eq!(
        s.check(&[0xEE; 32], epoch).map(|_| ()).unwrap_err().code,
        ErrorCode::BadToken
    );
    assert_eq!(
        s.check(&out[0].3, epoch + 1).map(|_| ()).unwrap_err().code,
        ErrorCode::StaleEpoch
    );
}

#[test]
fn any_differing_field_refuses_every_rank_and_names_the_field() {
    let now = Instant::now();
    let cases: Vec<(&str, Change)> = vec![
        ("computation identity", Box::new(|r| r.identity[0] ^= 1)),
        (
            "hash domain",
            Box::new(|r| r.domain = HashDomain::SglangSha256),
        ),
        ("number of workers", Box::new(|r| r.workers = 3)),
        ("cache scope", Box::new(|r| r.scope = "tenant-b".into())),
        (
            "storage layout",
            Box::new(|r| r.layout = layout(32).encode().to_vec()),
        ),
        (
            "recovery rules",
            Box::new(|r| r.rules = vec![(0, Rule::Undefined)]),
        ),
    ];
    for (field, change) in cases {
        for which in [1, 2] {
            let mut s = sessions();
            let out = refused(&round(&mut s, now, &change, which));
            assert_eq!(out.len(), 3, "{field}: every rank refused");
            for (_, code, detail) in &out {
                assert_eq!(*code, ErrorCode::SealRefused, "{field}");
                assert!(detail.contains(field), "{field}: {detail}");
            }
        }
    }
}

#[test]
fn a_workers_own_format_must_be_the_layouts() {
    let mut s = sessions();
    let out = refused(&round(
        &mut s,
        Instant::now(),
        |r| {
            r.formats = vec![
                format(1, "float16")
                    .encode()
                    .unwrap_or_else(|e| panic!("{e}")),
            ]
        },
        2,
    ));
    assert!(out.iter().all(|(_, c, d)| *c == ErrorCode::SealRefused
        && d.contains("worker 1")
        && d.contains("cache group 0")));
}

#[test]
fn a_rank_that_never_arrives_times_the_seal_out() {
    let mut s = sessions();
    let now = Instant::now();
    assert!(s.register(1, reg(Role::Scheduler, 0), now).is_empty());
    assert!(s.register(2, reg(Role::Worker, 0), now).is_empty());
    assert_eq!(s.next_deadline(), Some(now + Duration::from_millis(1000)));
    assert!(s.expire(now + Duration::from_millis(999)).is_empty());
    let out = refused(&s.expire(now + Duration::from_millis(1000)));
    assert_eq!(out.len(), 2);
    for (_, code, detail) in &out {
        assert_eq!(*code, ErrorCode::SealTimeout);
        assert!(detail.contains("worker 1"), "{detail}");
    }
    assert_eq!(s.next_deadline(), None);
}

#[test]
fn re_registration_gets_a_new_epoch_and_the_old_one_is_refused() {
    let mut s = sessions();
    let now = Instant::now();
    let first = sealed(&round(&mut s, now, |_| {}, 0));
    // The engine restarts: its ranks register again (new connections).
    let mut regs = vec![
        reg(Role::Scheduler, 0),
        reg(Role::Worker, 0),
        reg(Role::Worker, 1),
    ];
    let mut last = Vec::new();
    for (i, r) in regs.drain(..).enumerate() {
        last = s.register(10 + i as u64, r, now);
    }
    let second = sealed(&last);
    assert!(second[0].1 > first[0].1, "a new, larger epoch");
    assert_eq!(second[0].2, first[0].2, "the same namespace: same identity");
    assert_eq!(
        s.check(&first[0].3, first[0].1)
            .map(|_| ())
            .unwrap_err()
            .code,
        ErrorCode::StaleEpoch
    );
    assert!(s.check(&second[0].3, second[0].1).is_ok());
}

#[test]
fn a_live_instances_name_is_refused_to_another_computation() {
    let mut s = sessions();
    let now = Instant::now();
    let first = sealed(&round(&mut s, now, |_| {}, 0));
    // Another engine on the node, configured with the same name: refused at once, by name.
    let mut other = reg(Role::Scheduler, 0);
    other.identity = [0xEE; 32];
    let out = refused(&s.register(10, other.clone(), now));
    assert_eq!(out[0].1, ErrorCode::SealRefused);
    assert!(
        out[0].2.contains("in use by a live instance"),
        "{}",
        out[0].2
    );
    assert!(out[0].2.contains("computation identity"), "{}", out[0].2);
    let mut relaid = reg(Role::Worker, 0);
    relaid.layout = layout(32).encode().to_vec();
    assert!(
        refused(&s.register(11, relaid, now))[0]
            .2
            .contains("storage layout")
    );
    // The first instance is untouched.
    assert!(s.check(&first[0].3, first[0].1).is_ok());
    // Its own ranks, on their connections, may re-register with new weights.
    let mut own = reg(Role::Scheduler, 0);
    own.identity = [0xEE; 32];
    assert!(s.register(1, own, now).is_empty());
    // Once the first instance's ranks are gone, the name is free.
    for conn in 1..=3 {
        s.disconnect(conn);
    }
    assert!(s.register(12, other, now).is_empty());
}

#[test]
fn duplicates_bad_ranks_and_disconnects() {
    let mut s = sessions();
    let now = Instant::now();
    assert!(s.register(1, reg(Role::Worker, 0), now).is_empty());
    let dup = refused(&s.register(2, reg(Role::Worker, 0), now));
    assert!(dup[0].2.contains("registered twice"), "{}", dup[0].2);
    let mut bad = reg(Role::Worker, 1);
    bad.rank = 5;
    assert!(refused(&s.register(3, bad, now))[0].2.contains("not below"));
    // The worker disconnects before the seal: a new worker 0 may take its place.
    s.disconnect(1);
    assert!(s.register(4, reg(Role::Scheduler, 0), now).is_empty());
    assert!(s.register(5, reg(Role::Worker, 0), now).is_empty());
    let out = sealed(&s.register(6, reg(Role::Worker, 1), now));
    let conns: Vec<u64> = out.iter().map(|x| x.0).collect();
    assert_eq!(conns, vec![4, 5, 6]);
    // A sealed rank's disconnect ends its session.
    let gone = s.disconnect(5);
    assert_eq!(gone.len(), 1);
    assert_eq!(
        s.check(&out[1].3, out[1].1).map(|_| ()).unwrap_err().code,
        ErrorCode::BadToken
    );
}

#[test]
fn a_layout_whose_shape_does_not_match_the_workers_is_refused() {
    let mut s = sessions();
    let now = Instant::now();
    let mut regs = vec![reg(Role::Scheduler, 0), reg(Role::Worker, 0)];
    for r in &mut regs {
        r.workers = 1;
    }
    assert!(s.register(1, regs[0].clone(), now).is_empty());
    let out = refused(&s.register(2, regs[1].clone(), now));
    assert!(out[0].2.contains("2 ranks"), "{}", out[0].2);
}

#[test]
fn an_instance_without_a_scheduler_seals_with_its_workers_alone() {
    let no_scheduler = |role, rank| {
        let mut r = reg(role, rank);
        r.no_scheduler = true;
        r
    };
    let mut s = sessions();
    let now = Instant::now();
    // A scheduler registering for such an instance is refused alone.
    let r = refused(&s.register(9, no_scheduler(Role::Scheduler, 0), now));
    assert_eq!(r[0].1, ErrorCode::SealRefused);
    assert!(r[0].2.contains("without one"), "{}", r[0].2);
    assert!(s.register(1, no_scheduler(Role::Worker, 1), now).is_empty());
    let out = sealed(&s.register(2, no_scheduler(Role::Worker, 0), now));
    assert_eq!(out.len(), 2);
    // Workers that disagree on having a scheduler are refused, the field named.
    let mut s = sessions();
    assert!(s.register(1, no_scheduler(Role::Worker, 0), now).is_empty());
    let mut other = reg(Role::Worker, 1);
    other.no_scheduler = false;
    let r = refused(&s.register(2, other, now));
    assert!(r[0].2.contains("scheduler"), "{}", r[0].2);
    // A round of such an instance times out naming only the missing workers.
    let mut s = sessions();
    assert!(s.register(1, no_scheduler(Role::Worker, 0), now).is_empty());
    let r = refused(&s.expire(now + Duration::from_secs(2)));
    assert_eq!(r[0].1, ErrorCode::SealTimeout);
    assert!(
        r[0].2.contains("worker 1") && !r[0].2.contains("scheduler"),
        "{}",
        r[0].2
    );
}

#[test]
fn a_huge_worker_count_is_refused_and_a_timeout_names_a_few_ranks() {
    let mut s = sessions();
    let now = Instant::now();
    let mut r = reg(Role::Worker, 0);
    r.workers = MAX_WORKERS + 1;
    let out = refused(&s.register(1, r, now));
    assert_eq!(out[0].1, ErrorCode::SealRefused);
    assert!(out[0].2.contains("at most"), "{}", out[0].2);
    assert_eq!(
        s.instance_count(),
        0,
        "nothing kept for a refused registration"
    );

    // The largest count allowed: one rank registers, the rest never come.
    let mut r = reg(Role::Worker, 0);
    r.workers = MAX_WORKERS;
    r.seal_timeout_ms = 0;
    assert!(s.register(1, r, now).is_empty());
    let started = Instant::now();
    let out = refused(&s.expire(now + Duration::from_millis(1)));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(out.len(), 1);
    let detail = &out[0].2;
    assert!(detail.len() < 1024, "{} bytes", detail.len());
    assert!(detail.contains("worker 1,"), "{detail}");
    assert!(
        detail.contains(&format!("{} more workers", MAX_WORKERS - 1 - 15)),
        "{detail}"
    );
    assert_eq!(s.instance_count(), 0, "a timed-out name is forgotten");
}

#[test]
fn one_connection_holds_a_bounded_number_of_registrations() {
    let mut s = sessions();
    let now = Instant::now();
    let named = |i: usize| {
        let mut r = reg(Role::Worker, 0);
        r.instance = format!("engine-{i}");
        r
    };
    for i in 0..MAX_HELD_PER_CONNECTION {
        assert!(s.register(7, named(i), now).is_empty(), "registration {i}");
    }
    let out = refused(&s.register(7, named(MAX_HELD_PER_CONNECTION), now));
    assert_eq!(out[0].1, ErrorCode::SealRefused);
    // Another connection is not held to this one's count.
    assert!(
        s.register(8, named(MAX_HELD_PER_CONNECTION), now)
            .is_empty()
    );
    assert_eq!(s.instance_count(), MAX_HELD_PER_CONNECTION + 1);
    s.disconnect(7);
    s.disconnect(8);
    assert_eq!(s.instance_count(), 0, "the names tried are forgotten");
    assert_eq!(s.next_deadline(), None);
}

#[test]
fn registering_again_on_the_same_connections_replaces_the_old_sessions() {
    let mut s = sessions();
    let now = Instant::now();
    let first = sealed(&round(&mut s, now, |_| {}, 0));
    for _ in 0..5 {
        sealed(&round(&mut s, now, |_| {}, 0));
    }
    let last = sealed(&round(&mut s, now, |_| {}, 0));
    assert_eq!(
        s.session_count(),
        3,
        "one session per rank, not one per seal"
    );
    assert_eq!(s.instance_count(), 1);
    assert_eq!(
        s.check(&first[0].3, first[0].1)
            .map(|_| ())
            .unwrap_err()
            .code,
        ErrorCode::BadToken
    );
    assert!(s.check(&last[0].3, last[0].1).is_ok());
    for conn in 1..=3 {
        s.disconnect(conn);
    }
    assert_eq!((s.session_count(), s.instance_count()), (0, 0));
}

#[test]
fn every_registration_gives_its_held_bytes_back_in_its_one_event() {
    let now = Instant::now();
    let mut s = sessions();
    let regs = [
        reg(Role::Scheduler, 0),
        reg(Role::Worker, 0),
        reg(Role::Worker, 1),
    ];
    let held = |e: &Event| match e {
        Event::Sealed { held, .. } | Event::Refused { held, .. } => *held,
    };
    // Sealed: each rank's event carries its own registration's bytes.
    let mut events = Vec::new();
    for (i, r) in regs.iter().enumerate() {
        events.extend(s.register(i as u64 + 1, r.clone(), now));
    }
    assert_eq!(
        events.iter().map(held).collect::<Vec<_>>(),
        regs.iter().map(Register::held_bytes).collect::<Vec<_>>()
    );
    assert!(regs[1].held_bytes() > regs[1].layout.len() as u64);
    // Refused alone, and timed out: the same.
    let mut bad = reg(Role::Worker, 1);
    bad.instance = "other".into();
    bad.workers = 0;
    let out = s.register(7, bad.clone(), now);
    assert_eq!(out.iter().map(held).collect::<Vec<_>>(), [bad.held_bytes()]);
    let mut waits = reg(Role::Worker, 0);
    waits.instance = "late".into();
    assert!(s.register(8, waits.clone(), now).is_empty());
    let out = s.expire(now + Duration::from_secs(3600));
    assert_eq!(
        out.iter().map(held).collect::<Vec<_>>(),
        [waits.held_bytes()]
    );
}

#[test]
fn a_rank_whose_connection_closed_rejoins_the_sealed_epoch_alone() {
    let mut s = sessions();
    let now = Instant::now();
    let first = sealed(&round(&mut s, now, |_| {}, 0));
    let epoch = first[0].1;
    // Worker 1's connection closes; the scheduler and worker 0 keep their sessions.
    assert_eq!(s.disconnect(3).len(), 1);
    // It registers again, alone, as the same computation: sealed at once, in the same epoch.
    let again = sealed(&s.register(7, reg(Role::Worker, 1), now));
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].0, again[0].1, again[0].2), (7, epoch, first[2].2));
    assert_ne!(again[0].3, first[2].3, "a new token");
    for (_, e, _, token) in [&first[0], &first[1], &again[0]] {
        assert!(s.check(token, *e).is_ok(), "every rank serves on");
    }
    // A rank whose session lives registering again starts a new round, as before.
    assert!(s.register(8, reg(Role::Worker, 1), now).is_empty());
    assert!(s.check(&again[0].3, epoch).is_ok());
    assert!(s.rejoin_waiting().is_empty(), "the old session lives");
    // Once that session's connection closes, the waiting registration rejoins the epoch.
    s.disconnect(7);
    let late = sealed(&s.rejoin_waiting());
    assert_eq!((late.len(), late[0].0, late[0].1), (1, 8, epoch));
    assert!(s.check(&first[0].3, epoch).is_ok());
    assert!(s.rejoin_waiting().is_empty());
}

#[test]
fn a_rank_rejoins_only_as_the_computation_sealed() {
    let now = Instant::now();
    let changes: Vec<Change> = vec![
        Box::new(|r| r.identity = [9; 32]),
        Box::new(|r| r.model = "another".into()),
        Box::new(|r| r.scope = "tenant-b".into()),
        Box::new(|r| r.rules = vec![(0, Rule::Undefined)]),
        Box::new(|r| r.no_scheduler = true),
    ];
    for change in changes {
        let mut s = sessions();
        let first = sealed(&round(&mut s, now, |_| {}, 0));
        s.disconnect(3);
        let mut r = reg(Role::Worker, 1);
        change(&mut r);
        // Not sealed into the old epoch: a round starts (and waits for the other ranks).
        let out = s.register(7, r, now);
        assert!(
            out.iter().all(|e| !matches!(e, Event::Sealed { .. })),
            "{out:?}"
        );
        assert!(s.check(&first[0].3, first[0].1).is_ok());
    }
    // Every rank gone: an engine restart seals a new epoch, as before.
    let mut s = sessions();
    let first = sealed(&round(&mut s, now, |_| {}, 0));
    for c in 1..=3 {
        s.disconnect(c);
    }
    assert!(s.register(11, reg(Role::Scheduler, 0), now).is_empty());
    assert!(s.register(12, reg(Role::Worker, 0), now).is_empty());
    let next = sealed(&s.register(13, reg(Role::Worker, 1), now));
    assert!(next[0].1 > first[0].1, "a new epoch");
}
