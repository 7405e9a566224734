//! Counters the store keeps, for metrics and for tests that check the failure policy exactly.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters.
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) puts: AtomicU64,
    pub(crate) put_records: AtomicU64,
    pub(crate) put_bytes: AtomicU64,
    pub(crate) refused_puts: AtomicU64,
    pub(crate) lost_records: AtomicU64,
    pub(crate) gets: AtomicU64,
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) checksum_failures: AtomicU64,
    pub(crate) read_errors: AtomicU64,
    pub(crate) quarantined_segments: AtomicU64,
    pub(crate) open_bytes_read: AtomicU64,
    pub(crate) open_payload_bytes: AtomicU64,
    pub(crate) torn_tails_truncated: AtomicU64,
    pub(crate) corrupt_records: AtomicU64,
    pub(crate) dram_hits: AtomicU64,
    pub(crate) capacity_refusals: AtomicU64,
    pub(crate) reclaimed_segments: AtomicU64,
    pub(crate) recycled_segments: AtomicU64,
    pub(crate) evicted_records: AtomicU64,
    pub(crate) reinserted_records: AtomicU64,
    pub(crate) punched_records: AtomicU64,
    pub(crate) punched_bytes: AtomicU64,
    pub(crate) failed_punches: AtomicU64,
    pub(crate) held_records: AtomicU64,
    pub(crate) admitted_records: AtomicU64,
    pub(crate) dropped_waiting: AtomicU64,
    pub(crate) pins: AtomicU64,
    pub(crate) failed_deletes: AtomicU64,
    pub(crate) failed_dir_syncs: AtomicU64,
    pub(crate) failed_stats: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Bundles accepted.
    pub puts: u64,
    /// Records accepted.
    pub put_records: u64,
    /// Payload bytes accepted.
    pub put_bytes: u64,
    /// Bundles refused (no space, writes refused after a failed sync).
    pub refused_puts: u64,
    /// Accepted records dropped because a sync failed before they were durable.
    pub lost_records: u64,
    /// Lookups.
    pub gets: u64,
    /// Lookups that returned verified bytes.
    pub hits: u64,
    /// Lookups that returned nothing.
    pub misses: u64,
    /// Reads whose bytes failed verification (the record is dropped from the index).
    pub checksum_failures: u64,
    /// Reads that failed with an I/O error (the segment is quarantined).
    pub read_errors: u64,
    /// Segments quarantined (on open or after read errors).
    pub quarantined_segments: u64,
    /// Bytes read while opening the store.
    pub open_bytes_read: u64,
    /// Stored payload bytes of the records indexed on open.
    pub open_payload_bytes: u64,
    /// Torn tails truncated on open.
    pub torn_tails_truncated: u64,
    /// Corrupt records found (and skipped) on open.
    pub corrupt_records: u64,
    /// Hits served from the DRAM tier.
    pub dram_hits: u64,
    /// Puts refused because the SSD tier was full of pinned or active segments.
    pub capacity_refusals: u64,
    /// Segments reclaimed by the SSD tier's policy.
    pub reclaimed_segments: u64,
    /// New segments written over a reclaimed segment's file (the spare).
    pub recycled_segments: u64,
    /// Records dropped by reclaiming.
    pub evicted_records: u64,
    /// Records copied forward by reclaiming.
    pub reinserted_records: u64,
    /// Evicted records punched out of their segments (`lru`).
    pub punched_records: u64,
    /// File bytes those punches gave back.
    pub punched_bytes: u64,
    /// Punches that failed (the bytes stay counted until the segment goes).
    pub failed_punches: u64,
    /// Records put that waited in DRAM instead of being written (SSD admission).
    pub held_records: u64,
    /// Waiting records written once read.
    pub admitted_records: u64,
    /// Waiting records the waiting room let go unwritten.
    pub dropped_waiting: u64,
    /// Pins taken.
    pub pins: u64,
    /// Segment files the store meant to delete (compaction, reclaim, salvage) but could not.
    /// Such a file stays counted in the SSD budget until it is gone; `fsck --repair` removes it.
    pub failed_deletes: u64,
    /// Directory fsyncs after deleting segment files that failed. The deletions may then not
    /// survive a power loss; a file that comes back is an orphan, counted in the SSD budget.
    pub failed_dir_syncs: u64,
    /// Size queries (stat) of a segment file that failed. The SSD budget then counts the size
    /// the manifest or the writer knows for it, or a whole configured segment, never 0.
    pub failed_stats: u64,
}

impl Stats {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// A snapshot.
    pub fn snapshot(&self) -> StatsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            puts: g(&self.puts),
            put_records: g(&self.put_records),
            put_bytes: g(&self.put_bytes),
            refused_puts: g(&self.refused_puts),
            lost_records: g(&self.lost_records),
            gets: g(&self.gets),
            hits: g(&self.hits),
            misses: g(&self.misses),
            checksum_failures: g(&self.checksum_failures),
            read_errors: g(&self.read_errors),
            quarantined_segments: g(&self.quarantined_segments),
            open_bytes_read: g(&self.open_bytes_read),
            open_payload_bytes: g(&self.open_payload_bytes),
            torn_tails_truncated: g(&self.torn_tails_truncated),
            corrupt_records: g(&self.corrupt_records),
            dram_hits: g(&self.dram_hits),
            capacity_refusals: g(&self.capacity_refusals),
            reclaimed_segments: g(&self.reclaimed_segments),
            recycled_segments: g(&self.recycled_segments),
            evicted_records: g(&self.evicted_records),
            reinserted_records: g(&self.reinserted_records),
            punched_records: g(&self.punched_records),
            punched_bytes: g(&self.punched_bytes),
            failed_punches: g(&self.failed_punches),
            held_records: g(&self.held_records),
            admitted_records: g(&self.admitted_records),
            dropped_waiting: g(&self.dropped_waiting),
            pins: g(&self.pins),
            failed_deletes: g(&self.failed_deletes),
            failed_dir_syncs: g(&self.failed_dir_syncs),
            failed_stats: g(&self.failed_stats),
        }
    }
}
