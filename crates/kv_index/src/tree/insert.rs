//! Recording keys for a tenant: a plain insert, one chosen from the match in the same
//! descent, or one resumed where an observed match ended.

use std::mem;

use super::lookup::Descent;
use super::{EvictStats, KeyRuns, KeyUnit, ROOT, RadixTree, TenantId, copy_units};
use crate::prefix_match::PrefixMatch;

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
    pub(super) fn resume<K: KeyRuns<E> + ?Sized>(
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
}
