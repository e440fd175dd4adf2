//! The selector actor: owns the policy, the current view of the fleet (registry state,
//! loads, in-flight counts, credit) and turns each request's facts into a decision. The
//! prefill hold, a second small state machine beside the decision, is in `hold`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kvgate_policies::{
    CreditLedger, Decision, DecisionNote, DecisionPath, HashRing, PolicyConfig, PrefixMatches,
    RECENT_HALF_LIFE, RequestFacts, RoutingText, SelectInput, WorkerId, WorkerView,
};
use kvgate_poller::{LoadsPolled, WorkerUrl};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use thiserror::Error;
use tokio::sync::watch;
use tracing::{Span, debug, trace, warn};

use super::index::{IndexActor, MatchPrefix, RecordPrefix};
use super::registry::{Fleet, FleetChanged, WorkerFailed, WorkerStatus};
use crate::config::Secret;

mod circuit;
mod hold;

use circuit::Circuit;
pub use circuit::{CircuitConfig, CircuitState, Outcome};
use hold::Holds;
pub use hold::{Hold, select};

/// Why no worker could be chosen.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum SelectError {
    #[error("the model '{0}' is not served by any worker")]
    UnknownModel(String),
    #[error("no worker is registered")]
    NoWorkers,
    #[error("no healthy worker is available")]
    NoHealthy,
    #[error("every worker is at its waiting-request cap")]
    Saturated,
    /// A decision panicked; the selector rebuilt its state and the request may ask again.
    #[error("the selector failed on this request and restarted")]
    Restarted,
}

/// A worker chosen for one request.
#[derive(Debug)]
pub struct Dispatch {
    pub worker: WorkerId,
    pub url: WorkerUrl,
    pub decision: Decision,
    /// The slot on the worker: dropping it (the response ended, or this reply was never
    /// delivered) releases the in-flight count and the credit.
    pub booking: Booking,
    /// Turns true when the worker is taken out (unhealthy or removed): a request waiting
    /// on it that has sent nothing to its client can be tried elsewhere.
    pub down: watch::Receiver<bool>,
    /// The key the worker expects, sent in place of the client's `Authorization`.
    pub worker_key: Option<Secret>,
    /// Where the index recorded the prompt for this worker, so a failed attempt can be
    /// taken back out: the index namespace and the units the worker held before.
    pub recorded: Option<(String, usize)>,
}

/// One in-flight request on a worker, released on drop whatever ended it.
#[derive(Debug)]
pub struct Booking {
    selector: Addr<SelectorActor>,
    release: Option<Release>,
    /// No byte of the answer yet: its prefill may still be running.
    prefilling: bool,
}

impl Booking {
    /// How the request ended, for the worker's circuit breaker; the last call wins.
    pub fn set_outcome(&mut self, outcome: Outcome) {
        if let Some(r) = &mut self.release {
            r.outcome = outcome;
        }
    }

    /// The worker refused the connection: nothing listens there, so it is taken out now,
    /// without waiting for its health checks.
    pub fn refused(&mut self, reason: String) {
        if let Some(r) = &mut self.release {
            r.outcome = Outcome::Failure;
            r.refused = Some(reason);
        }
    }

    /// The worker sent the first byte of the answer: its prefill is done, so the prompt is
    /// in its cache and its tokens no longer queue ahead of anyone. Called on every
    /// streamed chunk; only the first call sends.
    pub fn first_byte(&mut self) {
        if std::mem::take(&mut self.prefilling)
            && let Some(r) = &self.release
        {
            self.selector.do_send(Warmed(r.clone()));
        }
    }
}

impl Drop for Booking {
    fn drop(&mut self) {
        if let Some(r) = self.release.take() {
            // do_send: a completion must never be lost to a full mailbox.
            self.selector.do_send(r);
        }
    }
}

/// Asks for a worker; on success the worker's in-flight count is already raised and the
/// caller must send [`Release`] when the response ends (dropping the dispatch's [`Booking`] does).
#[derive(Message, Debug)]
#[rtype(result = "Result<Selected, SelectError>")]
pub struct Select {
    pub facts: RequestFacts,
    /// Workers to leave out (a retry elsewhere).
    pub exclude: Vec<WorkerId>,
    /// The request's span, so the selector's logs join the request's.
    pub span: Span,
    pub enqueued_at: Instant,
    /// Whether the answer may be [`Selected::Hold`] (a held request's hold budget is not
    /// spent yet).
    pub may_hold: bool,
    /// The request's first ask, whose lookup counts as traffic; a re-ask after a hold is
    /// the same request and does not count again.
    pub first: bool,
    /// Which attempt of the request this is (1: the first); later ones are retries.
    pub attempt: u32,
}

/// The answer to [`Select`].
#[derive(Debug)]
pub enum Selected {
    Go(Dispatch),
    Hold(Hold),
}

/// A streamed dispatch produced its first byte (see [`Booking::first_byte`]): requests
/// holding on it may go, and its credit goes (what a worker has left of a request after
/// its prefill is decode, which the credit does not price). It carries the dispatch's
/// [`Release`], which still follows at the end for the in-flight count.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Warmed(pub Release);

/// A dry run: the decision the policy would make now, with nothing dispatched or credited.
#[derive(Message, Debug)]
#[rtype(result = "Result<Decision, SelectError>")]
pub struct Explain {
    pub facts: RequestFacts,
}

/// A dispatched request finished (completed, failed or was abandoned by its client).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Release {
    pub worker: WorkerId,
    /// The registration the request was sent to; a release for an older one (the worker
    /// was removed and added again meanwhile) must not lower the new one's count.
    pub incarnation: u64,
    /// The dispatch's booking, so its credit goes with it.
    pub booked_at: Duration,
    pub credit_tokens: u64,
    /// Which dispatch this is, for the requests holding on it.
    pub booking: u64,
    /// Whether it was a probe of the worker's half-open circuit.
    pub probe: bool,
    pub outcome: Outcome,
    /// Set when the worker refused the connection (see [`Booking::refused`]).
    pub refused: Option<String>,
}

/// What the selector knows of one worker beyond its view, for `/workers`.
#[derive(Debug, Clone)]
pub struct WorkerState {
    pub view: WorkerView,
    pub circuit: CircuitState,
    /// Failures inside the breaker's window.
    pub recent_failures: usize,
}

/// Answers at once: the selector is alive and its mailbox moves (readiness).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Ping;

impl Handler<Ping> for SelectorActor {
    type Result = ();

    fn handle(&mut self, _: Ping, _: &mut Context<Self>) {}
}

/// The selector's current per-worker views (inspection, tests).
#[derive(Message, Debug)]
#[rtype(result = "Vec<WorkerView>")]
pub struct GetViews;

/// The selector's current per-worker state, circuits included (for `/workers`).
#[derive(Message, Debug)]
#[rtype(result = "Vec<WorkerState>")]
pub struct GetWorkerStates;

pub struct SelectorActor {
    policy: PolicyConfig,
    /// One view per registered worker, in registry order; policies read it in place.
    views: Vec<WorkerView>,
    /// What else is kept per worker (same order).
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
    /// Which views serve each model, rebuilt on every fleet change.
    by_model: HashMap<String, Vec<usize>>,
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

/// Per worker, beside its view.
#[derive(Debug)]
struct Meta {
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
            by_model: HashMap::new(),
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

    /// Where refused connections are reported, so the worker is taken out at once.
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
        self.by_model.clear();
        self.pending = fleet.iter().any(|w| w.status == WorkerStatus::Pending);
        for (i, rec) in fleet.iter().enumerate() {
            let (mut view, mut meta) = match old.remove(&rec.id) {
                Some((v, m)) if m.incarnation == rec.incarnation => (v, m),
                // New, or removed and added again: nothing carries over.
                _ => {
                    self.ledger.remove(rec.id);
                    let meta = Meta {
                        incarnation: rec.incarnation,
                        url: rec.url.clone(),
                        ready: false,
                        circuit: Circuit::default(),
                        down: watch::channel(false).0,
                        key: None,
                    };
                    (WorkerView::new(rec.id, rec.url.as_str()), meta)
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
                self.by_model.entry(model.clone()).or_default().push(i);
            }
        }
        // Removed workers: their requests' waits end with the senders dropped here.
        for gone in old.keys() {
            if !fleet.iter().any(|w| w.id == *gone) {
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
    ) -> Result<(Option<usize>, Decision), SelectError> {
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
        let indices: Option<&Vec<usize>> = match &facts.model {
            Some(model) => match self.by_model.get(model) {
                Some(ix) => Some(ix),
                None => return Err(self.unknown_model(model)),
            },
            None => None,
        };
        // The common case (every worker serves the model, nothing excluded) reads the
        // views in place; otherwise a filtered copy is built.
        let all = indices.is_none_or(|ix| ix.len() == self.views.len());
        let workers: &[WorkerView] = if all && exclude.is_empty() {
            &self.views
        } else {
            self.scratch.clear();
            match indices {
                Some(ix) => self
                    .scratch
                    .extend(ix.iter().map(|i| self.views[*i].clone())),
                None => self.scratch.extend(self.views.iter().cloned()),
            }
            for v in &mut self.scratch {
                if exclude.contains(&v.id) {
                    v.eligible = false;
                }
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
        Ok((idx, decision))
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

    /// The index namespace of a request: its model, or the fleet's only model.
    fn model_key(&self, facts: &RequestFacts) -> String {
        match &facts.model {
            Some(m) => m.clone(),
            None if self.by_model.len() == 1 => {
                self.by_model.keys().next().cloned().unwrap_or_default()
            }
            None => String::new(),
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

    /// A fresh state, as at startup, with the registry's last fleet applied.
    fn restart(&mut self) {
        self.views.clear();
        self.meta.clear();
        self.by_model.clear();
        self.ledger = CreditLedger::new();
        self.ring = None;
        self.holds = Holds::new(self.holds.max, &self.policy);
        if let Some(fleet) = self.fleet.clone() {
            self.apply_fleet(&fleet);
        }
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
    ) -> Result<Dispatched, SelectError> {
        self.seq = self.seq.wrapping_add(1);
        let (idx, decision) = self.decide(facts, matches, exclude, self.seq)?;
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
        let recorded = decision
            .record_prefix
            .then(|| (self.model_key(facts), known));
        let meta = &mut self.meta[idx];
        let probe = meta.circuit.sent(&self.circuit, now);
        let v = &mut self.views[idx];
        if probe {
            // A half-open circuit admits a bounded number of probes at once.
            v.eligible = meta.circuit.admits(&self.circuit, now);
            self.breakers_tripped = true;
        }
        v.in_flight += 1;
        v.credit = self.ledger.credit(v.id);
        debug!(worker = %v.url, decision = %decision, probe, "selected");
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
            worker: v.id,
            url: meta.url.clone(),
            decision,
            booking,
            down: meta.down.subscribe(),
            worker_key: meta.key.clone(),
            recorded,
        }))
    }

    fn index_for(&self, facts: &RequestFacts) -> Option<Addr<IndexActor>> {
        if !self.policy.kind.needs_prefix_matches() || matches!(facts.key, RoutingText::Empty) {
            return None;
        }
        self.index.clone()
    }
}

impl Handler<Select> for SelectorActor {
    // Atomic: no other selection runs between the index lookup and the record, so a
    // burst of one prefix sees its own earlier decisions (the fused match-then-insert).
    type Result = AtomicResponse<Self, Result<Selected, SelectError>>;

    fn handle(&mut self, msg: Select, ctx: &mut Context<Self>) -> Self::Result {
        let me = ctx.address();
        let span = msg.span;
        trace!(parent: &span, queued_us = msg.enqueued_at.elapsed().as_micros() as u64, "select");
        // An unknown model is refused before the index hop, so it never creates an index.
        if let Some(m) = &msg.facts.model
            && !self.by_model.contains_key(m)
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
            let r = match self.guarded(|s| s.dispatch(me, &msg.facts, None, &msg.exclude, false)) {
                Ok(Dispatched::Go(mut d)) => {
                    if msg.attempt > 1 {
                        d.decision.notes.push(DecisionNote::Retry {
                            attempt: msg.attempt,
                        });
                    }
                    Ok(Selected::Go(d))
                }
                Ok(Dispatched::Hold(_)) => Err(SelectError::NoHealthy),
                Err(e) => Err(e),
            };
            return AtomicResponse::new(Box::pin(fut::ready(r)));
        };
        let model = self.model_key(&msg.facts);
        let exclude = msg.exclude;
        let may_hold = msg.may_hold;
        let attempt = msg.attempt;
        let ask = index.send(MatchPrefix {
            model: model.clone(),
            facts: msg.facts,
            count: msg.first,
        });
        AtomicResponse::new(Box::pin(ask.into_actor(self).map(move |answer, act, _| {
            let _enter = span.enter();
            let (facts, matches) = match answer {
                Ok((facts, m)) => (facts, Some(m)),
                // The index is gone (shutdown): the facts went with it.
                Err(_) => return Err(SelectError::NoHealthy),
            };
            let dispatched =
                act.guarded(|s| s.dispatch(me, &facts, matches.as_ref(), &exclude, may_hold))?;
            let mut d = match dispatched {
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
            if attempt > 1 {
                d.decision.notes.push(DecisionNote::Retry { attempt });
            }
            if d.decision.record_prefix {
                // do_send keeps order with the next lookup, which this actor sends later.
                index.do_send(RecordPrefix {
                    model,
                    key: facts.key,
                    worker: d.worker,
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
                .map(|(_, d)| d);
            return AtomicResponse::new(Box::pin(fut::ready(r)));
        };
        let ask = index.send(MatchPrefix {
            model: self.model_key(&msg.facts),
            facts: msg.facts,
            count: false,
        });
        AtomicResponse::new(Box::pin(ask.into_actor(self).map(move |answer, act, _| {
            let (facts, matches) = answer.map_err(|_| SelectError::NoHealthy)?;
            act.guarded(|s| s.decide(&facts, Some(&matches), &[], seq))
                .map(|(_, d)| d)
        })))
    }
}

impl Handler<Release> for SelectorActor {
    type Result = ();

    fn handle(&mut self, msg: Release, _: &mut Context<Self>) {
        // Ended before its first byte (failed, or its client left): nobody waits longer.
        self.holds.warmed(msg.booking);
        let Some(i) = self.views.iter().position(|v| v.id == msg.worker) else {
            return;
        };
        if self.meta[i].incarnation != msg.incarnation {
            return;
        }
        self.ledger
            .release(msg.worker, msg.booked_at, msg.credit_tokens);
        let now = self.now();
        let v = &mut self.views[i];
        v.in_flight = v.in_flight.saturating_sub(1);
        v.credit = self.ledger.credit(msg.worker);
        let meta = &mut self.meta[i];
        if meta
            .circuit
            .ended(&self.circuit, now, msg.outcome, msg.probe)
        {
            warn!(worker = %meta.url, "circuit open: repeated failures; no traffic until it is probed");
            meta.down.send_replace(true);
            meta.down = watch::channel(false).0;
        }
        if let (Some(reason), Some(registry)) = (msg.refused, &self.registry) {
            registry.do_send(WorkerFailed {
                worker: msg.worker,
                incarnation: msg.incarnation,
                reason,
            });
        }
        self.refresh_eligibility(now);
    }
}

impl Handler<Warmed> for SelectorActor {
    type Result = ();

    fn handle(&mut self, Warmed(msg): Warmed, _: &mut Context<Self>) {
        self.holds.warmed(msg.booking);
        if let Some(i) = self.views.iter().position(|v| v.id == msg.worker)
            && self.meta[i].incarnation == msg.incarnation
        {
            // The Release at the end finds this dispatch gone and releases no credit.
            self.ledger
                .release(msg.worker, msg.booked_at, msg.credit_tokens);
            self.views[i].credit = self.ledger.credit(msg.worker);
        }
    }
}

impl Handler<FleetChanged> for SelectorActor {
    type Result = ();

    fn handle(&mut self, msg: FleetChanged, _: &mut Context<Self>) {
        self.apply_fleet(&msg.0);
        self.fleet = Some(msg.0.clone());
        let views = &self.views;
        self.holds.forget_gone(|w| views.iter().any(|v| v.id == w));
    }
}

impl Handler<LoadsPolled> for SelectorActor {
    type Result = ();

    fn handle(&mut self, msg: LoadsPolled, _: &mut Context<Self>) {
        let LoadsPolled { worker: id, load } = msg;
        let Some(v) = self.views.iter_mut().find(|v| v.id == id) else {
            return;
        };
        // An unknown report is scored as unknown, never as the last good one; the credit
        // stays until a report that covers it arrives.
        if let Some(l) = &load {
            self.ledger.on_report(id, Some(l.sampled_at));
        }
        v.load = load;
        v.credit = self.ledger.credit(id);
    }
}

impl Handler<GetViews> for SelectorActor {
    type Result = MessageResult<GetViews>;

    fn handle(&mut self, _: GetViews, _: &mut Context<Self>) -> Self::Result {
        self.refresh_eligibility(self.now());
        MessageResult(self.views.clone())
    }
}

impl Handler<GetWorkerStates> for SelectorActor {
    type Result = MessageResult<GetWorkerStates>;

    fn handle(&mut self, _: GetWorkerStates, _: &mut Context<Self>) -> Self::Result {
        let now = self.now();
        self.refresh_eligibility(now);
        let cfg = self.circuit;
        let states = self
            .views
            .iter()
            .zip(&mut self.meta)
            .map(|(v, m)| WorkerState {
                view: v.clone(),
                circuit: m.circuit.state(&cfg, now),
                recent_failures: m.circuit.recent_failures(),
            })
            .collect();
        MessageResult(states)
    }
}

/// Test builds only: makes the next decision panic, to show routing survives it.
#[cfg(feature = "fault-injection")]
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct InjectPanic;

#[cfg(feature = "fault-injection")]
impl Handler<InjectPanic> for SelectorActor {
    type Result = ();

    fn handle(&mut self, _: InjectPanic, _: &mut Context<Self>) {
        self.panic_next = true;
    }
}
