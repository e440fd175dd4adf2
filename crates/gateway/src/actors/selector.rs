//! The selector actor: owns the policy, the current view of the fleet (registry state,
//! loads, in-flight counts, credit) and turns each request's facts into a decision. The
//! prefill hold, a second small state machine beside the decision, is in `hold`.
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
use kvgate_core::WorkerUrl;
use kvgate_policies::{
    CreditLedger, Decision, DecisionNote, DecisionPath, HashRing, MatchSource, PolicyConfig,
    PrefixMatches, RECENT_HALF_LIFE, RequestFacts, RoutingText, SelectInput, WorkerId, WorkerView,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::sync::watch;
use tracing::{debug, trace};

use super::events::{ChainAnswer, EventsActor, MatchChain};
use super::index::{IndexActor, MatchPrefix, RecordPrefix};
use super::registry::{Fleet, WorkerFailed, WorkerStatus};
use kvgate_core::Secret;

mod circuit;
mod events;
mod hold;
mod messages;

use circuit::Circuit;
pub use circuit::{CircuitConfig, CircuitState, Outcome};
#[cfg(feature = "fault-injection")]
pub use events::InjectPanic;
use hold::Holds;
pub use hold::{Hold, select};
pub use messages::{
    Booking, Dispatch, EventsLive, Explain, GetViews, GetWorkerStates, LoadPushed, Ping, Release,
    Select, SelectError, Selected, Warmed, WorkerState, worker_state,
};

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
    next_booking: u64,
    /// What `WorkerView::recent` keeps per dispatch: half of it every `RECENT_HALF_LIFE`.
    recent_keep: f64,
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
}

/// What `decide` chose.
struct Chosen {
    /// The chosen target's place in `views`.
    idx: Option<usize>,
    decision: Decision,
    /// The request's model, as the fleet's own name for it.
    model: Option<Arc<str>>,
}

/// What `dispatch` did.
#[expect(
    clippy::large_enum_variant,
    reason = "made and matched at once on the stack; a box would allocate per request"
)]
enum Dispatched {
    Go(Dispatch),
    /// The caller builds the [`Hold`] around this.
    Hold(tokio::sync::oneshot::Receiver<()>),
}

/// Per target, beside its view.
#[derive(Debug)]
struct Meta {
    /// The worker it is, or one rank of.
    worker: WorkerId,
    /// The rank sent in the body; `None` when the target is the whole worker.
    rank: Option<u32>,
    /// The registration; a release for an older one must not touch this one.
    incarnation: u64,
    url: WorkerUrl,
    /// The registry's verdict: ready to route.
    ready: bool,
    circuit: Circuit,
    down: watch::Sender<bool>,
    key: Option<Secret>,
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
            policy,
            views: Vec::new(),
            meta: Vec::new(),
            circuit: CircuitConfig::default(),
            breakers_tripped: false,
            registry: None,
            fleet: None,
            #[cfg(feature = "fault-injection")]
            panic_next: false,
            by_model: HashMap::default(),
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
            mailbox_wait: None,
            events: None,
            events_live: false,
            pushed: HashMap::new(),
        }
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

    /// A view is eligible while its worker is ready and its circuit admits a request.
    fn refresh_eligibility(&mut self, now: Duration) {
        let mut tripped = false;
        for (v, m) in self.views.iter_mut().zip(&mut self.meta) {
            v.eligible = m.ready && m.circuit.admits(&self.circuit, now);
            tripped |= m.circuit.state(&self.circuit, now) != CircuitState::Closed;
        }
        self.breakers_tripped = tripped;
    }

    fn apply_fleet(&mut self, fleet: &Fleet) {
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
                            incarnation: rec.incarnation,
                            url: rec.url.clone(),
                            ready: false,
                            circuit: Circuit::default(),
                            down: watch::channel(false).0,
                            key: None,
                        };
                        (WorkerView::new(target, rec.url.as_str()), meta)
                    }
                };
                let ready = rec.healthy();
                if meta.ready && !ready && rec.status != WorkerStatus::Draining {
                    // Requests waiting on it may go elsewhere; a draining worker finishes them.
                    meta.down.send_replace(true);
                }
                if ready && *meta.down.borrow() {
                    meta.down = watch::channel(false).0;
                }
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

    /// Runs the policy over the candidates for `facts`; returns the member index chosen.
    fn decide(
        &mut self,
        facts: &RequestFacts,
        matches: Option<&PrefixMatches>,
        exclude: &[WorkerId],
        seq: u64,
    ) -> Result<Chosen, SelectError> {
        #[cfg(feature = "fault-injection")]
        if std::mem::take(&mut self.panic_next) {
            panic!("injected panic in a routing decision");
        }
        if self.views.is_empty() {
            return Err(SelectError::NoWorkers);
        }
        let now = self.now();
        if self.breakers_tripped {
            // An open circuit's time may be up (half-open), a probe may have ended.
            self.refresh_eligibility(now);
        }
        let (model, indices) = match &facts.model {
            Some(model) => match self.by_model.get_key_value(model.as_str()) {
                Some((name, ix)) => (Some(name.clone()), Some(ix)),
                None => return Err(self.unknown_model(model)),
            },
            None => (None, None),
        };
        // The common case (every worker serves the model, nothing excluded) reads the
        // views in place; otherwise a filtered copy is built.
        let all = indices.is_none_or(|ix| ix.len() == self.views.len());
        let workers: &[WorkerView] = if all && exclude.is_empty() {
            &self.views
        } else {
            self.scratch.clear();
            let all_ix: Vec<usize>;
            let ix = match indices {
                Some(ix) => ix.as_slice(),
                None => {
                    all_ix = (0..self.views.len()).collect();
                    &all_ix
                }
            };
            // A worker tried and failed is left out with all its ranks.
            for &i in ix {
                let mut v = self.views[i].clone();
                if exclude.contains(&self.meta[i].worker) {
                    v.eligible = false;
                }
                self.scratch.push(v);
            }
            &self.scratch
        };
        let input = SelectInput {
            workers,
            request: facts,
            matches,
            seq,
            now,
            ring: self.ring.as_ref(),
        };
        let decision = kvgate_policies::select(&self.policy, &input, &mut self.rng);
        let Some(worker) = decision.worker else {
            return Err(if decision.path == DecisionPath::Saturated {
                SelectError::Saturated
            } else {
                SelectError::NoHealthy
            });
        };
        let idx = self.views.iter().position(|v| v.id == worker);
        Ok(Chosen {
            idx,
            decision,
            model,
        })
    }
}

impl Actor for SelectorActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Every request passes through here; a deep mailbox keeps bursts from bouncing.
        ctx.set_mailbox_capacity(65_536);
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

    /// The index namespace of a request: its model, or the fleet's only model; the
    /// fleet's shared name where it has one, so a dispatch copies no name.
    fn model_key(&self, facts: &RequestFacts) -> Arc<str> {
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
        let kept: HashMap<WorkerId, (u64, Meta)> = self
            .views
            .drain(..)
            .zip(self.meta.drain(..))
            .map(|(v, m)| (v.id, (v.in_flight, m)))
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
            if let Some((in_flight, old)) = kept.remove(&v.id)
                && old.incarnation == m.incarnation
            {
                v.in_flight = in_flight;
                *m = old;
            }
        }
        self.refresh_eligibility(self.now());
    }

    /// Decides and books the dispatch: in-flight and credit go up on the chosen worker.
    /// With `may_hold`, a request whose chosen worker is still prefilling its prefix for a
    /// streamed request books nothing and is told to wait.
    fn dispatch(
        &mut self,
        me: Addr<SelectorActor>,
        facts: &RequestFacts,
        matches: Option<&PrefixMatches>,
        exclude: &[WorkerId],
        may_hold: bool,
        attempt: u32,
    ) -> Result<Dispatched, SelectError> {
        self.seq = self.seq.wrapping_add(1);
        let Chosen {
            idx,
            mut decision,
            model: served,
        } = self.decide(facts, matches, exclude, self.seq)?;
        if attempt > 1 {
            decision.notes.push(DecisionNote::Retry { attempt });
        }
        let idx = idx.ok_or(SelectError::NoHealthy)?;
        let worker = self.views[idx].id;
        if may_hold && let Some(rx) = self.holds.join(worker, &facts.key) {
            debug!(worker = %self.views[idx].url, "held behind a prefill in progress");
            return Ok(Dispatched::Hold(rx));
        }
        let booked_at = self.epoch.elapsed();
        self.ledger.apply(&decision, booked_at);
        self.next_booking = self.next_booking.wrapping_add(1);
        let booking = self.next_booking;
        let known = matches
            .and_then(|m| m.per_worker.iter().find(|(w, _)| *w == worker))
            .map_or(0, |(_, n)| *n);
        self.holds
            .track(booking, worker, facts, known, decision.record_prefix);
        if self.policy.kind.needs_prefix_matches() {
            // Only cache_aware reads `recent`; the others skip the pass over the fleet.
            for v in &mut self.views {
                v.recent *= self.recent_keep;
            }
            if decision.new_prefix {
                self.views[idx].recent += 1.0;
            }
        }
        let now = self.now();
        // What a failed attempt's record is taken back to. A hash probe names only the
        // deepest boundary's holders, so every boundary down to it stays: only keys no
        // worker held before are surely this record's.
        let keep = match matches.map(|m| m.source) {
            Some(MatchSource::Hash { boundary }) => boundary.unwrap_or(0),
            _ => known,
        };
        let recorded = decision
            .record_prefix
            .then(|| (self.model_key(facts), keep));
        let meta = &mut self.meta[idx];
        let probe = meta.circuit.sent(&self.circuit, now);
        let v = &mut self.views[idx];
        if probe.is_some() {
            // A half-open circuit admits a bounded number of probes at once.
            v.eligible = meta.circuit.admits(&self.circuit, now);
            self.breakers_tripped = true;
        }
        v.in_flight += 1;
        v.credit = self.ledger.credit(v.id);
        debug!(worker = %v.url, decision = %decision, probe = probe.is_some(), "selected");
        let booking = Booking {
            selector: me,
            release: Some(Release {
                worker: v.id,
                incarnation: meta.incarnation,
                booked_at,
                credit_tokens: decision.credit_tokens,
                booking,
                probe,
                outcome: Outcome::Neutral,
                refused: None,
            }),
            prefilling: true,
        };
        Ok(Dispatched::Go(Dispatch {
            worker: meta.worker,
            url: meta.url.clone(),
            decision,
            booking,
            down: meta.down.subscribe(),
            worker_key: meta.key.clone(),
            recorded,
            target: v.id,
            rank: meta.rank,
            model: served,
        }))
    }

    fn index_for(&self, facts: &RequestFacts) -> Option<&Addr<IndexActor>> {
        if !self.policy.kind.needs_prefix_matches() || matches!(facts.key, RoutingText::Empty) {
            return None;
        }
        self.index.as_ref()
    }
}

/// How long what the gateway routed to a target counts as held there even where its
/// engine's KV events do not say so yet: an engine publishes a prompt's blocks when its
/// prefill ends, so a burst on a new prefix would otherwise find no holder until then and
/// start it on every engine. Longer than a prefill waits and runs on a busy engine;
/// past it the events alone tell (an eviction since included).
const ROUTED_LATELY: Duration = Duration::from_secs(10);

/// What a lookup found: the index's matches, what each target was routed lately, and for
/// a token request the chain index's answer for the workers whose KV events are live.
type Found = (
    RequestFacts,
    PrefixMatches,
    Vec<(WorkerId, usize)>,
    Option<ChainAnswer>,
    Option<u64>,
);

/// Asks the index for `ask`'s matches and, for a token request, the events actor for the
/// blocks each live worker's engine holds (both at once).
fn lookup(
    index: &Addr<IndexActor>,
    events: Option<&Addr<EventsActor>>,
    ask: MatchPrefix,
) -> impl std::future::Future<Output = Result<Found, MailboxError>> + 'static {
    let chain = match (&ask.facts.key, events) {
        (RoutingText::Tokens(t), Some(e)) => Some(e.send(MatchChain { tokens: t.clone() })),
        _ => None,
    };
    let ask = MatchPrefix {
        recent: chain.is_some().then_some(ROUTED_LATELY),
        ..ask
    };
    let matched = index.send(ask);
    async move {
        let (facts, m, lately, ticket) = matched.await?;
        let c = match chain {
            Some(c) => c.await.ok(),
            None => None,
        };
        Ok((facts, m, lately, c, ticket))
    }
}

impl SelectorActor {
    /// Lays exact chain holdings (blocks × block size, in tokens) over a token tree's
    /// matches: per rank for a rank target, the worker's best rank for a whole worker;
    /// what a target was routed lately (`lately`, [`ROUTED_LATELY`]) counts too, as its
    /// engine has not published it yet.
    fn overlay(
        &self,
        m: &mut PrefixMatches,
        lately: &[(WorkerId, usize)],
        c: Option<&ChainAnswer>,
    ) {
        let Some(c) = c else {
            return;
        };
        if m.source != MatchSource::TokenTree {
            return;
        }
        for (v, meta) in self.views.iter().zip(&self.meta) {
            let mut live = false;
            let mut best = 0usize;
            for &(w, rank, blocks, block_size) in &c.per_rank {
                if w == meta.worker && meta.rank.is_none_or(|r| r == rank) {
                    live = true;
                    best = best.max(blocks * block_size as usize);
                }
            }
            if !live {
                continue;
            }
            if let Some((_, n)) = lately.iter().find(|(t, _)| *t == v.id) {
                best = best.max(*n);
            }
            m.per_worker.retain(|(x, _)| *x != v.id);
            let held = best.min(m.input_len);
            if held > 0 {
                m.per_worker.push((v.id, held));
            }
        }
    }
}

impl Handler<Select> for SelectorActor {
    // Atomic: no other selection runs between the index lookup and the record, so a
    // burst of one prefix sees its own earlier decisions (the fused match-then-insert).
    type Result = AtomicResponse<Self, Result<Selected, SelectError>>;

    fn handle(&mut self, msg: Select, ctx: &mut Context<Self>) -> Self::Result {
        let me = ctx.address();
        let span = msg.span;
        let queued = msg.enqueued_at.elapsed();
        if let Some(h) = &self.mailbox_wait {
            h.observe(queued.as_secs_f64());
        }
        trace!(parent: &span, queued_us = queued.as_micros() as u64, "select");
        // An unknown model is refused before the index hop, so it never creates an index.
        if let Some(m) = &msg.facts.model
            && !self.by_model.contains_key(m.as_str())
        {
            let e = if self.views.is_empty() {
                SelectError::NoWorkers
            } else {
                self.unknown_model(m)
            };
            return AtomicResponse::new(Box::pin(fut::ready(Err(e))));
        }
        let Some(index) = self.index_for(&msg.facts) else {
            let _enter = span.enter();
            // Without an index nothing is recorded, so nothing warms and nothing holds.
            let attempt = msg.attempt;
            let r = match self
                .guarded(|s| s.dispatch(me, &msg.facts, None, &msg.exclude, false, attempt))
            {
                Ok(Dispatched::Go(d)) => Ok(Selected::Go(d)),
                Ok(Dispatched::Hold(_)) => Err(SelectError::NoHealthy),
                Err(e) => Err(e),
            };
            return AtomicResponse::new(Box::pin(fut::ready(r)));
        };
        let model = self.model_key(&msg.facts);
        let exclude = msg.exclude;
        let may_hold = msg.may_hold;
        let attempt = msg.attempt;
        let ask = lookup(
            index,
            self.events.as_ref().filter(|_| self.events_live),
            MatchPrefix {
                model: model.clone(),
                facts: msg.facts,
                count: msg.first,
                recent: None,
            },
        );
        AtomicResponse::new(Box::pin(ask.into_actor(self).map(move |answer, act, _| {
            let _enter = span.enter();
            let (facts, matches, ticket) = match answer {
                Ok((facts, mut m, lately, chain, ticket)) => {
                    act.overlay(&mut m, &lately, chain.as_ref());
                    (facts, Some(m), ticket)
                }
                // The index is gone (shutdown): the facts went with it.
                Err(_) => return Err(SelectError::NoHealthy),
            };
            let dispatched = act.guarded(|s| {
                s.dispatch(me, &facts, matches.as_ref(), &exclude, may_hold, attempt)
            })?;
            let d = match dispatched {
                Dispatched::Go(d) => d,
                Dispatched::Hold(ready) => {
                    return Ok(Selected::Hold(Hold {
                        facts,
                        exclude,
                        ready,
                        max: act.holds.max,
                    }));
                }
            };
            if d.decision.record_prefix
                && let Some(index) = &act.index
            {
                // do_send keeps order with the next lookup, which this actor sends later.
                index.do_send(RecordPrefix {
                    model,
                    key: facts.key,
                    worker: d.target,
                    ticket,
                });
            }
            Ok(Selected::Go(d))
        })))
    }
}

impl Handler<Explain> for SelectorActor {
    type Result = AtomicResponse<Self, Result<Decision, SelectError>>;

    fn handle(&mut self, msg: Explain, _: &mut Context<Self>) -> Self::Result {
        let seq = self.seq.wrapping_add(1);
        let Some(index) = self.index_for(&msg.facts) else {
            let r = self
                .guarded(|s| s.decide(&msg.facts, None, &[], seq))
                .map(|c| c.decision);
            return AtomicResponse::new(Box::pin(fut::ready(r)));
        };
        let ask = lookup(
            index,
            self.events.as_ref().filter(|_| self.events_live),
            MatchPrefix {
                model: self.model_key(&msg.facts),
                facts: msg.facts,
                count: false,
                recent: None,
            },
        );
        AtomicResponse::new(Box::pin(ask.into_actor(self).map(move |answer, act, _| {
            let (facts, mut matches, lately, chain, _) =
                answer.map_err(|_| SelectError::NoHealthy)?;
            act.overlay(&mut matches, &lately, chain.as_ref());
            act.guarded(|s| s.decide(&facts, Some(&matches), &[], seq))
                .map(|c| c.decision)
        })))
    }
}
