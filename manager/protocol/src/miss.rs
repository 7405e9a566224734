//! The miss reasons: why a Query found nothing to restore (docs/protocol.md, "Miss reasons").
//! Each reason has a wire code from 1 and a name.
//! The daemon's metrics and the simulated engine name misses with these.

use orbitkv_state::Recompute;

/// Miss reason names, by code from 1 (docs/protocol.md, "Miss reasons").
pub const MISS_REASONS: [&str; 10] = [
    "nothing_beyond_origin",
    "unsupported_component",
    "gap",
    "overlap",
    "duplicate",
    "past_end",
    "missing_rank",
    "window_incomplete",
    "no_checkpoint",
    "no_common_boundary",
];

/// The wire code of a recompute reason (docs/protocol.md, "Miss reasons").
pub fn miss_code(r: &Recompute) -> u16 {
    match r {
        Recompute::NothingBeyondOrigin => 1,
        Recompute::UnsupportedComponent { .. } => 2,
        Recompute::Gap { .. } => 3,
        Recompute::Overlap { .. } => 4,
        Recompute::Duplicate { .. } => 5,
        Recompute::PastEnd { .. } => 6,
        Recompute::MissingRank { .. } => 7,
        Recompute::WindowIncomplete { .. } => 8,
        Recompute::NoCheckpoint { .. } => 9,
        Recompute::NoCommonBoundary => 10,
    }
}

/// The name of miss reason `code`, if it has one.
pub fn miss_reason_name(code: u16) -> Option<&'static str> {
    usize::from(code)
        .checked_sub(1)
        .and_then(|i| MISS_REASONS.get(i))
        .copied()
}
