//! Snapshots of a [`RadixTree`]: a flat pre-order list of records, produced in chunks.
//!
//! Each record is `(parent record, edge units, [(tenant, age)])`, where age is
//! `clock − stamp`, so recency survives a restart relative to the new clock. A
//! [`SnapshotCursor`] yields the records a bounded chunk at a time from `&self`, so the
//! owner can interleave snapshot chunks with routing and write them out in the background.
//! The tree may change between chunks; the result is then a fuzzy snapshot (some recent
//! inserts missed, evicted subtrees skipped), never a corrupt one: a pending node whose slot
//! was freed is skipped (generation check), and one that was pushed down by an edge split
//! is emitted with the edges above it joined back, so every record's path is a path that
//! existed. Restore repairs tenant sets (a tenant on a child is added to its ancestors).

use serde::{Deserialize, Serialize};

use crate::error::SnapshotError;
use crate::lru::NIL;
use crate::tree::{KeyUnit, ROOT, RadixTree, TenantId, TreeConfig};

#[cfg(test)]
mod tests;

/// Format version written into every snapshot (2: postcard bytes).
pub const SNAPSHOT_VERSION: u32 = 2;

/// A whole tree (or the records gathered so far), serde-encoded (postcard).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeSnapshot<E, T> {
    pub version: u32,
    pub page_size: usize,
    /// Pre-order: a record's parent always comes before it.
    pub records: Vec<SnapshotRecord<E, T>>,
}

impl<E, T> TreeSnapshot<E, T> {
    /// A snapshot with no records yet, to be filled from [`RadixTree::snapshot_chunk`].
    pub fn new(page_size: usize) -> Self {
        Self {
            version: SNAPSHOT_VERSION,
            page_size,
            records: Vec::new(),
        }
    }
}

/// One node: its edge, the record index of its parent (`None`: the root) and its tenants
/// with their ages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord<E, T> {
    pub parent: Option<u32>,
    pub edge: Vec<E>,
    pub tenants: Vec<(T, u64)>,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    node: u32,
    generation: u32,
    parent_node: u32,
    parent_record: Option<u32>,
}

/// Progress of a chunked snapshot. Holds node ids only; pass it back with the same tree.
#[derive(Debug, Clone)]
pub struct SnapshotCursor {
    stack: Vec<Pending>,
    next_record: u32,
    page_size: usize,
}

impl SnapshotCursor {
    /// True once every record has been produced.
    pub fn is_done(&self) -> bool {
        self.stack.is_empty()
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Records produced so far.
    pub fn records_done(&self) -> usize {
        self.next_record as usize
    }
}

impl<E: KeyUnit, T: TenantId> RadixTree<E, T> {
    /// The whole tree in one call.
    pub fn snapshot(&self) -> TreeSnapshot<E, T> {
        let mut cursor = self.snapshot_cursor();
        let mut snap = TreeSnapshot::new(self.page_size());
        snap.records = self.snapshot_chunk(&mut cursor, usize::MAX);
        snap
    }

    /// Starts a chunked snapshot.
    pub fn snapshot_cursor(&self) -> SnapshotCursor {
        let mut cursor = SnapshotCursor {
            stack: Vec::new(),
            next_record: 0,
            page_size: self.page_size(),
        };
        self.push_children(&mut cursor, ROOT, None);
        cursor
    }

    /// Up to `max_records` further records (empty once the cursor is done). Records
    /// from successive chunks concatenate into one [`TreeSnapshot::records`].
    pub fn snapshot_chunk(
        &self,
        cursor: &mut SnapshotCursor,
        max_records: usize,
    ) -> Vec<SnapshotRecord<E, T>> {
        self.snapshot_chunk_within(cursor, max_records, usize::MAX)
    }

    /// As [`snapshot_chunk`](Self::snapshot_chunk), and the chunk ends once its edges
    /// hold `max_units` units (it always takes one record), so a tree of long prompts is
    /// copied out a bounded piece at a time.
    pub fn snapshot_chunk_within(
        &self,
        cursor: &mut SnapshotCursor,
        max_records: usize,
        max_units: usize,
    ) -> Vec<SnapshotRecord<E, T>> {
        let mut out = Vec::new();
        let mut units = 0usize;
        while out.len() < max_records && (out.is_empty() || units < max_units) {
            let Some(p) = cursor.stack.pop() else {
                break;
            };
            let Some(edge) = self.pending_edge(p) else {
                continue;
            };
            let node = &self.nodes[p.node as usize];
            let tenants = node
                .tenants
                .iter()
                .map(|&(t, e)| (t, self.clock.saturating_sub(self.lru.get(e).stamp)))
                .collect();
            let index = cursor.next_record;
            cursor.next_record += 1;
            units = units.saturating_add(edge.len());
            out.push(SnapshotRecord {
                parent: p.parent_record,
                edge,
                tenants,
            });
            self.push_children(cursor, p.node, Some(index));
        }
        out
    }

    fn push_children(&self, cursor: &mut SnapshotCursor, n: u32, record: Option<u32>) {
        // Reversed so that popping visits children in key order.
        for &(_, c) in self.nodes[n as usize].children.iter().rev() {
            cursor.stack.push(Pending {
                node: c,
                generation: self.nodes[c as usize].generation,
                parent_node: n,
                parent_record: record,
            });
        }
    }

    /// The edge from the pending node's recorded parent down to the end of the node, or
    /// `None` if the node is gone.
    fn pending_edge(&self, p: Pending) -> Option<Vec<E>> {
        let node = self.nodes.get(p.node as usize)?;
        if node.generation != p.generation || node.parent == NIL {
            return None;
        }
        if node.parent == p.parent_node {
            return Some(node.edge.clone());
        }
        // Split since it was queued: join the new heads above it back on.
        let mut chain = vec![p.node];
        let mut cur = node.parent;
        while cur != p.parent_node {
            if cur == ROOT || cur == NIL {
                return None;
            }
            chain.push(cur);
            cur = self.nodes[cur as usize].parent;
        }
        let mut edge = Vec::new();
        for &n in chain.iter().rev() {
            edge.extend_from_slice(&self.nodes[n as usize].edge);
        }
        Some(edge)
    }

    /// Rebuilds a tree from `snapshot` under `config`, with stamps `now − age`, then
    /// evicts down to the budgets of `config`.
    pub fn restore(
        snapshot: TreeSnapshot<E, T>,
        config: TreeConfig,
        now: u64,
    ) -> Result<Self, SnapshotError> {
        if snapshot.version != SNAPSHOT_VERSION {
            return Err(SnapshotError::Version {
                found: snapshot.version,
                expected: SNAPSHOT_VERSION,
            });
        }
        let page = config.page_size.get();
        if snapshot.page_size != page {
            return Err(SnapshotError::PageSize {
                snapshot: snapshot.page_size,
                config: page,
            });
        }
        let mut records = snapshot.records;
        if records.len() >= (NIL - 1) as usize {
            return Err(SnapshotError::TooLarge);
        }
        let mut depth = vec![0u32; records.len()];
        for (i, r) in records.iter_mut().enumerate() {
            if r.edge.is_empty() || r.edge.len() % page != 0 {
                return Err(SnapshotError::BadEdge { record: i });
            }
            if let Some(p) = r.parent {
                let p = p as usize;
                if p >= i {
                    return Err(SnapshotError::BadParent { record: i });
                }
                depth[i] = depth[p] + 1;
            }
            // Sorted by tenant, youngest first, then one entry per tenant.
            r.tenants.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
            r.tenants.dedup_by_key(|t| t.0);
        }
        // A tenant on a node is on its parent, at least as young.
        for i in (0..records.len()).rev() {
            let Some(p) = records[i].parent else {
                continue;
            };
            let child = std::mem::take(&mut records[i].tenants);
            let parent = &mut records[p as usize].tenants;
            for &(t, age) in &child {
                match parent.binary_search_by(|x| x.0.cmp(&t)) {
                    Ok(j) => parent[j].1 = parent[j].1.min(age),
                    Err(j) => parent.insert(j, (t, age)),
                }
            }
            records[i].tenants = child;
        }

        let mut tree = Self::new(config);
        tree.clock = now;
        // Sized up front: growing these by doubling copies hundreds of MiB at 1M prompts.
        tree.nodes.reserve(records.len());
        let mut node_of = vec![NIL; records.len()];
        let mut entries: Vec<(u64, u32, u32, T)> =
            Vec::with_capacity(records.iter().map(|r| r.tenants.len()).sum());
        for (i, r) in records.into_iter().enumerate() {
            if r.tenants.is_empty() {
                // Nobody holds it, hence nobody holds anything below it either.
                continue;
            }
            let parent = match r.parent {
                None => ROOT,
                Some(p) => node_of[p as usize],
            };
            if parent == NIL {
                continue;
            }
            if tree.find_child(parent, &r.edge).is_some() {
                return Err(SnapshotError::DuplicateChild { record: i });
            }
            let n = tree.alloc_node(r.edge, parent);
            tree.link_child(parent, n);
            node_of[i] = n;
            entries.extend(
                r.tenants
                    .into_iter()
                    .map(|(t, age)| (now.saturating_sub(age), depth[i], n, t)),
            );
        }
        // Oldest first, children before parents on equal stamps: the eviction order. A
        // node's tenants touched at one stamp went to the back in tenant order, so that
        // order breaks the remaining ties.
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.3.cmp(&b.3)));
        tree.lru.reserve(entries.len());
        for (stamp, _, n, t) in entries {
            tree.attach(n, t, stamp);
        }
        tree.evict();
        Ok(tree)
    }
}
