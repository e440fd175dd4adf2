//! Matching a request against the chains: hash its blocks a group at a time and walk from
//! the root while any rank still holds the path.

use super::{ChainIndex, ChainMatch, Node, key};
use crate::tree::TenantId;

impl<T: TenantId> ChainIndex<T> {
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
}
