//! How big a request is, in tokens, when routing only sees its text.
//!
//! Token requests are exact. A text request is its character count divided by
//! `chars_per_token` (4 by default, rounded up): the reference credits a flat p̄ = 1024 to
//! every text request whatever its length, which overstates short chats and understates
//! long documents. A request with no prompt at all is credited p̄.

use crate::config::PolicyConfig;
use crate::snapshot::{PrefixMatches, RequestFacts, RoutingText};

/// The prompt's length in tokens; `None` when the request carries no prompt.
pub(crate) fn prompt_tokens(
    req: &RequestFacts,
    matches: Option<&PrefixMatches>,
    cfg: &PolicyConfig,
) -> Option<f64> {
    match &req.key {
        RoutingText::Tokens(t) => Some(t.len() as f64),
        RoutingText::Text(s) => {
            // The text tree already counted the chars (without any namespace marker).
            let chars = match matches {
                Some(m) if m.source.counts_chars() => m.input_len,
                _ => s.chars().count(),
            };
            Some(chars as f64 / chars_per_token(cfg))
        }
        RoutingText::Empty => None,
    }
}

/// Token-work to credit for dispatching the whole request: at least 1 token.
pub(crate) fn full_credit(
    req: &RequestFacts,
    matches: Option<&PrefixMatches>,
    cfg: &PolicyConfig,
) -> u64 {
    match prompt_tokens(req, matches, cfg) {
        Some(t) => to_credit(t),
        None => cfg.mean_prefill_tokens.max(1),
    }
}

/// Tokens of the prompt that a worker holding `matched` index units still has to prefill.
pub(crate) fn uncached_tokens(
    req: &RequestFacts,
    matches: Option<&PrefixMatches>,
    matched: usize,
    cfg: &PolicyConfig,
) -> f64 {
    match matches {
        Some(m) if m.input_len > 0 => {
            let units = m.input_len.saturating_sub(matched) as f64;
            if m.source.counts_chars() {
                units / chars_per_token(cfg)
            } else {
                units
            }
        }
        _ => prompt_tokens(req, matches, cfg).unwrap_or(cfg.mean_prefill_tokens as f64),
    }
}

/// A token estimate rounded up to a credit of at least 1.
pub(crate) fn to_credit(tokens: f64) -> u64 {
    if tokens.is_finite() && tokens > 1.0 {
        tokens.ceil().min(u64::MAX as f64) as u64
    } else {
        1
    }
}

fn chars_per_token(cfg: &PolicyConfig) -> f64 {
    let c = cfg.chars_per_token;
    if c.is_finite() && c > 0.0 { c } else { 4.0 }
}
