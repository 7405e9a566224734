//! A manifest history exercising every record type.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]
#![allow(dead_code, reason = "shared by several test files; each uses a subset")]

use orbitkv_state::{Namespace, ParallelShape};
use orbitkv_wal::{ManifestRecord, NamespaceInfo, SegmentCreated, SegmentSealed, encode_record};

pub fn info(model: &str) -> NamespaceInfo {
    NamespaceInfo {
        identity: [0x11; 32],
        layout_digest: [0x22; 32],
        model: model.to_owned(),
        revision: "0123456789abcdef0123456789abcdef01234567".to_owned(),
        engine: "vllm".to_owned(),
        engine_release: "0.33.0".to_owned(),
        dtype: "bfloat16".to_owned(),
        parallel: ParallelShape {
            tensor: 2,
            pipeline: 1,
            context: 1,
        },
    }
}

pub fn created(id: u64, seq: u64) -> ManifestRecord {
    ManifestRecord::SegmentCreated(SegmentCreated {
        segment_id: id,
        segment_sequence: seq,
        direct: id.is_multiple_of(2),
        compression: false,
    })
}

pub fn sealed(id: u64) -> ManifestRecord {
    ManifestRecord::SegmentSealed(SegmentSealed {
        segment_id: id,
        footer_digest: [id as u8; 32],
        records: 10 * id,
        data_end: 4096 * (id + 1),
    })
}

/// (sequence, record) pairs of a small but complete history.
pub fn history() -> Vec<(u64, ManifestRecord)> {
    let a = Namespace([0xa0; 32]);
    let b = Namespace([0xb0; 32]);
    vec![
        (
            1,
            ManifestRecord::NamespaceRegistered {
                namespace: a,
                info: info("org/model-a"),
            },
        ),
        (2, created(1, 1)),
        (
            5,
            ManifestRecord::NamespaceRegistered {
                namespace: b,
                info: info("org/model-b"),
            },
        ),
        (9, sealed(1)),
        (10, created(2, 2)),
        (11, sealed(2)),
        (12, created(3, 3)),
        (13, sealed(3)),
        (
            14,
            ManifestRecord::CompactionCommitted {
                inputs: vec![1, 2],
                outputs: vec![3],
            },
        ),
        (
            20,
            ManifestRecord::NamespaceRetired {
                namespace: a,
                watermark: 18,
            },
        ),
        (21, created(4, 4)),
        (22, ManifestRecord::SegmentDeleted { segment_id: 4 }),
    ]
}

pub fn encode(history: &[(u64, ManifestRecord)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (seq, rec) in history {
        encode_record(*seq, rec, &mut out).unwrap();
    }
    out
}
