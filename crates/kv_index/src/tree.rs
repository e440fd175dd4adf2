//! The radix tree: one generic implementation for bytes, chars and token ids.
//!
//! Layout: an arena of nodes addressed by `u32`, with a free list. A node owns its edge
//! (always whole pages), its children sorted by first unit, and its tenants sorted by id,
//! each pointing at an [`Entry`](crate::lru) on the recency lists. A tenant present on a
//! node is present on every ancestor, so a tenant's match is the depth of the deepest node
//! it holds on the key's path. Nodes with no tenant are unlinked at once; only the root is
//! ever empty.

use std::collections::BTreeMap;
use std::mem;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::lru::{Lru, NIL, TenantList};
use crate::prefix_match::PrefixMatch;
use crate::small::Small;

mod config;
mod evict;
mod key;
mod traffic;

pub use config::{EvictStats, KeyUnit, TenantId, TreeConfig};
pub use key::KeyRuns;
use key::{common_prefix_at, copy_units};
pub(crate) use traffic::Traffic;

#[cfg(test)]
pub(crate) mod tests;

pub(crate) const ROOT: u32 = 0;

#[derive(Debug, Clone)]
pub(crate) struct Node<E, T> {
    pub(crate) edge: Vec<E>,
    /// (key of the child's first page, child), sorted by key. The key is the unit itself
    /// on an unpaged tree and a digest of the page otherwise, so a lookup is a binary
    /// search over small inline integers; equal keys are told apart by comparing pages.
    pub(crate) children: Small<(u32, u32)>,
    /// (tenant, entry), sorted by tenant.
    pub(crate) tenants: Small<(T, u32)>,
    pub(crate) parent: u32,
    /// Bumped when the slot is freed, so a snapshot cursor can tell a reused slot.
    pub(crate) generation: u32,
    /// Lookups that entered this node, decayed; not part of a snapshot.
    pub(crate) traffic: Traffic,
}

#[derive(Debug, Clone)]
pub(crate) struct TenantSlot<T> {
    pub(crate) id: T,
    pub(crate) list: TenantList,
}

/// Where a descent stopped: `pos` units of the (page-truncated) key matched, the last
/// `partial.1` of them inside the edge of `partial.0`, which then needs a split to insert.
#[derive(Debug, Clone, Copy)]
struct Descent {
    pos: usize,
    partial: Option<(u32, usize)>,
}

/// A multi-tenant radix tree over keys of `E`, with leaf-first LRU eviction.
///
/// Time is whatever `u64` the caller passes as `now` (a clock reading or a counter); the
/// tree never reads a clock. It keeps the largest `now` seen and stamps with that, so
/// stamps never go backwards.
#[derive(Debug, Clone)]
pub struct RadixTree<E, T> {
    pub(crate) config: TreeConfig,
    pub(crate) nodes: Vec<Node<E, T>>,
    free_nodes: Vec<u32>,
    pub(crate) lru: Lru,
    pub(crate) slots: Vec<TenantSlot<T>>,
    free_slots: Vec<u32>,
    pub(crate) index: BTreeMap<T, u32>,
    total_units: usize,
    /// Units on edges, each counted once however many tenants hold it.
    edge_units: usize,
    pub(crate) clock: u64,
    evicted: EvictStats,
    /// Scratch for descents, kept to avoid an allocation per call.
    path: Vec<u32>,
    /// Counted lookups so far (wrapping): the clock of the traffic counts.
    lookups: u32,
    /// This tree among all in the process: an [`Observed`] is only good for its own.
    epoch: u64,
}

/// Trees made so far in the process, for [`RadixTree::epoch`].
static EPOCHS: AtomicU64 = AtomicU64::new(0);

/// Where a counted match of a key ended ([`RadixTree::observe_for_insert`]), so that an
/// insert of the same key right after ([`RadixTree::insert_observed`]) resumes there
/// instead of comparing the key with the tree again. It holds node numbers with their
/// generations and edge lengths, checked before use: any change along the path since (a
/// node freed or split, a child grown where the match stopped) and the insert walks the key
/// as [`RadixTree::insert`] does.
#[derive(Debug, Clone)]
pub struct Observed {
    epoch: u64,
    key_len: usize,
    /// Node, generation, edge length.
    path: Vec<(u32, u32, usize)>,
    pos: usize,
    /// The node the match stopped inside: node, generation, edge length, units matched.
    partial: Option<(u32, u32, usize, usize)>,
}

impl<E: KeyUnit, T: TenantId> RadixTree<E, T> {
    pub fn new(config: TreeConfig) -> Self {
        let root = Node {
            edge: Vec::new(),
            children: Small::Empty,
            tenants: Small::Empty,
            parent: NIL,
            generation: 0,
            traffic: Traffic::default(),
        };
        Self {
            config,
            nodes: vec![root],
            free_nodes: Vec::new(),
            lru: Lru::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            index: BTreeMap::new(),
            total_units: 0,
            edge_units: 0,
            clock: 0,
            evicted: EvictStats::default(),
            path: Vec::new(),
            lookups: 0,
            epoch: EPOCHS.fetch_add(1, Ordering::Relaxed),
        }
    }

    pub fn config(&self) -> &TreeConfig {
        &self.config
    }

    pub fn page_size(&self) -> usize {
        self.config.page_size.get()
    }

    /// Changes the budgets (a config reload). Nothing is evicted until the next
    /// [`evict`](Self::evict) or insert.
    pub fn set_budgets(&mut self, max_units: Option<usize>, max_tenant_units: Option<usize>) {
        self.config.max_units = max_units;
        self.config.max_tenant_units = max_tenant_units;
    }

    /// Matches `key` and touches every (node, tenant) it matched, as recently used.
    pub fn match_prefix<K: KeyRuns<E> + ?Sized>(&mut self, key: &K, now: u64) -> PrefixMatch<T> {
        self.tick(now);
        let mut path = mem::take(&mut self.path);
        let d = self.descend(key, self.truncate(key.units()), &mut path);
        let m = self.collect(key.units(), &path, d, None);
        let clock = self.clock;
        for n in d
            .partial
            .map(|p| p.0)
            .into_iter()
            .chain(path.iter().rev().copied())
        {
            let node = &self.nodes[n as usize];
            for &(_, e) in &node.tenants {
                let ts = self.lru.get(e).tslot;
                self.lru
                    .move_to_back(&mut self.slots[ts as usize].list, e, clock);
            }
        }
        self.path = path;
        m
    }

    /// Matches `key` without touching anything (for explanations and tests).
    pub fn peek_prefix<K: KeyRuns<E> + ?Sized>(&self, key: &K) -> PrefixMatch<T> {
        let mut path = Vec::new();
        let d = self.descend(key, self.truncate(key.units()), &mut path);
        self.collect(key.units(), &path, d, None)
    }

    /// [`peek_prefix`](Self::peek_prefix), with [`PrefixMatch::recent`]: each tenant's
    /// match counting only entries stamped at or after `since`.
    pub fn peek_since<K: KeyRuns<E> + ?Sized>(&self, key: &K, since: u64) -> PrefixMatch<T> {
        let mut path = Vec::new();
        let d = self.descend(key, self.truncate(key.units()), &mut path);
        self.collect(key.units(), &path, d, Some(since))
    }

    /// Matches `key` like [`peek_prefix`](Self::peek_prefix), then counts it as traffic
    /// through every node it entered (see [`PrefixMatch::traffic`]); recency is not
    /// touched. The match reports the counts from before this lookup.
    pub fn observe<K: KeyRuns<E> + ?Sized>(&mut self, key: &K) -> PrefixMatch<T> {
        let mut path = mem::take(&mut self.path);
        let d = self.descend(key, self.truncate(key.units()), &mut path);
        let m = self.collect(key.units(), &path, d, None);
        self.count(&path, d);
        self.path = path;
        m
    }

    /// [`observe`](Self::observe), and where the match ended, for
    /// [`insert_observed`](Self::insert_observed); with `since`, the match also has
    /// [`PrefixMatch::recent`] as in [`peek_since`](Self::peek_since).
    pub fn observe_for_insert<K: KeyRuns<E> + ?Sized>(
        &mut self,
        key: &K,
        since: Option<u64>,
    ) -> (PrefixMatch<T>, Observed) {
        let len = self.truncate(key.units());
        let mut path = mem::take(&mut self.path);
        let d = self.descend(key, len, &mut path);
        let m = self.collect(key.units(), &path, d, since);
        self.count(&path, d);
        let node = |n: u32| {
            let node = &self.nodes[n as usize];
            (n, node.generation, node.edge.len())
        };
        let seen = Observed {
            epoch: self.epoch,
            key_len: len,
            path: path.iter().map(|&n| node(n)).collect(),
            pos: d.pos,
            partial: d.partial.map(|(n, k)| {
                let (n, g, len) = node(n);
                (n, g, len, k)
            }),
        };
        self.path = path;
        (m, seen)
    }

    /// [`insert`](Self::insert) of the key `seen` was observed for, resuming where that
    /// match ended when nothing changed along its path since (it is checked); the caller
    /// must pass the same key.
    pub fn insert_observed<K: KeyRuns<E> + ?Sized>(
        &mut self,
        key: &K,
        tenant: T,
        now: u64,
        seen: &Observed,
    ) {
        self.tick(now);
        let len = self.truncate(key.units());
        let mut path = mem::take(&mut self.path);
        let d = match self.resume(key, len, seen, &mut path) {
            Some(d) => d,
            None => self.descend(key, len, &mut path),
        };
        self.record(key, len, &mut path, d, tenant);
        self.path = path;
    }

    /// The descent `seen` recorded, onto `path`, if it still holds.
    fn resume<K: KeyRuns<E> + ?Sized>(
        &self,
        key: &K,
        len: usize,
        seen: &Observed,
        path: &mut Vec<u32>,
    ) -> Option<Descent> {
        if seen.epoch != self.epoch || seen.key_len != len {
            return None;
        }
        let same = |n: u32, generation: u32, len: usize, parent: u32| {
            self.nodes.get(n as usize).is_some_and(|node| {
                node.generation == generation && node.edge.len() == len && node.parent == parent
            })
        };
        path.clear();
        let mut parent = ROOT;
        for &(n, g, len) in &seen.path {
            if !same(n, g, len, parent) {
                return None;
            }
            path.push(n);
            parent = n;
        }
        match seen.partial {
            Some((n, g, len, k)) => same(n, g, len, parent).then_some(Descent {
                pos: seen.pos,
                partial: Some((n, k)),
            }),
            // Where the match stopped between nodes, no child may have grown since.
            None if seen.pos < len && self.find_child_at(parent, key, seen.pos).is_some() => None,
            None => Some(Descent {
                pos: seen.pos,
                partial: None,
            }),
        }
    }

    /// Counts one lookup through `path` and into the edge a descent stopped inside.
    fn count(&mut self, path: &[u32], d: Descent) {
        self.lookups = self.lookups.wrapping_add(1);
        let (now, half_life) = (self.lookups, self.config.traffic_half_life);
        for &n in [ROOT].iter().chain(path) {
            self.nodes[n as usize].traffic.bump(now, half_life, false);
        }
        if let Some((n, _)) = d.partial {
            self.nodes[n as usize].traffic.bump(now, half_life, true);
        }
    }

    /// One descent: computes the match as the tree stands, lets `choose` pick a tenant
    /// from it, then records the whole key for that tenant only (nothing for `None`).
    /// Only the chosen tenant's path is touched: it is the engine that sees the request.
    /// Counts as a lookup for [`PrefixMatch::traffic`], as [`observe`](Self::observe) does.
    pub fn match_and_insert<K: KeyRuns<E> + ?Sized>(
        &mut self,
        key: &K,
        now: u64,
        choose: impl FnOnce(&PrefixMatch<T>) -> Option<T>,
    ) -> (PrefixMatch<T>, Option<T>) {
        self.tick(now);
        let len = self.truncate(key.units());
        let mut path = mem::take(&mut self.path);
        let d = self.descend(key, len, &mut path);
        let m = self.collect(key.units(), &path, d, None);
        self.count(&path, d);
        let chosen = choose(&m);
        if let Some(t) = chosen {
            self.record(key, len, &mut path, d, t);
        }
        self.path = path;
        (m, chosen)
    }

    /// Records `key` (page-truncated) for `tenant`, then evicts if the config says so.
    /// A key shorter than a page records nothing.
    pub fn insert<K: KeyRuns<E> + ?Sized>(&mut self, key: &K, tenant: T, now: u64) {
        self.tick(now);
        let len = self.truncate(key.units());
        let mut path = mem::take(&mut self.path);
        let d = self.descend(key, len, &mut path);
        self.record(key, len, &mut path, d, tenant);
        self.path = path;
    }

    /// Units `tenant` holds (0 if unknown).
    pub fn tenant_units(&self, tenant: T) -> usize {
        self.index
            .get(&tenant)
            .map_or(0, |&ts| self.slots[ts as usize].list.units)
    }

    /// Units held, summed over tenants: what `max_units` bounds.
    pub fn total_units(&self) -> usize {
        self.total_units
    }

    /// Tenants known to the tree, ascending: every tenant inserted and not removed.
    pub fn tenants(&self) -> Vec<T> {
        self.index.keys().copied().collect()
    }

    /// Units stored on edges, each counted once however many tenants hold it.
    pub fn distinct_units(&self) -> usize {
        self.edge_units
    }

    /// Nodes in the tree, the root excluded.
    pub fn node_count(&self) -> usize {
        self.nodes.len() - 1 - self.free_nodes.len()
    }

    /// What eviction has removed since the tree was built (inserts included).
    pub fn evicted_total(&self) -> EvictStats {
        self.evicted
    }

    /// Estimated heap and inline bytes of the structure (allocator overhead excluded).
    pub fn size_bytes(&self) -> usize {
        let mut bytes = size_of::<Self>()
            + self.nodes.capacity() * size_of::<Node<E, T>>()
            + self.free_nodes.capacity() * size_of::<u32>()
            + self.slots.capacity() * size_of::<TenantSlot<T>>()
            + self.free_slots.capacity() * size_of::<u32>()
            + self.index.len() * (size_of::<(T, u32)>() + size_of::<usize>())
            + self.path.capacity() * size_of::<u32>()
            + self.lru.size_bytes();
        for n in &self.nodes {
            bytes += n.edge.capacity() * size_of::<E>()
                + n.children.heap_bytes()
                + n.tenants.heap_bytes();
        }
        bytes
    }

    // ---- internals ----

    fn tick(&mut self, now: u64) {
        self.clock = self.clock.max(now);
    }

    fn page(&self) -> usize {
        self.config.page_size.get()
    }

    /// A key's length in whole pages.
    pub(crate) fn truncate(&self, units: usize) -> usize {
        units - units % self.page()
    }

    /// The child of `node` whose first page equals the first page of `rest` (non-empty,
    /// whole pages).
    pub(crate) fn find_child(&self, node: u32, rest: &[E]) -> Option<u32> {
        let key = self.child_key(rest);
        let page = self.page();
        let children = &self.nodes[node as usize].children;
        let start = children.partition_point(|c| c.0 < key);
        for &(k, child) in &children[start..] {
            if k != key {
                break;
            }
            if self.nodes[child as usize].edge[..page] == rest[..page] {
                return Some(child);
            }
        }
        None
    }

    /// [`find_child`](Self::find_child) for the units of `key` from `pos` (whole pages
    /// follow it).
    fn find_child_at<K: KeyRuns<E> + ?Sized>(&self, node: u32, key: &K, pos: usize) -> Option<u32> {
        let page = self.page();
        let run = key.run(pos);
        if run.len() >= page {
            self.find_child(node, run)
        } else {
            // A page across two runs: rare, and at most a page copied.
            self.find_child(node, &copy_units(key, pos, pos + page))
        }
    }

    /// The child key of an edge or key suffix (at least one page long).
    fn child_key(&self, units: &[E]) -> u32 {
        let page = self.page();
        if page == 1 {
            // Exact for the 8-, 16- and 32-bit units and char.
            return units[0].bits() as u32;
        }
        let h = units[..page]
            .iter()
            .fold(0x243F_6A88_85A3_08D3, |h: u64, u| {
                (h.rotate_left(5) ^ u.bits()).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            });
        (h >> 32) as u32
    }

    /// Follows the first `len` units of `key` (whole pages) down the tree.
    fn descend<K: KeyRuns<E> + ?Sized>(&self, key: &K, len: usize, path: &mut Vec<u32>) -> Descent {
        path.clear();
        let page = self.page();
        let mut node = ROOT;
        let mut pos = 0;
        while pos < len {
            let Some(child) = self.find_child_at(node, key, pos) else {
                break;
            };
            let edge = &self.nodes[child as usize].edge;
            let mut k = common_prefix_at(edge, key, pos, len);
            k -= k % page;
            if k == edge.len() {
                path.push(child);
                pos += k;
                node = child;
            } else {
                // find_child matched the first page, so k ≥ page > 0 here.
                return Descent {
                    pos: pos + k,
                    partial: Some((child, k)),
                };
            }
        }
        Descent { pos, partial: None }
    }

    fn collect(
        &self,
        input_len: usize,
        path: &[u32],
        d: Descent,
        since: Option<u64>,
    ) -> PrefixMatch<T> {
        let mut per: Vec<(T, usize)> = Vec::new();
        // Tenants matching on entries stamped since `since`: (tenant, depth, still open),
        // sorted by tenant; a tenant stops at the first node where its entry is older or
        // absent.
        let mut recent: Vec<(T, usize, bool)> = Vec::new();
        let fresh = |e: u32| since.is_some_and(|s| self.lru.get(e).stamp >= s);
        let mut traffic = Vec::with_capacity(path.len() + 1);
        let half_life = self.config.traffic_half_life;
        let mut depth = 0;
        let steps = path
            .iter()
            .map(|&n| (n, self.nodes[n as usize].edge.len()))
            .chain(d.partial);
        for (i, (n, len)) in steps.enumerate() {
            depth += len;
            traffic.push((
                depth,
                self.nodes[n as usize]
                    .traffic
                    .entered_at(self.lookups, half_life),
            ));
            let tenants = &self.nodes[n as usize].tenants;
            if since.is_some() {
                if i == 0 {
                    let open = tenants.iter().filter(|x| fresh(x.1));
                    recent.extend(open.map(|&(t, _)| (t, depth, true)));
                } else {
                    let mut theirs = tenants.iter().filter(|x| fresh(x.1)).peekable();
                    for r in recent.iter_mut().filter(|r| r.2) {
                        while theirs.peek().is_some_and(|x| x.0 < r.0) {
                            theirs.next();
                        }
                        if theirs.peek().is_some_and(|x| x.0 == r.0) {
                            r.1 = depth;
                        } else {
                            r.2 = false;
                        }
                    }
                }
            }
            if i == 0 {
                per.extend(tenants.iter().map(|&(t, _)| (t, depth)));
                continue;
            }
            // A node's tenants are a sorted subset of its parent's: one merge pass.
            let mut j = 0;
            for &(t, _) in tenants {
                while j < per.len() && per[j].0 < t {
                    j += 1;
                }
                if j < per.len() && per[j].0 == t {
                    per[j].1 = depth;
                    j += 1;
                }
            }
        }
        per.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut recent: Vec<(T, usize)> = recent.into_iter().map(|(t, n, _)| (t, n)).collect();
        recent.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        PrefixMatch {
            recent,
            input_len,
            matched_len: per.first().map_or(0, |p| p.1),
            per_tenant: per,
            traffic,
            traffic_total: self.nodes[ROOT as usize]
                .traffic
                .entered_at(self.lookups, half_life),
        }
    }

    pub(crate) fn tenant_slot(&mut self, tenant: T) -> u32 {
        if let Some(&ts) = self.index.get(&tenant) {
            return ts;
        }
        let slot = TenantSlot {
            id: tenant,
            list: TenantList::new(),
        };
        let ts = match self.free_slots.pop() {
            Some(ts) => {
                self.slots[ts as usize] = slot;
                ts
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert(tenant, ts);
        ts
    }

    fn record<K: KeyRuns<E> + ?Sized>(
        &mut self,
        key: &K,
        len: usize,
        path: &mut Vec<u32>,
        d: Descent,
        tenant: T,
    ) {
        if len == 0 {
            return;
        }
        let ts = self.tenant_slot(tenant);
        let mut last = path.last().copied().unwrap_or(ROOT);
        if let Some((child, k)) = d.partial {
            last = self.split(child, k);
            path.push(last);
        }
        if d.pos < len {
            let leaf = self.alloc_node(copy_units(key, d.pos, len), last);
            self.link_child(last, leaf);
            path.push(leaf);
        }
        // Deepest first, so each entry lands before its parent's on the recency lists.
        for &n in path.iter().rev() {
            self.hold(n, ts, tenant);
        }
        if self.config.evict_on_insert {
            let mut stats = EvictStats::default();
            if self.config.max_tenant_units.is_some() {
                self.evict_tenant(ts, &mut stats);
            }
            self.evict_global(&mut stats);
        }
    }

    /// Adds `tenant` to node `n`, or touches it there.
    fn hold(&mut self, n: u32, ts: u32, tenant: T) {
        let clock = self.clock;
        let node = &mut self.nodes[n as usize];
        let list = &mut self.slots[ts as usize].list;
        match node.tenants.binary_search_by(|p| p.0.cmp(&tenant)) {
            Ok(i) => self.lru.move_to_back(list, node.tenants[i].1, clock),
            Err(i) => {
                let e = self.lru.push_back(list, ts, n, clock);
                node.tenants.insert(i, (tenant, e));
                list.units += node.edge.len();
                self.total_units += node.edge.len();
            }
        }
    }

    pub(crate) fn alloc_node(&mut self, edge: Vec<E>, parent: u32) -> u32 {
        self.edge_units += edge.len();
        match self.free_nodes.pop() {
            Some(n) => {
                let node = &mut self.nodes[n as usize];
                node.edge = edge;
                node.parent = parent;
                node.traffic = Traffic::default();
                n
            }
            None => {
                debug_assert!(self.nodes.len() < NIL as usize);
                self.nodes.push(Node {
                    edge,
                    children: Small::Empty,
                    tenants: Small::Empty,
                    parent,
                    generation: 0,
                    traffic: Traffic::default(),
                });
                (self.nodes.len() - 1) as u32
            }
        }
    }

    pub(crate) fn link_child(&mut self, parent: u32, child: u32) {
        let key = self.child_key(&self.nodes[child as usize].edge);
        let children = &mut self.nodes[parent as usize].children;
        let at = children.partition_point(|c| c.0 <= key);
        children.insert(at, (key, child));
    }

    /// Position of `child` (whose key is `key`) among `parent`'s children.
    fn child_slot(&self, parent: u32, child: u32, key: u32) -> Option<usize> {
        let children = &self.nodes[parent as usize].children;
        let start = children.partition_point(|c| c.0 < key);
        children[start..]
            .iter()
            .take_while(|c| c.0 == key)
            .position(|c| c.1 == child)
            .map(|i| start + i)
    }

    /// Cuts `child`'s edge after `k` units. The head becomes a new node in its place;
    /// `child` keeps the tail, its children and its tenants. Returns the head.
    fn split(&mut self, child: u32, k: usize) -> u32 {
        let parent_key = self.child_key(&self.nodes[child as usize].edge);
        let c = &mut self.nodes[child as usize];
        let parent = c.parent;
        let head_edge = c.edge[..k].to_vec();
        c.edge.drain(..k);
        c.edge.shrink_to_fit();
        let tenants: Vec<(T, u32)> = c.tenants.to_vec();
        let tail_key = self.child_key(&self.nodes[child as usize].edge);
        let head = self.alloc_node(head_edge, parent);
        self.edge_units -= k; // moved from the child, not added
        let mut head_tenants = Small::Empty;
        for (i, (t, e)) in tenants.into_iter().enumerate() {
            let (ts, stamp) = {
                let en = self.lru.get(e);
                (en.tslot, en.stamp)
            };
            // Entries of one stamp are ordered deeper first, then by tenant (the order a
            // restore rebuilds): the head goes after the child's entries of its stamp and
            // the heads placed before it.
            let global = self.lru.run_end(e, |n| n == child || n == head);
            let list = &mut self.slots[ts as usize].list;
            let h = self.lru.insert_after(list, (global, e), ts, head, stamp);
            head_tenants.insert(i, (t, h));
        }
        let (head_traffic, tail_traffic) = self.nodes[child as usize].traffic.split();
        self.nodes[child as usize].traffic = tail_traffic;
        let h = &mut self.nodes[head as usize];
        h.traffic = head_traffic;
        h.tenants = head_tenants;
        h.children = Small::One((tail_key, child));
        self.nodes[child as usize].parent = head;
        // The head starts with the same page, so the parent's order is unchanged.
        if let Some(i) = self.child_slot(parent, child, parent_key) {
            self.nodes[parent as usize].children[i].1 = head;
        }
        head
    }

    /// Restore's counterpart of `hold`: attaches an entry with a given stamp at the back.
    pub(crate) fn attach(&mut self, n: u32, tenant: T, stamp: u64) {
        let ts = self.tenant_slot(tenant);
        let node = &mut self.nodes[n as usize];
        let list = &mut self.slots[ts as usize].list;
        if let Err(i) = node.tenants.binary_search_by(|p| p.0.cmp(&tenant)) {
            let e = self.lru.push_back(list, ts, n, stamp);
            node.tenants.insert(i, (tenant, e));
            list.units += node.edge.len();
            self.total_units += node.edge.len();
        }
    }
}
