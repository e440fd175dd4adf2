//! The radix tree: one generic implementation for bytes, chars and token ids.
//!
//! Layout: an arena of nodes addressed by `u32`, with a free list. A node owns its edge
//! (always whole pages), its children sorted by first unit, and its tenants sorted by id,
//! each pointing at an [`Entry`](crate::lru) on the recency lists. A tenant present on a
//! node is present on every ancestor, so a tenant's match is the depth of the deepest node
//! it holds on the key's path. Nodes with no tenant are unlinked at once; only the root is
//! ever empty.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::lru::{Lru, NIL, TenantList};
use crate::small::Small;

mod config;
mod evict;
mod insert;
mod key;
mod lookup;
mod nodes;
mod traffic;

pub use config::{EvictStats, KeyUnit, TenantId, TreeConfig};
pub use insert::Observed;
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
}
