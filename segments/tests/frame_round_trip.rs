//! Frames round-trip for every kind, alignment and compression setting, including empty and
//! maximum-size payloads; anything larger is refused.

mod common;

use common::{header, key, meta, payload};
use orbitkv_segments::frame::{encode_frame, encode_padding};
use orbitkv_segments::{
    Alignment, Compression, Error, FRAME_HEADER_LEN, FrameBody, FrameHeader, MAX_PAYLOAD_LEN,
};
use proptest::prelude::*;

fn alignment() -> impl Strategy<Value = Alignment> {
    prop_oneof![Just(Alignment::Packed), Just(Alignment::Direct)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn record_frames_round_trip(
        i in 0u64..1000,
        len in prop_oneof![Just(0usize), 0usize..9000],
        align in alignment(),
        compress in any::<bool>(),
        repetitive in any::<bool>(),
        seq in 1u64..u64::MAX,
    ) {
        let seg = header(7, align, compress);
        let data = if repetitive { vec![b'k'; len] } else { payload(i, len) };
        let mut out = vec![0u8; align.unit()];
        let body = FrameBody::Record(meta(2, i));
        let h = encode_frame(&seg, body.clone(), seq, &data, Compression::Zstd { level: 1 }, &mut out).unwrap();
        prop_assert_eq!(out.len(), align.unit() + h.frame_len as usize);
        prop_assert_eq!(h.frame_len as usize % align.unit(), 0);
        let d = FrameHeader::decode(&out[align.unit()..], 0).unwrap();
        prop_assert_eq!(&d, &h);
        prop_assert_eq!(&d.body, &body);
        prop_assert_eq!(d.record_sequence, seq);
        // Compression only where the segment allows it and it pays.
        prop_assert!(!d.compressed || (compress && repetitive));
        let stored = &out[align.unit() + FRAME_HEADER_LEN..][..d.stored_len as usize];
        let decoded = d.payload(stored, 0).unwrap();
        prop_assert_eq!(decoded.as_ref(), data.as_slice());
        let mut copy = vec![0u8; d.uncompressed_len as usize];
        d.copy_payload(stored, &mut copy, 0).unwrap();
        prop_assert_eq!(copy, data);
    }

    #[test]
    fn tombstones_and_padding_round_trip(i in 0u64..1000, align in alignment(), pad_units in 1usize..4) {
        let seg = header(3, align, false);
        let mut out = Vec::new();
        let h = encode_frame(&seg, FrameBody::Tombstone { key: key(5, i) }, i + 1, &[], Compression::None, &mut out).unwrap();
        prop_assert_eq!(FrameHeader::decode(&out, 0).unwrap(), h);
        let pad = (FRAME_HEADER_LEN / align.unit() + pad_units) * align.unit();
        let start = out.len();
        encode_padding(&seg, pad, &mut out).unwrap();
        let p = FrameHeader::decode(&out[start..], start as u64).unwrap();
        prop_assert_eq!(p.body, FrameBody::Padding);
        prop_assert_eq!(p.frame_len as usize, pad);
    }
}

#[test]
fn maximum_payload_round_trips_and_larger_is_refused() {
    let seg = header(1, Alignment::Direct, false);
    let data = payload(1, MAX_PAYLOAD_LEN);
    let mut out = Vec::new();
    let h = encode_frame(
        &seg,
        FrameBody::Record(meta(1, 1)),
        1,
        &data,
        Compression::None,
        &mut out,
    )
    .unwrap();
    assert_eq!(h.stored_len as usize, MAX_PAYLOAD_LEN);
    let d = FrameHeader::decode(&out, 0).unwrap();
    let stored = &out[FRAME_HEADER_LEN..FRAME_HEADER_LEN + MAX_PAYLOAD_LEN];
    d.verify_payload(stored, 0).unwrap();
    drop(out);
    let too_big = vec![0u8; MAX_PAYLOAD_LEN + 1];
    let mut out = Vec::new();
    assert!(matches!(
        encode_frame(
            &seg,
            FrameBody::Record(meta(1, 1)),
            1,
            &too_big,
            Compression::None,
            &mut out
        ),
        Err(Error::LengthOutOfBounds { .. })
    ));
}

#[test]
fn header_fields_are_guarded_by_the_header_crc() {
    let seg = header(1, Alignment::Packed, false);
    let mut out = Vec::new();
    encode_frame(
        &seg,
        FrameBody::Record(meta(1, 3)),
        9,
        &payload(3, 100),
        Compression::None,
        &mut out,
    )
    .unwrap();
    for byte in 0..FRAME_HEADER_LEN {
        let mut bad = out.clone();
        bad[byte] ^= 0x40;
        assert!(FrameHeader::decode(&bad, 0).is_err(), "byte {byte}");
    }
    // A payload flip is caught by the payload CRC.
    let mut bad = out.clone();
    bad[FRAME_HEADER_LEN + 10] ^= 1;
    let h = FrameHeader::decode(&bad, 0).unwrap();
    assert!(
        h.verify_payload(&bad[FRAME_HEADER_LEN..FRAME_HEADER_LEN + 100], 0)
            .is_err()
    );
    let mut dst = vec![0u8; 100];
    assert!(
        h.copy_payload(&bad[FRAME_HEADER_LEN..FRAME_HEADER_LEN + 100], &mut dst, 0)
            .is_err()
    );
}
