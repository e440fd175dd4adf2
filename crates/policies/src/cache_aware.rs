//! cache_aware: prefix affinity, traded against load.
//!
//! The selector filters the fleet to the workers that serve the request's model, asks that
//! model's index (one per served model: a text tree, a token tree, or the hash-mode
//! holder map) for [`PrefixMatches`], and calls this policy. Steps:
//!
//! 1. E = the eligible workers; none eligible → no worker.
//! 2. **KV pressure** (only if a KV threshold is set, see `gate`): expected wait over all
//!    of E, ungated, path `kv_pressure`. The request is still recorded in the index.
//! 3. By `cache_mode`:
//!    - `threshold` (reference-compatible), below; when no matches were passed (the
//!      index was not consulted): expected wait over the ungated workers, path
//!      `fallback`, nothing recorded;
//!    - `cost` (threshold-free, the default), see the `cost` module; with no matches it
//!      prices every worker as holding nothing, path `fallback`, nothing recorded.
//!
//! Threshold mode, tree index (text or tokens):
//! - rate = best / input_len, where best is the deepest match among eligible workers
//!   (a shallower eligible holder still counts when the deepest one is down);
//! - **hit** iff rate > `cache_threshold` (strict): the holders at the best depth, minus
//!   gated ones, are chosen among by expected wait (path `hit`);
//! - every holder gated → **spill**: expected wait over the ungated workers of E, which
//!   never reselects a hot holder (path `spill`);
//! - rate ≤ threshold → **miss**: expected wait over the ungated workers of E (path
//!   `miss`). Gating misses bounds a burst of novel prompts by the same margins as a spill.
//! - Whoever is chosen is recorded (`record_prefix`), so a spill replicates a hot prefix.
//!
//! Threshold mode, hash index: the threshold does not apply; any live holder at the
//! deepest boundary is affinity. Holders minus gated → path `hash`; all gated → `spill`;
//! no holder → `miss`. A request that reaches no configured boundary (untokenized, or
//! shorter than the first) is a miss with nothing recorded.
//!
//! Credit: the whole prompt (exact tokens, or bytes / `bytes_per_token` for text, p̄ when
//! unknown). The match rate reported is the chosen worker's matched units / input units.

use rand::RngCore;

use crate::config::{CacheMode, PolicyConfig};
use crate::cost;
use crate::decision::{CandidateScore, Decision, DecisionNote, DecisionPath};
use crate::estimate;
use crate::gate::{Gate, kv_pressure};
use crate::snapshot::{MatchSource, PrefixMatches, RoutingText, SelectInput};
use crate::wait::{Few, Fleet, Pick};

/// Everything one cache_aware decision reads, computed once.
#[derive(Debug)]
pub(crate) struct Ctx<'a> {
    pub cfg: &'a PolicyConfig,
    pub input: &'a SelectInput<'a>,
    pub fleet: Fleet<'a>,
    pub gate: Gate,
    /// Matched units per worker index (0 for non-holders and ineligible workers).
    pub matched: Few<usize>,
}

impl<'a> Ctx<'a> {
    pub(crate) fn matches(&self) -> Option<&'a PrefixMatches> {
        self.input.matches
    }

    /// Whether the request reaches a configured hash boundary.
    pub(crate) fn hash_applicable(&self) -> bool {
        let tokens = match &self.input.request.key {
            RoutingText::Tokens(t) => t.len(),
            _ => 0,
        };
        !self.cfg.applicable_boundaries(tokens).is_empty()
    }

    /// Whether the index should record the chosen worker for this request.
    pub(crate) fn recordable(&self) -> bool {
        match self.matches().map(|m| m.source) {
            None => false,
            Some(MatchSource::Hash { .. }) => self.hash_applicable(),
            Some(MatchSource::TextTree | MatchSource::TokenTree) => true,
        }
    }

    /// The eligible workers holding any part of the prompt.
    pub(crate) fn holders(&self) -> Few<usize> {
        self.fleet
            .eligible
            .iter()
            .copied()
            .filter(|&i| self.matched[i] > 0)
            .collect()
    }

    pub(crate) fn ungated_eligible(&self) -> Few<usize> {
        self.gate.ungated(&self.fleet, &self.fleet.eligible)
    }

    /// Matched units / input units for worker index `i`.
    pub(crate) fn match_rate(&self, i: usize) -> Option<f64> {
        let m = self.matches()?;
        Some(if m.input_len == 0 {
            0.0
        } else {
            (self.matched[i] as f64 / m.input_len as f64).min(1.0)
        })
    }

    /// One entry per eligible worker, with its match and gate verdict.
    pub(crate) fn candidates(&self) -> Vec<CandidateScore> {
        let has_matches = self.matches().is_some();
        self.fleet
            .eligible
            .iter()
            .map(|&i| {
                let w = &self.fleet.workers[i];
                CandidateScore {
                    matched: has_matches.then_some(self.matched[i]),
                    gated: self.gate.gated(w.in_flight),
                    ..CandidateScore::new(w.id, w.in_flight)
                }
            })
            .collect()
    }

    /// EW(set) with the whole prompt as credit.
    fn by_wait(
        &self,
        set: &[usize],
        path: DecisionPath,
        record: bool,
        rng: &mut dyn RngCore,
    ) -> Decision {
        let Some(pick) = self.fleet.pick_by_wait(set, rng) else {
            return Decision::none();
        };
        let credit = estimate::full_credit(self.input.request, self.matches(), self.cfg);
        self.decide(&pick, path, credit, record)
    }

    /// The decision for `pick`, with every eligible worker listed.
    pub(crate) fn decide(
        &self,
        pick: &Pick,
        path: DecisionPath,
        credit_tokens: u64,
        record_prefix: bool,
    ) -> Decision {
        let mut candidates = self.candidates();
        for (i, score) in &pick.scored {
            let id = self.fleet.workers[*i].id;
            if let Some(c) = candidates.iter_mut().find(|c| c.worker == id) {
                c.score = Some(*score);
            }
        }
        Decision {
            worker: Some(self.fleet.workers[pick.worker].id),
            path,
            candidates,
            match_rate: self.match_rate(pick.worker),
            credit_tokens,
            record_prefix,
            rule: None,
            new_prefix: false,
            notes: Vec::new(),
        }
    }
}

/// The cache_aware policy.
pub(crate) fn select(
    cfg: &PolicyConfig,
    input: &SelectInput<'_>,
    rng: &mut dyn RngCore,
) -> Decision {
    let fleet = Fleet::new(input.workers, cfg);
    if fleet.eligible.is_empty() {
        return Decision::none();
    }
    let gate = Gate::new(&fleet, cfg);
    let mut matched = Few::from_elem(0, input.workers.len());
    if let Some(m) = input.matches {
        for &i in &fleet.eligible {
            matched[i] = m.matched(input.workers[i].id);
        }
    }
    let ctx = Ctx {
        cfg,
        input,
        fleet,
        gate,
        matched,
    };
    let mut d = if kv_pressure(&ctx.fleet, cfg) {
        let all = ctx.fleet.eligible.clone();
        ctx.by_wait(&all, DecisionPath::KvPressure, ctx.recordable(), rng)
    } else {
        match cfg.cache_mode {
            CacheMode::Threshold => threshold(&ctx, rng),
            CacheMode::Cost => cost::select(&ctx, rng),
        }
    };
    let hash_index = input
        .matches
        .is_some_and(|m| matches!(m.source, MatchSource::Hash { .. }));
    if hash_index && matches!(input.request.key, RoutingText::Text(_)) {
        d.notes.push(DecisionNote::TextNotHashed);
    }
    d
}

/// The reference-compatible pipeline: threshold, gate, expected wait.
fn threshold(ctx: &Ctx<'_>, rng: &mut dyn RngCore) -> Decision {
    let Some(m) = ctx.matches() else {
        return ctx.by_wait(&ctx.ungated_eligible(), DecisionPath::Fallback, false, rng);
    };
    let (holders, hit_path) = match m.source {
        MatchSource::Hash { .. } => {
            if !ctx.hash_applicable() {
                return ctx.by_wait(&ctx.ungated_eligible(), DecisionPath::Miss, false, rng);
            }
            (ctx.holders(), DecisionPath::Hash)
        }
        MatchSource::TextTree | MatchSource::TokenTree => {
            let best = ctx
                .fleet
                .eligible
                .iter()
                .map(|&i| ctx.matched[i])
                .max()
                .unwrap_or(0);
            let rate = if m.input_len == 0 {
                0.0
            } else {
                best as f64 / m.input_len as f64
            };
            let holders = if best > 0 && rate > ctx.cfg.cache_threshold {
                ctx.fleet
                    .eligible
                    .iter()
                    .copied()
                    .filter(|&i| ctx.matched[i] == best)
                    .collect()
            } else {
                Few::new()
            };
            (holders, DecisionPath::Hit)
        }
    };
    if holders.is_empty() {
        return ctx.by_wait(&ctx.ungated_eligible(), DecisionPath::Miss, true, rng);
    }
    let safe: Few<usize> = holders
        .iter()
        .copied()
        .filter(|&i| !ctx.gate.gated(ctx.fleet.in_flight(i)))
        .collect();
    if safe.is_empty() {
        ctx.by_wait(&ctx.ungated_eligible(), DecisionPath::Spill, true, rng)
    } else {
        ctx.by_wait(&safe, hit_path, true, rng)
    }
}

#[cfg(test)]
mod tests;
