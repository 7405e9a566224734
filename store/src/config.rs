//! The store's configuration and its limits.
//!
//! [`StoreConfig`] says how to open a store; [`Durability`] says when a put's bytes are durable.
//! The constants bound what a configuration or a put may ask for.

use std::path::PathBuf;
use std::time::Duration;

use orbitkv_segments::footer::{
    FOOTER_FIXED_LEN, INDEX_ENTRY_LEN, NAMESPACE_SUMMARY_LEN, TRAILER_LEN,
};
use orbitkv_segments::segment_header::SEGMENT_HEADER_LEN;
use orbitkv_segments::{Alignment, Compression, FRAME_HEADER_LEN};

#[cfg(doc)]
use crate::StateStore;
use crate::manifest;
use crate::reclaimer::Policy;

/// When put bytes become durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Every put syncs before it returns.
    EveryPut,
    /// Puts return once written; [`StateStore::sync`] makes them durable (group commit).
    /// Readers may see records not yet durable.
    Manual,
    /// Puts return once written (several writes in flight); a record is indexed — readable —
    /// only once a [`StateStore::sync`] or a segment's seal has made it durable: readers never
    /// see a record a failed write or fsync could still take away. One sync makes every put
    /// before it durable (group commit across putters).
    Group,
}

/// SSD admission: whether a record put for the first time may wait in DRAM instead of being
/// written to the SSD tier (docs/design.md, "SSD admission").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Every record put is written.
    Off,
    /// Adaptive (decided by an [`crate::AdmissionChooser`]): under [`Policy::RecordLru`] with an
    /// SSD budget, while the tier is full and shadows of it measure that holding back loses no
    /// hit, a record [`StateStore::put`] stores for the first time waits in a waiting room of
    /// `waiting_bytes` of DRAM. It is written once read there, or put again while the ghost
    /// remembers its key. A waiting record is readable, and not durable. [`StateStore::put`]
    /// and [`StateStore::put_frames`] both hold records back.
    Adaptive {
        /// The waiting room's bytes, its records counted as frames (header and payload, in
        /// 4 KiB pages).
        waiting_bytes: u64,
    },
}

impl Admission {
    /// Adaptive, with a waiting room of a tenth of `ssd_bytes` (the share the admission
    /// matrix in docs/performance.md measures).
    pub fn adaptive_for(ssd_bytes: u64) -> Self {
        Self::Adaptive {
            waiting_bytes: ssd_bytes / 10,
        }
    }

    /// The waiting room's bytes; `None` when off.
    pub fn waiting_bytes(self) -> Option<u64> {
        match self {
            Self::Off => None,
            Self::Adaptive { waiting_bytes } => Some(waiting_bytes),
        }
    }
}

/// How to open a store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// The data directory (created if missing).
    pub data_dir: PathBuf,
    /// A segment is sealed and a new one started once it would pass this size.
    pub segment_bytes: u64,
    /// Frame alignment of new segments (direct under [`Policy::RecordLru`] with an SSD budget, whatever
    /// this says: a punch frees only the pages a frame owns).
    pub alignment: Alignment,
    /// Payload compression of new segments.
    pub compression: Compression,
    /// Sync policy.
    pub durability: Durability,
    /// Records the index should hold without rebuilding its tables.
    pub index_capacity: usize,
    /// The manifest is rewritten as one checkpoint after this many records.
    pub checkpoint_every: u64,
    /// Open without changing anything on disk (no truncation, no sealing; puts are refused), for
    /// inspection. The directory is still locked.
    pub read_only: bool,
    /// The SSD tier's budget: segment files never outgrow it (beyond one bundle being written),
    /// whole segments being reclaimed by `policy`. `None`: unbounded (the disk is the limit).
    pub ssd_bytes: Option<u64>,
    /// The DRAM tier's budget for copies of hot payloads (0: no DRAM tier).
    pub dram_bytes: u64,
    /// Which segments the SSD tier reclaims when full.
    pub policy: Policy,
    /// SSD admission (with [`Policy::RecordLru`] and an SSD budget only).
    pub admission: Admission,
}

impl StoreConfig {
    /// Defaults for `data_dir`: 256 MiB packed segments, no compression, a sync per put.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            alignment: Alignment::Packed,
            compression: Compression::None,
            durability: Durability::EveryPut,
            index_capacity: 0,
            checkpoint_every: manifest::CHECKPOINT_EVERY,
            read_only: false,
            ssd_bytes: None,
            dram_bytes: 0,
            policy: Policy::RecordLru,
            admission: Admission::Off,
        }
    }
}

/// The segment size of [`StoreConfig::new`].
pub const DEFAULT_SEGMENT_BYTES: u64 = 256 << 20;
/// Largest segment size accepted: index entries address offsets below 32 GiB, and a segment
/// may exceed its size by one bundle.
pub const MAX_SEGMENT_BYTES: u64 = 16 << 30;
/// Largest bundle (sum of payloads) accepted in one put.
pub const MAX_BUNDLE_BYTES: u64 = 1 << 30;
/// Record and manifest sequences stay below this: a billion a second would take over a century
/// to reach it. A sequence on disk at or above it is damage, and the store then refuses writes.
pub const SEQUENCE_LIMIT: u64 = 1 << 62;
/// Smallest SSD budget accepted.
pub const MIN_SSD_BYTES: u64 = 1 << 20;
/// With an SSD budget, a segment is at most this fraction of it, so reclaiming one segment
/// frees little of what is still wanted (measured on the shared trace: 1/64 keeps within 0.2%
/// of the hit ratio of finer segments, 1/8 loses 2–6%).
pub const SEGMENTS_PER_BUDGET: u64 = 64;
/// With an SSD budget under [`Policy::RecordLru`], a segment is at most this fraction of it. Records
/// leave one at a time, so a segment need not be small for reclaim to be fine-grained; a
/// segment kept alive by a few records costs its header, footer and trailer, fewer for fewer
/// segments (measured in a model on the policy matrix: a 16th keeps ≥ 1.0× LRU from 16 KiB
/// records, a 64th from 32 KiB).
pub const RECORD_LRU_SEGMENTS_PER_BUDGET: u64 = 16;
/// The SSD budget under which the segments hold `records` records of `payload_len` bytes each
/// (one namespace per segment) on average over reclaim cycles, at `alignment` and the default
/// segment size (a [`SEGMENTS_PER_BUDGET`]th of the budget at most).
///
/// A record takes its frame and its footer entry; each segment adds a header, a footer and a
/// trailer, and seals early by the room its footer would need for one more record. A cache
/// that counts payload blocks only (a simulated LRU of `records` blocks) holds as many.
pub fn ssd_bytes_holding(records: u64, payload_len: u64, alignment: Alignment) -> u64 {
    let held = |budget| ssd_records_held(budget, payload_len, alignment);
    let (mut low, mut high) = (MIN_SSD_BYTES, MIN_SSD_BYTES);
    while held(high) < records && high < u64::MAX / 4 {
        high *= 2;
    }
    while low < high {
        let mid = low + (high - low) / 2;
        if held(mid) >= records {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    high
}

/// Records of `payload_len` bytes an SSD budget of `budget` bytes holds on average over
/// reclaim cycles (the inverse of [`ssd_bytes_holding`]).
pub fn ssd_records_held(budget: u64, payload_len: u64, alignment: Alignment) -> u64 {
    // No record is larger than a segment: this bounds every product below.
    let payload_len = payload_len.min(MAX_SEGMENT_BYTES);
    let segment = (budget / SEGMENTS_PER_BUDGET).clamp(8 << 10, DEFAULT_SEGMENT_BYTES);
    let per_segment = records_per_segment(segment, payload_len, alignment);
    let file = sealed_file_bytes(per_segment, payload_len, alignment);
    // Reclaim frees a whole segment: on average half of one is free.
    let segments = budget.saturating_sub(file / 2) / file.max(1);
    segments.saturating_mul(per_segment)
}

/// Records of `payload_len` bytes a segment of `segment_bytes` takes before it seals (the seal
/// check keeps room for the footer of one more record, with a namespace summary per entry).
fn records_per_segment(segment_bytes: u64, payload_len: u64, alignment: Alignment) -> u64 {
    let unit = alignment.unit() as u64;
    let frame = frame_bytes(payload_len, alignment);
    let entry = (INDEX_ENTRY_LEN + NAMESPACE_SUMMARY_LEN) as u64;
    let first = SEGMENT_HEADER_LEN as u64
        + (FRAME_HEADER_LEN as u64 + payload_len + unit)
        + (FOOTER_FIXED_LEN + 4 + TRAILER_LEN) as u64
        + entry
        + unit;
    1 + segment_bytes.saturating_sub(first) / (frame + entry)
}

/// Bytes of one record's frame: its header and payload, padded to the alignment.
fn frame_bytes(payload_len: u64, alignment: Alignment) -> u64 {
    let unit = alignment.unit() as u64;
    (FRAME_HEADER_LEN as u64 + payload_len).div_ceil(unit) * unit
}

/// Bytes of a sealed segment file holding `records` records of `payload_len` bytes.
fn sealed_file_bytes(records: u64, payload_len: u64, alignment: Alignment) -> u64 {
    let frame = frame_bytes(payload_len, alignment);
    SEGMENT_HEADER_LEN as u64
        + records * (frame + INDEX_ENTRY_LEN as u64)
        + (FOOTER_FIXED_LEN + NAMESPACE_SUMMARY_LEN + 4 + TRAILER_LEN) as u64
}

/// After the disk reported no space, puts are refused for this long before one is tried again.
pub const NO_SPACE_RETRY: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_past_the_segment_cap_and_absurd_inputs_stay_sane() {
        // 1 TiB of 16 KiB records in 256 MiB segments: the segments' fixed bytes cost under
        // half a percent beside the records' frames and footer entries.
        let budget = 1u64 << 40;
        let held = ssd_records_held(budget, 16 << 10, Alignment::Packed);
        let ideal = budget / ((16 << 10) + (FRAME_HEADER_LEN + INDEX_ENTRY_LEN) as u64);
        assert!(
            held < ideal && held > ideal * 995 / 1000,
            "{held} of {ideal}"
        );
        assert_eq!(
            ssd_bytes_holding(held, 16 << 10, Alignment::Packed).div_ceil(1 << 30),
            1 << 10
        );
        // Nothing overflows or panics.
        let _ = ssd_records_held(u64::MAX, u64::MAX, Alignment::Direct);
        let _ = ssd_records_held(0, 0, Alignment::Packed);
        assert!(ssd_bytes_holding(0, 4096, Alignment::Packed) >= MIN_SSD_BYTES);
    }
}
