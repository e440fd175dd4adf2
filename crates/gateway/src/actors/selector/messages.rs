//! What the selector is asked and what it answers: the messages, the `Dispatch` handed to
//! the dispatch pipeline, and the `Booking` that gives its slot back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kvgate_core::WorkerUrl;
use kvgate_policies::{Decision, RequestFacts, WorkerId, WorkerView};
use thiserror::Error;
use tokio::sync::watch;
use tracing::Span;

use super::{CircuitState, Hold, Outcome, RankVia, SelectorActor};

use kvgate_core::Secret;

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
    /// The routing target chosen: the worker, or one of its ranks (the index's tenant).
    pub target: WorkerId,
    /// The data-parallel rank to send (`routed_dp_rank` in the body, or vLLM's
    /// `X-data-parallel-rank` header, as `rank_via` says), when the target is one rank
    /// of the worker.
    pub rank: Option<u32>,
    pub rank_via: RankVia,
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
    /// Where the index recorded the prompt for this dispatch, so a failed attempt can be
    /// taken back out ([`Failed`]).
    pub recorded: Option<Recorded>,
    /// The request's model as the fleet names it, shared rather than copied (the
    /// decision log and the metrics' label); `None` when the request named none.
    pub model: Option<Arc<str>>,
}

/// One in-flight request on a worker, released on drop whatever ended it.
#[derive(Debug)]
pub struct Booking {
    pub(super) selector: Addr<SelectorActor>,
    pub(super) release: Option<Release>,
    /// No byte of the answer yet: its prefill may still be running.
    pub(super) prefilling: bool,
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
            && let Some(r) = &mut self.release
        {
            self.selector.do_send(Warmed(r.clone()));
            r.warmed = true;
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
    /// The request's facts, parsed once and shared by every ask of the request.
    pub facts: Arc<RequestFacts>,
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
#[expect(
    clippy::large_enum_variant,
    reason = "sent once per ask and matched at once; a box would allocate per request"
)]
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

/// A dry run: the decision the policy would make now, with nothing dispatched, credited
/// or drawn (the random generator is left as it was, so the dispatch that follows decides
/// the same).
#[derive(Message, Debug)]
#[rtype(result = "Result<Explained, SelectError>")]
pub struct Explain {
    pub facts: Arc<RequestFacts>,
}

/// An [`Explain`]'s answer: the decision, and the targets whose match came from their
/// engine's KV events (the others' from the approximate index, if any).
#[derive(Debug)]
pub struct Explained {
    pub decision: Decision,
    pub from_events: Vec<WorkerId>,
}

/// What a dispatch recorded in the prefix index: the index namespace, the target, and
/// the units the target held before.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub model: Arc<str>,
    pub target: WorkerId,
    pub keep: usize,
}

/// A dispatch failed before any byte reached the client: the selector takes its record
/// back out of the index (the engine's cache did not get the prompt). Sent with
/// `do_send`: a correction must not be lost to a full mailbox.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Failed {
    pub recorded: Recorded,
    pub facts: Arc<RequestFacts>,
}

/// A dispatched request finished (completed, failed or was abandoned by its client).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Release {
    /// The routing target (the worker, or one rank of it).
    pub worker: WorkerId,
    /// The registration the request was sent to; a release for an older one (the worker
    /// was removed and added again meanwhile) must not lower the new one's count.
    pub incarnation: u64,
    /// The dispatch's booking, so its credit goes with it.
    pub booked_at: Duration,
    pub credit_tokens: u64,
    /// Which dispatch this is, for the requests holding on it.
    pub booking: u64,
    /// A [`Warmed`] for this dispatch went first: its booked tokens are taken back already.
    pub warmed: bool,
    /// The half-open period of the worker's circuit it probes, if it is a probe.
    pub probe: Option<u32>,
    pub outcome: Outcome,
    /// Set when the worker refused the connection (see [`Booking::refused`]).
    pub refused: Option<String>,
}

/// What the selector knows of one worker beyond its view, for `/workers`.
#[derive(Debug, Clone)]
pub struct WorkerState {
    /// The target's view: the worker's, or one rank's.
    pub view: WorkerView,
    /// The worker it is, or one rank of.
    pub worker: WorkerId,
    pub rank: Option<u32>,
    pub circuit: CircuitState,
    /// Failures inside the breaker's window.
    pub recent_failures: usize,
}

/// One worker's state from its targets' (`states` as [`GetWorkerStates`] answers): in-flight
/// requests, credit and failures summed over its ranks, their loads side by side (the
/// oldest sample's time), the most open circuit. `None` when the selector has no target
/// of it.
pub(crate) fn worker_state(states: &[WorkerState], worker: WorkerId) -> Option<WorkerState> {
    let mut of = states.iter().filter(|s| s.worker == worker);
    let first = of.next()?;
    let mut out = WorkerState {
        view: first.view.clone(),
        worker,
        rank: None,
        circuit: first.circuit,
        recent_failures: first.recent_failures,
    };
    out.view.id = worker;
    for s in of {
        let v = &mut out.view;
        v.in_flight += s.view.in_flight;
        v.credit.tokens += s.view.credit.tokens;
        v.credit.requests += s.view.credit.requests;
        v.eligible |= s.view.eligible;
        v.recent += s.view.recent;
        v.last_start = v.last_start.max(s.view.last_start);
        v.own = match (v.own, s.view.own) {
            (Some(a), Some(b)) => Some(kvgate_policies::Own {
                unprefilled_tokens: a.unprefilled_tokens + b.unprefilled_tokens,
                requests_at_sample: a.requests_at_sample + b.requests_at_sample,
            }),
            (a, b) => a.or(b),
        };
        v.load = match (v.load.take(), &s.view.load) {
            (Some(mut a), Some(b)) => {
                a.ranks.extend(b.ranks.iter().cloned());
                a.sampled_at = a.sampled_at.min(b.sampled_at);
                Some(a)
            }
            // One rank unknown: the worker's load is not known whole.
            _ => None,
        };
        out.recent_failures += s.recent_failures;
        out.circuit = worst(out.circuit, s.circuit);
    }
    if let Some(l) = &mut out.view.load {
        l.ranks.sort_by_key(|r| r.dp_rank);
    }
    Some(out)
}

fn worst(a: CircuitState, b: CircuitState) -> CircuitState {
    let rank = |c| match c {
        CircuitState::Closed => 0,
        CircuitState::HalfOpen => 1,
        CircuitState::Open => 2,
    };
    if rank(b) > rank(a) { b } else { a }
}

/// Answers at once (the selector is alive and its mailbox moves) whether some target
/// can be routed to now: ready, and its circuit admitting or the fleet in panic
/// (readiness).
#[derive(Message, Debug)]
#[rtype(result = "bool")]
pub struct Ping;

impl Handler<Ping> for SelectorActor {
    type Result = bool;

    fn handle(&mut self, _: Ping, _: &mut Context<Self>) -> bool {
        self.routable()
    }
}

/// The selector's current view of every routing target (inspection, tests).
#[derive(Message, Debug)]
#[rtype(result = "Vec<WorkerView>")]
pub struct GetViews;

/// The selector's current state of every routing target, circuits included (for
/// `/workers`).
#[derive(Message, Debug)]
#[rtype(result = "Vec<WorkerState>")]
pub struct GetWorkerStates;
