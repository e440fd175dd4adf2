//! What a tree is generic over (its key unit and tenant id), how it is configured, and
//! what an eviction reports.

use std::fmt;
use std::hash::Hash;
use std::num::NonZeroUsize;

#[cfg(doc)]
use super::RadixTree;
#[cfg(doc)]
use crate::PrefixMatch;

/// A key element: `u8` for text bytes, `char`, or `u32` for token ids (sealed).
pub trait KeyUnit: Copy + Ord + fmt::Debug + sealed::Sealed {
    /// The unit as an integer, to key children without touching their edges.
    fn bits(self) -> u64;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! key_unit {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl KeyUnit for $t {
            fn bits(self) -> u64 {
                u64::from(self)
            }
        }
    )*};
}
key_unit!(u8, u16, u32, u64);

impl sealed::Sealed for char {}
impl KeyUnit for char {
    fn bits(self) -> u64 {
        u64::from(u32::from(self))
    }
}

/// A tenant (worker) id. The gateway uses a `u64`.
pub trait TenantId: Copy + Ord + Hash + fmt::Debug {}
impl<X: Copy + Ord + Hash + fmt::Debug> TenantId for X {}

/// How a tree stores keys and how much it may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeConfig {
    /// Units per page: 1 for text, the engine's block size for tokens. Only whole pages
    /// are stored and matched.
    pub page_size: NonZeroUsize,
    /// Budget over all tenants: the sum of what each tenant holds, so a path shared by
    /// three tenants counts three times. `None`: unbounded.
    pub max_units: Option<usize>,
    /// Budget for each tenant alone. `None`: unbounded.
    pub max_tenant_units: Option<usize>,
    /// Evict right after each insert, so a call never returns over budget. When false the
    /// caller runs [`RadixTree::evict`] on its own schedule and the tree may overshoot
    /// until then.
    pub evict_on_insert: bool,
    /// Half-life, in counted lookups, of the traffic counts kept on each node (see
    /// [`PrefixMatch::traffic`]); at least 1.
    pub traffic_half_life: u32,
}

impl Default for TreeConfig {
    fn default() -> Self {
        Self {
            page_size: NonZeroUsize::MIN,
            max_units: None,
            max_tenant_units: None,
            evict_on_insert: true,
            traffic_half_life: 1024,
        }
    }
}

impl TreeConfig {
    /// A token tree with `page_size`-unit pages and no budget.
    pub fn paged(page_size: NonZeroUsize) -> Self {
        Self {
            page_size,
            ..Self::default()
        }
    }
}

/// What an eviction (or a purge) removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictStats {
    /// (node, tenant) entries dropped.
    pub entries: usize,
    /// Units dropped, summed over tenants.
    pub units: usize,
    /// Nodes unlinked because no tenant held them any more.
    pub nodes: usize,
}

impl std::ops::AddAssign for EvictStats {
    fn add_assign(&mut self, o: Self) {
        self.entries += o.entries;
        self.units += o.units;
        self.nodes += o.nodes;
    }
}
