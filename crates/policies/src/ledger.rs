//! Credit bookkeeping: work dispatched to a worker since its last load sample.
//!
//! A load report is a poll old. Until the next one arrives, the selector credits each
//! dispatch's `Decision::credit_tokens` to the chosen worker, and policies read the sum as
//! `WorkerView::credit`. When a report arrives, the dispatches it already covers are
//! released: those at or before its sample instant. Later ones stay (the report cannot
//! have seen them). A report with no sample instant releases everything. At most
//! [`CreditLedger::MAX_DISPATCHES`] dispatches are kept per worker; the oldest drop first.
//!
//! This is a plain data structure owned by the selector: no clock, no lock. Times are the
//! selector's monotonic clock, the same one that stamps `WorkerLoad::sampled_at`.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::decision::Decision;
use kvgate_core::WorkerId;

use crate::snapshot::Credit;

/// Per-worker dispatches since the last sample.
#[derive(Debug, Clone, Default)]
pub struct CreditLedger {
    workers: HashMap<WorkerId, Tally>,
}

#[derive(Debug, Clone, Default)]
struct Tally {
    dispatches: VecDeque<(Duration, u64)>,
    tokens: u64,
}

impl Tally {
    fn resum(&mut self) {
        self.tokens = self
            .dispatches
            .iter()
            .fold(0u64, |s, (_, t)| s.saturating_add(*t));
    }
}

impl CreditLedger {
    /// Dispatches kept per worker.
    pub const MAX_DISPATCHES: usize = 8192;

    pub fn new() -> CreditLedger {
        CreditLedger::default()
    }

    /// Credits `tokens` of work dispatched to `worker` at `at`.
    pub fn record(&mut self, worker: WorkerId, tokens: u64, at: Duration) {
        let t = self.workers.entry(worker).or_default();
        t.dispatches.push_back((at, tokens));
        t.tokens = t.tokens.saturating_add(tokens);
        if t.dispatches.len() > Self::MAX_DISPATCHES
            && let Some((_, old)) = t.dispatches.pop_front()
        {
            t.tokens = t.tokens.saturating_sub(old);
        }
    }

    /// Credits a decision's work to its chosen worker (nothing if it chose none).
    pub fn apply(&mut self, decision: &Decision, at: Duration) {
        if let Some(w) = decision.worker {
            self.record(w, decision.credit_tokens, at);
        }
    }

    /// A new report for `worker` was published: release what its sample covers.
    pub fn on_report(&mut self, worker: WorkerId, sampled_at: Option<Duration>) {
        let Some(t) = self.workers.get_mut(&worker) else {
            return;
        };
        match sampled_at {
            Some(s) => {
                t.dispatches.retain(|(at, _)| *at > s);
                t.resum();
            }
            None => {
                t.dispatches.clear();
                t.tokens = 0;
            }
        }
    }

    /// A dispatch finished before any report covered it: its work is neither queued nor
    /// going to show up in a later report, so its credit goes now. Removes one dispatch
    /// booked at `at` for `tokens`; nothing if a report already released it.
    pub fn release(&mut self, worker: WorkerId, at: Duration, tokens: u64) {
        let Some(t) = self.workers.get_mut(&worker) else {
            return;
        };
        if let Some(i) = t
            .dispatches
            .iter()
            .position(|(a, tok)| *a == at && *tok == tokens)
        {
            t.dispatches.remove(i);
            t.tokens = t.tokens.saturating_sub(tokens);
        }
    }

    /// Work dispatched to `worker` since its last report.
    pub fn credit(&self, worker: WorkerId) -> Credit {
        self.workers
            .get(&worker)
            .map_or_else(Credit::default, |t| Credit {
                tokens: t.tokens,
                requests: t.dispatches.len() as u64,
            })
    }

    /// Forgets a worker (removed from the fleet).
    pub fn remove(&mut self, worker: WorkerId) {
        self.workers.remove(&worker);
    }

    /// Forgets every worker.
    pub fn clear(&mut self) {
        self.workers.clear();
    }
}

#[cfg(test)]
mod tests;
