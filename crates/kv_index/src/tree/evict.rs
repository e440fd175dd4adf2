//! Eviction and purges: least recently used (node, tenant) leaves first, O(1) per entry
//! dropped, since the recency lists are kept in eviction order.

use std::mem;

use super::{EvictStats, KeyRuns, KeyUnit, NIL, ROOT, RadixTree, Small, TenantId};

impl<E: KeyUnit, T: TenantId> RadixTree<E, T> {
    /// Undoes a record of `key` for `tenant` back to its first `keep` units (what the tenant
    /// held of it before): the tenant's entries on the key's path that begin at or past
    /// `keep` are dropped, deepest first, stopping at a node where the tenant still holds
    /// a child (another key of its own passes there). Returns the units dropped.
    pub fn forget<K: KeyRuns<E> + ?Sized>(&mut self, key: &K, tenant: T, keep: usize) -> usize {
        if !self.index.contains_key(&tenant) {
            return 0;
        }
        let len = self.truncate(key.units());
        let mut path = mem::take(&mut self.path);
        self.descend(key, len, &mut path);
        let holds = |tree: &Self, n: u32| {
            let tenants = &tree.nodes[n as usize].tenants;
            tenants
                .binary_search_by(|p| p.0.cmp(&tenant))
                .ok()
                .map(|i| tenants[i].1)
        };
        let mut end: usize = path
            .iter()
            .map(|&n| self.nodes[n as usize].edge.len())
            .sum();
        let mut stats = EvictStats::default();
        for &n in path.iter().rev() {
            let start = end - self.nodes[n as usize].edge.len();
            end = start;
            if start < keep {
                break;
            }
            let Some(entry) = holds(self, n) else {
                continue;
            };
            let below = self.nodes[n as usize]
                .children
                .iter()
                .any(|&(_, c)| holds(self, c).is_some());
            if below {
                break;
            }
            self.drop_entry(entry, &mut stats);
        }
        self.path = path;
        stats.units
    }

    /// Brings every tenant within `max_tenant_units` and the tree within `max_units`,
    /// dropping least recently used (node, tenant) leaves first. Costs O(1) per entry
    /// dropped: the recency lists are kept in eviction order.
    pub fn evict(&mut self) -> EvictStats {
        let mut stats = EvictStats::default();
        if self.config.max_tenant_units.is_some() {
            for ts in self.index.values().copied().collect::<Vec<_>>() {
                self.evict_tenant(ts, &mut stats);
            }
        }
        self.evict_global(&mut stats);
        stats
    }

    /// Drops `tenant` everywhere and forgets it. Returns the units it held.
    pub fn remove_tenant(&mut self, tenant: T) -> usize {
        let Some(ts) = self.index.remove(&tenant) else {
            return 0;
        };
        let units = self.purge(ts);
        self.free_slots.push(ts);
        units
    }

    /// Drops everything `tenant` holds (its engine was emptied) but keeps it listed in
    /// [`tenants`](Self::tenants). Returns the units it held.
    pub fn clear_tenant(&mut self, tenant: T) -> usize {
        match self.index.get(&tenant) {
            Some(&ts) => self.purge(ts),
            None => 0,
        }
    }

    /// Removes every tenant for which `keep` is false (e.g. workers that restarted while a
    /// snapshot was on disk). Returns how many tenants were removed.
    pub fn retain_tenants(&mut self, mut keep: impl FnMut(T) -> bool) -> usize {
        let gone: Vec<T> = self.index.keys().copied().filter(|t| !keep(*t)).collect();
        for &t in &gone {
            self.remove_tenant(t);
        }
        gone.len()
    }

    pub(super) fn evict_tenant(&mut self, ts: u32, stats: &mut EvictStats) {
        let Some(max) = self.config.max_tenant_units else {
            return;
        };
        while self.slots[ts as usize].list.units > max {
            let Some(head) = self.slots[ts as usize].list.head() else {
                break;
            };
            self.drop_entry(head, stats);
        }
    }

    pub(super) fn evict_global(&mut self, stats: &mut EvictStats) {
        let Some(max) = self.config.max_units else {
            return;
        };
        while self.total_units > max {
            let Some(e) = self.lru.head() else {
                break;
            };
            self.drop_entry(e, stats);
        }
    }

    fn purge(&mut self, ts: u32) -> usize {
        let mut stats = EvictStats::default();
        while let Some(head) = self.slots[ts as usize].list.head() {
            self.drop_entry(head, &mut stats);
        }
        stats.units
    }

    /// Removes one entry, which the list invariant guarantees is a leaf for its tenant,
    /// and unlinks its node if no tenant is left on it.
    fn drop_entry(&mut self, e: u32, stats: &mut EvictStats) {
        let (n, ts) = {
            let en = self.lru.get(e);
            (en.node, en.tslot)
        };
        let slot = &mut self.slots[ts as usize];
        let node = &mut self.nodes[n as usize];
        if let Ok(i) = node.tenants.binary_search_by(|p| p.0.cmp(&slot.id)) {
            node.tenants.remove(i);
        }
        let len = node.edge.len();
        slot.list.units -= len;
        self.total_units -= len;
        self.lru.remove(&mut slot.list, e);
        stats.entries += 1;
        stats.units += len;
        self.evicted.entries += 1;
        self.evicted.units += len;
        if n != ROOT && node.tenants.is_empty() && node.children.is_empty() {
            self.free_node(n);
            stats.nodes += 1;
            self.evicted.nodes += 1;
        }
    }

    fn free_node(&mut self, n: u32) {
        let key = self.child_key(&self.nodes[n as usize].edge);
        let node = &mut self.nodes[n as usize];
        let parent = node.parent;
        self.edge_units -= node.edge.len();
        node.edge = Vec::new();
        node.children = Small::Empty;
        node.tenants = Small::Empty;
        node.parent = NIL;
        node.generation = node.generation.wrapping_add(1);
        if let Some(i) = self.child_slot(parent, n, key) {
            self.nodes[parent as usize].children.remove(i);
        }
        self.free_nodes.push(n);
    }
}
