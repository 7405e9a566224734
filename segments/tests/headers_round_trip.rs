//! Data-directory and segment headers round-trip for every field value, and every truncation or
//! single-byte change of their checksummed bytes is refused.

use orbitkv_segments::{Alignment, DataDirHeader, SegmentHeader};
use proptest::prelude::*;

proptest! {
    #[test]
    fn data_dir_header(id in any::<[u8; 16]>(), created in any::<u64>(), at in 0usize..64, x in 1u8..=255) {
        let h = DataDirHeader { directory_id: id, created_unix_ms: created, flags: 0 };
        let b = h.encode();
        prop_assert_eq!(DataDirHeader::decode(&b), Ok(h));
        let mut bad = b;
        bad[at] ^= x;
        prop_assert!(DataDirHeader::decode(&bad).is_err());
        prop_assert!(DataDirHeader::decode(&b[..at]).is_err());
    }

    #[test]
    fn segment_header(
        id in any::<u64>(),
        seq in any::<u64>(),
        created in any::<u64>(),
        dir in any::<[u8; 16]>(),
        direct in any::<bool>(),
        compression in any::<bool>(),
        at in 0usize..64,
        x in 1u8..=255,
    ) {
        let h = SegmentHeader {
            segment_id: id,
            sequence: seq,
            created_unix_ms: created,
            directory_id: dir,
            alignment: if direct { Alignment::Direct } else { Alignment::Packed },
            compression,
        };
        let b = h.encode();
        prop_assert_eq!(SegmentHeader::decode(&b), Ok(h));
        let mut bad = b.clone();
        bad[at] ^= x;
        prop_assert!(SegmentHeader::decode(&bad).is_err());
        prop_assert!(SegmentHeader::decode(&b[..at]).is_err());
    }
}
