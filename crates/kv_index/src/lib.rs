//! The prefix index of kvgate: which worker (tenant) holds which key prefix.
//!
//! It owns three structures, one instance per (model, key kind), driven from a single
//! thread by the gateway's index actor. [`RadixTree`] is one multi-tenant radix tree, generic
//! over the key unit (`u8` text bytes, `char`, or `u32` token ids, with whole-page storage
//! for tokens, and keys given as slices or read a run at a time through [`KeyRuns`]); it
//! reports for every tenant how much of a key it holds, records routing
//! decisions in the same descent, evicts least recently used leaves first under a global
//! and a per-tenant budget, counts how much recent traffic entered each node (lookups
//! through [`RadixTree::observe`] or [`RadixTree::match_and_insert`], decayed; not
//! snapshotted), and snapshots in chunks with relative ages. [`HashIndex`] is
//! the tree-less hash mode: holders per hashed token head at fixed boundaries, with a TTL
//! and a key bound; it snapshots whole or in parts ([`HashIndex::snapshot_part`]).
//! [`ChainIndex`] is the exact index fed by the engines' own KV events: blocks keyed by
//! content (a hash over each block's tokens chained to its parent, [`chain_keys`]), held per
//! (worker, data-parallel rank), removed and cleared only for the rank that says so, under a
//! cap on blocks held; it takes plain inputs ([`ChainStore`]), not any wire format, and
//! exports and restores a rank's holdings ([`ChainBlock`]) so they outlive the process. The
//! crate never reads a clock (time is a `u64` the caller passes), does no I/O, and depends
//! on nothing async.
//!
//! Eviction is O(1) per entry dropped (recency lists kept in leaf-first order) and runs
//! after each insert by default, so no call returns over budget. Snapshots are flat
//! pre-order records produced in bounded chunks from `&self`, so the owner can interleave
//! them with routing; [`encode`]/[`decode`] turn them into bytes.
//!
//! ```
//! use kvgate_kv_index::{RadixTree, TreeConfig};
//!
//! let mut tree: RadixTree<u8, u64> = RadixTree::new(TreeConfig::default());
//! tree.insert(b"system: be brief. user: hi", 1, 10);
//! let (m, chosen) = tree.match_and_insert(b"system: be brief. user: bye", 11, |m| {
//!     // Route to the deepest holder, else to worker 2.
//!     Some(m.per_tenant.first().map_or(2, |(t, _)| *t))
//! });
//! assert_eq!(m.per_tenant, vec![(1, 24)]);
//! assert_eq!(chosen, Some(1));
//! assert_eq!(tree.peek_prefix(b"system: be brief. user: bye").matched_by(1), 27);
//!
//! let bytes = kvgate_kv_index::encode(&tree.snapshot()).unwrap();
//! let snap = kvgate_kv_index::decode(&bytes).unwrap();
//! let restored = RadixTree::<u8, u64>::restore(snap, TreeConfig::default(), 1_000).unwrap();
//! assert_eq!(restored.tenant_units(1), tree.tenant_units(1));
//! ```

mod chain;
mod codec;
mod error;
mod hash;
mod lru;
mod prefix_match;
mod small;
mod snapshot;
mod tree;

pub use chain::{
    ChainApply, ChainBlock, ChainConfig, ChainIndex, ChainMatch, ChainStats, ChainStore, chain_keys,
};
pub use codec::{decode, encode};
pub use error::SnapshotError;
pub use hash::{HashConfig, HashIndex, HashProbe, HashRecord, HashSnapshot, SweepStats};
pub use prefix_match::PrefixMatch;
pub use snapshot::{SNAPSHOT_VERSION, SnapshotCursor, SnapshotRecord, TreeSnapshot};
pub use tree::{EvictStats, KeyRuns, KeyUnit, Observed, RadixTree, TenantId, TreeConfig};
