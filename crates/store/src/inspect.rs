//! Reading a stopped gateway's store offline (`kvgatectl snapshot inspect`).

use std::collections::BTreeMap;
use std::path::Path;

use kvgate_core::WorkerId;
use serde::Serialize;

use crate::db::Store;
use crate::error::StoreError;
use crate::image::{Chunk, RegistryImage};

/// What `kvgatectl snapshot inspect` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoreSummary {
    pub path: String,
    /// As found on disk (a version-1 store is shown as 1, not upgraded); 0 when none is
    /// recorded.
    pub format_version: u32,
    pub written_at: Option<f64>,
    pub generation: Option<u64>,
    pub size_on_disk: u64,
    pub models: Vec<ModelSummary>,
    pub registry: RegistryImage,
    /// The KV-event chain index's snapshot, when one was written.
    pub events: Option<EventsSummary>,
}

/// What the chain index's snapshot holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventsSummary {
    pub generation: u64,
    pub written_at: f64,
    pub ranks: Vec<RankSummary>,
}

/// One engine rank in the chain index's snapshot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankSummary {
    pub worker: String,
    pub url: String,
    pub rank: u32,
    pub startup_time: Option<f64>,
    /// Replay resumes from here after a restart.
    pub next_seq: u64,
    pub blocks: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSummary {
    pub model: String,
    pub workers: Vec<WorkerSummary>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerSummary {
    pub worker: String,
    pub url: Option<String>,
    pub startup_time: Option<f64>,
    /// Index nodes (text and token trees) and hash-mode keys the worker holds.
    pub entries: u64,
    /// Bytes of text plus tokens the worker holds.
    pub units: u64,
}

/// Reads a store offline. A directory without a store is an error (nothing is created).
pub fn inspect(dir: &Path) -> Result<StoreSummary, StoreError> {
    if !dir.join("store").is_dir() {
        return Err(StoreError::Io {
            path: dir.join("store").display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no kvgate store here"),
        });
    }
    let store = Store::open_here(dir, false, crate::db::StoreOptions::default())?;
    let image = store.load()?;
    let registry = store.registry()?;
    let mut models = Vec::new();
    if let Some(img) = &image {
        let mut per: BTreeMap<(u32, WorkerId), (u64, u64)> = BTreeMap::new();
        let mut add = |m: u32, w: WorkerId, units: usize| {
            let e = per.entry((m, w)).or_default();
            e.0 += 1;
            e.1 += units as u64;
        };
        for c in &img.chunks {
            match c {
                Chunk::Text { model, records, .. } => {
                    for r in records {
                        for (w, _) in &r.tenants {
                            add(*model, *w, r.edge.len());
                        }
                    }
                }
                Chunk::Tokens { model, records, .. } => {
                    for r in records {
                        for (w, _) in &r.tenants {
                            add(*model, *w, r.edge.len());
                        }
                    }
                }
                Chunk::Hash { model, snapshot } => {
                    for r in &snapshot.records {
                        for (w, _) in &r.holders {
                            add(*model, *w, 0);
                        }
                    }
                }
            }
        }
        for (i, name) in img.header.models.iter().enumerate() {
            let workers = per
                .iter()
                .filter(|((m, _), _)| *m as usize == i)
                .map(|((_, w), (entries, units))| {
                    let stamp = img.header.workers.iter().find(|s| s.worker == *w);
                    WorkerSummary {
                        worker: w.to_string(),
                        url: stamp.map(|s| s.url.clone()),
                        startup_time: stamp.and_then(|s| s.startup_time),
                        entries: *entries,
                        units: *units,
                    }
                })
                .collect();
            models.push(ModelSummary {
                model: name.clone(),
                workers,
            });
        }
    }
    let events = store.load_events()?.map(|e| {
        let ranks = e
            .header
            .ranks
            .iter()
            .map(|r| RankSummary {
                worker: r.worker.to_string(),
                url: r.url.clone(),
                rank: r.rank,
                startup_time: r.startup_time,
                next_seq: r.next_seq,
                blocks: (e.chunks.iter())
                    .filter(|c| c.worker == r.worker && c.rank == r.rank)
                    .map(|c| c.blocks.len() as u64)
                    .sum(),
            })
            .collect();
        EventsSummary {
            generation: e.header.generation,
            written_at: e.header.written_at,
            ranks,
        }
    });
    Ok(StoreSummary {
        path: store.path.display().to_string(),
        format_version: store.on_disk.unwrap_or(0),
        written_at: image.as_ref().map(|i| i.header.written_at),
        generation: image.as_ref().map(|i| i.header.generation),
        size_on_disk: store.size_on_disk(),
        models,
        registry,
        events,
    })
}
