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

mod key;
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

    /// Leading blocks of `tokens` (split at `block_size`, namespace as stored) each
    /// (worker, rank) holds.
    pub fn match_tokens(&self, tokens: &[u32], block_size: usize, namespace: u64) -> ChainMatch<T> {
        let blocks = tokens.len().checked_div(block_size).unwrap_or(0);
        let mut out = ChainMatch {
            blocks,
            per_rank: Vec::new(),
        };
        if blocks == 0 {
            return out;
        }
        let mut buf = Vec::new();
        let mut chunks = tokens.chunks_exact(block_size);
        // Keys are hashed a group at a time, ahead of the walk: the hashes of a group do not
        // wait on each other or on the walk's memory reads, and a walk that stops early
        // has hashed at most one group past its end.
        const GROUP: usize = 32;
        let mut keys = [0u64; GROUP];
        let mut k = key::root(namespace, block_size);
        let mut fill = |keys: &mut [u64; GROUP], k: &mut u64, limit: usize| {
            let mut n = 0;
            for (slot, b) in keys[..limit].iter_mut().zip(chunks.by_ref()) {
                *k = key::block(*k, b, &mut buf);
                *slot = *k;
                n += 1;
            }
            n
        };
        // The first block alone: most misses end there.
        let mut n = fill(&mut keys, &mut k, 1);
        let Some(&start) = self.by_key.get(&keys[0]) else {
            return out;
        };
        // Holders only shrink along a path (holdings are prefix-closed), so the active set
        // is the current node's holder list, and a holder missing from the next node's list
        // ends there.
        let mut node = &self.nodes[start as usize];
        let mut depth = 1;
        let mut at = n;
        'walk: loop {
            for &want in &keys[at..n] {
                let Some(next) = self.child(node, want) else {
                    break 'walk;
                };
                let next = &self.nodes[next as usize];
                if next.holders.is_empty() {
                    break 'walk;
                }
                if next.holders.len() != node.holders.len() {
                    let mut theirs = next.holders.iter().peekable();
                    for &(s, _) in node.holders.iter() {
                        if theirs.peek().is_some_and(|x| x.0 == s) {
                            theirs.next();
                        } else {
                            out.per_rank.push((self.holders[s as usize].id, depth));
                        }
                    }
                }
                node = next;
                depth += 1;
            }
            n = fill(&mut keys, &mut k, GROUP);
            at = 0;
            if n == 0 {
                break;
            }
        }
        for &(s, _) in node.holders.iter() {
            out.per_rank.push((self.holders[s as usize].id, depth));
        }
        out.per_rank
            .sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        out
    }

    /// Every block `worker`'s `rank` holds, each after its parent: what
    /// [`ChainIndex::restore_rank`] takes back. Keys are content, so the blocks mean the same
    /// in another process (a restarted gateway, another replica).
    pub fn export_rank(&self, worker: T, rank: u32) -> Vec<ChainBlock> {
        let Some(&slot) = self.slots.get(&(worker, rank)) else {
            return Vec::new();
        };
        let held = &self.holders[slot as usize].engine;
        let mut out = Vec::with_capacity(held.len());
        // Chain starts of this rank: a node with no parent, or whose parent it does not hold.
        let mut stack: Vec<u32> = held
            .values()
            .copied()
            .filter(|&h| {
                let parent = self.nodes[self.holdings[h as usize].node as usize].parent;
                parent == NIL || self.holder_index(parent, slot).is_none()
            })
            .collect();
        while let Some(h) = stack.pop() {
            let hd = &self.holdings[h as usize];
            let node = &self.nodes[hd.node as usize];
            out.push(ChainBlock {
                key: node.key,
                parent: (node.parent != NIL).then(|| self.nodes[node.parent as usize].key),
                engine: hd.engine,
                tiers: hd.tiers,
            });
            if hd.held_children > 0 {
                for &c in node.children.iter() {
                    if let Some(i) = self.holder_index(c, slot) {
                        stack.push(self.nodes[c as usize].holders[i].1);
                    }
                }
            }
        }
        out
    }

    /// Gives `worker`'s `rank` the blocks of an [`export_rank`](ChainIndex::export_rank)
    /// (parents first), on top of what it holds. A block whose parent the rank does not
    /// hold is skipped, as is a block with no tier; returns the blocks restored. The cap
    /// applies as after a store.
    pub fn restore_rank(&mut self, worker: T, rank: u32, blocks: &[ChainBlock]) -> usize {
        let slot = self.slot((worker, rank));
        let mut restored = 0;
        for b in blocks {
            if b.tiers == 0 {
                continue;
            }
            let parent = match b.parent {
                None => NIL,
                Some(pk) => match self.by_key.get(&pk) {
                    Some(&p) if self.holder_index(p, slot).is_some() => p,
                    _ => continue,
                },
            };
            // A key already known under another parent is not this block.
            if let Some(&n) = self.by_key.get(&b.key)
                && self.nodes[n as usize].parent != parent
            {
                continue;
            }
            // An engine hash already held for other content: the newer word wins, as in
            // a store.
            if let Some(old) = self.holding_of(slot, b.engine)
                && self.nodes[self.holdings[old as usize].node as usize].key != b.key
            {
                self.drop_subtree(old);
                if parent != NIL && self.holder_index(parent, slot).is_none() {
                    continue;
                }
            }
            let node = self.node_for(b.key, parent);
            self.hold(slot, node, b.engine, b.tiers);
            restored += 1;
        }
        self.enforce_cap();
        restored
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

    fn slot(&mut self, id: (T, u32)) -> u32 {
        if let Some(&s) = self.slots.get(&id) {
            return s;
        }
        let s = self.holders.len() as u32;
        self.holders.push(Holder {
            id,
            engine: FastMap::default(),
        });
        self.slots.insert(id, s);
        s
    }

    fn holding_of(&self, slot: u32, engine: u64) -> Option<u32> {
        self.holders[slot as usize].engine.get(&engine).copied()
    }

    fn holder_index(&self, node: u32, slot: u32) -> Option<usize> {
        let hs = &self.nodes[node as usize].holders;
        hs.binary_search_by_key(&slot, |x| x.0).ok()
    }

    fn child(&self, node: &Node, k: u64) -> Option<u32> {
        // A node with many children (a shared prefix) is faster to find through the map.
        if node.children.len() <= 8 {
            node.children
                .iter()
                .copied()
                .find(|&c| self.nodes[c as usize].key == k)
        } else {
            self.by_key.get(&k).copied()
        }
    }

    /// The node of key `k`, created under `parent` if new.
    fn node_for(&mut self, k: u64, parent: u32) -> u32 {
        if let Some(&n) = self.by_key.get(&k) {
            return n;
        }
        let node = Node {
            key: k,
            parent,
            children: Small::Empty,
            holders: Small::Empty,
        };
        let n = match self.free_nodes.pop() {
            Some(n) => {
                self.nodes[n as usize] = node;
                n
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.by_key.insert(k, n);
        if parent != NIL {
            let ch = &mut self.nodes[parent as usize].children;
            ch.insert(ch.len(), n);
        }
        n
    }

    /// `slot` holds `node` in `tier`, known by `engine`.
    fn hold(&mut self, slot: u32, node: u32, engine: u64, tier: u8) {
        if let Some(i) = self.holder_index(node, slot) {
            let h = self.nodes[node as usize].holders[i].1;
            let hd = &mut self.holdings[h as usize];
            hd.tiers |= tier;
            let leaf = hd.held_children == 0;
            if hd.engine != engine {
                // One block known by two engine hashes keeps the newer one.
                let old = std::mem::replace(&mut hd.engine, engine);
                let map = &mut self.holders[slot as usize].engine;
                map.remove(&old);
                map.insert(engine, h);
            }
            // Announced again: the chain end is live, the last to evict.
            if leaf {
                self.unlink(h);
                self.link_back(h);
            }
            return;
        }
        let parent = self.nodes[node as usize].parent;
        // Prefix-closed: a rank holds a block only below a block it holds.
        let parent_holding = (parent != NIL)
            .then(|| self.holder_index(parent, slot))
            .flatten()
            .map(|i| self.nodes[parent as usize].holders[i].1);
        debug_assert!(parent == NIL || parent_holding.is_some(), "parent not held");
        let h = self.alloc_holding(Holding {
            slot,
            node,
            engine,
            tiers: tier,
            held_children: 0,
            prev: NIL,
            next: NIL,
        });
        let hs = &mut self.nodes[node as usize].holders;
        let at = hs.partition_point(|x| x.0 < slot);
        hs.insert(at, (slot, h));
        self.holders[slot as usize].engine.insert(engine, h);
        self.link_back(h);
        if let Some(p) = parent_holding {
            let ph = &mut self.holdings[p as usize];
            ph.held_children += 1;
            if ph.held_children == 1 {
                self.unlink(p);
            }
        }
    }

    fn alloc_holding(&mut self, h: Holding) -> u32 {
        match self.free_holdings.pop() {
            Some(i) => {
                self.holdings[i as usize] = h;
                i
            }
            None => {
                self.holdings.push(h);
                (self.holdings.len() - 1) as u32
            }
        }
    }

    /// Drops holding `h` and the same rank's holdings below it; returns how many.
    fn drop_subtree(&mut self, h: u32) -> usize {
        let slot = self.holdings[h as usize].slot;
        let mut stack = vec![(h, false)];
        let mut dropped = 0;
        // Post-order, so every holding is a leaf when it goes.
        while let Some((h, expanded)) = stack.pop() {
            let node = self.holdings[h as usize].node;
            if expanded || self.holdings[h as usize].held_children == 0 {
                self.drop_leaf(h);
                dropped += 1;
                continue;
            }
            stack.push((h, true));
            for &c in self.nodes[node as usize].children.iter() {
                if let Some(i) = self.holder_index(c, slot) {
                    stack.push((self.nodes[c as usize].holders[i].1, false));
                }
            }
        }
        dropped
    }

    /// Drops a holding with no held children; frees its node when no one holds it.
    fn drop_leaf(&mut self, h: u32) {
        let Holding {
            slot, node, engine, ..
        } = self.holdings[h as usize];
        debug_assert_eq!(self.holdings[h as usize].held_children, 0);
        self.unlink(h);
        self.holders[slot as usize].engine.remove(&engine);
        self.free_holdings.push(h);
        if let Some(i) = self.holder_index(node, slot) {
            self.nodes[node as usize].holders.remove(i);
        }
        let parent = self.nodes[node as usize].parent;
        if parent != NIL
            && let Some(i) = self.holder_index(parent, slot)
        {
            let p = self.nodes[parent as usize].holders[i].1;
            let ph = &mut self.holdings[p as usize];
            ph.held_children -= 1;
            if ph.held_children == 0 {
                // Left without children by a removal or eviction: the first to go next.
                self.link_front(p);
            }
        }
        let n = &self.nodes[node as usize];
        if n.holders.is_empty() && n.children.is_empty() {
            self.free_node(node);
        }
    }

    fn free_node(&mut self, mut node: u32) {
        // A parent left with no holder and no child goes too.
        loop {
            let (k, parent) = {
                let n = &self.nodes[node as usize];
                (n.key, n.parent)
            };
            self.by_key.remove(&k);
            self.nodes[node as usize].children = Small::Empty;
            self.free_nodes.push(node);
            if parent == NIL {
                return;
            }
            let p = &mut self.nodes[parent as usize];
            if let Some(i) = p.children.iter().position(|&c| c == node) {
                p.children.remove(i);
            }
            if !(p.holders.is_empty() && p.children.is_empty()) {
                return;
            }
            node = parent;
        }
    }

    fn clear_slot(&mut self, slot: u32) -> usize {
        let starts: Vec<u32> = (self.holders[slot as usize].engine.values())
            .copied()
            .filter(|&h| {
                let node = self.holdings[h as usize].node;
                self.nodes[node as usize].parent == NIL
                    || self
                        .holder_index(self.nodes[node as usize].parent, slot)
                        .is_none()
            })
            .collect();
        starts.into_iter().map(|h| self.drop_subtree(h)).sum()
    }

    fn enforce_cap(&mut self) -> usize {
        let Some(max) = self.config.max_blocks else {
            return 0;
        };
        let mut evicted = 0;
        while self.holdings.len() - self.free_holdings.len() > max && self.head != NIL {
            let h = self.head;
            self.drop_leaf(h);
            evicted += 1;
        }
        self.stats.evicted += evicted as u64;
        evicted
    }

    fn link_back(&mut self, h: u32) {
        let t = self.tail;
        let hd = &mut self.holdings[h as usize];
        (hd.prev, hd.next) = (t, NIL);
        match t {
            NIL => self.head = h,
            t => self.holdings[t as usize].next = h,
        }
        self.tail = h;
    }

    fn link_front(&mut self, h: u32) {
        let f = self.head;
        let hd = &mut self.holdings[h as usize];
        (hd.prev, hd.next) = (NIL, f);
        match f {
            NIL => self.tail = h,
            f => self.holdings[f as usize].prev = h,
        }
        self.head = h;
    }

    /// Takes `h` off the leaf list (a no-op when it is not on it).
    fn unlink(&mut self, h: u32) {
        let (prev, next) = {
            let hd = &self.holdings[h as usize];
            (hd.prev, hd.next)
        };
        if prev == NIL && self.head != h {
            return;
        }
        match prev {
            NIL => self.head = next,
            p => self.holdings[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.holdings[n as usize].prev = prev,
        }
        let hd = &mut self.holdings[h as usize];
        (hd.prev, hd.next) = (NIL, NIL);
    }
}
