//! Node storage: the arena of nodes, finding and linking children by their first page,
//! splitting an edge, and each tenant's entries on the nodes it holds.

use super::{KeyRuns, KeyUnit, Node, RadixTree, TenantId, TenantSlot, Traffic, copy_units};
use crate::lru::{NIL, TenantList};
use crate::small::Small;

impl<E: KeyUnit, T: TenantId> RadixTree<E, T> {
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
    pub(super) fn find_child_at<K: KeyRuns<E> + ?Sized>(
        &self,
        node: u32,
        key: &K,
        pos: usize,
    ) -> Option<u32> {
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
    pub(super) fn child_key(&self, units: &[E]) -> u32 {
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

    /// Adds `tenant` to node `n`, or touches it there.
    pub(super) fn hold(&mut self, n: u32, ts: u32, tenant: T) {
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
    pub(super) fn child_slot(&self, parent: u32, child: u32, key: u32) -> Option<usize> {
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
    pub(super) fn split(&mut self, child: u32, k: usize) -> u32 {
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
