//! What the index holds and where its persistence stands, for `/admin/index` and tests.

use actix::prelude::*;
use kvgate_policies::WorkerId;

use super::IndexActor;

/// Per-model sizes and the persistence state, for inspection and tests.
#[derive(Message, Debug)]
#[rtype(result = "(Vec<IndexStats>, PersistState)")]
pub struct GetIndexStats;

/// Where persistence stands, for inspection and tests.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PersistState {
    pub enabled: bool,
    /// Changes not yet in a committed snapshot.
    pub pending: bool,
    pub snapshots_written: u64,
    pub write_failures: u64,
    /// Times the snapshot paused because the writer was behind.
    pub deferred: u64,
    pub committed_generation: u64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct IndexStats {
    pub model: String,
    pub text_units: usize,
    pub token_units: usize,
    pub hash_keys: usize,
    /// Units held per worker (text + tokens).
    pub per_worker: Vec<(WorkerId, usize)>,
    /// The same apart: per worker, bytes of text and tokens.
    #[serde(skip)]
    pub per_worker_split: Vec<(WorkerId, usize, usize)>,
}

impl Handler<GetIndexStats> for IndexActor {
    type Result = MessageResult<GetIndexStats>;

    fn handle(&mut self, _: GetIndexStats, _: &mut Context<Self>) -> Self::Result {
        let mut out: Vec<IndexStats> = self
            .models
            .iter()
            .map(|(name, m)| {
                let mut workers = m.text.tenants();
                workers.extend(m.tokens.tenants());
                workers.sort();
                workers.dedup();
                let split: Vec<(WorkerId, usize, usize)> = workers
                    .into_iter()
                    .map(|w| (w, m.text.tenant_units(w), m.tokens.tenant_units(w)))
                    .collect();
                IndexStats {
                    model: name.clone(),
                    text_units: m.text.total_units(),
                    token_units: m.tokens.total_units(),
                    hash_keys: m.hash.key_count(),
                    per_worker: split.iter().map(|(w, t, k)| (*w, t + k)).collect(),
                    per_worker_split: split,
                }
            })
            .collect();
        out.sort_by(|a, b| a.model.cmp(&b.model));
        let persist = self
            .persist
            .as_ref()
            .map_or_else(PersistState::default, |p| {
                use std::sync::atomic::Ordering::{Acquire, Relaxed};
                let committed = p.stats.committed_generation.load(Acquire);
                PersistState {
                    enabled: true,
                    pending: self.dirty || self.job.is_some() || committed < self.generation,
                    snapshots_written: p.stats.snapshots_written.load(Relaxed),
                    write_failures: p.stats.write_failures.load(Relaxed),
                    deferred: p.stats.deferred.load(Relaxed),
                    committed_generation: committed,
                }
            });
        MessageResult((out, persist))
    }
}
