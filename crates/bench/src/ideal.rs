//! The best hit rate a run allows: an upper bound, computed from what was sent and answered,
//! in the token ids the engines computed and generated.
//!
//! A request can be served from cache at most the tokens its prompt shares with the prompt
//! plus answer of some request sent before it (an engine caches only what it computed),
//! page-aligned, no more than the engine's pool holds, and never its last token (an engine
//! recomputes at least one). Any routing, on any fleet of engines with that page size and
//! pool, reaches at most this; a real engine reaches less (its answer's last token has no
//! KV, the cache evicts, concurrent requests miss what is still prefilling).

use std::collections::BTreeSet;
use std::ops::Bound;

use serde::{Deserialize, Serialize};

use crate::workload::Message;

/// Prompt and cached tokens, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    pub prompt: u64,
    pub cached: u64,
}

impl Tokens {
    /// `cached / prompt`, 0 for no prompt tokens.
    pub fn rate(&self) -> f64 {
        if self.prompt == 0 {
            0.0
        } else {
            self.cached as f64 / self.prompt as f64
        }
    }
}

impl std::ops::Add for Tokens {
    type Output = Tokens;

    fn add(self, o: Tokens) -> Tokens {
        Tokens {
            prompt: self.prompt + o.prompt,
            cached: self.cached + o.cached,
        }
    }
}

/// The prompt text the simulator renders for a chat, by its own template.
pub fn render_chat(messages: &[Message]) -> String {
    kvgate_engine_sim::tokenizer::render_chat(
        messages
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str())),
    )
}

/// One request of a run, in the order it was sent, in the engines' own tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The prompt's ids as the engine computed them.
    pub prompt: Vec<u32>,
    /// The answer's ids (empty when it failed).
    pub answer: Vec<u32>,
}

/// What an engine can keep: its page size and its KV pool, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineShape {
    pub page_size: usize,
    pub pool_tokens: usize,
}

/// The upper bound over `sent`.
pub fn upper_bound(sent: &[Sent], shape: EngineShape) -> Tokens {
    upper_bound_after(&[], sent, shape)
}

/// The upper bound over `sent` when the engines had served `before` first (traffic before
/// the gateway started): what they computed counts as earlier, their tokens do not count.
pub fn upper_bound_after(before: &[Sent], sent: &[Sent], shape: EngineShape) -> Tokens {
    let page = shape.page_size.max(1);
    // Each earlier request's prompt + answer, in token order, so the closest one is a
    // neighbour.
    let mut earlier: BTreeSet<Vec<u32>> = before.iter().map(kept).collect();
    let mut out = Tokens::default();
    for s in sent {
        let shared = closest(&earlier, &s.prompt);
        let cap = shared
            .min(shape.pool_tokens)
            .min(s.prompt.len().saturating_sub(1));
        out.prompt += s.prompt.len() as u64;
        out.cached += (cap / page * page) as u64;
        earlier.insert(kept(s));
    }
    out
}

/// What an engine can keep of a request: its prompt and its answer.
fn kept(s: &Sent) -> Vec<u32> {
    let mut ids = s.prompt.clone();
    ids.extend_from_slice(&s.answer);
    ids
}

/// The longest common prefix of `ids` with a member of `seen`: in sorted order the best
/// member is one of the two neighbours.
fn closest(seen: &BTreeSet<Vec<u32>>, ids: &[u32]) -> usize {
    let before = seen.range::<[u32], _>((Bound::Unbounded, Bound::Included(ids)));
    let after = seen.range::<[u32], _>((Bound::Excluded(ids), Bound::Unbounded));
    before
        .rev()
        .take(1)
        .chain(after.take(1))
        .map(|other| common_len(ids, other))
        .max()
        .unwrap_or(0)
}

fn common_len<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
