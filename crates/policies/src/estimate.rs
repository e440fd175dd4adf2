//! How big a request is, in tokens, when routing only sees its text.
//!
//! Token requests are exact. A text request is its UTF-8 length in bytes divided by
//! `bytes_per_token` (4 by default, rounded up); bytes are the text tree's unit too, cost
//! nothing to count, and for scripts of several bytes per character come closer to a
//! tokenizer than characters do. The reference credits a flat p̄ = 1024 to every text
//! request whatever its length, which overstates short chats and understates long
//! documents. A request with no prompt at all is credited p̄.

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
            // The text tree already measured the text (without any namespace marker).
            let bytes = match matches {
                Some(m) if m.source.is_text() => m.input_len,
                _ => s.len(),
            };
            Some(bytes as f64 / bytes_per_token(cfg))
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
            if units_are_bytes(req) {
                units / bytes_per_token(cfg)
            } else {
                units
            }
        }
        _ => prompt_tokens(req, matches, cfg).unwrap_or(cfg.mean_prefill_tokens as f64),
    }
}

/// Whether the index measured this request in bytes of text rather than tokens. It is
/// the request that decides, not the index that answered: the hash index measures a text
/// prompt in bytes too, although it holds nothing for it.
pub(crate) fn units_are_bytes(req: &RequestFacts) -> bool {
    matches!(req.key, RoutingText::Text(_))
}

/// A token estimate rounded up to a credit of at least 1.
pub(crate) fn to_credit(tokens: f64) -> u64 {
    if tokens.is_finite() && tokens > 1.0 {
        tokens.ceil().min(u64::MAX as f64) as u64
    } else {
        1
    }
}

pub(crate) fn bytes_per_token(cfg: &PolicyConfig) -> f64 {
    let c = cfg.bytes_per_token;
    if c.is_finite() && c > 0.0 { c } else { 4.0 }
}

/// Whether `matched` index units of `req` are a useful match: at least `min_match_tokens`
/// tokens (bytes converted at the configured rate).
pub(crate) fn useful(req: &RequestFacts, matched: usize, cfg: &PolicyConfig) -> bool {
    let tokens = if units_are_bytes(req) {
        matched as f64 / bytes_per_token(cfg)
    } else {
        matched as f64
    };
    matched > 0 && tokens >= cfg.min_match_tokens as f64
}
