//! Node and holding storage: the content nodes, each rank's holdings on them, kept
//! prefix-closed as blocks are held and dropped.

use super::{ChainIndex, FastMap, Holder, Holding, Node};
use crate::lru::NIL;
use crate::small::Small;
use crate::tree::TenantId;

impl<T: TenantId> ChainIndex<T> {
    /// The holder slot of (worker, rank), made on first sight.
    pub(super) fn slot(&mut self, id: (T, u32)) -> u32 {
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

    /// The holding `slot` knows by `engine`'s hash.
    pub(super) fn holding_of(&self, slot: u32, engine: u64) -> Option<u32> {
        self.holders[slot as usize].engine.get(&engine).copied()
    }

    /// Where `slot` sits in `node`'s holder list, if it holds the node.
    pub(super) fn holder_index(&self, node: u32, slot: u32) -> Option<usize> {
        let hs = &self.nodes[node as usize].holders;
        hs.binary_search_by_key(&slot, |x| x.0).ok()
    }

    /// The node of key `k`, created under `parent` if new.
    pub(super) fn node_for(&mut self, k: u64, parent: u32) -> u32 {
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
    pub(super) fn hold(&mut self, slot: u32, node: u32, engine: u64, tier: u8) {
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
    pub(super) fn drop_subtree(&mut self, h: u32) -> usize {
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
    pub(super) fn drop_leaf(&mut self, h: u32) {
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

    pub(super) fn clear_slot(&mut self, slot: u32) -> usize {
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
}
