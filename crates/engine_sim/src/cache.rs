//! A rank's prefix cache: a page-granular radix tree over token ids, as SGLang's.
//!
//! Each node adds whole pages of tokens to its parent's prefix; children are keyed by their
//! first page. A running request locks the node its prefix ends at, which locks every node up
//! to the root: locked nodes are never evicted. Unlocked leaves form an LRU set; evicting
//! one may make its parent an evictable leaf, so eviction trims prefixes from their ends and
//! a cached prefix always stays reachable from the root. Matching and inserting cost one
//! child lookup per node on the path plus a comparison of the tokens, so a long prompt is
//! cheap even at page size 1.
//!
//! With events on ([`PrefixCache::recording`]) every node also keeps one engine hash per
//! page, and stores, evictions and clears are recorded as KV events ([`PrefixCache::take_events`]).

use std::collections::{BTreeSet, HashMap};

use std::sync::Arc;

use kvgate_kv_events::KvEvent;

use crate::scopes::Scopes;

use self::events::Recorder;

mod events;

/// A node of the tree; [`ROOT`] is the empty prefix.
pub(crate) type NodeId = usize;
pub(crate) const ROOT: NodeId = 0;

#[derive(Debug, Default)]
struct Node {
    parent: NodeId,
    /// Whole pages this node adds to its parent's prefix.
    tokens: Vec<u32>,
    /// The engine hash of each of those pages; empty unless events are recorded.
    hashes: Vec<u64>,
    /// Children by their first page.
    children: HashMap<Box<[u32]>, NodeId>,
    last_used: u64,
    /// Locks held through this node (by requests whose prefix ends here or below).
    lock: u32,
    /// The `last_used` this node is filed under in `leaves`, while it is an evictable leaf.
    filed: Option<u64>,
}

#[derive(Debug)]
pub(crate) struct PrefixCache {
    page_size: usize,
    nodes: Vec<Option<Node>>,
    free: Vec<NodeId>,
    /// Unlocked leaves, least recently used first.
    leaves: BTreeSet<(u64, NodeId)>,
    tick: u64,
    tokens: usize,
    locked_tokens: usize,
    events: Option<Recorder>,
}

/// Where a walk down the tree stopped.
#[derive(Debug, Clone, Copy)]
struct Walk {
    /// Tokens matched (whole pages).
    matched: usize,
    /// The last node matched whole.
    node: NodeId,
    /// A child matched only in part: it and how many of its tokens.
    partial: Option<(NodeId, usize)>,
}

impl PrefixCache {
    pub(crate) fn new(page_size: usize) -> Self {
        Self {
            page_size: page_size.max(1),
            nodes: vec![Some(Node::default())],
            free: Vec::new(),
            leaves: BTreeSet::new(),
            tick: 0,
            tokens: 0,
            locked_tokens: 0,
            events: None,
        }
    }

    /// A cache that records its changes as KV events, in blocks of one page; `scopes`
    /// names the adapter and salt of scoped pages.
    pub(crate) fn recording(page_size: usize, scopes: Arc<Scopes>) -> Self {
        let mut cache = Self::new(page_size);
        cache.events = Some(Recorder::new(cache.page_size, scopes));
        cache
    }

    /// The events recorded since the last call, oldest first; empty when not recording.
    pub(crate) fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(Recorder::take).unwrap_or_default()
    }

    /// Cached tokens at the start of `tokens` (whole pages), touching nothing.
    pub(crate) fn peek(&self, tokens: &[u32]) -> usize {
        self.walk(tokens).matched
    }

    /// Cached tokens at the start of `tokens` and the node that prefix ends at (split so it
    /// ends exactly there, ready to lock); marks the prefix as just used.
    pub(crate) fn match_prefix(&mut self, tokens: &[u32]) -> (usize, NodeId) {
        let walk = self.walk(tokens);
        let node = match walk.partial {
            Some((child, k)) => self.split(child, k),
            None => walk.node,
        };
        self.touch(node);
        (walk.matched, node)
    }

    /// Stores every whole page of `tokens`; returns the node their prefix ends at. Never
    /// evicts: the caller keeps the pool within its budget.
    pub(crate) fn insert(&mut self, tokens: &[u32]) -> NodeId {
        let whole = tokens.len() / self.page_size * self.page_size;
        let tokens = &tokens[..whole];
        let walk = self.walk(tokens);
        let mut node = match walk.partial {
            Some((child, k)) => self.split(child, k),
            None => walk.node,
        };
        if walk.matched < whole {
            let rest = &tokens[walk.matched..];
            let key: Box<[u32]> = rest[..self.page_size].into();
            let parent_hash = self.node(node).hashes.last().copied();
            let hashes = match self.events.as_mut() {
                Some(rec) => rec.stored(parent_hash, rest),
                None => Vec::new(),
            };
            let leaf = self.alloc(Node {
                parent: node,
                tokens: rest.to_vec(),
                hashes,
                ..Node::default()
            });
            self.node_mut(node).children.insert(key, leaf);
            self.tokens += rest.len();
            self.refile(node);
            node = leaf;
        }
        self.touch(node);
        node
    }

    /// Locks the prefix ending at `node` against eviction.
    pub(crate) fn lock(&mut self, node: NodeId) {
        let mut id = node;
        while id != ROOT {
            let n = self.node_mut(id);
            n.lock += 1;
            let (first, len, parent) = (n.lock == 1, n.tokens.len(), n.parent);
            if first {
                self.locked_tokens += len;
            }
            self.refile(id);
            id = parent;
        }
    }

    /// Releases one [`Self::lock`] of `node`.
    pub(crate) fn unlock(&mut self, node: NodeId) {
        let mut id = node;
        while id != ROOT {
            let n = self.node_mut(id);
            n.lock = n.lock.saturating_sub(1);
            let (last, len, parent) = (n.lock == 0, n.tokens.len(), n.parent);
            if last {
                self.locked_tokens -= len;
            }
            self.refile(id);
            id = parent;
        }
    }

    /// Evicts unlocked leaves, least recently used first, until `tokens` are freed or nothing
    /// is evictable; returns the tokens freed (whole nodes, so possibly more).
    pub(crate) fn evict(&mut self, tokens: usize) -> usize {
        let mut freed = 0;
        while freed < tokens {
            let Some((_, id)) = self.leaves.pop_first() else {
                break;
            };
            let Some(node) = self.nodes[id].take() else {
                continue;
            };
            self.free.push(id);
            if let Some(rec) = self.events.as_mut() {
                rec.removed(&node.hashes);
            }
            freed += node.tokens.len();
            self.tokens -= node.tokens.len();
            let (parent, ps) = (node.parent, self.page_size);
            self.node_mut(parent).children.remove(&node.tokens[..ps]);
            self.refile(parent);
        }
        freed
    }

    /// Empties the cache. Only while nothing holds a lock: ids handed out become invalid.
    pub(crate) fn clear(&mut self) {
        let mut events = self.events.take();
        *self = Self::new(self.page_size);
        if let Some(rec) = events.as_mut() {
            rec.cleared();
        }
        self.events = events;
    }

    /// Tokens resident.
    pub(crate) fn tokens(&self) -> usize {
        self.tokens
    }

    /// Tokens in locked nodes (held by running requests).
    pub(crate) fn locked_tokens(&self) -> usize {
        self.locked_tokens
    }

    fn walk(&self, tokens: &[u32]) -> Walk {
        let ps = self.page_size;
        let mut walk = Walk {
            matched: 0,
            node: ROOT,
            partial: None,
        };
        while let Some(page) = tokens.get(walk.matched..walk.matched + ps) {
            let Some(&child) = self.node(walk.node).children.get(page) else {
                break;
            };
            let have = &self.node(child).tokens;
            let want = &tokens[walk.matched..];
            let common = have.iter().zip(want).take_while(|(a, b)| a == b).count() / ps * ps;
            walk.matched += common;
            if common < have.len() {
                walk.partial = Some((child, common));
                break;
            }
            walk.node = child;
        }
        walk
    }

    /// Splits `child` after its first `k` tokens (whole pages, `0 < k < len`); returns the
    /// new upper node. `child` keeps its id for the lower part, so locks on it stay valid.
    fn split(&mut self, child: NodeId, k: usize) -> NodeId {
        let ps = self.page_size;
        let c = self.node_mut(child);
        let lower = c.tokens.split_off(k);
        let upper_tokens = std::mem::replace(&mut c.tokens, lower);
        // No hashes when not recording; otherwise one per page, split with the pages.
        let lower_hashes = c.hashes.split_off((k / ps).min(c.hashes.len()));
        let upper_hashes = std::mem::replace(&mut c.hashes, lower_hashes);
        let (parent, last_used, lock) = (c.parent, c.last_used, c.lock);
        let mut children = HashMap::new();
        children.insert(self.node(child).tokens[..ps].into(), child);
        let key: Box<[u32]> = upper_tokens[..ps].into();
        let upper = self.alloc(Node {
            parent,
            tokens: upper_tokens,
            hashes: upper_hashes,
            children,
            last_used,
            lock,
            filed: None,
        });
        self.node_mut(child).parent = upper;
        self.node_mut(parent).children.insert(key, upper);
        upper
    }

    /// Stamps the path from `node` to the root as just used, so a parent is never older
    /// than its children.
    fn touch(&mut self, node: NodeId) {
        self.tick += 1;
        let mut id = node;
        while id != ROOT {
            let tick = self.tick;
            let n = self.node_mut(id);
            n.last_used = tick;
            let parent = n.parent;
            self.refile(id);
            id = parent;
        }
    }

    /// Files `id` in `leaves` exactly while it is an unlocked leaf.
    fn refile(&mut self, id: NodeId) {
        if id == ROOT {
            return;
        }
        let n = self.node_mut(id);
        let want = (n.lock == 0 && n.children.is_empty()).then_some(n.last_used);
        let was = std::mem::replace(&mut n.filed, want);
        if was != want {
            if let Some(t) = was {
                self.leaves.remove(&(t, id));
            }
            if let Some(t) = want {
                self.leaves.insert((t, id));
            }
        }
    }

    fn alloc(&mut self, node: Node) -> NodeId {
        match self.free.pop() {
            Some(id) => {
                self.nodes[id] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    fn node(&self, id: NodeId) -> &Node {
        self.nodes[id]
            .as_ref()
            .unwrap_or_else(|| unreachable!("node {id} is live"))
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id]
            .as_mut()
            .unwrap_or_else(|| unreachable!("node {id} is live"))
    }
}

#[cfg(test)]
mod tests;
