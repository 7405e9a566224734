//! Every record type round-trips, checkpoints of arbitrary states included; the golden manifest's
//! bytes stay identical while the version stays the same (regenerate with `ORBITKV_BLESS=1`).

mod common;

use std::collections::BTreeMap;

use common::{encode, history, info};
use orbitkv_state::Namespace;
use orbitkv_wal::{
    ManifestRecord, NamespaceState, ReplayStop, SegmentCreated, SegmentSealed, SegmentState,
    Snapshot, decode_record, encode_record, replay,
};
use proptest::prelude::*;

fn snapshot() -> impl Strategy<Value = Snapshot> {
    let ns = (
        any::<[u8; 32]>(),
        "[a-z/]{0,20}",
        prop::option::of(any::<u64>()),
    );
    let seg = (
        any::<u64>(),
        any::<u64>(),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(any::<[u8; 32]>()),
    );
    (
        prop::collection::vec(ns, 0..5),
        prop::collection::vec(seg, 0..8),
        prop::option::of(any::<u64>()),
    )
        .prop_map(|(nss, segs, last)| {
            let mut namespaces = BTreeMap::new();
            for (n, model, wm) in nss {
                namespaces.insert(
                    Namespace(n),
                    NamespaceState {
                        info: info(&model),
                        retired_below: wm,
                    },
                );
            }
            let mut segments = BTreeMap::new();
            for (id, seq, direct, compression, seal) in segs {
                let c = SegmentCreated {
                    segment_id: id,
                    segment_sequence: seq,
                    direct,
                    compression,
                };
                let st = match seal {
                    None => SegmentState::Active(c),
                    Some(d) => SegmentState::Sealed(
                        c,
                        SegmentSealed {
                            segment_id: id,
                            footer_digest: d,
                            records: seq / 2,
                            data_end: seq / 3,
                        },
                    ),
                };
                segments.insert(id, st);
            }
            Snapshot {
                namespaces,
                segments,
                last_segment_sequence: last,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn checkpoints_round_trip(snap in snapshot(), seq in any::<u64>()) {
        let rec = ManifestRecord::Checkpoint(snap);
        let mut out = Vec::new();
        encode_record(seq, &rec, &mut out).unwrap();
        prop_assert_eq!(out.len() % 8, 0);
        let d = decode_record(&out, 0).unwrap();
        prop_assert_eq!(d.sequence, seq);
        prop_assert_eq!(d.record, rec);
        prop_assert_eq!(d.len, out.len());
    }

    #[test]
    fn id_lists_round_trip(inputs in prop::collection::vec(any::<u64>(), 0..50), outputs in prop::collection::vec(any::<u64>(), 0..50)) {
        let rec = ManifestRecord::CompactionCommitted { inputs, outputs };
        let mut out = Vec::new();
        encode_record(1, &rec, &mut out).unwrap();
        prop_assert_eq!(decode_record(&out, 0).unwrap().record, rec);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_record(&bytes, 0);
        let _ = replay(&bytes);
    }
}

#[test]
fn every_history_record_round_trips() {
    for (seq, rec) in history() {
        let mut out = Vec::new();
        encode_record(seq, &rec, &mut out).unwrap();
        assert_eq!(decode_record(&out, 0).unwrap().record, rec);
    }
}

#[test]
fn manifest_v1_bytes_are_stable() {
    let mut bytes = encode(&history());
    let state = replay(&bytes).state;
    encode_record(100, &state.checkpoint(), &mut bytes).unwrap();
    let path = format!(
        "{}/tests/golden/manifest-v1.bin",
        env!("CARGO_MANIFEST_DIR")
    );
    if std::env::var_os("ORBITKV_BLESS").is_some() {
        std::fs::write(&path, &bytes).unwrap();
    }
    let committed = std::fs::read(&path).unwrap();
    assert!(
        committed == bytes,
        "manifest encoding changed without a version bump"
    );
    let r = replay(&committed);
    assert_eq!(r.stop, ReplayStop::CleanEnd);
    assert_eq!(r.state.snapshot, state.snapshot);
}
