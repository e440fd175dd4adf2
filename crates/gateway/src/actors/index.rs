//! The index actor: owns the prefix indexes (one text tree, one token tree and one hash
//! index per model) and answers "who holds how much of this prompt". The selector asks
//! before each cache-aware decision and tells it what to record after. Persistence (the
//! snapshot job and the restore) is in `snapshot`.

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kvgate_kv_index::{
    HashConfig, HashIndex, KeyRuns, Observed, PrefixMatch, RadixTree, TreeConfig,
};
use kvgate_policies::{
    CacheIndex, MatchSource, PolicyConfig, PrefixMatches, PrefixTraffic, PromptText, RoutingText,
    WorkerId,
};
use kvgate_store::Persister;
use tracing::debug;

use super::registry::Fleet;
use crate::config::SnapshotConfig;

mod messages;
pub(crate) use messages::{ClearWorker, FleetSettled, ForgetPrefix, Ping};
#[cfg(feature = "fault-injection")]
pub use messages::{Crash, HoldRebuild, InjectPanic};
pub use messages::{MatchPrefix, RecordPrefix};
mod snapshot;
mod stats;

pub use stats::{GetIndexStats, IndexStats};

use snapshot::SnapJob;

/// The index actor's mailbox. Its messages, by response type:
/// - `MatchPrefix` (`send`, `MessageResult`): from the selector, at most one at a time (its
///   `Select` is atomic), and from explains; `GetIndexStats`, `Ping` (`send`) for
///   inspection and readiness. Only these wait for room; the depth is generous so that a
///   burst of explains or scrapes never does.
/// - `RecordPrefix`, `ForgetPrefix`, `ClearWorker`, `FleetChanged`, `FleetSettled`
///   (`do_send`): ordered after the lookups sent before them, never dropped.
const MAILBOX: usize = 65_536;

/// The trees' clock starts here, so ages restored from disk never saturate at zero.
const CLOCK_BASE: u64 = 1 << 40;

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
    pub fn from_policy(p: &PolicyConfig, snapshot: &SnapshotConfig) -> IndexConfig {
        IndexConfig {
            snapshot_interval: snapshot.interval,
            snapshot_backoff: snapshot.backoff,
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

#[derive(Debug)]
pub struct IndexActor {
    cfg: IndexConfig,
    models: HashMap<String, ModelIndex, foldhash::fast::RandomState>,
    known: HashMap<WorkerId, Known>,
    epoch: Instant,
    persist: Option<Persister>,
    /// Changed since the last committed snapshot.
    dirty: bool,
    job: Option<SnapJob>,
    generation: u64,
    /// The timer's next snapshot waits until then (see `IndexConfig::snapshot_backoff`).
    next_timed_snapshot: Option<Instant>,
    /// The registry's last word, to confirm workers again after a rebuild.
    fleet: Option<Fleet>,
    /// Test builds: the next lookup panics.
    #[cfg(feature = "fault-injection")]
    panic_next: bool,
    /// Test builds: the next rebuild waits for this before it reads the snapshot.
    #[cfg(feature = "fault-injection")]
    hold_rebuild: Option<std::sync::mpsc::Receiver<()>>,
    /// Its own address, to be told when a rebuild is done (weak: it must not keep
    /// itself alive).
    me: Option<actix::WeakAddr<IndexActor>>,
    /// A rebuild from the last snapshot is under way on the writer's thread: no snapshot
    /// is taken meanwhile (it would replace the good one with a nearly empty index).
    rebuilding: bool,
    /// Where each snapshot's duration goes (`/metrics`).
    snapshot_seconds: Option<prometheus_client::metrics::histogram::Histogram>,
    /// Where recent counted lookups ended in their tree, by ticket: the record that
    /// follows a dispatch resumes there rather than comparing the prompt again.
    observed: VecDeque<(u64, Observed)>,
    next_ticket: u64,
}

/// Tickets kept: far more than lookups waiting for their record at any time.
const OBSERVED_KEPT: usize = 1024;

impl IndexActor {
    pub fn new(cfg: IndexConfig, epoch: Instant, persist: Option<Persister>) -> IndexActor {
        IndexActor {
            cfg,
            models: HashMap::default(),
            known: HashMap::new(),
            epoch,
            persist,
            dirty: false,
            job: None,
            next_timed_snapshot: None,
            fleet: None,
            #[cfg(feature = "fault-injection")]
            panic_next: false,
            #[cfg(feature = "fault-injection")]
            hold_rebuild: None,
            me: None,
            rebuilding: false,
            generation: 0,
            snapshot_seconds: None,
            observed: VecDeque::new(),
            next_ticket: 0,
        }
    }

    /// Observes into `h` how long each snapshot took, start to its commit handed to the
    /// store's writer.
    pub fn with_snapshot_histogram(
        mut self,
        h: prometheus_client::metrics::histogram::Histogram,
    ) -> Self {
        self.snapshot_seconds = Some(h);
        self
    }

    /// Runs `f` on the index; if it panics, the index is rebuilt from the last committed
    /// snapshot and the registry's fleet (what came after the snapshot is lost), and the
    /// caller gets `None`: a lookup then sees no holder, a record is dropped.
    fn guarded<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> Option<R> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self))) {
            Ok(r) => Some(r),
            Err(_) => {
                tracing::error!("the prefix index panicked; it restarts from the last snapshot");
                self.restart();
                None
            }
        }
    }

    /// Starts over empty and rebuilds from the last committed snapshot on the store's
    /// writer thread, never on this one (the first HTTP thread: a read there would stall
    /// every request). Until `Rebuilt` comes back lookups find no holder.
    fn restart(&mut self) {
        self.models.clear();
        self.known.clear();
        self.abandon_job();
        self.dirty = false;
        let (Some(persist), Some(me)) = (&self.persist, self.me.clone()) else {
            self.settle_fleet();
            return;
        };
        let (cfg, now) = (self.cfg.clone(), self.now());
        #[cfg(feature = "fault-injection")]
        let hold = self.hold_rebuild.take();
        let sent = persist.reload_then(move |image| {
            #[cfg(feature = "fault-injection")]
            if let Some(h) = hold {
                let _ = h.recv();
            }
            let rebuilt = image.map(|i| snapshot::rebuild(&cfg, now, i));
            if let Some(me) = me.upgrade() {
                me.do_send(messages::Rebuilt(rebuilt));
            }
        });
        self.rebuilding = sent;
        if !sent {
            self.settle_fleet();
        }
    }

    /// Confirms the workers of the registry's last fleet; restored ones it does not name
    /// are gone.
    fn settle_fleet(&mut self) {
        if let Some(fleet) = self.fleet.clone() {
            self.confirm(&fleet);
            self.known.retain(|_, k| k.confirmed);
            let known = &self.known;
            for m in self.models.values_mut() {
                m.retain(|w| known.contains_key(&w));
            }
        }
    }

    fn forget(&mut self, msg: ForgetPrefix) {
        let hash_mode = self.cfg.cache_index == CacheIndex::Hash;
        let Some(m) = self.models.get_mut(&*msg.model) else {
            return;
        };
        let key = msg.facts.index_key();
        let dropped = match (&*key, hash_mode) {
            (RoutingText::Tokens(t), true) => m.hash.forget(t, 0, msg.worker, msg.keep),
            (RoutingText::Tokens(t), false) => m.tokens.forget(t, msg.worker, msg.keep),
            (RoutingText::Text(s), false) => m.text.forget(&Runs(s), msg.worker, msg.keep),
            (RoutingText::Text(_), true) | (RoutingText::Empty, _) => 0,
        };
        if dropped > 0 {
            self.dirty = true;
        }
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
        self.abandon_job();
    }

    #[expect(
        clippy::expect_used,
        reason = "inserted just above: the lookup cannot miss"
    )]
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
    /// through the prefixes it matched (a routing decision, not an explanation), and
    /// answers a ticket for the record of the same key that may follow.
    fn lookup(
        &mut self,
        model: &str,
        key: &RoutingText,
        count: bool,
        recent: Option<Duration>,
    ) -> (PrefixMatches, Vec<(WorkerId, usize)>, Option<u64>) {
        #[cfg(feature = "fault-injection")]
        if std::mem::take(&mut self.panic_next) {
            panic!("injected panic in a prefix lookup");
        }
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
            let none = PrefixMatches {
                input_len,
                per_worker: Vec::new(),
                source,
                traffic: None,
                session_holder: None,
            };
            return (none, Vec::new(), None);
        };
        let mut seen: Option<Observed> = None;
        // Records made since then (token tree only, when asked).
        let since = recent.map(|w| now.saturating_sub(w.as_millis() as u64));
        let mut lately = Vec::new();
        let matches = match (key, hash_mode) {
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
                    session_holder: None,
                }
            }
            (RoutingText::Text(s), true) => PrefixMatches {
                input_len: s.len(),
                per_worker: Vec::new(),
                source: MatchSource::Hash { boundary: None },
                traffic: None,
                session_holder: None,
            },
            (RoutingText::Tokens(t), false) => {
                let mut pm = match (count, since) {
                    (true, since) => {
                        let (pm, o) = m.tokens.observe_for_insert(t, since);
                        seen = Some(o);
                        pm
                    }
                    (false, Some(s)) => m.tokens.peek_since(t, s),
                    (false, None) => m.tokens.peek_prefix(t),
                };
                lately = std::mem::take(&mut pm.recent);
                PrefixMatches {
                    input_len: pm.input_len,
                    source: MatchSource::TokenTree,
                    traffic: Some(traffic(&pm)),
                    per_worker: pm.per_tenant,
                    session_holder: None,
                }
            }
            (RoutingText::Text(s), false) => {
                let pm = if count {
                    let (pm, o) = m.text.observe_for_insert(&Runs(s), None);
                    seen = Some(o);
                    pm
                } else {
                    m.text.peek_prefix(&Runs(s))
                };
                PrefixMatches {
                    input_len: pm.input_len,
                    source: MatchSource::TextTree,
                    traffic: Some(traffic(&pm)),
                    per_worker: pm.per_tenant,
                    session_holder: None,
                }
            }
            (RoutingText::Empty, _) => PrefixMatches::default(),
        };
        let ticket = seen.map(|o| {
            let t = self.next_ticket;
            self.next_ticket = t.wrapping_add(1);
            if self.observed.len() == OBSERVED_KEPT {
                self.observed.pop_front();
            }
            self.observed.push_back((t, o));
            t
        });
        (matches, lately, ticket)
    }

    fn record(&mut self, model: &str, key: &RoutingText, worker: WorkerId, ticket: Option<u64>) {
        // The ticket of this key's lookup, if still kept (each is used once).
        let seen = ticket.and_then(|t| {
            let i = self.observed.iter().rposition(|(id, _)| *id == t)?;
            self.observed.remove(i).map(|(_, o)| o)
        });
        // A worker removed while this record was in the mailbox must not come back.
        if !self.known.get(&worker).is_some_and(|k| k.confirmed) {
            return;
        }
        let now = self.now();
        let hash_mode = self.cfg.cache_index == CacheIndex::Hash;
        let m = self.model(model);
        match (key, hash_mode, &seen) {
            (RoutingText::Tokens(t), true, _) => {
                m.hash.record(t, 0, worker, now);
            }
            (RoutingText::Tokens(t), false, Some(o)) => m.tokens.insert_observed(t, worker, now, o),
            (RoutingText::Tokens(t), false, None) => m.tokens.insert(t, worker, now),
            (RoutingText::Text(s), false, Some(o)) => {
                m.text.insert_observed(&Runs(s), worker, now, o)
            }
            (RoutingText::Text(s), false, None) => m.text.insert(&Runs(s), worker, now),
            (RoutingText::Text(_), true, _) | (RoutingText::Empty, _, _) => return,
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

/// Restarted after a panic (`actors::supervise`): rebuilt from the last snapshot, off this
/// thread, and the registry's fleet.
impl actix::Supervised for IndexActor {
    fn restarting(&mut self, _: &mut Context<Self>) {
        self.restart();
    }
}

impl Actor for IndexActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(MAILBOX);
        self.me = Some(ctx.address().downgrade());
        if let Some(every) = self.cfg.eviction_interval {
            ctx.run_interval(every, |act, _| act.sweep());
        }
        if self.persist.is_some() {
            ctx.run_interval(self.cfg.snapshot_interval, |act, ctx| {
                if !act.rebuilding && act.next_timed_snapshot.is_none_or(|t| Instant::now() >= t) {
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

/// A prompt's text as the tree reads it: run by run, the long ones borrowed from the body.
struct Runs<'a>(&'a PromptText);

impl KeyRuns<u8> for Runs<'_> {
    fn units(&self) -> usize {
        self.0.len()
    }

    fn run(&self, pos: usize) -> &[u8] {
        self.0.run(pos)
    }
}
