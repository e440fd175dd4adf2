//! prefix_hash: the ring owner of the request's head, with a bounded-load fallback.
//!
//! The head is, in order of preference:
//! - a usable routing key (see `consistent_hashing`);
//! - for token requests with `cache_boundaries`, the first `b` tokens for every boundary
//!   `b` the request reaches, deepest first;
//! - otherwise the first `prefix_token_count` tokens, or for text the first
//!   `prefix_token_count × bytes_per_token` bytes (cut back to a character boundary).
//!
//! Each head is hashed (xxh3_64 of the u32 little-endian ids, or of the UTF-8 bytes) to a
//! ring position. A worker is **acceptable** when
//! `in_flight ≤ max(avg · prefix_hash_load_factor, avg + prefix_hash_balance_abs_threshold)`
//! with `avg = (Σ in_flight + 1) / n_eligible` (everyone is acceptable when nothing is in
//! flight). The first acceptable ring target, deepest head first, wins (path `hash`);
//! else the least-loaded acceptable worker (path `spill`); else the deepest target
//! regardless (path `hash`). Without a ring or a head: the least-loaded eligible worker
//! (path `fallback`). In-flight ties are drawn uniformly.

use rand::{Rng, RngCore};

use crate::config::PolicyConfig;
use crate::consistent_hashing::valid_routing_key;
use crate::decision::{CandidateScore, Decision, DecisionPath};
use crate::input::SelectInput;
use crate::ring::HashRing;
use crate::snapshot::{RequestFacts, RoutingText, WorkerView};

pub(crate) fn select(
    cfg: &PolicyConfig,
    input: &SelectInput<'_>,
    rng: &mut dyn RngCore,
) -> Decision {
    let eligible: Vec<&WorkerView> = input.workers.iter().filter(|w| w.eligible).collect();
    if eligible.is_empty() {
        return Decision::none();
    }
    let total: f64 = eligible.iter().map(|w| w.in_flight as f64).sum();
    let avg = (total + 1.0) / eligible.len() as f64;
    let limit =
        (avg * cfg.prefix_hash_load_factor).max(avg + cfg.prefix_hash_balance_abs_threshold as f64);
    let acceptable = |w: &WorkerView| total == 0.0 || w.in_flight as f64 <= limit;
    let candidates: Vec<CandidateScore> = eligible
        .iter()
        .map(|w| CandidateScore::new(w.id, w.in_flight))
        .collect();
    let decide = |w: &WorkerView, path| Decision {
        candidates: candidates.clone(),
        ..Decision::simple(w.id, path)
    };

    let heads = head_positions(cfg, input.request);
    let ring = input.ring.filter(|r| !r.is_empty());
    let (Some(ring), false) = (ring, heads.is_empty()) else {
        return least_loaded(&eligible, rng)
            .map_or_else(Decision::none, |w| decide(w, DecisionPath::Fallback));
    };
    let view = |id| eligible.iter().copied().find(|w| w.id == id);
    let mut deepest = None;
    for pos in heads {
        let Some(target) = ring.owner(pos, |id| view(id).is_some()).and_then(view) else {
            continue;
        };
        deepest.get_or_insert(target);
        if acceptable(target) {
            return decide(target, DecisionPath::Hash);
        }
    }
    let open: Vec<&WorkerView> = eligible.iter().copied().filter(|w| acceptable(w)).collect();
    if let Some(w) = least_loaded(&open, rng) {
        let path = if deepest.is_some() {
            DecisionPath::Spill
        } else {
            DecisionPath::Fallback
        };
        return decide(w, path);
    }
    match deepest.or_else(|| least_loaded(&eligible, rng)) {
        Some(w) => decide(w, DecisionPath::Hash),
        None => Decision::none(),
    }
}

/// Ring positions of the request's heads, deepest first; empty when there is nothing to
/// hash.
pub(crate) fn head_positions(cfg: &PolicyConfig, req: &RequestFacts) -> Vec<u64> {
    if let Some(key) = valid_routing_key(req.routing_key.as_deref()) {
        return vec![HashRing::position(key.as_bytes())];
    }
    match &req.key {
        RoutingText::Tokens(t) if !t.is_empty() => {
            let boundaries = cfg.applicable_boundaries(t.len());
            let fixed = t.len().min(cfg.prefix_token_count.max(1));
            let deepest = boundaries.last().copied().unwrap_or(fixed);
            let bytes: Vec<u8> = t[..deepest].iter().flat_map(|x| x.to_le_bytes()).collect();
            if boundaries.is_empty() {
                vec![HashRing::position(&bytes)]
            } else {
                boundaries
                    .iter()
                    .rev()
                    .map(|&b| HashRing::position(&bytes[..4 * b]))
                    .collect()
            }
        }
        RoutingText::Text(s) if !s.is_empty() => {
            let want = (cfg.prefix_token_count as f64 * cfg.bytes_per_token).max(1.0) as usize;
            vec![HashRing::position(s.head(want).as_bytes())]
        }
        _ => Vec::new(),
    }
}

/// The worker with the fewest in flight; ties drawn uniformly.
fn least_loaded<'w>(set: &[&'w WorkerView], rng: &mut dyn RngCore) -> Option<&'w WorkerView> {
    let min = set.iter().map(|w| w.in_flight).min()?;
    let tied: Vec<&WorkerView> = set.iter().copied().filter(|w| w.in_flight == min).collect();
    let k = if tied.len() > 1 {
        rng.gen_range(0..tied.len())
    } else {
        0
    };
    tied.get(k).copied()
}

#[cfg(test)]
mod tests;
