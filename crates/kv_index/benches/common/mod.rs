//! A prompt workload shared by the benches: `groups` shared heads (system prompts) of
//! `head` units, each prompt one head plus a unique random tail up to `len` units.
//! Routing follows affinity: a prompt goes to the deepest holder, and every 8th one
//! spills to the next tenant, so heads end up replicated on a few tenants.

#![allow(dead_code, reason = "each bench binary uses a different part")]

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

pub(crate) const TENANTS: u64 = 16;

pub(crate) struct Workload<E> {
    rng: SmallRng,
    heads: Vec<Vec<E>>,
    alphabet: u32,
    len: usize,
    count: u64,
}

pub(crate) trait Unit: Copy {
    fn from_u32(x: u32) -> Self;
}
impl Unit for u8 {
    fn from_u32(x: u32) -> Self {
        // Lowercase letters, digits and punctuation: 48 printable symbols.
        b"abcdefghijklmnopqrstuvwxyz0123456789 .,;:!?-'()\n"[x as usize % 48]
    }
}
impl Unit for u32 {
    fn from_u32(x: u32) -> Self {
        x
    }
}

impl<E: Unit> Workload<E> {
    /// `alphabet`: distinct units in tails (48 for text, a vocabulary size for tokens).
    pub(crate) fn new(
        seed: u64,
        groups: usize,
        head: (usize, usize),
        len: usize,
        alphabet: u32,
    ) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let heads = (0..groups)
            .map(|_| {
                let n = rng.gen_range(head.0..=head.1);
                (0..n)
                    .map(|_| E::from_u32(rng.gen_range(0..alphabet)))
                    .collect()
            })
            .collect();
        Self {
            rng,
            heads,
            alphabet,
            len,
            count: 0,
        }
    }

    pub(crate) fn prompt(&mut self) -> Vec<E> {
        let g = self.rng.gen_range(0..self.heads.len());
        let mut p = Vec::with_capacity(self.len);
        p.extend_from_slice(&self.heads[g]);
        while p.len() < self.len {
            p.push(E::from_u32(self.rng.gen_range(0..self.alphabet)));
        }
        p
    }

    /// The tenant a prompt is routed to, given its match.
    pub(crate) fn choose(&mut self, deepest: Option<u64>) -> u64 {
        self.count += 1;
        let base = deepest.unwrap_or_else(|| self.rng.gen_range(0..TENANTS));
        if self.count.is_multiple_of(8) {
            (base + 1) % TENANTS
        } else {
            base
        }
    }
}

/// Resident set size of this process in bytes (Linux), for a cross-check of the tree's
/// own size accounting.
pub(crate) fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}
