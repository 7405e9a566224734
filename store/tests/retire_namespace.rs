//! Retiring a namespace is one durable manifest record with a sequence watermark: none of its
//! older records is served again, before or after a restart, even though their bytes remain in
//! old segments; records published after the watermark are live (a redeployed model is not
//! locked out).

mod common;

use common::*;
use orbitkv_state::Namespace;
use orbitkv_store::Durability;
use orbitkv_store::io::fault::{Crash, FaultIo};

#[test]
fn retired_records_are_never_served_again() {
    let io = FaultIo::new();
    let other = Namespace([0x22; 32]);
    {
        let store = open(&io, 32 << 10, Durability::EveryPut);
        store.register_namespace(other, info()).unwrap();
        put_range(&store, 9, 0, 20, 2000);
        for i in 0..5 {
            let p = payload(9, i, 2000);
            store.put(&[(meta_in(other, i), p.as_slice())]).unwrap();
        }
        let watermark = store.retire_namespace(NS).unwrap();
        for i in 0..20 {
            assert_eq!(check(&store, 9, i, 2000), None, "record {i} before restart");
        }
        // Republished after the watermark: live.
        put_range(&store, 10, 100, 105, 2000);
        for i in 100..105 {
            assert_eq!(check(&store, 10, i, 2000), Some(true));
        }
        assert!(
            store
                .namespaces()
                .iter()
                .any(|(ns, _, w)| *ns == NS && *w == Some(watermark))
        );
    }
    io.crash(Crash::DropUnsynced);
    let store = open(&io, 32 << 10, Durability::EveryPut);
    assert!(store.recovery_report().retired_skipped >= 20);
    for i in 0..20 {
        assert_eq!(check(&store, 9, i, 2000), None, "record {i} after restart");
    }
    for i in 100..105 {
        assert_eq!(check(&store, 10, i, 2000), Some(true), "republished {i}");
    }
    let mut out = Vec::new();
    for i in 0..5 {
        assert!(
            store.get(&key_in(other, i), &mut out).unwrap().is_some(),
            "other namespace kept"
        );
    }
}
