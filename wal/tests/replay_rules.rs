//! Replay semantics: retirement watermarks, re-registration, segment lifecycle, compaction,
//! checkpoints that let the log be truncated, and refusal of contradictory records.

mod common;

use common::{created, encode, history, info, sealed};
use orbitkv_state::Namespace;
use orbitkv_wal::{Error, ManifestRecord, ReplayStop, SegmentState, encode_record, replay};

#[test]
fn history_replays_to_the_expected_state() {
    let bytes = encode(&history());
    let r = replay(&bytes);
    assert_eq!(r.stop, ReplayStop::CleanEnd);
    assert_eq!(r.valid_len as usize, bytes.len());
    assert_eq!(r.records, 12);
    let s = &r.state;
    assert_eq!(s.last_sequence, Some(22));
    assert_eq!(s.snapshot.segments.len(), 1);
    assert!(matches!(
        s.snapshot.segments.get(&3),
        Some(SegmentState::Sealed(..))
    ));
    let a = Namespace([0xa0; 32]);
    // Records of `a` below the watermark are dead; later ones (a redeployment) live.
    assert!(s.is_retired(&a, 17));
    assert!(!s.is_retired(&a, 18));
    assert!(!s.is_retired(&Namespace([0xb0; 32]), 1));
}

#[test]
fn a_checkpoint_stands_for_everything_before_it() {
    let full = replay(&encode(&history()));
    let mut truncated = Vec::new();
    encode_record(30, &full.state.checkpoint(), &mut truncated).unwrap();
    encode_record(31, &created(5, 5), &mut truncated).unwrap();
    let r = replay(&truncated);
    assert_eq!(r.stop, ReplayStop::CleanEnd);
    let mut expected = full.state.clone();
    expected.apply(30, &full.state.checkpoint(), 0).unwrap();
    expected.apply(31, &created(5, 5), 0).unwrap();
    assert_eq!(r.state, expected);
    // Segment sequence 4 belonged to a segment deleted before the checkpoint: still never reused.
    assert_eq!(full.state.snapshot.last_segment_sequence, Some(4));
    let mut reuse = Vec::new();
    encode_record(30, &full.state.checkpoint(), &mut reuse).unwrap();
    encode_record(31, &created(6, 4), &mut reuse).unwrap();
    assert!(matches!(replay(&reuse).stop, ReplayStop::Invalid { .. }));
}

#[test]
fn a_mid_log_checkpoint_must_restate_the_state() {
    let full = replay(&encode(&history()));
    let mut bytes = encode(&history());
    let mut changed = full.state.snapshot.clone();
    // Un-retiring a namespace through a checkpoint would resurrect dead records.
    for ns in changed.namespaces.values_mut() {
        ns.retired_below = None;
    }
    encode_record(40, &ManifestRecord::Checkpoint(changed), &mut bytes).unwrap();
    assert!(matches!(replay(&bytes).stop, ReplayStop::Invalid { .. }));
    let mut same = encode(&history());
    encode_record(40, &full.state.checkpoint(), &mut same).unwrap();
    assert_eq!(replay(&same).stop, ReplayStop::CleanEnd);
}

#[test]
fn a_starting_checkpoint_must_be_consistent() {
    let ns = Namespace([1; 32]);
    let mut snap = orbitkv_wal::Snapshot::default();
    snap.namespaces.insert(
        ns,
        orbitkv_wal::NamespaceState {
            info: info("x"),
            retired_below: Some(100),
        },
    );
    let mut bytes = Vec::new();
    encode_record(5, &ManifestRecord::Checkpoint(snap.clone()), &mut bytes).unwrap();
    assert!(
        matches!(replay(&bytes).stop, ReplayStop::Invalid { .. }),
        "watermark after itself"
    );
    snap.namespaces.clear();
    for id in [1, 2] {
        let ManifestRecord::SegmentCreated(c) = created(id, 7) else {
            unreachable!()
        };
        snap.segments.insert(id, SegmentState::Active(c));
    }
    snap.last_segment_sequence = Some(7);
    let mut bytes = Vec::new();
    encode_record(5, &ManifestRecord::Checkpoint(snap), &mut bytes).unwrap();
    assert!(
        matches!(replay(&bytes).stop, ReplayStop::Invalid { .. }),
        "shared sequence"
    );
}

#[test]
fn text_longer_than_a_record_field_is_refused_not_cut() {
    let mut out = Vec::new();
    let long = "é".repeat(40_000);
    let rec = ManifestRecord::NamespaceRegistered {
        namespace: Namespace([1; 32]),
        info: info(&long),
    };
    assert!(matches!(
        encode_record(1, &rec, &mut out),
        Err(Error::FieldTooLong { field: "model", .. })
    ));
    assert!(out.is_empty());
}

#[test]
fn contradictory_records_stop_replay() {
    let ns = Namespace([1; 32]);
    let cases: Vec<Vec<(u64, ManifestRecord)>> = vec![
        vec![(1, sealed(1))],
        vec![(1, created(1, 1)), (2, created(1, 2))],
        vec![(1, created(1, 1)), (2, sealed(1)), (3, sealed(1))],
        vec![(1, ManifestRecord::SegmentDeleted { segment_id: 9 })],
        vec![(
            1,
            ManifestRecord::NamespaceRetired {
                namespace: ns,
                watermark: 1,
            },
        )],
        vec![
            (
                1,
                ManifestRecord::NamespaceRegistered {
                    namespace: ns,
                    info: info("x"),
                },
            ),
            (
                2,
                ManifestRecord::NamespaceRegistered {
                    namespace: ns,
                    info: info("y"),
                },
            ),
        ],
        vec![
            (
                1,
                ManifestRecord::NamespaceRegistered {
                    namespace: ns,
                    info: info("x"),
                },
            ),
            (
                2,
                ManifestRecord::NamespaceRetired {
                    namespace: ns,
                    watermark: 5,
                },
            ),
        ],
        vec![
            (
                1,
                ManifestRecord::NamespaceRegistered {
                    namespace: ns,
                    info: info("x"),
                },
            ),
            (
                5,
                ManifestRecord::NamespaceRetired {
                    namespace: ns,
                    watermark: 4,
                },
            ),
            (
                6,
                ManifestRecord::NamespaceRetired {
                    namespace: ns,
                    watermark: 3,
                },
            ),
        ],
        vec![
            (1, created(1, 1)),
            (
                2,
                ManifestRecord::CompactionCommitted {
                    inputs: vec![],
                    outputs: vec![1],
                },
            ),
        ],
        // An input still being written cannot be compacted away.
        vec![
            (1, created(1, 1)),
            (2, created(2, 2)),
            (3, sealed(2)),
            (
                4,
                ManifestRecord::CompactionCommitted {
                    inputs: vec![1],
                    outputs: vec![2],
                },
            ),
        ],
        // An input that is also an output, or listed twice.
        vec![
            (1, created(1, 1)),
            (2, sealed(1)),
            (
                3,
                ManifestRecord::CompactionCommitted {
                    inputs: vec![1],
                    outputs: vec![1],
                },
            ),
        ],
        vec![
            (1, created(1, 1)),
            (2, sealed(1)),
            (3, created(2, 2)),
            (4, sealed(2)),
            (
                5,
                ManifestRecord::CompactionCommitted {
                    inputs: vec![1, 1],
                    outputs: vec![2],
                },
            ),
        ],
    ];
    for (i, case) in cases.iter().enumerate() {
        let bytes = encode(case);
        let r = replay(&bytes);
        assert!(
            matches!(
                r.stop,
                ReplayStop::Invalid {
                    error: Error::Invalid { .. }
                }
            ),
            "case {i}: {:?}",
            r.stop
        );
        // The state is that of the records before the contradiction.
        assert_eq!(r.records as usize, case.len() - 1, "case {i}");
    }
}

#[test]
fn re_registration_after_retirement_is_allowed() {
    let ns = Namespace([1; 32]);
    let bytes = encode(&[
        (
            1,
            ManifestRecord::NamespaceRegistered {
                namespace: ns,
                info: info("x"),
            },
        ),
        (
            4,
            ManifestRecord::NamespaceRetired {
                namespace: ns,
                watermark: 4,
            },
        ),
        (
            5,
            ManifestRecord::NamespaceRegistered {
                namespace: ns,
                info: info("x"),
            },
        ),
    ]);
    let r = replay(&bytes);
    assert_eq!(r.stop, ReplayStop::CleanEnd);
    assert!(r.state.is_retired(&ns, 3));
    assert!(!r.state.is_retired(&ns, 6));
}
