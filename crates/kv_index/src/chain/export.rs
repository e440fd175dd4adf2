//! A rank's holdings out of the index and back in, as content keys that mean the same in
//! another process.

use super::{ChainBlock, ChainIndex};
use crate::lru::NIL;
use crate::tree::TenantId;

impl<T: TenantId> ChainIndex<T> {
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
}
