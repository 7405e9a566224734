//! Store-free models: the one-log reclaim policy (`fifo-reinsert`) and the default,
//! `record-lru`, per block, the latter with SSD admission as an option, to measure admission
//! rules on every cell; and reference policies without segments (CLOCK, ARC, LRU evicting a
//! chain's deepest blocks first), to measure how close any online policy gets to per-block LRU.
//!
//! The log is cut into segments of a [`SEGMENTS`]th of the capacity, as the store cuts its
//! budget. When the blocks pass the capacity the oldest segment is reclaimed: a block read since
//! it was written is copied forward (written again at the head), the others are dropped.
//! Hits are the present prefix of each request; the missing blocks after it are written.
//!
//! With admission, a block seen for the first time while the SSD tier is full is not written:
//! it waits in a DRAM tier of a tenth of the capacity (LRU), and a ghost remembers its key for
//! twice the capacity in blocks. It is written when asked for while in the DRAM tier (a hit
//! there), or when published again while the ghost remembers it. Without admission there is no
//! DRAM tier in the model: the store's DRAM tier holds copies of SSD records, which add no hits.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use orbitkv_store::AdmissionChooser;

/// Segments per capacity, as the store's budget.
const SEGMENTS: usize = orbitkv_store::SEGMENTS_PER_BUDGET as usize;

/// What one run of the model measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Modelled {
    /// Blocks referenced.
    pub block_refs: u64,
    /// Blocks hit (the present prefix of each request, either tier).
    pub hits: u64,
    /// Blocks written to the SSD log, copies forward included.
    pub ssd_writes: u64,
}

impl Modelled {
    /// Hits per reference.
    pub(crate) fn hit_ratio(&self) -> f64 {
        if self.block_refs == 0 {
            0.0
        } else {
            self.hits as f64 / self.block_refs as f64
        }
    }

    /// SSD blocks written per block hit (the same as bytes per byte: blocks are one size);
    /// `None` without hits.
    pub(crate) fn writes_per_hit(&self) -> Option<f64> {
        (self.hits > 0).then(|| self.ssd_writes as f64 / self.hits as f64)
    }
}

/// The SSD log: segments of block ids, oldest first, the last one active.
struct Log {
    segment_blocks: usize,
    capacity: usize,
    segments: VecDeque<(u64, Vec<u64>)>,
    next_segment: u64,
    /// Each present block's segment.
    at: HashMap<u64, u64>,
    read: HashSet<u64>,
    blocks: usize,
    writes: u64,
}

impl Log {
    fn new(capacity: usize, segment_blocks: usize) -> Self {
        Self {
            segment_blocks: segment_blocks.max(1),
            capacity,
            segments: VecDeque::new(),
            next_segment: 0,
            at: HashMap::new(),
            read: HashSet::new(),
            blocks: 0,
            writes: 0,
        }
    }

    fn append(&mut self, id: u64) {
        let full = self
            .segments
            .back()
            .is_none_or(|(_, s)| s.len() >= self.segment_blocks);
        if full {
            self.segments.push_back((self.next_segment, Vec::new()));
            self.next_segment += 1;
        }
        if let Some((seg, blocks)) = self.segments.back_mut() {
            blocks.push(id);
            self.at.insert(id, *seg);
        }
        self.blocks += 1;
        self.writes += 1;
    }

    /// Writes `id` and reclaims the oldest sealed segments while the log is over capacity.
    fn write(&mut self, id: u64) {
        self.append(id);
        while self.blocks > self.capacity && self.segments.len() > 1 {
            let Some((seg, blocks)) = self.segments.pop_front() else {
                break;
            };
            self.blocks -= blocks.len();
            for b in blocks {
                if self.at.get(&b) != Some(&seg) {
                    continue;
                }
                if self.read.remove(&b) {
                    self.append(b);
                } else {
                    self.at.remove(&b);
                }
            }
        }
    }
}

/// First-time blocks waiting for admission, and the ghost of their keys.
struct Admission {
    dram: Recency,
    dram_blocks: usize,
    ghost: HashSet<u64>,
    ghost_order: VecDeque<u64>,
    ghost_blocks: usize,
}

impl Admission {
    fn new(capacity: usize) -> Self {
        Self {
            dram: Recency::default(),
            dram_blocks: (capacity / 10).max(1),
            ghost: HashSet::new(),
            ghost_order: VecDeque::new(),
            ghost_blocks: 2 * capacity.max(1),
        }
    }

    fn take(&mut self, id: u64) -> bool {
        self.dram.remove(id)
    }

    /// Whether `id` is to be written now (the ghost remembered it, or `hold` is off); else it
    /// waits in DRAM. Either way the ghost remembers it.
    fn publish(&mut self, id: u64, hold: bool) -> bool {
        if self.ghost.remove(&id) {
            return true;
        }
        if hold {
            self.dram.touch(id);
            while self.dram.len() > self.dram_blocks {
                self.dram.pop_oldest();
            }
        }
        if self.ghost.insert(id) {
            self.ghost_order.push_back(id);
        }
        while self.ghost_order.len() > self.ghost_blocks {
            if let Some(old) = self.ghost_order.pop_front() {
                self.ghost.remove(&old);
            }
        }
        !hold
    }
}

/// Runs the model of `fifo-reinsert` over `trace` at `capacity` blocks.
pub(crate) fn fifo_reinsert(trace: &[Vec<u64>], capacity: usize) -> Modelled {
    let capacity = capacity.max(1);
    one_log(trace, Log::new(capacity, capacity / SEGMENTS))
}

/// Runs per-block CLOCK over `trace` at `capacity` blocks: the model of `fifo-reinsert` with
/// segments of one block, so no block leaves with a segment.
pub(crate) fn clock(trace: &[Vec<u64>], capacity: usize) -> Modelled {
    one_log(trace, Log::new(capacity.max(1), 1))
}

/// Runs `log` over `trace`.
fn one_log(trace: &[Vec<u64>], mut log: Log) -> Modelled {
    let mut out = Modelled::default();
    for ids in trace {
        out.block_refs += ids.len() as u64;
        let hit = ids.iter().take_while(|id| log.at.contains_key(id)).count();
        out.hits += hit as u64;
        for (i, &id) in ids.iter().enumerate() {
            if i < hit {
                log.read.insert(id);
            } else if !log.at.contains_key(&id) {
                log.write(id);
            }
        }
    }
    out.ssd_writes = log.writes;
    out
}

/// When the model of `record-lru` holds first-time blocks back from the SSD tier (only ever
/// while the tier is full: while it has room, a write evicts nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Every block is written.
    Never,
    /// Every first-time block waits ([`Admission`]).
    Always,
    /// First-time blocks wait while shadows on a sample of the keys say that holding them back
    /// loses no hit: the store's own [`AdmissionChooser`] decides.
    Chosen,
}

/// The model of `record-lru` at one capacity, with the DRAM tier admission fills.
struct RecordLru {
    capacity: usize,
    ssd: Recency,
    adm: Admission,
    write: Vec<bool>,
}

impl RecordLru {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            ssd: Recency::default(),
            adm: Admission::new(capacity),
            write: Vec::new(),
        }
    }

    fn present(&self, id: u64) -> bool {
        self.ssd.contains(id) || self.adm.dram.contains(id)
    }

    /// One request: returns its hits and the blocks it wrote to SSD. With `hold` and the SSD
    /// tier full, first-time blocks wait in DRAM; else they are written (blocks already
    /// waiting still wait).
    fn request(&mut self, ids: &[u64], hold: bool) -> (u64, u64) {
        let hold = hold && self.ssd.len() >= self.capacity;
        let hit = ids.iter().take_while(|&&id| self.present(id)).count();
        self.write.clear();
        for (i, &id) in ids.iter().enumerate() {
            let now = if i < hit {
                // Asked for again while waiting in DRAM: admitted.
                self.adm.take(id)
            } else {
                !self.present(id) && self.adm.publish(id, hold)
            };
            self.write.push(now);
        }
        let mut writes = 0;
        // Deepest first: the request's root is its most recent block.
        for (&id, &now) in ids.iter().zip(&self.write).rev() {
            if now || self.ssd.contains(id) {
                writes += u64::from(!self.ssd.contains(id));
                self.ssd.touch(id);
                while self.ssd.len() > self.capacity {
                    self.ssd.pop_oldest();
                }
            }
        }
        (hit as u64, writes)
    }
}

/// Runs the model of `record-lru` (deepest-first LRU per block, [`DeepestFirstLru`]) over
/// `trace` at `capacity` blocks, first-time blocks held back from the SSD tier as `admit` says;
/// a block held back hits only while it waits in DRAM.
pub(crate) fn record_lru(trace: &[Vec<u64>], capacity: usize, admit: Admit) -> Modelled {
    let capacity = capacity.max(1);
    let mut cache = RecordLru::new(capacity);
    // The store's chooser, every block one unit long: the SSD tier holds `capacity` of them.
    let mut chooser = (admit == Admit::Chosen).then(|| {
        let c = capacity as u64;
        AdmissionChooser::new(c, c / 10, 1)
    });
    let mut out = Modelled::default();
    for ids in trace {
        out.block_refs += ids.len() as u64;
        let hold = match &mut chooser {
            Some(c) => {
                for &id in ids {
                    c.reference(id, 1);
                }
                c.holds()
            }
            None => admit == Admit::Always,
        };
        let (hits, writes) = cache.request(ids, hold);
        out.hits += hits;
        out.ssd_writes += writes;
    }
    out
}

/// Block ids in recency order: the least recent first out.
#[derive(Default)]
struct Recency {
    tick: u64,
    at: HashMap<u64, u64>,
    order: BTreeMap<u64, u64>,
}

impl Recency {
    fn len(&self) -> usize {
        self.at.len()
    }

    fn contains(&self, id: u64) -> bool {
        self.at.contains_key(&id)
    }

    /// Makes `id` the most recent (adding it if absent).
    fn touch(&mut self, id: u64) {
        self.remove(id);
        self.tick += 1;
        self.at.insert(id, self.tick);
        self.order.insert(self.tick, id);
    }

    fn remove(&mut self, id: u64) -> bool {
        match self.at.remove(&id) {
            Some(t) => {
                self.order.remove(&t);
                true
            }
            None => false,
        }
    }

    fn pop_oldest(&mut self) -> Option<u64> {
        let (_, id) = self.order.pop_first()?;
        self.at.remove(&id);
        Some(id)
    }
}

/// Per-block ARC (Megiddo and Modha, FAST 2003): blocks seen once (`t1`) and more than once
/// (`t2`), each in recency order, with ghosts of the keys each recently dropped (`b1`, `b2`);
/// a hit on a ghost moves the target size of `t1` (`p`) toward the list it came from.
struct ArcCache {
    capacity: usize,
    p: usize,
    t1: Recency,
    t2: Recency,
    b1: Recency,
    b2: Recency,
}

impl ArcCache {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            p: 0,
            t1: Recency::default(),
            t2: Recency::default(),
            b1: Recency::default(),
            b2: Recency::default(),
        }
    }

    fn holds(&self, id: u64) -> bool {
        self.t1.contains(id) || self.t2.contains(id)
    }

    /// Drops the oldest block of `t1` or `t2` to its ghost, as ARC's REPLACE does.
    fn replace(&mut self, ghost_of_t2: bool) {
        let from_t1 = self.t1.len() > 0
            && (self.t1.len() > self.p || (ghost_of_t2 && self.t1.len() == self.p));
        if (from_t1 || self.t2.len() == 0)
            && let Some(id) = self.t1.pop_oldest()
        {
            self.b1.touch(id);
        } else if let Some(id) = self.t2.pop_oldest() {
            self.b2.touch(id);
        }
    }

    /// One reference to `id`; returns whether it was a miss that entered the cache.
    fn reference(&mut self, id: u64) -> bool {
        let c = self.capacity;
        if self.t1.remove(id) || self.t2.contains(id) {
            self.t2.touch(id);
            return false;
        }
        if self.b1.contains(id) {
            let step = (self.b2.len() / self.b1.len()).max(1);
            self.p = (self.p + step).min(c);
            self.replace(false);
            self.b1.remove(id);
            self.t2.touch(id);
            return true;
        }
        if self.b2.contains(id) {
            let step = (self.b1.len() / self.b2.len()).max(1);
            self.p = self.p.saturating_sub(step);
            self.replace(true);
            self.b2.remove(id);
            self.t2.touch(id);
            return true;
        }
        let l1 = self.t1.len() + self.b1.len();
        let all = l1 + self.t2.len() + self.b2.len();
        if l1 >= c {
            if self.t1.len() < c {
                self.b1.pop_oldest();
                self.replace(false);
            } else {
                self.t1.pop_oldest();
            }
        } else if all >= c {
            if all >= 2 * c {
                self.b2.pop_oldest();
            }
            self.replace(false);
        }
        self.t1.touch(id);
        true
    }
}

/// A cache the models run per block: hits are the present prefix of each request; then the
/// cache sees every block of it.
trait PerBlock {
    fn holds(&self, id: u64) -> bool;
    /// One request's blocks; returns how many of them entered the cache (misses written).
    fn request(&mut self, ids: &[u64]) -> u64;
}

impl PerBlock for ArcCache {
    fn holds(&self, id: u64) -> bool {
        ArcCache::holds(self, id)
    }

    fn request(&mut self, ids: &[u64]) -> u64 {
        ids.iter().map(|&id| u64::from(self.reference(id))).sum()
    }
}

/// LRU that sees each request's blocks deepest first: of blocks last used together, a chain's
/// root leaves last (as a radix tree evicts leaves first).
struct DeepestFirstLru {
    capacity: usize,
    cache: Recency,
}

impl PerBlock for DeepestFirstLru {
    fn holds(&self, id: u64) -> bool {
        self.cache.contains(id)
    }

    fn request(&mut self, ids: &[u64]) -> u64 {
        let mut entered = 0;
        for &id in ids.iter().rev() {
            entered += u64::from(!self.cache.contains(id));
            self.cache.touch(id);
            while self.cache.len() > self.capacity {
                self.cache.pop_oldest();
            }
        }
        entered
    }
}

/// Deepest-first LRU over a log whose evicted records are freed at once (as punching a hole
/// in their segment would free them), so the capacity counts live blocks only. The log keeps
/// at most [`SEGMENTS`] segments of a [`SEGMENTS`]th of the capacity, as the store's budget
/// assumes: past that, the sealed segment with the fewest live blocks is compacted (its live
/// blocks written again at the head, their recency kept). A segment with no live block is
/// deleted. Hits are [`lru_deepest_first`]'s; what the model adds is the writes.
struct PunchedLog {
    capacity: usize,
    cache: Recency,
    segment_blocks: usize,
    /// Live blocks of each segment, oldest first; the last one is active.
    segments: BTreeMap<u64, HashSet<u64>>,
    /// Each live block's segment.
    at: HashMap<u64, u64>,
    active_fill: usize,
    next_segment: u64,
    writes: u64,
}

impl PunchedLog {
    fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            cache: Recency::default(),
            segment_blocks: capacity.div_ceil(SEGMENTS).max(1),
            segments: BTreeMap::new(),
            at: HashMap::new(),
            active_fill: usize::MAX,
            next_segment: 0,
            writes: 0,
        }
    }

    /// Writes `id` at the head of the log.
    fn append(&mut self, id: u64) {
        if self.active_fill >= self.segment_blocks {
            self.next_segment += 1;
            self.segments.insert(self.next_segment, HashSet::new());
            self.active_fill = 0;
        }
        self.active_fill += 1;
        self.writes += 1;
        if let Some(s) = self.segments.get_mut(&self.next_segment) {
            s.insert(id);
        }
        if let Some(old) = self.at.insert(id, self.next_segment) {
            self.free(id, old);
        }
    }

    /// Frees `id`'s record in segment `seg`, deleting a sealed segment left empty.
    fn free(&mut self, id: u64, seg: u64) {
        if let Some(s) = self.segments.get_mut(&seg) {
            s.remove(&id);
            if s.is_empty() && seg != self.next_segment {
                self.segments.remove(&seg);
            }
        }
    }

    /// Compacts the sparsest sealed segments while there are too many.
    fn bound_segments(&mut self) {
        // Each round deletes one segment and adds at most one.
        for _ in 0..self.segments.len() {
            if self.segments.len() <= SEGMENTS {
                return;
            }
            let Some((&seg, _)) = self
                .segments
                .iter()
                .filter(|(s, _)| **s != self.next_segment)
                .min_by_key(|(_, live)| live.len())
            else {
                return;
            };
            let live: Vec<u64> = self
                .segments
                .remove(&seg)
                .map(|s| s.into_iter().collect())
                .unwrap_or_default();
            for id in live {
                self.at.remove(&id);
                self.append(id);
            }
        }
    }
}

impl PerBlock for PunchedLog {
    fn holds(&self, id: u64) -> bool {
        self.cache.contains(id)
    }

    fn request(&mut self, ids: &[u64]) -> u64 {
        // As DeepestFirstLru, noting the blocks that enter and those evicted.
        let (mut fresh, mut evicted) = (Vec::new(), Vec::new());
        for &id in ids.iter().rev() {
            if !self.cache.contains(id) {
                fresh.push(id);
            }
            self.cache.touch(id);
            while self.cache.len() > self.capacity {
                evicted.extend(self.cache.pop_oldest());
            }
        }
        for id in evicted {
            if let Some(seg) = self.at.remove(&id) {
                self.free(id, seg);
            }
        }
        // The missing blocks are written in chain order.
        for id in fresh.into_iter().rev() {
            if self.cache.contains(id) {
                self.append(id);
            }
        }
        self.bound_segments();
        std::mem::take(&mut self.writes)
    }
}

/// Runs `cache` over `trace`.
fn per_block(trace: &[Vec<u64>], mut cache: impl PerBlock) -> Modelled {
    let mut out = Modelled::default();
    for ids in trace {
        out.block_refs += ids.len() as u64;
        out.hits += ids.iter().take_while(|id| cache.holds(**id)).count() as u64;
        out.ssd_writes += cache.request(ids);
    }
    out
}

/// Runs per-block ARC over `trace` at `capacity` blocks, each block referenced in request
/// order, as LRU's are.
pub(crate) fn arc(trace: &[Vec<u64>], capacity: usize) -> Modelled {
    per_block(trace, ArcCache::new(capacity.max(1)))
}

/// Runs deepest-first LRU over segments whose evicted records are punched out ([`PunchedLog`]).
pub(crate) fn punched_lru(trace: &[Vec<u64>], capacity: usize) -> Modelled {
    per_block(trace, PunchedLog::new(capacity))
}

/// Runs per-block LRU over `trace` at `capacity` blocks, each request's blocks referenced
/// deepest first ([`DeepestFirstLru`]).
pub(crate) fn lru_deepest_first(trace: &[Vec<u64>], capacity: usize) -> Modelled {
    let cache = DeepestFirstLru {
        capacity: capacity.max(1),
        cache: Recency::default(),
    };
    per_block(trace, cache)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_blocks_are_copied_forward_and_unread_ones_dropped() {
        // Capacity 64: segments of one block. Block 1 is read, 2 is not; 64 more fill the log.
        let mut trace = vec![vec![1], vec![2], vec![1]];
        trace.extend((100..164).map(|i| vec![i]));
        trace.push(vec![1]);
        trace.push(vec![2]);
        let m = fifo_reinsert(&trace, 64);
        // Hits: block 1 twice (its second read finds the copy); block 2 was dropped.
        assert_eq!(m.hits, 2);
        // Writes: 66 first writes, block 1 once more (copied), block 2 again (missed).
        assert_eq!(m.ssd_writes, 66 + 1 + 1);
    }

    #[test]
    fn admission_holds_first_time_blocks_back_only_while_the_ssd_is_full() {
        // Capacity 20 (a DRAM tier of 2 blocks): the first 20 blocks fill the SSD and are
        // written; the next 30 wait in DRAM, the last two of them still there.
        let mut trace: Vec<Vec<u64>> = (0..50).map(|i| vec![i]).collect();
        trace.push(vec![49]);
        let m = record_lru(&trace, 20, Admit::Always);
        assert_eq!(m.hits, 1, "block 49 waits in the DRAM tier");
        assert_eq!(m.ssd_writes, 20 + 1, "and is admitted when asked for");
        let m = record_lru(&trace, 20, Admit::Never);
        assert_eq!((m.hits, m.ssd_writes), (1, 50));
        // Published again after leaving DRAM, while the ghost remembers it: written.
        let mut trace: Vec<Vec<u64>> = (0..50).map(|i| vec![i]).collect();
        trace.push(vec![30]);
        let m = record_lru(&trace, 20, Admit::Always);
        assert_eq!((m.hits, m.ssd_writes), (0, 20 + 1));
    }

    #[test]
    fn chosen_admission_holds_back_where_nothing_returns_and_not_where_turns_do() {
        use crate::tracegen::{Params, Shape, generate, stats};
        let trace =
            |p: &Params| -> Vec<Vec<u64>> { generate(p).into_iter().map(|r| r.hash_ids).collect() };
        let one_shot = trace(&Params::new(Shape::OneShot, 1, 2_000));
        let (never, chosen) = (
            record_lru(&one_shot, 1_000, Admit::Never),
            record_lru(&one_shot, 1_000, Admit::Chosen),
        );
        assert_eq!((never.hits, chosen.hits), (0, 0), "nothing comes back");
        assert!(
            chosen.ssd_writes * 10 < never.ssd_writes,
            "{chosen:?} {never:?}"
        );
        // Conversations of 600 users at a quarter of the blocks: a turn held back is gone
        // from DRAM before the user returns, so holding back loses; the shadows see it.
        let mut p = Params::new(Shape::MultiTurn, 1, 4_000);
        (p.users, p.message_blocks, p.turns) = (600, 16, 4);
        let turns = trace(&p);
        let quarter = stats(&turns).distinct as usize / 4;
        let (never, always, chosen) = (
            record_lru(&turns, quarter, Admit::Never),
            record_lru(&turns, quarter, Admit::Always),
            record_lru(&turns, quarter, Admit::Chosen),
        );
        assert!(always.hits * 100 < never.hits * 97, "{always:?} {never:?}");
        assert!(chosen.hits * 100 >= never.hits * 97, "{chosen:?} {never:?}");
    }

    #[test]
    fn clock_gives_a_read_block_a_second_pass() {
        // Capacity 4: block 1 is read, then four new blocks come. The fourth reclaims block 1,
        // which is copied behind it (LRU would drop it); block 2, unread, leaves instead.
        let trace = vec![
            vec![1],
            vec![1],
            vec![2],
            vec![3],
            vec![4],
            vec![5],
            vec![1],
        ];
        assert_eq!(clock(&trace, 4).hits, 2);
        let trace = vec![vec![1], vec![2], vec![3], vec![4], vec![5], vec![1]];
        assert_eq!(clock(&trace, 4).hits, 0, "unread blocks leave in order");
    }

    #[test]
    fn arc_keeps_a_reused_set_through_a_scan() {
        // Blocks 0..4 used twice, then a scan of 100 new blocks, then 0..4 again: ARC keeps
        // them in t2 (the scan only churns t1); LRU would have dropped them.
        let mut trace: Vec<Vec<u64>> = (0..4).map(|i| vec![i]).collect();
        trace.extend((0..4).map(|i| vec![i]));
        trace.extend((100..200).map(|i| vec![i]));
        trace.extend((0..4).map(|i| vec![i]));
        let m = arc(&trace, 8);
        assert_eq!(m.hits, 4 + 4);
        assert_eq!(lru_deepest_first(&trace, 8).hits, 4);
    }

    #[test]
    fn arc_never_holds_more_than_its_capacity() {
        let mut cache = ArcCache::new(16);
        for i in 0..2_000u64 {
            cache.reference((i * 7919) % 97);
            assert!(cache.t1.len() + cache.t2.len() <= 16);
            assert!(cache.t1.len() + cache.t2.len() + cache.b1.len() + cache.b2.len() <= 32);
        }
    }

    #[test]
    fn a_punched_log_hits_as_deepest_first_lru_and_compacts_sparse_segments() {
        // One hot chain read between runs of one-time blocks: LRU keeps the chain, so the
        // segments it was written in stay, each holding a little of it, until compacted.
        let mut trace = Vec::new();
        for round in 0..200u64 {
            trace.push(vec![1, 2, 3]);
            trace.push((0..40).map(|i| 1_000 + round * 40 + i).collect());
        }
        let lru = lru_deepest_first(&trace, 256);
        let punched = punched_lru(&trace, 256);
        assert_eq!(punched.hits, lru.hits);
        // Writes: every miss once, and the live blocks of compacted segments again: a few
        // blocks a round, not a rewrite of the log (256 blocks) as copying forward by LRU
        // rank costs.
        assert!(punched.ssd_writes > lru.ssd_writes, "{punched:?} {lru:?}");
        assert!(
            punched.ssd_writes < lru.ssd_writes + 200 * 8,
            "{punched:?} {lru:?}"
        );
        let mut log = PunchedLog::new(256);
        for ids in &trace {
            log.request(ids);
        }
        assert!(log.segments.len() <= SEGMENTS);
        let live: usize = log.segments.values().map(HashSet::len).sum();
        assert_eq!(live, log.cache.len());
    }

    #[test]
    fn the_record_lru_model_is_deepest_first_lru() {
        let p = crate::tracegen::Params::new(crate::tracegen::Shape::OneShot, 1, 300);
        let trace: Vec<Vec<u64>> = crate::tracegen::generate(&p)
            .into_iter()
            .map(|r| r.hash_ids)
            .collect();
        let plain = record_lru(&trace, 500, Admit::Never);
        assert_eq!(plain, lru_deepest_first(&trace, 500));
        // Capacity 10: the SSD tier is full after the first request, and a DRAM tier of one
        // block holds 11 back until it is asked for, then it is written.
        let reused = vec![(1..=10).collect(), vec![11], vec![11], vec![11]];
        let m = record_lru(&reused, 10, Admit::Always);
        assert_eq!((m.hits, m.ssd_writes), (2, 11));
    }

    #[test]
    fn lru_deepest_first_drops_a_chain_from_its_end() {
        // Capacity 3: chain 1-2-3, then one new block pushes out the chain's last block, not
        // its root, so the next request still hits 1-2.
        let trace = vec![vec![1, 2, 3], vec![9], vec![1, 2, 3]];
        assert_eq!(lru_deepest_first(&trace, 3).hits, 2);
    }
}
