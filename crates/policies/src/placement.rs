//! Where a prompt that no prefix decides starts: a rendezvous (highest random weight)
//! ranking of the candidates, keyed by the prompt's first block past what the index
//! matched and by each worker's URL.
//!
//! Gateway replicas share no index: each one's tree holds only what it routed. A prompt
//! new to one replica may already live on an engine another replica chose. Ranking the
//! candidates by a hash of the prompt's head and of the workers' URLs (the same strings in
//! every replica, unlike process-local ids) makes every replica prefer the same engine for
//! the same conversation or system prompt, with no message between them. The cost mode
//! ranks only among workers that never started a prefix (its rotation decides the rest),
//! so a single replica's placement stays even and the ranking is the tie-break.
//!
//! The key: units `[0, end)` of the prompt, with `end` the first block boundary past the
//! deepest match any candidate has (a block is `min_match_tokens` tokens, or as many bytes
//! as that many tokens take), capped at the prompt's length. A prompt nobody holds is
//! keyed by its first block; a conversation that shares only a system prompt with others
//! is keyed by the system prompt and the start of its own first message, which every
//! replica sees alike (their trees all hold the shared prompt, or none does).

use std::collections::HashMap;

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::config::PolicyConfig;
use crate::estimate;
use crate::snapshot::{RequestFacts, RoutingText, WorkerView};

/// The rendezvous key of `request`: a hash of its head up to the first block boundary
/// past `deepest` matched units; `None` for a request without a prompt.
pub(crate) fn key(request: &RequestFacts, deepest: usize, cfg: &PolicyConfig) -> Option<u64> {
    // A session's requests share its key, whatever their prompts.
    if let Some(s) = &request.session {
        return Some(xxh3_64(s.as_bytes()));
    }
    let tokens = cfg.min_match_tokens.max(1);
    match &request.key {
        RoutingText::Empty => None,
        RoutingText::Tokens(t) if t.is_empty() => None,
        RoutingText::Tokens(t) => {
            let end = boundary(deepest, tokens, t.len());
            let bytes: Vec<u8> = t[..end].iter().flat_map(|x| x.to_le_bytes()).collect();
            Some(xxh3_64(&bytes))
        }
        RoutingText::Text(s) if s.is_empty() => None,
        RoutingText::Text(s) => {
            let block = (tokens as f64 * estimate::bytes_per_token(cfg)).ceil() as usize;
            let end = boundary(deepest, block.max(1), s.len());
            Some(xxh3_64(s.head(end).as_bytes()))
        }
    }
}

/// The first multiple of `block` above `deepest`, at most `len`.
fn boundary(deepest: usize, block: usize, len: usize) -> usize {
    (deepest / block + 1).saturating_mul(block).min(len)
}

/// Each worker's rendezvous weight for `key`, in `workers` order. The weight depends on
/// the worker's URL alone (and, for data-parallel ranks that share one URL, on the rank's
/// place among them), so every replica computes the same for the same fleet in any order.
pub(crate) fn weights(key: u64, workers: &[WorkerView]) -> Vec<u64> {
    // Earlier workers of each URL, counted as the walk goes: a scan of the earlier ones
    // per worker was quadratic, 60 µs of a decision at 256 engines.
    let mut seen: HashMap<&str, u64> = HashMap::with_capacity(workers.len());
    workers
        .iter()
        .map(|w| {
            let count = seen.entry(&*w.url).or_insert(0);
            let nth = *count;
            *count += 1;
            xxh3_64_with_seed(
                w.url.as_bytes(),
                key ^ nth.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            )
        })
        .collect()
}

/// Rank (0 = first choice) of each member of `set` (indices into `weights`) among `set`.
pub(crate) fn ranks(weights: &[u64], set: &[usize]) -> Vec<u32> {
    // The members' weights sorted once, each rank the count above its own: n log n where a
    // count per member was n².
    let mut sorted: Vec<u64> = set.iter().map(|&i| weights[i]).collect();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    set.iter()
        .map(|&i| sorted.partition_point(|&w| w > weights[i]) as u32)
        .collect()
}

#[cfg(test)]
mod tests;
