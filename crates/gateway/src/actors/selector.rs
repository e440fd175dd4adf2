//! The selector actor: owns the policy, the current view of the fleet (registry state,
//! loads, in-flight counts, credit) and turns each request's facts into a decision. Its
//! children: `select` answers `Select` and `Explain` (the index lookup and what follows),
//! `decide` runs the policy and books its choice, `hold` is the prefill hold (a second
//! small state machine beside the decision), `circuit` each worker's breaker, `events`
//! what it learns between decisions, `messages` what it is asked and answers.
//!
//! Policies choose among routing targets: a worker, or each data-parallel rank of an
//! SGLang worker with `dp_size > 1` (`WorkerRecord::targets`; rank 0 keeps the worker's
//! id). Each target has its own view (that rank's load, its own in-flight count and
//! credit), its own prefix-index tenant and its own chain-index match, so the gate and the
//! expected wait work per rank; the chosen rank is sent in the body (`routed_dp_rank`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kvgate_core::Secret;
use kvgate_core::WorkerUrl;
use kvgate_policies::{
    CreditLedger, HashRing, Own, PolicyConfig, RECENT_HALF_LIFE, RequestFacts, WorkerId, WorkerView,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::sync::watch;

use super::events::EventsActor;
use super::index::IndexActor;
use super::registry::{Fleet, RankVia, WorkerFailed, WorkerStatus};

mod circuit;
mod decide;
mod events;
mod hold;
mod messages;
mod select;
mod sessions;

use circuit::Circuit;
pub(crate) use circuit::{CircuitConfig, CircuitState, Outcome};
#[cfg(feature = "fault-injection")]
pub use events::{Crash, InjectPanic};
pub(crate) use hold::Hold;
use hold::Holds;
pub(crate) use messages::{
    Booking, Dispatch, Failed, GetWorkerStates, Ping, Recorded, Release, Select, SelectError,
    Selected, Warmed, WorkerState, worker_state,
};
pub use messages::{Explain, Explained, GetViews};

/// The selector's mailbox. Its messages, by response type:
/// - `Select`, `Explain` (`send`, `AtomicResponse`): one per admitted request and attempt,
///   awaited by the request, so a full mailbox makes requests wait for room (backpressure,
///   nothing dropped). Deep because every request of a burst arrives at once and the
///   routing actors share the HTTP thread: the burst is bounded by admission
///   (`--max-concurrent-requests`), not by this queue.
/// - `Release`, `Warmed`, `Failed` (`do_send`): a request's end must never be lost, so
///   these bypass the capacity.
/// - `FleetChanged`, `LoadsPolled`, `LoadPushed`, `EventsLive` (`do_send` from the other
///   actors): state pushed whole; `GetViews`, `GetWorkerStates`, `Ping` (`send`, answered
///   at once) for inspection and readiness.
const MAILBOX: usize = 65_536;

pub struct SelectorActor {
    policy: PolicyConfig,
    /// One view per routing target (a worker, or one rank of it), in registry order;
    /// policies read it in place.
    views: Vec<WorkerView>,
    /// What else is kept per target (same order).
    meta: Vec<Meta>,
    circuit: CircuitConfig,
    /// Some circuit is not closed, so eligibility is checked against the clock.
    breakers_tripped: bool,
    /// Panic mode: more than half of the ready targets' circuits admit nothing, so every
    /// ready target is eligible as if none were open.
    panic: bool,
    /// Told when a worker refused a connection.
    registry: Option<Recipient<WorkerFailed>>,
    /// The registry's last word, to rebuild from after a failed decision.
    fleet: Option<Fleet>,
    /// Test builds: the next decision panics.
    #[cfg(feature = "fault-injection")]
    panic_next: bool,
    /// Which views serve each model, rebuilt on every fleet change. The names are handed
    /// out with each dispatch: the decision log and the metrics share them, uncopied.
    by_model: HashMap<Arc<str>, Vec<usize>, foldhash::fast::RandomState>,
    /// The LoRA adapters the fleet lists, each with its base model.
    adapters: HashMap<Arc<str>, Arc<str>, foldhash::fast::RandomState>,
    /// Models an SGLang engine serves: only SGLang reads `lora_path`.
    lora_path_models: std::collections::HashSet<Arc<str>>,
    /// Work dispatched since each worker's load sample.
    ledger: CreditLedger,
    /// Rebuilt only when the set of workers changes.
    ring: Option<HashRing>,
    rng: SmallRng,
    seq: u64,
    epoch: Instant,
    scratch: Vec<WorkerView>,
    /// Consulted before each decision of a policy that reads prefix matches.
    index: Option<Addr<IndexActor>>,
    /// Some worker is not detected yet, so an unknown model may still arrive with it.
    pending: bool,
    /// Requests held behind a streamed request still prefilling their prefix.
    holds: Holds,
    /// Where each session went last.
    sessions: sessions::Sessions,
    next_booking: u64,
    /// What `WorkerView::recent` keeps per dispatch: half of it every `RECENT_HALF_LIFE`.
    recent_keep: f64,
    /// New prefixes started so far: the clock of `WorkerView::last_start`.
    starts: u64,
    /// Where the time each `Select` waited in the mailbox goes (`/metrics`).
    mailbox_wait: Option<prometheus_client::metrics::histogram::Histogram>,
    /// The chain index fed by engines' KV events: exact holdings for token requests.
    events: Option<Addr<EventsActor>>,
    /// Some worker's events are live: only then is `events` asked (a hop to another
    /// thread per token request).
    events_live: bool,
    /// When each (worker, rank) last pushed its load: a report is as fresh as its oldest
    /// rank.
    pushed: HashMap<(WorkerId, u32), Duration>,
    /// How long a worker out on failed checks may show no progress before the requests
    /// waiting on it are tried elsewhere (it is frozen, not slow).
    stall_grace: Duration,
}

/// Per target, beside its view.
#[derive(Debug)]
struct Meta {
    /// The worker it is, or one rank of.
    worker: WorkerId,
    /// The rank sent with the request; `None` when the target is the whole worker.
    rank: Option<u32>,
    /// Where the rank goes: vLLM's header, or a member of the body (SGLang).
    rank_via: RankVia,
    /// The registration; a release for an older one must not touch this one.
    incarnation: u64,
    url: WorkerUrl,
    /// The registry's verdict: ready to route.
    ready: bool,
    circuit: Circuit,
    down: watch::Sender<bool>,
    key: Option<Secret>,
    /// Since when it is out without having refused (failing or slow checks).
    out_since: Option<Duration>,
    /// When a request on it last answered or sent its first byte: a worker out on its
    /// checks that shows none for `stall_grace` is taken as frozen.
    progress: Duration,
    /// The engine process's `startup_time` last seen.
    startup_time: Option<f64>,
}

impl std::fmt::Debug for SelectorActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelectorActor")
            .field("policy", &self.policy.kind)
            .field("workers", &self.views.len())
            .finish()
    }
}

impl SelectorActor {
    pub fn new(
        policy: PolicyConfig,
        seed: Option<u64>,
        epoch: Instant,
        index: Option<Addr<IndexActor>>,
    ) -> Self {
        SelectorActor {
            holds: Holds::new(Duration::ZERO, &policy),
            sessions: sessions::Sessions::default(),
            policy,
            views: Vec::new(),
            meta: Vec::new(),
            circuit: CircuitConfig::default(),
            breakers_tripped: false,
            panic: false,
            registry: None,
            fleet: None,
            #[cfg(feature = "fault-injection")]
            panic_next: false,
            by_model: HashMap::default(),
            adapters: HashMap::default(),
            lora_path_models: Default::default(),
            ledger: CreditLedger::new(),
            ring: None,
            rng: seed.map_or_else(SmallRng::from_entropy, SmallRng::seed_from_u64),
            seq: 0,
            epoch,
            scratch: Vec::new(),
            index,
            pending: false,
            next_booking: 0,
            recent_keep: 0.5f64.powf(1.0 / RECENT_HALF_LIFE),
            starts: 0,
            mailbox_wait: None,
            events: None,
            events_live: false,
            pushed: HashMap::new(),
            stall_grace: Duration::from_secs(10),
        }
    }

    /// How long a worker taken out by its health checks may show no progress before the
    /// requests waiting on it go elsewhere.
    pub fn with_stall_grace(mut self, grace: Duration) -> Self {
        self.stall_grace = grace;
        self
    }

    /// Holds requests behind a streamed request still prefilling their prefix on the
    /// worker they would go to, for at most `max` (zero: never).
    pub fn with_prefill_hold(mut self, max: Duration) -> Self {
        self.holds = Holds::new(max, &self.policy);
        self
    }

    /// Opens a worker's circuit after repeated failures (`cfg.enabled` false: never).
    pub fn with_circuit_breaker(mut self, cfg: CircuitConfig) -> Self {
        self.circuit = cfg;
        self
    }

    /// Observes into `h` how long each `Select` waited in the mailbox.
    pub fn with_mailbox_histogram(
        mut self,
        h: prometheus_client::metrics::histogram::Histogram,
    ) -> Self {
        self.mailbox_wait = Some(h);
        self
    }

    /// Where refused connections are reported, so the worker is taken out at once.
    /// Token requests also ask `events` which workers hold their blocks; a worker whose
    /// events are live is matched by them, the others by the approximate index.
    pub fn read_events_from(&mut self, events: Addr<EventsActor>) {
        self.events = Some(events);
    }

    pub fn report_refusals_to(&mut self, registry: Recipient<WorkerFailed>) {
        self.registry = Some(registry);
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// A view is eligible while its worker is ready and its circuit admits a request; in
    /// panic (more than half of the ready targets' circuits admit nothing), while its
    /// worker is ready. A fleet-wide burst of failures opens every circuit, and a fleet
    /// kept dark until they close would serve nobody after the engines recover.
    fn refresh_eligibility(&mut self, now: Duration) {
        let mut tripped = false;
        let (mut ready, mut shut) = (0usize, 0usize);
        for (v, m) in self.views.iter_mut().zip(&mut self.meta) {
            let admits = m.circuit.admits(&self.circuit, now);
            v.eligible = m.ready && admits;
            ready += usize::from(m.ready);
            shut += usize::from(m.ready && !admits);
            tripped |= m.circuit.state(&self.circuit, now) != CircuitState::Closed;
        }
        self.breakers_tripped = tripped;
        let panic = shut * 2 > ready;
        if panic != self.panic {
            tracing::warn!(
                ready,
                shut,
                "panic routing {}: {}",
                if panic { "on" } else { "off" },
                if panic {
                    "most circuits are open, every ready worker is routed"
                } else {
                    "most circuits admit traffic again"
                }
            );
        }
        self.panic = panic;
        if panic {
            for (v, m) in self.views.iter_mut().zip(&self.meta) {
                v.eligible = m.ready;
            }
        }
    }

    /// Whether some target can be routed to now (readiness).
    fn routable(&mut self) -> bool {
        self.refresh_eligibility(self.now());
        self.views.iter().any(|v| v.eligible)
    }

    fn apply_fleet(&mut self, fleet: &Fleet) {
        let now = self.now();
        let mut old: HashMap<WorkerId, (WorkerView, Meta)> = self
            .views
            .drain(..)
            .zip(self.meta.drain(..))
            .map(|(v, m)| (v.id, (v, m)))
            .collect();
        let before: Vec<WorkerId> = old.keys().copied().collect();
        // Emptied rather than cleared: a model still served keeps its shared name.
        for ix in self.by_model.values_mut() {
            ix.clear();
        }
        self.pending = fleet.iter().any(|w| w.status == WorkerStatus::Pending);
        self.adapters = fleet
            .iter()
            .flat_map(|w| &w.adapters)
            .map(|(a, base)| (Arc::from(a.as_str()), Arc::from(base.as_str())))
            .collect();
        self.lora_path_models = fleet
            .iter()
            .filter(|w| w.runtime == super::registry::Runtime::Sglang)
            .flat_map(|w| w.models.iter().map(|m| Arc::from(m.as_str())))
            .collect();
        for rec in fleet.iter() {
            for (target, rank) in rec.targets() {
                let i = self.views.len();
                let (mut view, mut meta) = match old.remove(&target) {
                    Some((v, m)) if m.incarnation == rec.incarnation && m.rank == rank => (v, m),
                    // New, or removed and added again: nothing carries over.
                    _ => {
                        self.ledger.remove(target);
                        let meta = Meta {
                            worker: rec.id,
                            rank,
                            rank_via: rec.rank_via(),
                            incarnation: rec.incarnation,
                            url: rec.url.clone(),
                            ready: false,
                            circuit: Circuit::default(),
                            down: watch::channel(false).0,
                            key: None,
                            out_since: None,
                            progress: now,
                            startup_time: rec.startup_time,
                        };
                        let view = WorkerView {
                            own: Some(Own::default()),
                            ..WorkerView::new(target, rec.url.as_str())
                        };
                        (view, meta)
                    }
                };
                let ready = rec.healthy();
                // Its circuit judged the process that failed. A new process (a new
                // `startup_time`), or one back from failing its health checks, starts
                // closed, as Envoy un-ejects a host on a passing active health check; an
                // engine that answers 500 while `/health` passes stays ejected.
                let restarted = meta.startup_time.is_some()
                    && rec.startup_time.is_some()
                    && meta.startup_time != rec.startup_time;
                if restarted || (ready && !meta.ready) {
                    meta.circuit = Circuit::default();
                }
                meta.startup_time = rec.startup_time;
                // Requests waiting on it go elsewhere only when it refused a connection: a
                // slow or failing health probe keeps them in place (new ones avoid it), and
                // a draining worker finishes them.
                if !ready && rec.refused && rec.status != WorkerStatus::Draining {
                    meta.down.send_replace(true);
                }
                if ready && *meta.down.borrow() {
                    meta.down = watch::channel(false).0;
                }
                // A draining worker finishes its requests however long they take.
                meta.out_since =
                    (rec.status == WorkerStatus::Unhealthy).then(|| meta.out_since.unwrap_or(now));
                meta.ready = ready;
                meta.key = rec.api_key.clone();
                if !ready {
                    // Not polled while out; its last report would be stale on its return.
                    view.load = None;
                }
                self.views.push(view);
                self.meta.push(meta);
                for model in &rec.models {
                    match self.by_model.get_mut(model.as_str()) {
                        Some(ix) => ix.push(i),
                        None => {
                            self.by_model.insert(Arc::from(model.as_str()), vec![i]);
                        }
                    }
                }
            }
        }
        self.by_model.retain(|_, ix| !ix.is_empty());
        // Removed targets: their requests' waits end with the senders dropped here.
        for gone in old.keys() {
            if !self.views.iter().any(|v| v.id == *gone) {
                self.ledger.remove(*gone);
            }
        }
        drop(old);
        self.refresh_eligibility(self.now());
        let mut after: Vec<WorkerId> = self.views.iter().map(|v| v.id).collect();
        let mut before = before;
        before.sort();
        after.sort();
        if before != after || self.ring.is_none() {
            self.ring = self
                .policy
                .kind
                .needs_ring()
                .then(|| HashRing::from_views(&self.views));
        }
    }
}

impl Actor for SelectorActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(MAILBOX);
        ctx.run_interval(Duration::from_secs(1), |act, _| act.release_frozen());
    }
}

/// Restarted after a panic (`actors::supervise`): the view is rebuilt from the registry's
/// last fleet; what requests in flight rely on is kept (`restart`).
impl actix::Supervised for SelectorActor {
    fn restarting(&mut self, _: &mut Context<Self>) {
        self.restart();
    }
}

impl SelectorActor {
    /// No served model matches: a 404, unless a worker still being detected may serve it.
    fn unknown_model(&self, model: &str) -> SelectError {
        if self.pending {
            SelectError::NoHealthy
        } else {
            SelectError::UnknownModel(model.to_owned())
        }
    }

    /// The index namespace of a request: its model (an adapter's base), or the fleet's only
    /// model; the fleet's shared name where it has one, so a dispatch copies no name.
    fn model_key(&self, facts: &RequestFacts) -> Arc<str> {
        // An adapter's prefixes live in its base model's index, however it was named
        // (vLLM's `model`, SGLang's `lora_path`), kept apart by the key's scope marker
        // (`RequestFacts::index_key`): salts and adapters add no index of their own.
        let base = (facts.adapter.as_deref()).and_then(|a| self.adapters.get(a));
        match base {
            Some(b) => b.clone(),
            None => self.model_name(facts),
        }
    }

    /// `facts` with its adapter said where its `model` names one of the fleet's adapters
    /// (vLLM's way); the same facts, shared, otherwise.
    fn with_adapter(&self, facts: Arc<RequestFacts>) -> Arc<RequestFacts> {
        match &facts.model {
            Some(m) if facts.adapter.is_none() && self.adapters.contains_key(m.as_str()) => {
                let mut f = (*facts).clone();
                f.adapter = Some(m.clone());
                Arc::new(f)
            }
            // A `lora_path` no SGLang engine of the model reads: vLLM ignores it and runs
            // the base model, so the request is routed as the base model's.
            _ if facts.adapter.is_some()
                && !(facts.model.as_deref())
                    .or(self
                        .by_model
                        .keys()
                        .next()
                        .map(|k| &**k)
                        .filter(|_| self.by_model.len() == 1))
                    .is_some_and(|m| self.lora_path_models.contains(m)) =>
            {
                let mut f = (*facts).clone();
                f.adapter = None;
                Arc::new(f)
            }
            _ => facts,
        }
    }

    fn model_name(&self, facts: &RequestFacts) -> Arc<str> {
        let shared = match &facts.model {
            Some(m) => self.by_model.get_key_value(m.as_str()).map(|(k, _)| k),
            None if self.by_model.len() == 1 => self.by_model.keys().next(),
            None => None,
        };
        match (shared, &facts.model) {
            (Some(k), _) => k.clone(),
            (None, Some(m)) => Arc::from(m.as_str()),
            (None, None) => Arc::from(""),
        }
    }

    /// Runs `f`, a step of a decision; if it panics, the selector's state is rebuilt from
    /// the registry's last fleet (loads, credit and in-flight counts start over) and the
    /// request is told to ask again. One bad request must not take routing down.
    fn guarded<R>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<R, SelectError>,
    ) -> Result<R, SelectError> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self))) {
            Ok(r) => r,
            Err(_) => {
                tracing::error!(
                    "a routing decision panicked; the selector restarts from the registry's fleet"
                );
                self.restart();
                Err(SelectError::Restarted)
            }
        }
    }

    /// A fresh state with the registry's last fleet applied. What the requests in flight
    /// rely on is kept: each worker's in-flight count (their releases will come), its
    /// down watch (they wait on it) and its circuit.
    fn restart(&mut self) {
        // What requests still in flight hold: their count, and the bookings their first
        // token or end will take back out of `own`.
        let kept: HashMap<WorkerId, (u64, Option<Own>, Meta)> = self
            .views
            .drain(..)
            .zip(self.meta.drain(..))
            .map(|(v, m)| (v.id, (v.in_flight, v.own, m)))
            .collect();
        self.by_model.clear();
        self.ledger = CreditLedger::new();
        self.ring = None;
        self.holds = Holds::new(self.holds.max, &self.policy);
        if let Some(fleet) = self.fleet.clone() {
            self.apply_fleet(&fleet);
        }
        let mut kept = kept;
        for (v, m) in self.views.iter_mut().zip(&mut self.meta) {
            if let Some((in_flight, own, old)) = kept.remove(&v.id)
                && old.incarnation == m.incarnation
            {
                v.in_flight = in_flight;
                v.own = own;
                *m = old;
            }
        }
        self.refresh_eligibility(self.now());
    }
}
