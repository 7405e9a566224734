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
    expected.apply(31, &created(5, 5), 0).unwrap();
    assert_eq!(r.state.snapshot, expected.snapshot);
    // Segment sequences are never reused, even across a truncated log.
    let mut reuse = truncated.clone();
    encode_record(32, &created(6, 3), &mut reuse).unwrap();
    assert!(matches!(replay(&reuse).stop, ReplayStop::Invalid { .. }));
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
