//! The input of one decision: the request's facts and the snapshot it is decided on.

use std::time::Duration;

use crate::ring::HashRing;
use crate::snapshot::{PrefixMatches, RequestFacts, WorkerView};

/// Everything one decision reads. Time and the dispatch sequence come in here so that
/// policies never read a clock or keep a counter of their own.
///
/// Build it with [`SelectInput::new`] and struct update syntax
/// (`SelectInput { seq, ..SelectInput::new(&workers, &request) }`), so that fields added
/// later do not break callers.
#[derive(Debug, Clone, Copy)]
pub struct SelectInput<'a> {
    pub workers: &'a [WorkerView],
    pub request: &'a RequestFacts,
    /// What the prefix index reported for this request (cache_aware only).
    pub matches: Option<&'a PrefixMatches>,
    /// Dispatch sequence number, used by round_robin.
    pub seq: u64,
    /// Now, on the selector's monotonic clock.
    pub now: Duration,
    /// The fleet's hash ring (consistent_hashing, prefix_hash), rebuilt by the selector
    /// only when the set of workers changes.
    pub ring: Option<&'a HashRing>,
}

impl<'a> SelectInput<'a> {
    /// An input with no prefix matches, no ring, sequence 0 and time 0.
    pub fn new(workers: &'a [WorkerView], request: &'a RequestFacts) -> SelectInput<'a> {
        SelectInput {
            workers,
            request,
            matches: None,
            seq: 0,
            now: Duration::ZERO,
            ring: None,
        }
    }
}
