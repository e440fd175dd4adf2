//! The index actor's persistence: snapshots produced a chunk at a time between requests
//! and handed to the store's writer, and the restore of a stored snapshot at startup.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kvgate_core::clock::unix_now;
use kvgate_kv_index::{
    HashIndex, HashSnapshot, KeyUnit, RadixTree, SNAPSHOT_VERSION, SnapshotCursor, SnapshotError,
    SnapshotRecord, TreeSnapshot,
};
use kvgate_policies::WorkerId;
use kvgate_store::{Chunk, FORMAT_VERSION, Image, ImageHeader, Persist, WorkerStamp};
use tracing::{debug, info, warn};

use super::{IndexActor, IndexConfig, Known, ModelIndex, hash_config, tree_config};

/// Records per snapshot chunk: small enough that producing one stalls routing for about a
/// millisecond.
const CHUNK_RECORDS: usize = 8192;

/// Bytes of edges per chunk: a tree of long prompts has few records, each a long edge, and
/// a chunk of 8192 of them would copy the whole tree out at once (and again as it is
/// encoded and written), several times its size in resident memory during a snapshot.
const CHUNK_BYTES: usize = 1 << 20;

/// Which of a model's indexes the job is writing, and where it stands in it.
#[derive(Debug)]
enum Stage {
    Text(Option<SnapshotCursor>),
    Tokens(Option<SnapshotCursor>),
    /// The hash index's next slot.
    Hash(usize),
}

/// A snapshot being produced a chunk at a time, between requests.
#[derive(Debug)]
pub(super) struct SnapJob {
    generation: u64,
    /// Taken when the job starts: a worker purged meanwhile must not vouch for chunks
    /// written before its purge.
    workers: Vec<WorkerStamp>,
    models: Vec<String>,
    model: usize,
    stage: Stage,
    seq: u32,
    /// A piece the writer had no room for yet.
    pending: Option<Persist>,
    started: Instant,
}

/// The next records of `tree` under `cursor` (started on first use); `None` as the cursor
/// once the tree is done.
fn tree_records<E: KeyUnit>(
    tree: &RadixTree<E, WorkerId>,
    cursor: &mut Option<SnapshotCursor>,
) -> (Vec<SnapshotRecord<E, WorkerId>>, bool) {
    let c = cursor.get_or_insert_with(|| tree.snapshot_cursor());
    let units = CHUNK_BYTES / std::mem::size_of::<E>().max(1);
    let records = tree.snapshot_chunk_within(c, CHUNK_RECORDS, units);
    let done = c.is_done();
    if done {
        *cursor = None;
    }
    (records, done)
}

impl IndexActor {
    pub(super) fn stamps(&self) -> Vec<WorkerStamp> {
        let mut workers: Vec<WorkerStamp> = self
            .known
            .iter()
            .map(|(w, k)| WorkerStamp {
                worker: *w,
                url: k.url.clone(),
                startup_time: k.startup_time,
            })
            .collect();
        workers.sort_by_key(|s| s.worker);
        workers
    }

    /// Starts a background snapshot when something changed and none is running.
    pub(super) fn start_snapshot(&mut self, ctx: &mut Context<Self>) {
        if self.persist.is_none() || self.job.is_some() || !self.dirty {
            return;
        }
        self.start_job();
        ctx.run_later(Duration::ZERO, |act, ctx| {
            act.snapshot_step(ctx, false);
        });
    }

    /// Changes made while the job runs mark the index dirty again.
    fn start_job(&mut self) {
        self.generation += 1;
        let mut models: Vec<String> = self.models.keys().cloned().collect();
        models.sort();
        self.job = Some(SnapJob {
            generation: self.generation,
            workers: self.stamps(),
            models,
            model: 0,
            stage: Stage::Text(None),
            seq: 0,
            pending: None,
            started: Instant::now(),
        });
        self.dirty = false;
    }

    /// Produces and hands over the next piece of the running job. When the writer's queue
    /// is full the piece waits and is offered again shortly (the job is paused, not lost);
    /// with `blocking` (shutdown) it waits for room instead.
    fn snapshot_step(&mut self, ctx: &mut Context<Self>, blocking: bool) -> bool {
        let (Some(mut job), Some(persist)) = (self.job.take(), self.persist.clone()) else {
            return false;
        };
        loop {
            if let Some(msg) = job.pending.take() {
                let is_commit = matches!(msg, Persist::Commit(_));
                let outcome = if blocking {
                    if persist.send_blocking(msg) {
                        Ok(())
                    } else {
                        Err(None)
                    }
                } else {
                    persist.offer(msg)
                };
                match outcome {
                    Ok(()) if is_commit => {
                        // A large index that stays dirty is then written at most
                        // 1 / (1 + backoff) of the time instead of again every interval.
                        let took = job.started.elapsed();
                        if let Some(h) = &self.snapshot_seconds {
                            h.observe(took.as_secs_f64());
                        }
                        let wait = took.mul_f64(self.cfg.snapshot_backoff);
                        self.next_timed_snapshot = Some(Instant::now() + wait);
                        return true;
                    }
                    Ok(()) if blocking => {}
                    Ok(()) => {
                        self.job = Some(job);
                        ctx.run_later(Duration::ZERO, |act, ctx| {
                            act.snapshot_step(ctx, false);
                        });
                        return true;
                    }
                    Err(Some(msg)) => {
                        job.pending = Some(msg);
                        self.job = Some(job);
                        ctx.run_later(Duration::from_millis(20), |act, ctx| {
                            act.snapshot_step(ctx, false);
                        });
                        return true;
                    }
                    Err(None) => {
                        warn!(
                            generation = job.generation,
                            "snapshot abandoned: the writer is gone"
                        );
                        self.dirty = true;
                        return false;
                    }
                }
            }
            job.pending = Some(self.next_piece(&mut job));
        }
    }

    /// The next chunk of the job, or its commit once every model is written.
    fn next_piece(&self, job: &mut SnapJob) -> Persist {
        loop {
            let Some(name) = job.models.get(job.model) else {
                return Persist::Commit(ImageHeader {
                    format_version: FORMAT_VERSION,
                    generation: job.generation,
                    written_at: unix_now(),
                    models: job.models.clone(),
                    workers: std::mem::take(&mut job.workers),
                    chunks: job.seq,
                });
            };
            let model = job.model as u32;
            let Some(m) = self.models.get(name) else {
                job.model += 1;
                continue;
            };
            let chunk = match &mut job.stage {
                Stage::Text(cursor) => {
                    let (records, done) = tree_records(&m.text, cursor);
                    if done {
                        job.stage = Stage::Tokens(None);
                    }
                    (!records.is_empty()).then(|| Chunk::Text {
                        model,
                        page_size: m.text.page_size(),
                        records,
                    })
                }
                Stage::Tokens(cursor) => {
                    let (records, done) = tree_records(&m.tokens, cursor);
                    if done {
                        job.stage = Stage::Hash(0);
                    }
                    (!records.is_empty()).then(|| Chunk::Tokens {
                        model,
                        page_size: m.tokens.page_size(),
                        records,
                    })
                }
                Stage::Hash(next) => {
                    // Up to 2^20 keys: a piece per turn, like the trees, so routing never
                    // waits for the whole map.
                    let (records, rest) = m.hash.snapshot_part(*next, CHUNK_RECORDS);
                    match rest {
                        Some(n) => *next = n,
                        None => {
                            job.stage = Stage::Text(None);
                            job.model += 1;
                        }
                    }
                    (!records.is_empty()).then_some(Chunk::Hash {
                        model,
                        snapshot: HashSnapshot {
                            version: SNAPSHOT_VERSION,
                            records,
                        },
                    })
                }
            };
            if let Some(chunk) = chunk {
                job.seq += 1;
                return Persist::Chunk {
                    generation: job.generation,
                    seq: job.seq - 1,
                    chunk: Box::new(chunk),
                };
            }
        }
    }

    /// A complete snapshot, written now; blocks this thread until the writer has flushed
    /// it (the actor is stopping, nothing else runs on it any more).
    pub(super) fn final_snapshot(&mut self, ctx: &mut Context<Self>) -> bool {
        let Some(persist) = self.persist.clone() else {
            return false;
        };
        // A job in flight is superseded by this complete one.
        self.job = None;
        self.dirty = true;
        self.start_job();
        let ok = self.snapshot_step(ctx, true);
        persist.flush();
        ok
    }

    /// Chunks already written may hold a purged worker's old entries: the running job
    /// must not commit them.
    pub(super) fn abandon_job(&mut self) {
        if self.job.take().is_some() {
            debug!("snapshot restarted after a purge");
        }
    }

    /// Rebuilds the index from a stored snapshot. Every entry is a hint until its worker
    /// is confirmed by the registry with the same engine start time.
    pub fn restore(&mut self, image: Image) {
        let rebuilt = rebuild(&self.cfg, self.now(), image);
        self.install(rebuilt);
    }

    /// Puts an index rebuilt from a snapshot in place of the current one.
    pub(super) fn install(&mut self, r: Rebuilt) {
        self.generation = r.generation;
        self.models = r.models;
        self.known = r.known;
    }
}

/// An index rebuilt from a stored snapshot apart from the actor, so that a rebuild after
/// a failure can run on another thread (the writer's) and routing goes on meanwhile.
#[derive(Debug)]
pub(super) struct Rebuilt {
    models: HashMap<String, ModelIndex, foldhash::fast::RandomState>,
    known: HashMap<WorkerId, Known>,
    generation: u64,
}

/// The indexes and workers of `image`, stamped `now` on the trees' clock.
pub(super) fn rebuild(cfg: &IndexConfig, now: u64, image: Image) -> Rebuilt {
    let Image { header, chunks } = image;
    let started = Instant::now();
    let mut models = HashMap::default();
    let mut pieces = Pieces::sized(&chunks);
    for c in chunks {
        pieces.add(c);
    }
    let Pieces {
        text, tokens, hash, ..
    } = pieces;
    let names = &header.models;
    restore_each(&mut models, cfg, names, "text", text, |m, s| {
        m.text = RadixTree::restore(s, tree_config(cfg, 1), now)?;
        Ok(())
    });
    // A changed --block-size makes stored pages meaningless: that index is dropped.
    restore_each(&mut models, cfg, names, "token", tokens, |m, s| {
        m.tokens = RadixTree::restore(s, tree_config(cfg, cfg.block_size), now)?;
        Ok(())
    });
    restore_each(&mut models, cfg, names, "hash", hash, |m, s| {
        m.hash = HashIndex::restore(s, hash_config(cfg), now)?;
        Ok(())
    });
    let known: HashMap<WorkerId, Known> = header
        .workers
        .into_iter()
        .map(|s| {
            let k = Known {
                url: s.url,
                startup_time: s.startup_time,
                confirmed: false,
            };
            (s.worker, k)
        })
        .collect();
    // A worker that joined while this snapshot was being written can have entries in
    // it but no stamp in its header: with no engine start to check them against, and
    // no record to drop them by if it never comes back, they are not restored.
    let mut unnamed = false;
    for m in models.values_mut() {
        unnamed |= m.retain(|w| known.contains_key(&w));
    }
    if unnamed {
        info!("restored entries of workers the snapshot's header does not name were dropped");
    }
    info!(
        generation = header.generation,
        models = header.models.len(),
        workers = known.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "prefix index restored"
    );
    Rebuilt {
        models,
        known,
        generation: header.generation,
    }
}

/// Restores one kind of index of every model named in the header; a snapshot that does
/// not fit the configuration costs only that model's index of that kind.
fn restore_each<S>(
    into: &mut HashMap<String, ModelIndex, foldhash::fast::RandomState>,
    cfg: &IndexConfig,
    models: &[String],
    kind: &str,
    snaps: HashMap<u32, S>,
    put: impl Fn(&mut ModelIndex, S) -> Result<(), SnapshotError>,
) {
    for (i, snap) in snaps {
        let Some(name) = models.get(i as usize) else {
            continue;
        };
        let m = into
            .entry(name.clone())
            .or_insert_with(|| ModelIndex::new(cfg));
        if let Err(e) = put(m, snap) {
            warn!(model = %name, index = kind, error = %e, "stored index dropped");
        }
    }
}

/// A stored snapshot's chunks gathered per model and kind.
struct Pieces {
    text: HashMap<u32, TreeSnapshot<u8, WorkerId>>,
    tokens: HashMap<u32, TreeSnapshot<u32, WorkerId>>,
    hash: HashMap<u32, HashSnapshot<WorkerId>>,
    /// Records per (model, is text) for the trees, so each is sized up front: one move
    /// per record, no regrowth.
    sizes: HashMap<(u32, bool), usize>,
}

impl Pieces {
    fn sized(chunks: &[Chunk]) -> Pieces {
        let mut sizes = HashMap::new();
        for c in chunks {
            match c {
                Chunk::Text { model, records, .. } => {
                    *sizes.entry((*model, true)).or_default() += records.len()
                }
                Chunk::Tokens { model, records, .. } => {
                    *sizes.entry((*model, false)).or_default() += records.len()
                }
                Chunk::Hash { .. } => {}
            }
        }
        Pieces {
            text: HashMap::new(),
            tokens: HashMap::new(),
            hash: HashMap::new(),
            sizes,
        }
    }

    fn add(&mut self, c: Chunk) {
        match c {
            Chunk::Text {
                model,
                page_size,
                records,
            } => gather(
                &mut self.text,
                &self.sizes,
                (model, true),
                page_size,
                records,
            ),
            Chunk::Tokens {
                model,
                page_size,
                records,
            } => gather(
                &mut self.tokens,
                &self.sizes,
                (model, false),
                page_size,
                records,
            ),
            // A model's hash index comes in several pieces.
            Chunk::Hash { model, snapshot } => match self.hash.entry(model) {
                Entry::Vacant(v) => {
                    v.insert(snapshot);
                }
                Entry::Occupied(mut o) if o.get().version == snapshot.version => {
                    o.get_mut().records.extend(snapshot.records)
                }
                // Pieces of mixed versions: restore refuses the model's whole index.
                Entry::Occupied(mut o) => o.get_mut().version = snapshot.version,
            },
        }
    }
}

fn gather<E>(
    into: &mut HashMap<u32, TreeSnapshot<E, WorkerId>>,
    sizes: &HashMap<(u32, bool), usize>,
    key: (u32, bool),
    page_size: usize,
    records: Vec<SnapshotRecord<E, WorkerId>>,
) {
    into.entry(key.0)
        .or_insert_with(|| {
            let mut t = TreeSnapshot::new(page_size);
            t.records.reserve(sizes.get(&key).copied().unwrap_or(0));
            t
        })
        .records
        .extend(records);
}

#[cfg(test)]
mod tests;
