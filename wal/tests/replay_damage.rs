//! Manifest damage: truncation at every byte, every bit of a record flipped, a duplicated record,
//! unknown versions and types. Replay always yields the state of an exact valid prefix and says
//! why it stopped; a bad record with valid records after it is corruption, never skipped.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::{encode, history};
use orbitkv_wal::record::RECORD_HEADER_LEN;
use orbitkv_wal::{Error, ManifestState, ReplayStop, decode_record, replay};

/// Byte offsets where each record ends.
fn ends(bytes: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        pos += decode_record(&bytes[pos..], pos as u64).unwrap().len;
        out.push(pos);
    }
    out
}

fn state_after(n: usize) -> ManifestState {
    let mut s = ManifestState::default();
    for (seq, rec) in history().iter().take(n) {
        s.apply(*seq, rec, 0).unwrap();
    }
    s
}

#[test]
fn truncation_at_every_byte_yields_the_complete_prefix() {
    let bytes = encode(&history());
    let ends = ends(&bytes);
    for cut in 0..=bytes.len() {
        let r = replay(&bytes[..cut]);
        let complete = ends.iter().filter(|&&e| e <= cut).count();
        assert_eq!(r.records as usize, complete, "cut {cut}");
        assert_eq!(r.state, state_after(complete), "cut {cut}");
        let valid = if complete == 0 { 0 } else { ends[complete - 1] };
        assert_eq!(r.valid_len as usize, valid, "cut {cut}");
        if cut == valid {
            assert_eq!(r.stop, ReplayStop::CleanEnd, "cut {cut}");
        } else {
            assert!(
                matches!(r.stop, ReplayStop::TornTail { .. }),
                "cut {cut}: {:?}",
                r.stop
            );
        }
    }
}

#[test]
fn every_bit_flip_is_caught_and_never_skipped() {
    let bytes = encode(&history());
    let ends = ends(&bytes);
    let (from, to) = (ends[3], ends[4]); // the fifth record
    for bit in from * 8..to * 8 {
        let mut bad = bytes.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        let r = replay(&bad);
        assert_eq!(r.records, 4, "bit {bit}");
        assert_eq!(r.state, state_after(4), "bit {bit}");
        assert_eq!(r.valid_len as usize, from, "bit {bit}");
        assert!(
            matches!(r.stop, ReplayStop::Corrupt { next_valid_at, .. } if next_valid_at as usize == to),
            "bit {bit}: {:?}",
            r.stop
        );
    }
    // The last record damaged: a torn tail.
    let last = ends[ends.len() - 2];
    let mut bad = bytes.clone();
    bad[last + RECORD_HEADER_LEN] ^= 1;
    assert!(matches!(replay(&bad).stop, ReplayStop::TornTail { .. }));
}

#[test]
fn duplicated_record_and_unknown_version_are_typed() {
    let bytes = encode(&history());
    let ends = ends(&bytes);
    let mut dup = bytes[..ends[1]].to_vec();
    dup.extend_from_slice(&bytes[ends[0]..ends[1]]);
    dup.extend_from_slice(&bytes[ends[1]..]);
    let r = replay(&dup);
    assert_eq!(r.records, 2);
    assert!(matches!(
        r.stop,
        ReplayStop::Corrupt {
            error: Error::SequenceNotIncreasing { .. },
            ..
        }
    ));

    let mut v2 = bytes[..ends[0]].to_vec();
    v2[4] = 2;
    let crc = crc32c::crc32c(&v2[..24]);
    v2[24..28].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        decode_record(&v2, 0),
        Err(Error::UnsupportedVersion { found: 2, .. })
    ));
    let mut unknown = bytes[..ends[0]].to_vec();
    unknown[5] = 99;
    let crc = crc32c::crc32c(&unknown[..24]);
    unknown[24..28].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        decode_record(&unknown, 0),
        Err(Error::UnknownType { code: 99, .. })
    ));
}

#[test]
fn a_forged_length_cannot_make_replay_allocate() {
    let bytes = encode(&history());
    let mut forged = bytes[..ends(&bytes)[0]].to_vec();
    forged[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
    let crc = crc32c::crc32c(&forged[..24]);
    forged[24..28].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        decode_record(&forged, 0),
        Err(Error::LengthOutOfBounds { .. })
    ));
}

#[test]
fn a_damaged_checkpoint_at_the_start_is_never_a_torn_tail() {
    // The log as a rewrite leaves it: one checkpoint, written whole and renamed into place.
    let state = state_after(history().len());
    let seq = state.last_sequence.unwrap() + 1;
    let bytes = encode(&[(seq, state.checkpoint())]);
    assert_eq!(replay(&bytes).stop, ReplayStop::CleanEnd);
    for bit in 0..bytes.len() * 8 {
        let mut bad = bytes.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        let r = replay(&bad);
        assert_eq!(r.valid_len, 0, "bit {bit}");
        assert!(
            matches!(r.stop, ReplayStop::DamagedStart { .. }),
            "bit {bit}: {:?}",
            r.stop
        );
    }
    for cut in RECORD_HEADER_LEN..bytes.len() {
        assert!(
            matches!(replay(&bytes[..cut]).stop, ReplayStop::DamagedStart { .. }),
            "cut {cut}"
        );
    }
    // Shorter than a header: what a crash leaves of a fresh log's first append, as before.
    for cut in 1..RECORD_HEADER_LEN {
        assert!(
            matches!(replay(&bytes[..cut]).stop, ReplayStop::TornTail { .. }),
            "cut {cut}"
        );
    }
    // Zeros where the checkpoint was are an unwritten file, as before.
    assert!(matches!(
        replay(&vec![0u8; bytes.len()]).stop,
        ReplayStop::TornTail { .. }
    ));
    // Appends after the checkpoint: the last one damaged is a torn tail, as before.
    let mut log = bytes.clone();
    let (s2, rec) = (seq + 1, history()[0].1.clone());
    log.extend(encode(&[(s2, rec)]));
    let at = bytes.len() + RECORD_HEADER_LEN;
    log[at] ^= 1;
    let r = replay(&log);
    assert_eq!(r.valid_len as usize, bytes.len());
    assert!(matches!(r.stop, ReplayStop::TornTail { .. }));
}

#[test]
fn a_torn_first_append_is_still_a_torn_tail() {
    // A fresh log's first record (not a checkpoint) with its payload cut or damaged.
    let bytes = encode(&history());
    let first = ends(&bytes)[0];
    for cut in RECORD_HEADER_LEN..first {
        assert!(
            matches!(replay(&bytes[..cut]).stop, ReplayStop::TornTail { .. }),
            "cut {cut}"
        );
    }
    let mut bad = bytes[..first].to_vec();
    bad[RECORD_HEADER_LEN] ^= 1;
    assert!(matches!(replay(&bad).stop, ReplayStop::TornTail { .. }));
    // Its header damaged: not what an append leaves.
    let mut bad = bytes[..first].to_vec();
    bad[9] ^= 1;
    assert!(matches!(replay(&bad).stop, ReplayStop::DamagedStart { .. }));
}
