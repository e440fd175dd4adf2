//! The KV chain index: which engine rank holds which block, built from the engines' own KV
//! events rather than from routing decisions.
//!
//! **Keys are content, not engine hashes.** A block's key is the XXH3 of its token ids
//! (little-endian `u32`s) folded into its parent block's key; a sequence's first block chains
//! to a root key made of a namespace (LoRA adapter or cache salt, chosen by the caller; 0
//! for none) and the block size. A router computes the same keys from a request's tokens
//! ([`chain_keys`]), which an engine's opaque hash (seeded per process, namespaced by its own
//! rules) would not allow. Engine hashes are kept per (worker, rank) only, to find a block
//! again when that rank removes it or names it as a parent.
//!
//! **Holdings are per (worker, rank) and prefix-closed.** A rank holds a block only while it
//! holds the block's parent: a removal (or an eviction) of a block also drops that rank's
//! holdings below it, which it could not serve from its cache anyway (an engine's prefix
//! match stops at the first missing block). Removals and [`ChainIndex::clear`] touch only
//! the rank that sent them. A block's holding records the tiers it lives in (bit `tier` of
//! a `u8`: GPU, host memory, disk, ... as the caller maps them); a removal naming a tier
//! clears that bit, one naming none clears them all, and the holding goes when none is left.
//!
//! **A store whose parent is unknown** (the index started after the engine had traffic, or
//! the parent was evicted here) starts a new chain at its position, keyed from the parent's
//! engine hash instead of the root. The reference gateway restarts such a store from
//! position 0 instead, which claims the blocks for any request that *begins* with their
//! tokens: a match the engine would not serve, since its cache holds them after a prefix the
//! request lacks. Here the orphan chain is never matched, but it is a chain like any other:
//! its continuations attach to it, removals of its blocks apply, and it counts against the
//! cap. It is counted ([`ChainApply::unknown`]) so the caller can ask the engine to replay
//! from the start, which brings the real parents.
//!
//! **Memory is bounded** by [`ChainConfig::max_blocks`], the sum over ranks of blocks held.
//! Past it, the index evicts the oldest chain end first: leaf holdings (a rank's blocks with
//! no held block below them) sit on one list in the order they became leaves, and a parent
//! left without held children by an eviction or removal goes to the front, so eviction
//! walks a cold chain up to where it joins a live one before touching anything else.
//!
//! Matching ([`ChainIndex::match_tokens`]) splits the tokens into whole blocks (a partial
//! tail block is ignored), walks the chain from the root and reports, per (worker, rank), the
//! number of leading blocks held. It hashes at most 32 blocks past the end of the chain and
//! takes `&self`.
//!
//! The crate does not decode events: the caller maps each decoded event into
//! [`ChainStore`], [`ChainIndex::apply_removed`] or [`ChainIndex::clear`], so the index
//! stays free of any wire format.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use serde::{Deserialize, Serialize};

use crate::lru::NIL;
use crate::small::Small;
use crate::tree::TenantId;

mod evict;
mod export;
mod holdings;
mod key;
mod matching;
#[cfg(test)]
mod tests;

use key::Mix;

type FastMap<V> = HashMap<u64, V, BuildHasherDefault<Mix>>;

/// Chain-index settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChainConfig {
    /// Blocks held, summed over every (worker, rank); `None`: unbounded.
    pub max_blocks: Option<usize>,
}

/// One `BlockStored` event, as the index needs it.
#[derive(Debug, Clone, Copy)]
pub struct ChainStore<'a> {
    /// The engine's hash of each stored block, in order.
    pub block_hashes: &'a [u64],
    /// The engine hash of the block before the first one; `None` at a sequence's start.
    pub parent: Option<u64>,
    /// The tokens of all blocks, `block_size` per block.
    pub token_ids: &'a [u32],
    pub block_size: usize,
    /// The key namespace (LoRA adapter, cache salt); 0 for none. Requests must use the same.
    pub namespace: u64,
    /// Which tier the blocks were stored in (0 for the default); values past 7 share bit 7.
    pub tier: u8,
}

/// What one applied event did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChainApply {
    /// Blocks stored, or holdings removed (with what lay below them).
    pub applied: usize,
    /// A store: 1 when its parent was unknown. A removal: engine hashes this rank did not
    /// hold. A store's hashes without whole blocks of tokens are counted in `skipped`.
    pub unknown: usize,
    pub skipped: usize,
    /// Holdings evicted to stay within the cap.
    pub evicted: usize,
}

/// How many leading blocks of a request each (worker, rank) holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainMatch<T> {
    /// Whole blocks in the request.
    pub blocks: usize,
    /// Every holder of at least the first block: deepest first, then by (worker, rank).
    pub per_rank: Vec<((T, u32), usize)>,
}

impl<T: Copy> ChainMatch<T> {
    /// Leading blocks held by `worker`'s `rank` (0 if none).
    pub fn matched_by(&self, worker: T, rank: u32) -> usize
    where
        T: PartialEq,
    {
        self.per_rank
            .iter()
            .find(|((w, r), _)| *w == worker && *r == rank)
            .map_or(0, |x| x.1)
    }
}

/// One held block as a snapshot keeps it: its content key, its parent's (`None` at a chain
/// start, root or orphan), the engine's hash and the tiers it lives in (a bit each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainBlock {
    pub key: u64,
    pub parent: Option<u64>,
    pub engine: u64,
    pub tiers: u8,
}

/// Counters since the index was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChainStats {
    /// Blocks held, summed over ranks.
    pub blocks: usize,
    /// Distinct content blocks (nodes).
    pub nodes: usize,
    pub unknown_parents: u64,
    pub unknown_removals: u64,
    pub evicted: u64,
}

#[derive(Debug, Clone)]
struct Node {
    key: u64,
    /// `NIL` at a chain start (root or orphan).
    parent: u32,
    children: Small<u32>,
    /// (holder slot, holding), sorted by slot.
    holders: Small<(u32, u32)>,
}

/// One rank's hold on one node.
#[derive(Debug, Clone)]
struct Holding {
    slot: u32,
    node: u32,
    engine: u64,
    tiers: u8,
    /// Children of `node` this rank holds; 0 makes this a leaf, on the eviction list.
    held_children: u32,
    prev: u32,
    next: u32,
}

#[derive(Debug, Clone)]
struct Holder<T> {
    id: (T, u32),
    /// Engine hash → holding.
    engine: FastMap<u32>,
}

/// The content-keyed chain index for one model. `T` names a worker; a holder is a
/// (worker, data-parallel rank) pair.
#[derive(Debug, Clone)]
pub struct ChainIndex<T> {
    config: ChainConfig,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    by_key: FastMap<u32>,
    holdings: Vec<Holding>,
    free_holdings: Vec<u32>,
    /// Leaf holdings, first to evict at `head`.
    head: u32,
    tail: u32,
    holders: Vec<Holder<T>>,
    slots: HashMap<(T, u32), u32>,
    stats: ChainStats,
    buf: Vec<u8>,
}

/// The chain key of each whole block of `tokens`, as the index keys a stored block with the
/// same tokens after the same prefix.
pub fn chain_keys(tokens: &[u32], block_size: usize, namespace: u64) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut buf = Vec::with_capacity(block_size * 4);
    let mut parent = key::root(namespace, block_size);
    tokens
        .chunks_exact(block_size)
        .map(|b| {
            parent = key::block(parent, b, &mut buf);
            parent
        })
        .collect()
}

impl<T: TenantId> ChainIndex<T> {
    pub fn new(config: ChainConfig) -> Self {
        Self {
            config,
            nodes: Vec::new(),
            free_nodes: Vec::new(),
            by_key: FastMap::default(),
            holdings: Vec::new(),
            free_holdings: Vec::new(),
            head: NIL,
            tail: NIL,
            holders: Vec::new(),
            slots: HashMap::new(),
            stats: ChainStats::default(),
            buf: Vec::new(),
        }
    }

    pub fn config(&self) -> &ChainConfig {
        &self.config
    }

    /// Applies a `BlockStored` from `worker`'s `rank`.
    pub fn apply_stored(&mut self, worker: T, rank: u32, s: &ChainStore<'_>) -> ChainApply {
        let mut out = ChainApply::default();
        if s.block_size == 0 {
            out.skipped = s.block_hashes.len();
            return out;
        }
        let slot = self.slot((worker, rank));
        let (mut parent, mut parent_key) = match s.parent {
            None => (NIL, key::root(s.namespace, s.block_size)),
            Some(ph) => match self.holding_of(slot, ph) {
                Some(h) => {
                    let n = self.holdings[h as usize].node;
                    (n, self.nodes[n as usize].key)
                }
                None => {
                    out.unknown = 1;
                    self.stats.unknown_parents += 1;
                    (NIL, key::orphan(s.namespace, s.block_size, ph))
                }
            },
        };
        let tier = 1u8 << s.tier.min(7);
        let blocks = s.token_ids.chunks_exact(s.block_size);
        out.skipped = s.block_hashes.len().saturating_sub(blocks.len());
        let mut buf = std::mem::take(&mut self.buf);
        let mut above = s.parent;
        for (&engine, tokens) in s.block_hashes.iter().zip(blocks) {
            let mut k = key::block(parent_key, tokens, &mut buf);
            // The engine reusing a hash for other content: its old block is gone. Dropping
            // it can cut the chain this block hangs from; the block then starts an orphan
            // chain rather than hanging off a lost parent.
            if let Some(old) = self.holding_of(slot, engine)
                && self.nodes[self.holdings[old as usize].node as usize].key != k
            {
                self.drop_subtree(old);
                if parent != NIL && self.holder_index(parent, slot).is_none() {
                    parent = NIL;
                    parent_key = key::orphan(s.namespace, s.block_size, above.unwrap_or(0));
                    k = key::block(parent_key, tokens, &mut buf);
                }
            }
            let node = self.node_for(k, parent);
            self.hold(slot, node, engine, tier);
            out.applied += 1;
            (parent, parent_key, above) = (node, k, Some(engine));
        }
        self.buf = buf;
        out.evicted = self.enforce_cap();
        out
    }

    /// Applies a `BlockRemoved` from `worker`'s `rank`: `tier` names the tier the blocks
    /// left, `None` all of them. Other ranks' holdings are untouched.
    pub fn apply_removed(
        &mut self,
        worker: T,
        rank: u32,
        block_hashes: &[u64],
        tier: Option<u8>,
    ) -> ChainApply {
        let mut out = ChainApply::default();
        let Some(&slot) = self.slots.get(&(worker, rank)) else {
            out.unknown = block_hashes.len();
            self.stats.unknown_removals += block_hashes.len() as u64;
            return out;
        };
        let mask = tier.map_or(u8::MAX, |t| 1u8 << t.min(7));
        for &engine in block_hashes {
            let Some(h) = self.holding_of(slot, engine) else {
                out.unknown += 1;
                self.stats.unknown_removals += 1;
                continue;
            };
            let hd = &mut self.holdings[h as usize];
            hd.tiers &= !mask;
            if hd.tiers == 0 {
                out.applied += self.drop_subtree(h);
            }
        }
        out
    }

    /// Applies `AllBlocksCleared` from `worker`'s `rank` (or its engine restarting): drops
    /// everything that rank holds, and nothing of any other.
    pub fn clear(&mut self, worker: T, rank: u32) -> usize {
        match self.slots.get(&(worker, rank)) {
            Some(&slot) => self.clear_slot(slot),
            None => 0,
        }
    }

    /// Drops every rank of `worker` (the worker left, or its engine restarted).
    pub fn forget_worker(&mut self, worker: T) -> usize {
        let slots: Vec<u32> = (self.slots.iter())
            .filter(|((w, _), _)| *w == worker)
            .map(|(_, &s)| s)
            .collect();
        slots.into_iter().map(|s| self.clear_slot(s)).sum()
    }

    /// Blocks `worker`'s `rank` holds.
    pub fn blocks_of(&self, worker: T, rank: u32) -> usize {
        self.slots
            .get(&(worker, rank))
            .map_or(0, |&s| self.holders[s as usize].engine.len())
    }

    /// Blocks held per (worker, rank), ranks holding nothing left out, sorted.
    pub fn blocks_per_rank(&self) -> Vec<((T, u32), usize)> {
        let mut v: Vec<_> = (self.holders.iter())
            .filter(|h| !h.engine.is_empty())
            .map(|h| (h.id, h.engine.len()))
            .collect();
        v.sort_unstable();
        v
    }

    /// Blocks held per worker, its ranks summed, workers holding nothing left out, sorted.
    pub fn blocks_per_worker(&self) -> Vec<(T, usize)> {
        let mut v: Vec<(T, usize)> = Vec::new();
        for ((w, _), n) in self.blocks_per_rank() {
            match v.last_mut() {
                Some((last, total)) if *last == w => *total += n,
                _ => v.push((w, n)),
            }
        }
        v
    }

    pub fn stats(&self) -> ChainStats {
        ChainStats {
            blocks: self.holdings.len() - self.free_holdings.len(),
            nodes: self.nodes.len() - self.free_nodes.len(),
            ..self.stats
        }
    }
}
