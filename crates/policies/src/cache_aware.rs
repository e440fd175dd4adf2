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

use crate::adapter;
use crate::affinity::Ctx;
use crate::config::{CacheMode, PolicyConfig};
use crate::cost;
use crate::decision::{Decision, DecisionNote, DecisionPath};
use crate::estimate;
use crate::gate::{Gate, kv_pressure};
use crate::input::SelectInput;
use crate::snapshot::{MatchSource, RoutingText};
use crate::wait::{Few, Fleet};

/// The cache_aware policy.
pub(crate) fn select(
    cfg: &PolicyConfig,
    input: &SelectInput<'_>,
    rng: &mut dyn RngCore,
) -> Decision {
    let mut fleet = Fleet::new(input.workers, cfg);
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
    // A holder of the prompt under the adapter has the adapter's blocks: it fits as well
    // as an engine where the adapter is at work (a matched unit of a scoped request is one
    // of its own scope).
    let holds = |i: usize| estimate::useful(input.request, matched[i], cfg);
    let fit = adapter::narrow(&mut fleet, &gate, input.request.adapter.as_deref(), &holds);
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
    if let Some(fit) = fit {
        d.notes.push(DecisionNote::Adapter { fit });
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
        .filter(|&i| !ctx.gate.gated(ctx.fleet.requests(i)))
        .collect();
    if safe.is_empty() {
        ctx.by_wait(&ctx.ungated_eligible(), DecisionPath::Spill, true, rng)
    } else {
        ctx.by_wait(&safe, hit_path, true, rng)
    }
}

#[cfg(test)]
mod tests;
