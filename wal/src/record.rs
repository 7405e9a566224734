//! Manifest records and their framing (docs/format.md, "Manifest record").
//!
//! A record is a 28-byte header — magic, version, type, record sequence, payload length, payload
//! CRC32C, and a CRC32C over the header itself, so the length is trusted only after its CRC
//! verified — then the payload, padded with zeros to 8 bytes.

use std::collections::BTreeMap;

use orbitkv_segments::crc::crc32c;
use orbitkv_state::{Namespace, ParallelShape};

use crate::codec::{Reader, Writer};
use crate::error::{Error, Result};

/// Record magic.
pub const RECORD_MAGIC: [u8; 4] = *b"OKVM";
/// Record format version.
pub const RECORD_VERSION: u8 = 1;
/// Size of a record header.
pub const RECORD_HEADER_LEN: usize = 28;
/// Largest payload a record may carry (a checkpoint of a large store fits easily).
pub const MAX_RECORD_PAYLOAD: usize = 64 << 20;
/// Record alignment.
pub const RECORD_ALIGN: usize = 8;

/// A readable summary of the computation a namespace stands for (for `inspect` and logs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NamespaceInfo {
    /// The computation identity digest.
    pub identity: [u8; 32],
    /// The storage layout digest.
    pub layout_digest: [u8; 32],
    /// Model name or directory.
    pub model: String,
    /// Hub revision or artifacts digest.
    pub revision: String,
    /// Engine kind.
    pub engine: String,
    /// Engine release.
    pub engine_release: String,
    /// Compute dtype.
    pub dtype: String,
    /// Parallel shape.
    pub parallel: ParallelShape,
}

/// How a segment was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SegmentCreated {
    /// Segment id (its file name).
    pub segment_id: u64,
    /// The segment instance's sequence (epoch), unique and increasing.
    pub segment_sequence: u64,
    /// Direct-I/O alignment.
    pub direct: bool,
    /// zstd payloads allowed.
    pub compression: bool,
}

/// A segment's seal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SegmentSealed {
    /// Segment id.
    pub segment_id: u64,
    /// SHA-256 of its footer (as in its trailer).
    pub footer_digest: [u8; 32],
    /// Records and tombstones in it.
    pub records: u64,
    /// Where its frames end.
    pub data_end: u64,
}

/// What the manifest knows about one namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NamespaceState {
    /// Its summary.
    pub info: NamespaceInfo,
    /// Records of this namespace with a record sequence below this are dead forever.
    pub retired_below: Option<u64>,
}

/// What the manifest knows about one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SegmentState {
    /// Being written.
    Active(SegmentCreated),
    /// Sealed.
    Sealed(SegmentCreated, SegmentSealed),
}

/// A full snapshot of live metadata; a checkpoint record carries one so the log can be truncated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Namespaces by namespace.
    pub namespaces: BTreeMap<Namespace, NamespaceState>,
    /// Segments by id.
    pub segments: BTreeMap<u64, SegmentState>,
    /// The highest segment sequence ever created, deleted segments included: segment sequences
    /// are never reused, even after the log is truncated to a checkpoint.
    pub last_segment_sequence: Option<u64>,
}

/// One manifest record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestRecord {
    /// A namespace sealed its registration.
    NamespaceRegistered {
        /// The namespace.
        namespace: Namespace,
        /// Its summary.
        info: NamespaceInfo,
    },
    /// Records of `namespace` with a sequence below `watermark` are dead; later ones live.
    NamespaceRetired {
        /// The namespace.
        namespace: Namespace,
        /// The sequence watermark.
        watermark: u64,
    },
    /// A segment file was created.
    SegmentCreated(SegmentCreated),
    /// A segment was sealed.
    SegmentSealed(SegmentSealed),
    /// A segment was deleted.
    SegmentDeleted {
        /// Segment id.
        segment_id: u64,
    },
    /// A compaction replaced `inputs` with `outputs` (already sealed).
    CompactionCommitted {
        /// Segments made obsolete.
        inputs: Vec<u64>,
        /// Segments holding their live records.
        outputs: Vec<u64>,
    },
    /// A full snapshot.
    Checkpoint(Snapshot),
}

impl ManifestRecord {
    /// The one-byte type code.
    pub fn code(&self) -> u8 {
        match self {
            ManifestRecord::NamespaceRegistered { .. } => 1,
            ManifestRecord::NamespaceRetired { .. } => 2,
            ManifestRecord::SegmentCreated(_) => 3,
            ManifestRecord::SegmentSealed(_) => 4,
            ManifestRecord::SegmentDeleted { .. } => 5,
            ManifestRecord::CompactionCommitted { .. } => 6,
            ManifestRecord::Checkpoint(_) => CHECKPOINT_TYPE,
        }
    }
}

fn put_info(w: &mut Writer, info: &NamespaceInfo) -> Result<()> {
    w.raw(&info.identity);
    w.raw(&info.layout_digest);
    w.text("model", &info.model)?;
    w.text("revision", &info.revision)?;
    w.text("engine", &info.engine)?;
    w.text("engine release", &info.engine_release)?;
    w.text("dtype", &info.dtype)?;
    w.u32(info.parallel.tensor);
    w.u32(info.parallel.pipeline);
    w.u32(info.parallel.context);
    Ok(())
}

fn get_info(r: &mut Reader<'_>) -> Result<NamespaceInfo> {
    Ok(NamespaceInfo {
        identity: r.array()?,
        layout_digest: r.array()?,
        model: r.text()?,
        revision: r.text()?,
        engine: r.text()?,
        engine_release: r.text()?,
        dtype: r.text()?,
        parallel: ParallelShape {
            tensor: r.u32()?,
            pipeline: r.u32()?,
            context: r.u32()?,
        },
    })
}

fn put_created(w: &mut Writer, c: &SegmentCreated) {
    w.u64(c.segment_id);
    w.u64(c.segment_sequence);
    w.u32(u32::from(c.direct) | (u32::from(c.compression) << 1));
}

fn get_created(r: &mut Reader<'_>) -> Result<SegmentCreated> {
    let segment_id = r.u64()?;
    let segment_sequence = r.u64()?;
    let flags = r.u32()?;
    if flags & !3 != 0 {
        return Err(r.malformed(format!("unknown segment flags {flags:#x}")));
    }
    Ok(SegmentCreated {
        segment_id,
        segment_sequence,
        direct: flags & 1 != 0,
        compression: flags & 2 != 0,
    })
}

fn put_sealed(w: &mut Writer, s: &SegmentSealed) {
    w.u64(s.segment_id);
    w.raw(&s.footer_digest);
    w.u64(s.records);
    w.u64(s.data_end);
}

fn get_sealed(r: &mut Reader<'_>) -> Result<SegmentSealed> {
    Ok(SegmentSealed {
        segment_id: r.u64()?,
        footer_digest: r.array()?,
        records: r.u64()?,
        data_end: r.u64()?,
    })
}

fn put_ids(w: &mut Writer, ids: &[u64]) {
    w.u32(ids.len() as u32);
    for id in ids {
        w.u64(*id);
    }
}

fn get_ids(r: &mut Reader<'_>) -> Result<Vec<u64>> {
    let n = r.count(8)?;
    (0..n).map(|_| r.u64()).collect()
}

/// Encodes a record's payload.
fn encode_payload(rec: &ManifestRecord) -> Result<Vec<u8>> {
    let mut w = Writer::default();
    match rec {
        ManifestRecord::NamespaceRegistered { namespace, info } => {
            w.raw(&namespace.0);
            put_info(&mut w, info)?;
        }
        ManifestRecord::NamespaceRetired {
            namespace,
            watermark,
        } => {
            w.raw(&namespace.0);
            w.u64(*watermark);
        }
        ManifestRecord::SegmentCreated(c) => put_created(&mut w, c),
        ManifestRecord::SegmentSealed(s) => put_sealed(&mut w, s),
        ManifestRecord::SegmentDeleted { segment_id } => w.u64(*segment_id),
        ManifestRecord::CompactionCommitted { inputs, outputs } => {
            put_ids(&mut w, inputs);
            put_ids(&mut w, outputs);
        }
        ManifestRecord::Checkpoint(snap) => {
            match snap.last_segment_sequence {
                None => w.u8(0),
                Some(s) => {
                    w.u8(1);
                    w.u64(s);
                }
            }
            w.u32(snap.namespaces.len() as u32);
            for (ns, st) in &snap.namespaces {
                w.raw(&ns.0);
                put_info(&mut w, &st.info)?;
                match st.retired_below {
                    None => w.u8(0),
                    Some(wm) => {
                        w.u8(1);
                        w.u64(wm);
                    }
                }
            }
            w.u32(snap.segments.len() as u32);
            for st in snap.segments.values() {
                match st {
                    SegmentState::Active(c) => {
                        w.u8(1);
                        put_created(&mut w, c);
                    }
                    SegmentState::Sealed(c, s) => {
                        w.u8(2);
                        put_created(&mut w, c);
                        put_sealed(&mut w, s);
                    }
                }
            }
        }
    }
    Ok(w.buf)
}

fn decode_payload(code: u8, payload: &[u8], offset: u64) -> Result<ManifestRecord> {
    let mut r = Reader::new(payload, offset);
    let rec = match code {
        1 => ManifestRecord::NamespaceRegistered {
            namespace: Namespace(r.array()?),
            info: get_info(&mut r)?,
        },
        2 => ManifestRecord::NamespaceRetired {
            namespace: Namespace(r.array()?),
            watermark: r.u64()?,
        },
        3 => ManifestRecord::SegmentCreated(get_created(&mut r)?),
        4 => ManifestRecord::SegmentSealed(get_sealed(&mut r)?),
        5 => ManifestRecord::SegmentDeleted {
            segment_id: r.u64()?,
        },
        6 => ManifestRecord::CompactionCommitted {
            inputs: get_ids(&mut r)?,
            outputs: get_ids(&mut r)?,
        },
        7 => {
            let last_segment_sequence = match r.u8()? {
                0 => None,
                1 => Some(r.u64()?),
                other => return Err(r.malformed(format!("bad segment-sequence tag {other}"))),
            };
            let mut snap = Snapshot {
                last_segment_sequence,
                ..Snapshot::default()
            };
            // A namespace entry is at least 32 + 64 + 5·2 + 12 + 1 bytes.
            for _ in 0..r.count(119)? {
                let ns = Namespace(r.array()?);
                let info = get_info(&mut r)?;
                let retired_below = match r.u8()? {
                    0 => None,
                    1 => Some(r.u64()?),
                    other => return Err(r.malformed(format!("bad watermark tag {other}"))),
                };
                if snap
                    .namespaces
                    .insert(
                        ns,
                        NamespaceState {
                            info,
                            retired_below,
                        },
                    )
                    .is_some()
                {
                    return Err(r.malformed("namespace listed twice"));
                }
            }
            for _ in 0..r.count(21)? {
                let st = match r.u8()? {
                    1 => SegmentState::Active(get_created(&mut r)?),
                    2 => {
                        let c = get_created(&mut r)?;
                        let s = get_sealed(&mut r)?;
                        if s.segment_id != c.segment_id {
                            return Err(r.malformed("seal of another segment"));
                        }
                        SegmentState::Sealed(c, s)
                    }
                    other => return Err(r.malformed(format!("bad segment state {other}"))),
                };
                let id = match st {
                    SegmentState::Active(c) | SegmentState::Sealed(c, _) => c.segment_id,
                };
                if snap.segments.insert(id, st).is_some() {
                    return Err(r.malformed("segment listed twice"));
                }
            }
            ManifestRecord::Checkpoint(snap)
        }
        other => {
            return Err(Error::UnknownType {
                offset,
                code: other,
            });
        }
    };
    r.finish()?;
    Ok(rec)
}

/// Appends one framed record with sequence `sequence` to `out`.
pub fn encode_record(sequence: u64, rec: &ManifestRecord, out: &mut Vec<u8>) -> Result<()> {
    let payload = encode_payload(rec)?;
    if payload.len() > MAX_RECORD_PAYLOAD {
        return Err(Error::LengthOutOfBounds {
            offset: out.len() as u64,
            length: payload.len() as u64,
            limit: MAX_RECORD_PAYLOAD as u64,
        });
    }
    let mut h = [0u8; RECORD_HEADER_LEN];
    h[..4].copy_from_slice(&RECORD_MAGIC);
    h[4] = RECORD_VERSION;
    h[5] = rec.code();
    h[8..16].copy_from_slice(&sequence.to_le_bytes());
    h[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    h[20..24].copy_from_slice(&crc32c(&payload).to_le_bytes());
    let crc = crc32c(&h[..24]);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(&payload);
    let pad = record_len(payload.len()) - RECORD_HEADER_LEN - payload.len();
    out.extend(std::iter::repeat_n(0u8, pad));
    Ok(())
}

/// The record type a record header names, when the header at the start of `bytes` verifies
/// (magic and header CRC); `None` otherwise. The payload is not checked.
pub fn verified_header_type(bytes: &[u8]) -> Option<u8> {
    let h = bytes.get(..RECORD_HEADER_LEN)?;
    let crc = u32::from_le_bytes([h[24], h[25], h[26], h[27]]);
    (h[..4] == RECORD_MAGIC && crc32c(&h[..24]) == crc).then_some(h[5])
}

/// The type code of a checkpoint record.
pub const CHECKPOINT_TYPE: u8 = 7;

/// Total framed length of a record with a payload of `payload_len` bytes.
pub fn record_len(payload_len: usize) -> usize {
    (RECORD_HEADER_LEN + payload_len).div_ceil(RECORD_ALIGN) * RECORD_ALIGN
}

/// A decoded record and where it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedRecord {
    /// Its sequence.
    pub sequence: u64,
    /// The record.
    pub record: ManifestRecord,
    /// Its framed length (the next record starts here).
    pub len: usize,
}

/// Decodes and verifies the record at the start of `bytes` (`offset`: its position in the log).
pub fn decode_record(bytes: &[u8], offset: u64) -> Result<DecodedRecord> {
    if bytes.len() < RECORD_HEADER_LEN {
        if bytes.len() >= 4 && bytes[..4] != RECORD_MAGIC {
            return Err(Error::BadMagic { offset });
        }
        return Err(Error::Truncated {
            offset,
            needed: (RECORD_HEADER_LEN - bytes.len()) as u64,
        });
    }
    if bytes[..4] != RECORD_MAGIC {
        return Err(Error::BadMagic { offset });
    }
    let word =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let expected = word(24);
    let actual = crc32c(&bytes[..24]);
    if expected != actual {
        return Err(Error::ChecksumMismatch {
            offset,
            what: "header",
            expected,
            actual,
        });
    }
    if bytes[4] != RECORD_VERSION {
        return Err(Error::UnsupportedVersion {
            offset,
            found: u32::from(bytes[4]),
            supported: u32::from(RECORD_VERSION),
        });
    }
    if bytes[6] != 0 || bytes[7] != 0 {
        return Err(Error::Malformed {
            offset,
            reason: "reserved header bytes are not zero".to_owned(),
        });
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&bytes[8..16]);
    let sequence = u64::from_le_bytes(seq);
    let payload_len = word(16) as usize;
    if payload_len > MAX_RECORD_PAYLOAD {
        return Err(Error::LengthOutOfBounds {
            offset,
            length: payload_len as u64,
            limit: MAX_RECORD_PAYLOAD as u64,
        });
    }
    let len = record_len(payload_len);
    if len > bytes.len() {
        return Err(Error::Truncated {
            offset,
            needed: (len - bytes.len()) as u64,
        });
    }
    let payload = &bytes[RECORD_HEADER_LEN..RECORD_HEADER_LEN + payload_len];
    let expected = word(20);
    let actual = crc32c(payload);
    if expected != actual {
        return Err(Error::ChecksumMismatch {
            offset,
            what: "payload",
            expected,
            actual,
        });
    }
    if bytes[RECORD_HEADER_LEN + payload_len..len]
        .iter()
        .any(|&b| b != 0)
    {
        return Err(Error::Malformed {
            offset,
            reason: "padding is not zero".to_owned(),
        });
    }
    let record = decode_payload(bytes[5], payload, offset)?;
    Ok(DecodedRecord {
        sequence,
        record,
        len,
    })
}
