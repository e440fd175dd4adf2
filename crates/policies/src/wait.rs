//! Expected wait: the load score shared by least_load, power_of_two and cache_aware.
//!
//! For a candidate set C (the workers a policy is choosing among):
//!
//! ```text
//! live(w)    = n_ranks(w) × mean gen_throughput of w's running ranks that report a rate
//!              above 0 (0 when there is none)
//! rank(C)    = mean live(w) / n_ranks(w) over w in C with a report and live(w) > 0,
//!              least_load_default_throughput if there is none
//! nominal(C) = mean live(w) over the same workers, least_load_default_throughput if none
//! rate(w)    = live(w) if > 0, else rank(C) × n_ranks(w)
//! queued(w)  = Σ_r num_waiting_uncached_tokens, or, if that is 0, Σ_r num_waiting_reqs × p̄
//! k(w)       = clamp(mean_r token_usage, 0, 0.999)
//! D(w)       = credit.tokens: work dispatched since the report was sampled
//! score(w)   = (queued(w) + D(w)) / rate(w) + λ · k / (1 − k)    w has a report
//!            = B + in_flight(w) · p̄ / nominal(C)                 no report, some of C has one
//!            = in_flight(w)                                      nobody in C has a report
//! B          = min score over the reporting candidates
//! ```
//!
//! The lowest score wins; scores within 1e-6 of the minimum are ties, broken uniformly at
//! random with the injected RNG.
//!
//! Why each piece:
//! - An idle rank's `gen_throughput` is stale (SGLang leaves ~0.36 tok/s from its last
//!   health generation), so only running ranks give a live rate.
//! - A worker with no live rate is priced at its fellow candidates' mean live rate per
//!   rank, times its own ranks, not at a flat default: an idle worker beside a busy
//!   8000 tok/s peer of as many ranks is as fast as that peer, two idle workers reporting
//!   0.36 and 0 tok/s are equal, and in a fleet of mixed data-parallel sizes an idle
//!   one-rank worker is not priced at a two-rank peer's rate. A running rank reporting
//!   0 tok/s (a window not closed yet) gives no rate and is left out of the mean.
//! - Beyond the reference: a worker with some ranks busy and some idle counts every rank at
//!   its busy ranks' mean rate. The reference sums the busy ranks only, so a worker with
//!   spare ranks reads as slower than a fully busy peer.
//! - A worker with no fresh report is scored as the best reporter plus its own in-flight
//!   requests at p̄ tokens each, so it neither wins by default nor starves.

use rand::{Rng, RngCore};

use crate::config::PolicyConfig;
use crate::decision::{CandidateScore, Decision, DecisionPath};
use crate::snapshot::{RankLoad, WorkerLoad, WorkerView};

/// A decision's per-worker list: on the stack for fleets of up to 16 targets, so a
/// decision allocates only what it returns.
pub(crate) type Few<T> = smallvec::SmallVec<[T; 16]>;

/// Scores closer than this (seconds) are ties.
pub(crate) const TIE_EPSILON: f64 = 1e-6;

/// The scorer's knobs, read once per decision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params {
    pub lambda: f64,
    pub p_bar: f64,
    pub default_rate: f64,
    pub default_prefill_rate: f64,
}

impl Params {
    pub(crate) fn from_config(cfg: &PolicyConfig) -> Params {
        Params {
            lambda: nonneg(cfg.kv_pressure_weight),
            p_bar: cfg.mean_prefill_tokens.max(1) as f64,
            default_rate: positive_or(cfg.least_load_default_throughput, 2000.0),
            default_prefill_rate: positive_or(cfg.default_prefill_throughput, 10_000.0),
        }
    }
}

/// What one fresh report says, with every float made finite and non-negative.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Load {
    /// Decode rate (tok/s) of the whole worker; 0 when no rank is running.
    pub live_rate: f64,
    /// Queued uncached prompt tokens (or waiting requests × p̄).
    pub queued: f64,
    /// Mean KV usage, clamped to 0..=1.
    pub usage: f64,
    /// Waiting requests summed over ranks.
    pub waiting_reqs: f64,
    /// Running and waiting requests summed over ranks: every gateway's, at the sample.
    pub requests: f64,
    /// Number of data-parallel ranks (at least 1).
    pub ranks: f64,
    /// Mean per-rank prefill rate from the cumulative counters; 0 when unknown.
    pub prefill_rate: f64,
    /// Mean prefix-cache hit rate over ranks, 0..=1.
    pub hit_rate: f64,
}

impl Load {
    /// `None` for a report with no ranks, which says nothing.
    pub(crate) fn read(load: &WorkerLoad, p_bar: f64) -> Option<Load> {
        let ranks = &load.ranks;
        if ranks.is_empty() {
            return None;
        }
        let n = ranks.len() as f64;
        let uncached: f64 = ranks
            .iter()
            .map(|r| r.num_waiting_uncached_tokens as f64)
            .sum();
        let waiting_reqs: f64 = ranks.iter().map(|r| r.num_waiting_reqs as f64).sum();
        let running_reqs: f64 = ranks.iter().map(|r| r.num_running_reqs as f64).sum();
        let queued = if uncached > 0.0 {
            uncached
        } else {
            waiting_reqs * p_bar
        };
        let usage = ranks
            .iter()
            .map(|r| nonneg(r.token_usage).min(1.0))
            .sum::<f64>()
            / n;
        let (prefill_sum, prefill_n) = ranks
            .iter()
            .filter_map(rank_prefill_rate)
            .fold((0.0, 0usize), |(s, c), r| (s + r, c + 1));
        let prefill_rate = if prefill_n > 0 {
            prefill_sum / prefill_n as f64
        } else {
            0.0
        };
        let hit_rate = ranks
            .iter()
            .map(|r| nonneg(r.cache_hit_rate).min(1.0))
            .sum::<f64>()
            / n;
        Some(Load {
            live_rate: live_rate(ranks),
            queued,
            usage,
            waiting_reqs,
            requests: waiting_reqs + running_reqs,
            ranks: n,
            prefill_rate,
            hit_rate,
        })
    }

    /// λ · k / (1 − k), the KV-pressure barrier.
    pub(crate) fn kv_term(&self, lambda: f64) -> f64 {
        let k = self.usage.clamp(0.0, 0.999);
        lambda * k / (1.0 - k)
    }
}

/// The worker's live decode rate: every rank counted at the mean rate of its running ranks.
pub(crate) fn live_rate(ranks: &[RankLoad]) -> f64 {
    let (sum, busy) = ranks
        .iter()
        .filter(|r| r.num_running_reqs > 0)
        .map(|r| nonneg(r.gen_throughput))
        .filter(|g| *g > 0.0)
        .fold((0.0, 0usize), |(s, c), g| (s + g, c + 1));
    if busy == 0 {
        return 0.0;
    }
    sum / busy as f64 * ranks.len() as f64
}

/// Tokens per second of prefill busy time, from SGLang's cumulative counters.
fn rank_prefill_rate(r: &RankLoad) -> Option<f64> {
    if r.total_prefill_busy_us == 0 || r.total_prefill_uncached_tokens == 0 {
        return None;
    }
    let rate = r.total_prefill_uncached_tokens as f64 / (r.total_prefill_busy_us as f64 / 1e6);
    (rate.is_finite() && rate > 0.0).then_some(rate)
}

/// The eligible workers of one decision and what their reports say, read once.
#[derive(Debug)]
pub(crate) struct Fleet<'a> {
    pub workers: &'a [WorkerView],
    /// Indices into `workers` of the eligible ones, in snapshot order.
    pub eligible: Few<usize>,
    /// Per worker index; `None` for no (usable) report or not eligible.
    loads: Few<Option<Load>>,
    pub params: Params,
}

impl<'a> Fleet<'a> {
    pub(crate) fn new(workers: &'a [WorkerView], cfg: &PolicyConfig) -> Fleet<'a> {
        let params = Params::from_config(cfg);
        let eligible: Few<usize> = (0..workers.len())
            .filter(|&i| workers[i].eligible)
            .collect();
        let loads = workers
            .iter()
            .map(|w| {
                if !w.eligible {
                    return None;
                }
                w.load.as_ref().and_then(|l| Load::read(l, params.p_bar))
            })
            .collect();
        Fleet {
            workers,
            eligible,
            loads,
            params,
        }
    }

    pub(crate) fn load(&self, i: usize) -> Option<&Load> {
        self.loads.get(i).and_then(Option::as_ref)
    }

    pub(crate) fn in_flight(&self, i: usize) -> u64 {
        self.workers[i].in_flight
    }

    /// Requests on worker `i` as far as this gateway can tell: the engine's running and
    /// waiting requests at its fresh report (other gateways' among them) plus what this
    /// gateway dispatched since, or its own in flight when that is more or there is no
    /// report. Counting only its own would let N gateways each pile a gate's margin onto
    /// one engine.
    pub(crate) fn requests(&self, i: usize) -> u64 {
        let own = self.in_flight(i);
        match self.load(i) {
            Some(l) => own.max((l.requests as u64).saturating_add(self.workers[i].credit.requests)),
            None => own,
        }
    }

    /// The reference expected wait of each worker of `set` (indices into `workers`).
    pub(crate) fn expected_waits(&self, set: &[usize]) -> Few<f64> {
        let p = &self.params;
        // Per rank, so a worker with no live rate is priced by its own rank count: an idle
        // one-rank worker beside a busy two-rank peer is as fast as one of its ranks.
        let per_rank = mean_positive(
            set.iter()
                .filter_map(|&i| self.load(i).map(|l| l.live_rate / l.ranks)),
        );
        // A worker without a report has no rank count: it is priced at a reporting
        // worker's mean live rate.
        let nominal = mean_positive(
            set.iter()
                .filter_map(|&i| self.load(i).map(|l| l.live_rate)),
        )
        .unwrap_or(p.default_rate);
        let mut scores: Few<Option<f64>> = set
            .iter()
            .map(|&i| {
                self.load(i).map(|l| {
                    let rate = if l.live_rate > 0.0 {
                        l.live_rate
                    } else {
                        per_rank.unwrap_or(p.default_rate) * l.ranks
                    };
                    let credit = self.workers[i].credit.tokens as f64;
                    (l.queued + credit) / rate + l.kv_term(p.lambda)
                })
            })
            .collect();
        let baseline = scores.iter().flatten().copied().reduce(f64::min);
        for (s, &i) in scores.iter_mut().zip(set) {
            if s.is_none() {
                let f = self.in_flight(i) as f64;
                *s = Some(match baseline {
                    Some(b) => b + f * p.p_bar / nominal,
                    None => f,
                });
            }
        }
        scores.into_iter().map(|s| s.unwrap_or(f64::MAX)).collect()
    }

    /// EW(set): the expected-wait winner of `set` and every member's score.
    pub(crate) fn pick_by_wait(&self, set: &[usize], rng: &mut dyn RngCore) -> Option<Pick> {
        let scores = self.expected_waits(set);
        let at = argmin_uniform(&scores, rng)?;
        Some(Pick {
            worker: set[at],
            scored: set.iter().copied().zip(scores).collect(),
        })
    }
}

/// A winner (index into `workers`) and the scores it was compared on.
#[derive(Debug, Clone)]
pub(crate) struct Pick {
    pub worker: usize,
    pub scored: Few<(usize, f64)>,
}

impl Pick {
    /// A load decision listing the scored workers.
    pub(crate) fn into_decision(
        self,
        fleet: &Fleet<'_>,
        path: DecisionPath,
        credit_tokens: u64,
    ) -> Decision {
        let candidates = self
            .scored
            .iter()
            .map(|&(i, score)| {
                let w = &fleet.workers[i];
                CandidateScore {
                    score: Some(score),
                    ..CandidateScore::new(w.id, w.in_flight)
                }
            })
            .collect();
        Decision {
            worker: Some(fleet.workers[self.worker].id),
            path,
            candidates,
            match_rate: None,
            credit_tokens,
            record_prefix: false,
            rule: None,
            new_prefix: false,
            notes: Vec::new(),
        }
    }
}

/// Position of the minimum of `scores`; ties within [`TIE_EPSILON`] are drawn uniformly.
/// Non-finite scores lose to finite ones; if none is finite, all tie.
pub(crate) fn argmin_uniform(scores: &[f64], rng: &mut dyn RngCore) -> Option<usize> {
    if scores.is_empty() {
        return None;
    }
    let min = scores
        .iter()
        .copied()
        .filter(|s| s.is_finite())
        .reduce(f64::min);
    let tied = |s: f64| match min {
        Some(m) => s.is_finite() && s - m <= TIE_EPSILON,
        None => true,
    };
    let n = scores.iter().filter(|&&s| tied(s)).count();
    let k = if n > 1 { rng.gen_range(0..n) } else { 0 };
    scores
        .iter()
        .enumerate()
        .filter(|&(_, &s)| tied(s))
        .nth(k)
        .map(|(i, _)| i)
}

/// Mean of the positive, finite values, `None` if there is none.
pub(crate) fn mean_positive(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((0.0, 0usize), |(s, c), v| (s + v, c + 1));
    (n > 0).then(|| sum / n as f64)
}

/// `x` if finite and positive, else 0.
pub(crate) fn nonneg(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 { x } else { 0.0 }
}

fn positive_or(x: f64, fallback: f64) -> f64 {
    if x.is_finite() && x > 0.0 {
        x
    } else {
        fallback
    }
}

#[cfg(test)]
mod tests;
