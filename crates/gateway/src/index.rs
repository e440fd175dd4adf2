//! The index actor: owns the prefix indexes (one text tree, one token tree and one hash
//! index per model) and answers "who holds how much of this prompt". The selector asks
//! before each cache-aware decision and tells it what to record after.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kvgate_kv_index::{HashConfig, HashIndex, RadixTree, TreeConfig};
use kvgate_policies::{
    CacheIndex, MatchSource, PolicyConfig, PrefixMatches, RequestFacts, RoutingText, WorkerId,
};
use tracing::debug;

use crate::registry::FleetChanged;

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
}

impl IndexConfig {
    pub fn from_policy(p: &PolicyConfig) -> IndexConfig {
        IndexConfig {
            cache_index: p.cache_index,
            block_size: p.block_size,
            max_tree_size: p.max_tree_size,
            eviction_interval: p.eviction_interval,
            boundaries: p.cache_boundaries.clone(),
            ttl: p.cache_ttl,
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

impl ModelIndex {
    fn new(cfg: &IndexConfig) -> ModelIndex {
        // Evicting on insert keeps memory bounded by the budget between sweeps.
        let tree = |page: usize| TreeConfig {
            page_size: NonZeroUsize::new(page).unwrap_or(NonZeroUsize::MIN),
            max_units: Some(cfg.max_tree_size),
            max_tenant_units: None,
            evict_on_insert: true,
        };
        ModelIndex {
            text: RadixTree::new(tree(1)),
            tokens: RadixTree::new(tree(cfg.block_size)),
            hash: HashIndex::new(HashConfig::new(
                cfg.boundaries.clone(),
                cfg.ttl.as_millis() as u64,
            )),
        }
    }

    fn remove(&mut self, w: WorkerId) {
        self.text.remove_tenant(w);
        self.tokens.remove_tenant(w);
        self.hash.remove_tenant(w);
    }
}

#[derive(Debug)]
pub struct IndexActor {
    cfg: IndexConfig,
    models: HashMap<String, ModelIndex>,
    /// Engine start times, to notice a restarted (emptied) engine.
    startup: HashMap<WorkerId, Option<f64>>,
    epoch: Instant,
}

impl IndexActor {
    pub fn new(cfg: IndexConfig, epoch: Instant) -> IndexActor {
        IndexActor {
            cfg,
            models: HashMap::new(),
            startup: HashMap::new(),
            epoch,
        }
    }

    /// Milliseconds on the shared monotonic clock: the trees' LRU stamps.
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
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

    fn lookup(&mut self, model: &str, key: &RoutingText) -> PrefixMatches {
        let now = self.now();
        let hash_mode = self.cfg.cache_index == CacheIndex::Hash;
        let m = self.model(model);
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
                }
            }
            (RoutingText::Text(s), true) => PrefixMatches {
                input_len: s.len(),
                per_worker: Vec::new(),
                source: MatchSource::Hash { boundary: None },
            },
            (RoutingText::Tokens(t), false) => {
                let pm = m.tokens.peek_prefix(t);
                PrefixMatches {
                    input_len: pm.input_len,
                    per_worker: pm.per_tenant,
                    source: MatchSource::TokenTree,
                }
            }
            (RoutingText::Text(s), false) => {
                let pm = m.text.peek_prefix(s.as_bytes());
                PrefixMatches {
                    input_len: pm.input_len,
                    per_worker: pm.per_tenant,
                    source: MatchSource::TextTree,
                }
            }
            (RoutingText::Empty, _) => PrefixMatches::default(),
        }
    }

    fn record(&mut self, model: &str, key: &RoutingText, worker: WorkerId) {
        let now = self.now();
        let hash_mode = self.cfg.cache_index == CacheIndex::Hash;
        let m = self.model(model);
        match (key, hash_mode) {
            (RoutingText::Tokens(t), true) => {
                m.hash.record(t, 0, worker, now);
            }
            (RoutingText::Tokens(t), false) => m.tokens.insert(t, worker, now),
            (RoutingText::Text(s), false) => m.text.insert(s.as_bytes(), worker, now),
            (RoutingText::Text(_), true) | (RoutingText::Empty, _) => {}
        }
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
    }
}

/// Who holds how much of the request's prompt. The facts travel with the message and come
/// back with the answer, so the prompt is never copied.
#[derive(Message, Debug)]
#[rtype(result = "(RequestFacts, PrefixMatches)")]
pub struct MatchPrefix {
    pub model: String,
    pub facts: RequestFacts,
}

impl Handler<MatchPrefix> for IndexActor {
    type Result = MessageResult<MatchPrefix>;

    fn handle(&mut self, msg: MatchPrefix, _: &mut Context<Self>) -> Self::Result {
        let m = self.lookup(&msg.model, &msg.facts.key);
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
        for m in self.models.values_mut() {
            m.remove(msg.0);
        }
    }
}

/// Per-model sizes, for inspection and tests.
#[derive(Message, Debug)]
#[rtype(result = "Vec<IndexStats>")]
pub struct GetIndexStats;

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
        MessageResult(out)
    }
}

impl Handler<FleetChanged> for IndexActor {
    type Result = ();

    /// A removed worker is purged; a worker whose engine restarted (new `startup_time`)
    /// starts empty, like its cache.
    fn handle(&mut self, msg: FleetChanged, _: &mut Context<Self>) {
        let mut gone: Vec<WorkerId> = self.startup.keys().copied().collect();
        for rec in msg.0.iter() {
            gone.retain(|w| *w != rec.id);
            let prev = self.startup.insert(rec.id, rec.startup_time);
            if let Some(Some(before)) = prev
                && rec.startup_time.is_some_and(|now| now != before)
            {
                for m in self.models.values_mut() {
                    m.remove(rec.id);
                }
            }
        }
        for w in gone {
            self.startup.remove(&w);
            for m in self.models.values_mut() {
                m.remove(w);
            }
        }
    }
}
