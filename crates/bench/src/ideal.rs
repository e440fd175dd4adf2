//! The best hit rate a run allows: an upper bound, computed from what was sent and answered.
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

/// One request of a run, in the order it was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The rendered prompt.
    pub prompt: String,
    /// The answer's text (empty when it failed).
    pub answer: String,
}

/// What an engine can keep: its page size and its KV pool, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineShape {
    pub page_size: usize,
    pub pool_tokens: usize,
}

/// The upper bound over `sent`, tokenized with `encode` (the engines' tokenizer).
pub fn upper_bound(sent: &[Sent], shape: EngineShape, encode: &dyn Fn(&str) -> Vec<u32>) -> Tokens {
    let page = shape.page_size.max(1);
    // Each earlier request's prompt + answer, by text, so the closest one is a neighbour.
    let mut earlier: BTreeSet<String> = BTreeSet::new();
    let mut out = Tokens::default();
    for s in sent {
        let prompt = encode(&s.prompt);
        let shared = closest(&earlier, &s.prompt)
            .map(|other| common_len(&prompt, &encode(other)))
            .unwrap_or(0);
        let cap = shared
            .min(shape.pool_tokens)
            .min(prompt.len().saturating_sub(1));
        out.prompt += prompt.len() as u64;
        out.cached += (cap / page * page) as u64;
        earlier.insert(format!("{}{}", s.prompt, s.answer));
    }
    out
}

/// The member of `seen` with the longest common text prefix with `text`: in sorted order it
/// is one of the two neighbours.
fn closest<'a>(seen: &'a BTreeSet<String>, text: &str) -> Option<&'a str> {
    let mut before = seen.range::<str, _>((Bound::Unbounded, Bound::Included(text)));
    let after = seen.range::<str, _>((Bound::Excluded(text), Bound::Unbounded));
    before
        .next_back()
        .into_iter()
        .chain(after.take(1))
        .max_by_key(|other| common_len(text.as_bytes(), other.as_bytes()))
        .map(String::as_str)
}

fn common_len<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
