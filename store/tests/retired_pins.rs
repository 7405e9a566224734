//! A retirement reaches pins too: once `retire_namespace` returns, a record of the namespace below
//! the watermark is refused through a pin taken before it — from the DRAM tier and from SSD, by
//! every pinned read — and stays refused after a reopen; a record put after the watermark is
//! served through a new pin, and another namespace's pins are untouched.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::*;
use orbitkv_state::Namespace;
use orbitkv_store::io::fault::FaultIo;
use orbitkv_store::{Durability, Pin, StateStore};

const OTHER: Namespace = Namespace([0x77; 32]);
const LEN: usize = 3000;

/// Whether each pinned read of `pin` returns bytes (and then exactly `want`).
fn served(store: &StateStore, pin: Pin, want: &[u8]) -> [bool; 3] {
    let mut out = Vec::new();
    let got = store.get_pinned(pin, &mut out).unwrap();
    if got.is_some() {
        assert_eq!(out, want);
    }
    let mut scratch = Vec::new();
    let lent = store
        .with_pinned(pin, &mut scratch, |b| assert_eq!(b, want))
        .unwrap();
    let mut part = vec![0u8; 100];
    let into = store.read_pinned_into(pin, LEN, 50, &mut part).unwrap();
    if into {
        assert_eq!(part, want[50..150]);
    }
    [got.is_some(), lent.is_some(), into]
}

fn retired_pins_are_refused(dram_bytes: u64) {
    let io = FaultIo::new();
    let mut cfg = config(1 << 20, Durability::EveryPut);
    cfg.dram_bytes = dram_bytes;
    let store = open_with(&io, cfg.clone());
    store.register_namespace(OTHER, info()).unwrap();
    put_range(&store, 5, 0, 4, LEN);
    let other = payload(6, 0, LEN);
    store.put(&[(meta_in(OTHER, 0), other.as_slice())]).unwrap();
    let pins: Vec<Pin> = (0..4).map(|i| store.pin(&key(i)).unwrap()).collect();
    let other_pin = store.pin(&key_in(OTHER, 0)).unwrap();
    for (i, pin) in pins.iter().enumerate() {
        assert_eq!(
            served(&store, *pin, &payload(5, i as u64, LEN)),
            [true; 3],
            "pin {i} before the retirement"
        );
    }
    let watermark = store.retire_namespace(NS).unwrap();
    for (i, pin) in pins.iter().enumerate() {
        assert_eq!(
            served(&store, *pin, &payload(5, i as u64, LEN)),
            [false; 3],
            "pin {i} after the retirement"
        );
        assert!(store.is_retired(&NS, watermark - 1));
    }
    assert_eq!(served(&store, other_pin, &other), [true; 3]);
    // Put after the watermark: served, also through a pin.
    let fresh = payload(7, 0, LEN);
    store.put(&[(meta(0), fresh.as_slice())]).unwrap();
    let pin = store.pin(&key(0)).unwrap();
    assert_eq!(served(&store, pin, &fresh), [true; 3]);
    for p in pins.into_iter().chain([pin, other_pin]) {
        assert!(store.unpin(p));
    }
    drop(store);
    // After a reopen the watermark still holds: the old records are gone, the fresh one stays.
    let store = open_with(&io, cfg);
    assert!(store.is_retired(&NS, watermark - 1));
    assert!(!store.is_retired(&NS, watermark + 1));
    assert_eq!(check(&store, 5, 1, LEN), None);
    let pin = store.pin(&key(0)).unwrap();
    assert_eq!(served(&store, pin, &fresh), [true; 3]);
}

#[test]
fn a_retirement_refuses_pins_taken_before_it_from_ssd() {
    retired_pins_are_refused(0);
}

#[test]
fn a_retirement_refuses_pins_taken_before_it_from_the_dram_tier() {
    retired_pins_are_refused(64 << 20);
}
