//! The best hit rate a workload allows: every request served by an engine that already holds
//! what it shares with earlier requests of its group, the first of each group cold.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;

use serde::{Deserialize, Serialize};

use crate::workload::{BYTES_PER_TOKEN, Message, Plan};

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

/// Both ideals of one plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ideal {
    /// Sharing within a group only (the targets' ideal).
    pub group: Tokens,
    /// Sharing with any earlier request: one engine with an unbounded cache.
    pub any: Tokens,
}

/// The prompt text the simulator renders for a chat (its template: `<|role|>\ncontent\n`
/// per message, then the assistant header). Keep in step with the simulator's tokenizer.
pub fn render_chat(messages: &[Message]) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str("<|");
        out.push_str(&m.role);
        out.push_str("|>\n");
        out.push_str(&m.content);
        out.push('\n');
    }
    out.push_str("<|assistant|>\n");
    out
}

/// Tokens of `text` for the simulator: one per 4 bytes, a partial last chunk is one more.
pub fn token_count(text: &str) -> usize {
    text.len().div_ceil(BYTES_PER_TOKEN)
}

/// Computes both ideals of `plan` with the engines' page size (cached prefixes are whole
/// pages), taking requests in plan order.
pub fn ideal(plan: &Plan, page_size: usize) -> Ideal {
    let texts: Vec<(usize, String)> = plan
        .requests()
        .map(|r| (r.group, render_chat(&r.messages)))
        .collect();
    let mut by_group: HashMap<usize, BTreeSet<&str>> = HashMap::new();
    let mut all: BTreeSet<&str> = BTreeSet::new();
    let mut out = Ideal::default();
    for (group, text) in &texts {
        let prompt = token_count(text) as u64;
        let seen = by_group.entry(*group).or_default();
        let in_group = shared_tokens(seen, text, page_size) as u64;
        let anywhere = shared_tokens(&all, text, page_size) as u64;
        seen.insert(text);
        all.insert(text);
        out.group.prompt += prompt;
        out.group.cached += in_group.min(prompt);
        out.any.prompt += prompt;
        out.any.cached += anywhere.min(prompt);
    }
    out
}

/// Page-aligned tokens `text` shares with the best of `seen`. In sorted order the longest
/// common prefix with a set is found at one of the two neighbours.
fn shared_tokens(seen: &BTreeSet<&str>, text: &str, page_size: usize) -> usize {
    let mut before = seen.range::<str, _>((Bound::Unbounded, Bound::Included(text)));
    let after = seen.range::<str, _>((Bound::Excluded(text), Bound::Unbounded));
    let best = before
        .next_back()
        .into_iter()
        .chain(after.take(1))
        .map(|other| common_tokens(text, other))
        .max()
        .unwrap_or(0);
    best.checked_div(page_size)
        .map_or(best, |pages| pages * page_size)
}

/// Leading tokens two texts have in common: whole 4-byte chunks before the first difference.
fn common_tokens(a: &str, b: &str) -> usize {
    if a == b {
        return token_count(a);
    }
    let bytes = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    bytes / BYTES_PER_TOKEN
}
