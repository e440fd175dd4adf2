//! The index actor: owns the prefix indexes (one text tree, one token tree and one hash
//! index per model) and answers "who holds how much of this prompt". The selector asks
//! before each cache-aware decision and tells it what to record after.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kvgate_kv_index::{
    HashConfig, HashIndex, HashSnapshot, PrefixMatch, RadixTree, SNAPSHOT_VERSION, SnapshotCursor,
    TreeConfig, TreeSnapshot,
};
use kvgate_policies::{
    CacheIndex, MatchSource, PolicyConfig, PrefixMatches, PrefixTraffic, RequestFacts, RoutingText,
    WorkerId,
};
use tracing::{debug, info, warn};

use crate::persist::{Persist, Persister};
use crate::registry::FleetChanged;
use crate::store::{Chunk, Image, ImageHeader, WorkerStamp, unix_now};

/// The trees' clock starts here, so ages restored from disk never saturate at zero.
const CLOCK_BASE: u64 = 1 << 40;

/// Records per snapshot chunk: small enough that producing one stalls routing for about a
/// millisecond.
const CHUNK_RECORDS: usize = 8192;

/// What the index needs from the policy configuration.
#[derive(Debug, Clone)]
pub struct IndexConfig {
    pub cache_index: CacheIndex,
    pub block_size: usize,
    /// Budget per model and tree, in units summed over workers.
    pub max_tree_size: usize,
    pub eviction_interval: Option<Duration>,
    pub boundaries: Vec<usize>,
    pub ttl: Duration,
    /// How often a changed index is written to the store.
    pub snapshot_interval: Duration,
    /// The timer's next snapshot waits this many times the last one's duration.
    pub snapshot_backoff: f64,
}

impl IndexConfig {
    pub fn from_policy(p: &PolicyConfig, snapshot_interval: Duration) -> IndexConfig {
        IndexConfig {
            snapshot_interval,
            cache_index: p.cache_index,
            block_size: p.block_size,
            max_tree_size: p.max_tree_size,
            eviction_interval: p.eviction_interval,
            boundaries: p.cache_boundaries.clone(),
            ttl: p.cache_ttl,
            snapshot_backoff: 4.0,
        }
    }
}

/// The indexes of one model.
#[derive(Debug)]
struct ModelIndex {
    text: RadixTree<u8, WorkerId>,
    tokens: RadixTree<u32, WorkerId>,
    hash: HashIndex<WorkerId>,
}

fn tree_config(cfg: &IndexConfig, page: usize) -> TreeConfig {
    // Evicting on insert keeps memory bounded by the budget between sweeps.
    TreeConfig {
        page_size: NonZeroUsize::new(page).unwrap_or(NonZeroUsize::MIN),
        max_units: Some(cfg.max_tree_size),
        max_tenant_units: None,
        evict_on_insert: true,
        ..TreeConfig::default()
    }
}

/// The tree's traffic counts, in the policies' terms.
fn traffic<T>(pm: &PrefixMatch<T>) -> PrefixTraffic {
    PrefixTraffic {
        total: f64::from(pm.traffic_total),
        by_prefix: pm
            .traffic
            .iter()
            .map(|&(end, c)| (end, f64::from(c)))
            .collect(),
    }
}

fn hash_config(cfg: &IndexConfig) -> HashConfig {
    HashConfig::new(cfg.boundaries.clone(), cfg.ttl.as_millis() as u64)
}

impl ModelIndex {
    fn new(cfg: &IndexConfig) -> ModelIndex {
        ModelIndex {
            text: RadixTree::new(tree_config(cfg, 1)),
            tokens: RadixTree::new(tree_config(cfg, cfg.block_size)),
            hash: HashIndex::new(hash_config(cfg)),
        }
    }

    fn remove(&mut self, w: WorkerId) {
        self.text.remove_tenant(w);
        self.tokens.remove_tenant(w);
        self.hash.remove_tenant(w);
    }

    /// Keeps only the entries of workers `keep` accepts; returns whether any went.
    fn retain(&mut self, keep: impl Fn(WorkerId) -> bool) -> bool {
        let text = self.text.retain_tenants(&keep);
        let tokens = self.tokens.retain_tenants(&keep);
        let hash = self.hash.retain_tenants(&keep);
        text + tokens + hash.holders > 0
    }
}

/// What the index knows of a worker whose entries it holds.
#[derive(Debug, Clone)]
struct Known {
    url: String,
    /// The engine start its entries belong to; a different one means an emptied cache.
    startup_time: Option<f64>,
    /// Seen in a fleet update of this process (restored workers start unconfirmed).
    confirmed: bool,
}

/// A snapshot being produced a chunk at a time, between requests.
#[derive(Debug)]
struct SnapJob {
    generation: u64,
    /// Taken when the job starts: a worker purged meanwhile must not vouch for chunks
    /// written before its purge.
    workers: Vec<WorkerStamp>,
    models: Vec<String>,
    model: usize,
    /// 0 text, 1 tokens, 2 hash.
    stage: u8,
    cursor: Option<SnapshotCursor>,
    /// The hash index's next slot.
    hash_next: usize,
    seq: u32,
    /// A piece the writer had no room for yet.
    pending: Option<Persist>,
    started: Instant,
}

#[derive(Debug)]
pub struct IndexActor {
    cfg: IndexConfig,
    models: HashMap<String, ModelIndex>,
    known: HashMap<WorkerId, Known>,
    epoch: Instant,
    persist: Option<Persister>,
    /// Changed since the last committed snapshot.
    dirty: bool,
    job: Option<SnapJob>,
    generation: u64,
    /// The timer's next snapshot waits until then (see `IndexConfig::snapshot_backoff`).
    next_timed_snapshot: Option<Instant>,
}

impl IndexActor {
    pub fn new(cfg: IndexConfig, epoch: Instant, persist: Option<Persister>) -> IndexActor {
        IndexActor {
            cfg,
            models: HashMap::new(),
            known: HashMap::new(),
            epoch,
            persist,
            dirty: false,
            job: None,
            next_timed_snapshot: None,
            generation: 0,
        }
    }

    /// Rebuilds the index from a stored snapshot. Every entry is a hint until its worker
    /// is confirmed by the registry with the same engine start time.
    pub fn restore(&mut self, image: Image) {
        let now = self.now();
        let Image { header, chunks } = image;
        let started = Instant::now();
        self.generation = header.generation;
        // Each model's records, sized up front: one move per record, no regrowth.
        let mut text_len: HashMap<u32, usize> = HashMap::new();
        let mut tokens_len: HashMap<u32, usize> = HashMap::new();
        for c in &chunks {
            match c {
                Chunk::Text { model, records, .. } => {
                    *text_len.entry(*model).or_default() += records.len()
                }
                Chunk::Tokens { model, records, .. } => {
                    *tokens_len.entry(*model).or_default() += records.len()
                }
                Chunk::Hash { .. } => {}
            }
        }
        let mut text: HashMap<u32, TreeSnapshot<u8, WorkerId>> = HashMap::new();
        let mut tokens: HashMap<u32, TreeSnapshot<u32, WorkerId>> = HashMap::new();
        let mut hash: HashMap<u32, HashSnapshot<WorkerId>> = HashMap::new();
        for c in chunks {
            match c {
                Chunk::Text {
                    model,
                    page_size,
                    records,
                } => text
                    .entry(model)
                    .or_insert_with(|| {
                        let mut t = TreeSnapshot::new(page_size);
                        t.records
                            .reserve(text_len.get(&model).copied().unwrap_or(0));
                        t
                    })
                    .records
                    .extend(records),
                Chunk::Tokens {
                    model,
                    page_size,
                    records,
                } => tokens
                    .entry(model)
                    .or_insert_with(|| {
                        let mut t = TreeSnapshot::new(page_size);
                        t.records
                            .reserve(tokens_len.get(&model).copied().unwrap_or(0));
                        t
                    })
                    .records
                    .extend(records),
                // A model's hash index comes in several pieces.
                Chunk::Hash { model, snapshot } => match hash.entry(model) {
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
        for (i, snap) in hash {
            let Some(name) = header.models.get(i as usize).cloned() else {
                continue;
            };
            match HashIndex::restore(snap, hash_config(&self.cfg), now) {
                Ok(h) => self.model(&name).hash = h,
                Err(e) => warn!(model = %name, error = %e, "stored hash index dropped"),
            }
        }
        for (i, snap) in text {
            let Some(name) = header.models.get(i as usize).cloned() else {
                continue;
            };
            match RadixTree::restore(snap, tree_config(&self.cfg, 1), now) {
                Ok(t) => self.model(&name).text = t,
                Err(e) => warn!(model = %name, error = %e, "stored text index dropped"),
            }
        }
        for (i, snap) in tokens {
            let Some(name) = header.models.get(i as usize).cloned() else {
                continue;
            };
            match RadixTree::restore(snap, tree_config(&self.cfg, self.cfg.block_size), now) {
                Ok(t) => self.model(&name).tokens = t,
                // A changed --block-size makes stored pages meaningless.
                Err(e) => warn!(model = %name, error = %e, "stored token index dropped"),
            }
        }
        for s in header.workers {
            self.known.insert(
                s.worker,
                Known {
                    url: s.url,
                    startup_time: s.startup_time,
                    confirmed: false,
                },
            );
        }
        // A worker that joined while this snapshot was being written can have entries in
        // it but no stamp in its header: with no engine start to check them against, and
        // no record to drop them by if it never comes back, they are not restored.
        let known = &self.known;
        let mut unnamed = false;
        for m in self.models.values_mut() {
            unnamed |= m.retain(|w| known.contains_key(&w));
        }
        if unnamed {
            info!("restored entries of workers the snapshot's header does not name were dropped");
        }
        info!(
            generation = header.generation,
            models = header.models.len(),
            workers = self.known.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "prefix index restored"
        );
    }

    /// Milliseconds on the shared monotonic clock (offset by `CLOCK_BASE`): LRU stamps.
    fn now(&self) -> u64 {
        CLOCK_BASE + self.epoch.elapsed().as_millis() as u64
    }

    fn purge(&mut self, w: WorkerId) {
        for m in self.models.values_mut() {
            m.remove(w);
        }
        self.dirty = true;
        // Chunks already written may hold its old entries: that snapshot must not commit.
        if self.job.take().is_some() {
            debug!("snapshot restarted after a purge");
        }
    }

    fn stamps(&self) -> Vec<WorkerStamp> {
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

    fn start_snapshot(&mut self, ctx: &mut Context<Self>) {
        if self.persist.is_none() || self.job.is_some() || !self.dirty {
            return;
        }
        self.start_snapshot_now();
        ctx.run_later(Duration::ZERO, |act, ctx| {
            act.snapshot_step(ctx, false);
        });
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
                        // 1 / (1 + backoff) of the time instead of again every interval
                        // (a 1M-prompt snapshot takes about 2.3 s, docs/benchmarks.md).
                        let wait = job.started.elapsed().mul_f64(self.cfg.snapshot_backoff);
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
                    format_version: crate::store::FORMAT_VERSION,
                    generation: job.generation,
                    written_at: unix_now(),
                    models: job.models.clone(),
                    workers: std::mem::take(&mut job.workers),
                    chunks: job.seq,
                });
            };
            let model_ix = job.model as u32;
            let Some(m) = self.models.get(name) else {
                job.model += 1;
                continue;
            };
            let chunk = match job.stage {
                0 => {
                    let cursor = job.cursor.get_or_insert_with(|| m.text.snapshot_cursor());
                    let records = m.text.snapshot_chunk(cursor, CHUNK_RECORDS);
                    if cursor.is_done() {
                        job.cursor = None;
                        job.stage = 1;
                    }
                    (!records.is_empty()).then(|| Chunk::Text {
                        model: model_ix,
                        page_size: m.text.page_size(),
                        records,
                    })
                }
                1 => {
                    let cursor = job.cursor.get_or_insert_with(|| m.tokens.snapshot_cursor());
                    let records = m.tokens.snapshot_chunk(cursor, CHUNK_RECORDS);
                    if cursor.is_done() {
                        job.cursor = None;
                        job.stage = 2;
                    }
                    (!records.is_empty()).then(|| Chunk::Tokens {
                        model: model_ix,
                        page_size: m.tokens.page_size(),
                        records,
                    })
                }
                _ => {
                    // Up to 2^20 keys: a piece per turn, like the trees, so routing never
                    // waits for the whole map.
                    let (records, next) = m.hash.snapshot_part(job.hash_next, CHUNK_RECORDS);
                    match next {
                        Some(n) => job.hash_next = n,
                        None => {
                            job.hash_next = 0;
                            job.stage = 0;
                            job.model += 1;
                        }
                    }
                    (!records.is_empty()).then_some(Chunk::Hash {
                        model: model_ix,
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

    fn model(&mut self, name: &str) -> &mut ModelIndex {
        // Looked up by &str first so the hot path does not allocate the key.
        if !self.models.contains_key(name) {
            self.models
                .insert(name.to_owned(), ModelIndex::new(&self.cfg));
        }
        self.models
            .get_mut(name)
            .expect("the model's index was inserted above")
    }

    /// What the index holds of `key`; with `count`, the lookup also counts as traffic
    /// through the prefixes it matched (a routing decision, not an explanation).
    fn lookup(&mut self, model: &str, key: &RoutingText, count: bool) -> PrefixMatches {
        let now = self.now();
        let hash_mode = self.cfg.cache_index == CacheIndex::Hash;
        // Only a record creates a model's index: a lookup never grows memory.
        let Some(m) = self.models.get_mut(model) else {
            let (input_len, source) = match key {
                RoutingText::Tokens(t) if hash_mode => {
                    (t.len(), MatchSource::Hash { boundary: None })
                }
                RoutingText::Tokens(t) => (t.len(), MatchSource::TokenTree),
                RoutingText::Text(s) if hash_mode => {
                    (s.len(), MatchSource::Hash { boundary: None })
                }
                RoutingText::Text(s) => (s.len(), MatchSource::TextTree),
                RoutingText::Empty => (0, MatchSource::TextTree),
            };
            return PrefixMatches {
                input_len,
                per_worker: Vec::new(),
                source,
                traffic: None,
            };
        };
        match (key, hash_mode) {
            (RoutingText::Tokens(t), true) => {
                let probe = m.hash.probe(t, 0, now);
                let boundary = probe.boundary;
                PrefixMatches {
                    input_len: t.len(),
                    per_worker: probe
                        .holders
                        .into_iter()
                        .map(|w| (w, boundary.unwrap_or(0)))
                        .collect(),
                    source: MatchSource::Hash { boundary },
                    traffic: None,
                }
            }
            (RoutingText::Text(s), true) => PrefixMatches {
                input_len: s.len(),
                per_worker: Vec::new(),
                source: MatchSource::Hash { boundary: None },
                traffic: None,
            },
            (RoutingText::Tokens(t), false) => {
                let pm = if count {
                    m.tokens.observe(t)
                } else {
                    m.tokens.peek_prefix(t)
                };
                PrefixMatches {
                    input_len: pm.input_len,
                    source: MatchSource::TokenTree,
                    traffic: Some(traffic(&pm)),
                    per_worker: pm.per_tenant,
                }
            }
            (RoutingText::Text(s), false) => {
                let pm = if count {
                    m.text.observe(s.as_bytes())
                } else {
                    m.text.peek_prefix(s.as_bytes())
                };
                PrefixMatches {
                    input_len: pm.input_len,
                    source: MatchSource::TextTree,
                    traffic: Some(traffic(&pm)),
                    per_worker: pm.per_tenant,
                }
            }
            (RoutingText::Empty, _) => PrefixMatches::default(),
        }
    }

    fn record(&mut self, model: &str, key: &RoutingText, worker: WorkerId) {
        // A worker removed while this record was in the mailbox must not come back.
        if !self.known.get(&worker).is_some_and(|k| k.confirmed) {
            return;
        }
        let now = self.now();
        let hash_mode = self.cfg.cache_index == CacheIndex::Hash;
        let m = self.model(model);
        match (key, hash_mode) {
            (RoutingText::Tokens(t), true) => {
                m.hash.record(t, 0, worker, now);
            }
            (RoutingText::Tokens(t), false) => m.tokens.insert(t, worker, now),
            (RoutingText::Text(s), false) => m.text.insert(s.as_bytes(), worker, now),
            (RoutingText::Text(_), true) | (RoutingText::Empty, _) => return,
        }
        self.dirty = true;
    }

    fn sweep(&mut self) {
        let now = self.now();
        for (name, m) in &mut self.models {
            let t = m.text.evict();
            let k = m.tokens.evict();
            let h = m.hash.sweep(now);
            debug!(model = %name, ?t, ?k, ?h, "index sweep");
        }
    }
}

impl Actor for IndexActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(65_536);
        if let Some(every) = self.cfg.eviction_interval {
            ctx.run_interval(every, |act, _| act.sweep());
        }
        if self.persist.is_some() {
            ctx.run_interval(self.cfg.snapshot_interval, |act, ctx| {
                if act.next_timed_snapshot.is_none_or(|t| Instant::now() >= t) {
                    act.start_snapshot(ctx);
                }
            });
        }
    }

    /// However the actor ends (graceful shutdown, its thread stopping), what it holds goes
    /// to the writer; the writer thread is joined after this.
    fn stopped(&mut self, ctx: &mut Self::Context) {
        if self.dirty || self.job.is_some() {
            self.final_snapshot(ctx);
        }
    }
}

/// Who holds how much of the request's prompt. The facts travel with the message and come
/// back with the answer, so the prompt is never copied.
#[derive(Message, Debug)]
#[rtype(result = "(RequestFacts, PrefixMatches)")]
pub struct MatchPrefix {
    pub model: String,
    pub facts: RequestFacts,
    /// Count the lookup as traffic (a dispatch); false for a dry run.
    pub count: bool,
}

impl Handler<MatchPrefix> for IndexActor {
    type Result = MessageResult<MatchPrefix>;

    fn handle(&mut self, msg: MatchPrefix, _: &mut Context<Self>) -> Self::Result {
        let m = self.lookup(&msg.model, &msg.facts.key, msg.count);
        MessageResult((msg.facts, m))
    }
}

/// Records that `worker` now holds the prompt (it was routed there).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct RecordPrefix {
    pub model: String,
    pub key: RoutingText,
    pub worker: WorkerId,
}

impl Handler<RecordPrefix> for IndexActor {
    type Result = ();

    fn handle(&mut self, msg: RecordPrefix, _: &mut Context<Self>) {
        self.record(&msg.model, &msg.key, msg.worker);
    }
}

/// Forget everything a worker holds (its cache was flushed).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct ClearWorker(pub WorkerId);

impl Handler<ClearWorker> for IndexActor {
    type Result = ();

    fn handle(&mut self, msg: ClearWorker, _: &mut Context<Self>) {
        self.purge(msg.0);
    }
}

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
                IndexStats {
                    model: name.clone(),
                    text_units: m.text.total_units(),
                    token_units: m.tokens.total_units(),
                    hash_keys: m.hash.key_count(),
                    per_worker: workers
                        .into_iter()
                        .map(|w| (w, m.text.tenant_units(w) + m.tokens.tenant_units(w)))
                        .collect(),
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

impl Handler<FleetChanged> for IndexActor {
    type Result = ();

    /// A removed worker is purged; a worker whose engine restarted (new `startup_time`)
    /// starts empty, like its cache. Restored workers not yet seen wait for `FleetSettled`.
    fn handle(&mut self, msg: FleetChanged, _: &mut Context<Self>) {
        let mut drop = Vec::new();
        for (w, k) in &self.known {
            if k.confirmed && !msg.0.iter().any(|r| r.id == *w) {
                drop.push(*w);
            }
        }
        for rec in msg.0.iter() {
            let k = self.known.entry(rec.id).or_insert_with(|| Known {
                url: rec.url.clone(),
                startup_time: rec.startup_time,
                confirmed: true,
            });
            k.confirmed = true;
            let Some(now) = rec.startup_time else {
                continue;
            };
            if k.startup_time.is_some_and(|before| before != now) {
                info!(worker = %rec.url, "engine restarted (new startup_time): its index entries are dropped");
                drop.push(rec.id);
            }
            k.startup_time = Some(now);
        }
        for w in drop {
            self.purge(w);
            if !msg.0.iter().any(|r| r.id == w) {
                self.known.remove(&w);
            }
        }
    }
}

/// Startup registration is over: restored entries of workers that did not come back go.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct FleetSettled;

impl Handler<FleetSettled> for IndexActor {
    type Result = ();

    fn handle(&mut self, _: FleetSettled, _: &mut Context<Self>) {
        let gone: Vec<WorkerId> = self
            .known
            .iter()
            .filter(|(_, k)| !k.confirmed)
            .map(|(w, _)| *w)
            .collect();
        for w in gone {
            if let Some(k) = self.known.remove(&w) {
                info!(worker = %k.url, "worker did not come back: its restored index entries are dropped");
            }
            self.purge(w);
        }
    }
}

/// Starts a background snapshot now, as the timer would (benchmarks, operators); a no-op
/// when nothing changed or one is already running.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct SnapshotNow;

impl Handler<SnapshotNow> for IndexActor {
    type Result = ();

    fn handle(&mut self, _: SnapshotNow, ctx: &mut Context<Self>) {
        self.start_snapshot(ctx);
    }
}

/// Writes a complete snapshot now and waits until it is on disk (graceful shutdown).
#[derive(Message, Debug)]
#[rtype(result = "bool")]
pub struct FinalSnapshot;

impl Handler<FinalSnapshot> for IndexActor {
    type Result = bool;

    fn handle(&mut self, _: FinalSnapshot, ctx: &mut Context<Self>) -> bool {
        self.final_snapshot(ctx)
    }
}

impl IndexActor {
    /// A complete snapshot, written now; waits until the writer has flushed it.
    fn final_snapshot(&mut self, ctx: &mut Context<Self>) -> bool {
        let Some(persist) = self.persist.clone() else {
            return false;
        };
        // A job in flight is superseded by this complete one.
        self.job = None;
        self.dirty = true;
        self.start_snapshot_now();
        let ok = self.snapshot_step(ctx, true);
        persist.flush();
        ok
    }

    /// Changes made while the job runs mark the index dirty again.
    fn start_snapshot_now(&mut self) {
        self.generation += 1;
        let mut models: Vec<String> = self.models.keys().cloned().collect();
        models.sort();
        self.job = Some(SnapJob {
            generation: self.generation,
            workers: self.stamps(),
            models,
            model: 0,
            stage: 0,
            cursor: None,
            hash_next: 0,
            seq: 0,
            pending: None,
            started: Instant::now(),
        });
        self.dirty = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{header, text_chunk};

    #[test]
    fn entries_of_a_worker_the_header_does_not_name_are_not_restored() {
        let cfg = IndexConfig::from_policy(&PolicyConfig::default(), Duration::from_secs(5));
        let mut index = IndexActor::new(cfg, Instant::now(), None);
        // Worker 1 is in the header; worker 2 joined while the snapshot was written.
        index.restore(Image {
            header: header(3, 1),
            chunks: vec![text_chunk(&[("hello there", 1), ("general kenobi", 2)])],
        });
        let text = &index.models["m"].text;
        assert_eq!(text.tenants(), vec![WorkerId(1)]);
        assert!(text.tenant_units(WorkerId(1)) > 0);
        assert_eq!(text.tenant_units(WorkerId(2)), 0);
    }

    #[test]
    fn a_hash_index_written_in_pieces_is_restored_whole() {
        let policy = PolicyConfig {
            cache_boundaries: vec![16, 64],
            ..PolicyConfig::default()
        };
        let cfg = IndexConfig::from_policy(&policy, Duration::from_secs(5));
        let mut source: HashIndex<WorkerId> = HashIndex::new(hash_config(&cfg));
        let deepest = 64;
        for i in 0..50u32 {
            let tokens: Vec<u32> = (0..deepest as u32).map(|t| t ^ (i << 20)).collect();
            source.record(&tokens, 0, WorkerId(1), 1);
        }
        let pieces = [source.snapshot_part(0, 30), source.snapshot_part(30, 1000)];
        assert!(pieces[0].1.is_some() && pieces[1].1.is_none());
        let chunks = pieces
            .into_iter()
            .map(|(records, _)| Chunk::Hash {
                model: 0,
                snapshot: HashSnapshot {
                    version: SNAPSHOT_VERSION,
                    records,
                },
            })
            .collect();
        let mut index = IndexActor::new(cfg, Instant::now(), None);
        index.restore(Image {
            header: header(3, 2),
            chunks,
        });
        assert_eq!(index.models["m"].hash.key_count(), source.key_count());
        assert_eq!(index.models["m"].hash.holder_count(), source.holder_count());
    }
}
