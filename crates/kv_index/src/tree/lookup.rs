//! Matching a key against the tree: the descent along the key's path, and what each
//! tenant holds of it, touched, counted as traffic or only read.

use std::mem;

use super::{KeyRuns, KeyUnit, ROOT, RadixTree, TenantId, common_prefix_at};
use crate::prefix_match::PrefixMatch;

/// Where a descent stopped: `pos` units of the (page-truncated) key matched, the last
/// `partial.1` of them inside the edge of `partial.0`, which then needs a split to insert.
#[derive(Debug, Clone, Copy)]
pub(super) struct Descent {
    pub(super) pos: usize,
    pub(super) partial: Option<(u32, usize)>,
}

impl<E: KeyUnit, T: TenantId> RadixTree<E, T> {
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

    /// Counts one lookup through `path` and into the edge a descent stopped inside.
    pub(super) fn count(&mut self, path: &[u32], d: Descent) {
        self.lookups = self.lookups.wrapping_add(1);
        let (now, half_life) = (self.lookups, self.config.traffic_half_life);
        for &n in [ROOT].iter().chain(path) {
            self.nodes[n as usize].traffic.bump(now, half_life, false);
        }
        if let Some((n, _)) = d.partial {
            self.nodes[n as usize].traffic.bump(now, half_life, true);
        }
    }

    /// Follows the first `len` units of `key` (whole pages) down the tree.
    pub(super) fn descend<K: KeyRuns<E> + ?Sized>(
        &self,
        key: &K,
        len: usize,
        path: &mut Vec<u32>,
    ) -> Descent {
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

    pub(super) fn collect(
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
}
