//! The count-pressure gate and the fleet-wide KV-pressure trigger.
//!
//! Count gate: with `avg` the mean of `requests` over the eligible workers,
//!
//! ```text
//! requests(w) = max(in_flight(w), running(w) + waiting(w) + dispatched_since_sample(w))  fresh report
//!             = in_flight(w)                                                            otherwise
//! gated(w)   ⇔ requests(w) > avg · balance_rel_threshold  AND  requests(w) > avg + balance_abs_threshold
//! ```
//!
//! `in_flight` is this gateway's own; the engine's counts are every gateway's. With
//! several replicas in front of one fleet, a gate on own counts alone lets each replica
//! pile its margin onto the same engine; the engine's report is the truth they share, and
//! each adds only what it dispatched since that report was taken.
//!
//! Both margins must clear, so the gate ignores small-count noise but still fires on a
//! deep queue. It removes a too-hot holder from a hit (the request spills), and it bounds
//! misses the same way: a burst of novel prompts cannot pile more than the margins onto the
//! fastest worker, because a miss chooses only among ungated workers too. That bound does
//! not hold under the KV-pressure fallback below, which is ungated on purpose. If the gate
//! would remove everyone (it cannot with a consistent snapshot, but counts may be odd), it
//! removes no one.
//!
//! KV pressure: over the eligible workers that have a report, with `usage` the mean KV
//! usage over ranks, the fleet is under pressure when the hottest exceeds
//! `overload_token_usage_threshold` or the spread (hottest − coldest) exceeds
//! `balance_token_usage_threshold`. Both are off by default. Under pressure cache_aware
//! ignores affinity and chooses by expected wait over every eligible worker, **ungated**:
//! the in-flight gate could otherwise push traffic onto a KV-saturated engine.

use crate::config::PolicyConfig;
use crate::wait::{Few, Fleet};

/// The gate for one decision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gate {
    avg: f64,
    rel: f64,
    abs: f64,
}

impl Gate {
    pub(crate) fn new(fleet: &Fleet<'_>, cfg: &PolicyConfig) -> Gate {
        let n = fleet.eligible.len().max(1) as f64;
        let total: f64 = fleet
            .eligible
            .iter()
            .map(|&i| fleet.requests(i) as f64)
            .sum();
        Gate {
            avg: total / n,
            rel: cfg.balance_rel_threshold,
            abs: cfg.balance_abs_threshold as f64,
        }
    }

    pub(crate) fn gated(&self, in_flight: u64) -> bool {
        let f = in_flight as f64;
        f > self.avg * self.rel && f > self.avg + self.abs
    }

    /// The members of `set` that are not gated, or `set` itself if that leaves none.
    pub(crate) fn ungated(&self, fleet: &Fleet<'_>, set: &[usize]) -> Few<usize> {
        let open: Few<usize> = set
            .iter()
            .copied()
            .filter(|&i| !self.gated(fleet.requests(i)))
            .collect();
        if open.is_empty() {
            Few::from_slice(set)
        } else {
            open
        }
    }
}

/// Whether the fleet's KV usage triggers the ungated load fallback.
pub(crate) fn kv_pressure(fleet: &Fleet<'_>, cfg: &PolicyConfig) -> bool {
    if cfg.balance_token_usage_threshold.is_none() && cfg.overload_token_usage_threshold.is_none() {
        return false;
    }
    let mut usages = fleet
        .eligible
        .iter()
        .filter_map(|&i| fleet.load(i).map(|l| l.usage));
    let Some(first) = usages.next() else {
        return false;
    };
    let (min, max) = usages.fold((first, first), |(lo, hi), u| (lo.min(u), hi.max(u)));
    cfg.overload_token_usage_threshold.is_some_and(|t| max > t)
        || cfg
            .balance_token_usage_threshold
            .is_some_and(|t| max - min > t)
}
