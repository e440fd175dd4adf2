//! The dispatch pipeline, the same for every front door: admission, then a decision (the
//! prefill hold waited out, a restarted selector asked again), its booking and its entry in
//! the decision log, and for a front door that proxies itself another decision elsewhere
//! when an attempt fails before any byte reached the client.
//!
//! A request's facts come in once, shared (`Arc`), and stay with the request through
//! every hold, retry and re-ask: nothing here parses or tokenizes again. What a failed
//! attempt leaves behind (its record in the prefix index) the selector takes back
//! ([`Failed`]); its slot goes back when its [`Booking`](crate::actors::selector::Booking)
//! drops. `docs/architecture.md` draws the whole pipeline.

use std::sync::Arc;
use std::time::Instant;

use actix::{Addr, MailboxError};
use kvgate_core::Endpoint;
use kvgate_policies::{DecisionNote, RequestFacts, WorkerId};
use tracing::{Instrument, Span, warn};

use crate::actors::selector::{
    Dispatch, Failed, GetWorkerStates, Recorded, Select, SelectError, Selected, SelectorActor,
};
use crate::config::RetryConfig;
use crate::metrics::{Door, Metrics};

mod admission;
mod budget;
mod decisions;
mod refusal;

pub(crate) use crate::actors::selector::Outcome;
pub(crate) use admission::{Admission, AdmitError, Ticket};
pub(crate) use budget::SharedBudget;
pub(crate) use decisions::{AnswerNote, DECISION_LOG_SIZE, Decided, DecisionSink, is_text};
pub(crate) use refusal::{Refusal, error_body};

/// Why a request got no worker.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error(transparent)]
    Select(#[from] SelectError),
    /// The selector is gone (the gateway is stopping).
    #[error("the selector is unavailable: {0}")]
    Gone(#[from] MailboxError),
}

/// One client request as the pipeline carries it through its attempts.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    /// Parsed once; every ask and record of the request shares them.
    pub facts: Arc<RequestFacts>,
    pub endpoint: Endpoint,
    pub request_id: Arc<str>,
    /// When the request arrived, for the decision log's timings.
    pub arrived: Instant,
    /// Which front door asked, for the metrics.
    pub door: Door,
}

/// A routing target as a front door names it: the worker it belongs to (what `exclude`
/// takes), the target's own id (what a decision's candidates name) and its URL.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub worker: WorkerId,
    pub id: WorkerId,
    pub url: Arc<str>,
    /// Ready to route (the registry's verdict, not draining).
    pub eligible: bool,
}

/// One attempt: the worker chosen, and the note its answer fills in for the decision log.
#[derive(Debug)]
pub(crate) struct Attempt {
    pub dispatch: Dispatch,
    pub note: AnswerNote,
    /// 1 for the first attempt.
    pub number: u32,
    /// The decision's runners-up, best first, for a front door that hands its gateway a
    /// fallback list (the ext_proc door); empty for the HTTP door, which retries itself.
    pub runners_up: Vec<WorkerId>,
}

/// Whether the engine may have started the work of a failed attempt (the table is in
/// `docs/operations.md`, "Retries").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureKind {
    /// It certainly did not: no connection, or its answer (503, 429) said so.
    NotStarted,
    /// It may have: the request was written, then the answer broke off or never came.
    /// Retried at most once per request, so a request that kills engines does not walk
    /// the fleet.
    MayHaveStarted,
}

/// An attempt that failed, as the front door that made it tells it.
pub(crate) trait AttemptFailure: std::fmt::Display {
    /// Whether another worker may serve the request (nothing reached the client, and the
    /// failure was the worker's, not the request's).
    fn retryable(&self) -> bool;
    fn kind(&self) -> FailureKind;
}

/// How a run ended without an answer.
#[derive(Debug)]
pub(crate) enum RunError<F> {
    /// No worker could be chosen, and no attempt had been made.
    Dispatch(DispatchError),
    /// The last attempt's failure: no retry was left, or no other worker could be chosen.
    Failed(F),
}

/// The pipeline's handle, one per gateway, cloned into each front door.
#[derive(Debug, Clone)]
pub(crate) struct Pipeline {
    pub(crate) selector: Addr<SelectorActor>,
    pub(crate) admission: Arc<Admission>,
    pub(crate) decisions: DecisionSink,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) retry: RetryConfig,
    /// Retries across all requests (`--retry-budget-*`).
    pub(crate) budget: Arc<SharedBudget>,
    /// The policy's text-to-token estimate, for the predicted cached tokens.
    pub(crate) bytes_per_token: f64,
}

impl Pipeline {
    pub(crate) fn decisions(&self) -> &DecisionSink {
        &self.decisions
    }

    /// The policy's text-to-token estimate.
    pub(crate) fn bytes_per_token(&self) -> f64 {
        self.bytes_per_token
    }

    /// Every routing target the selector knows now, in its order.
    pub(crate) async fn targets(&self) -> Result<Vec<Target>, DispatchError> {
        let states = self.selector.send(GetWorkerStates).await?;
        Ok(states
            .into_iter()
            .map(|s| Target {
                worker: s.worker,
                id: s.view.id,
                url: s.view.url,
                eligible: s.view.eligible,
            })
            .collect())
    }

    /// An attempt that did not serve the request: what it recorded in the index is taken
    /// back (the engine's cache did not get the prompt).
    pub(crate) fn forget(&self, job: &Job, recorded: Recorded) {
        // do_send: a correction must not be lost to a full mailbox.
        self.selector.do_send(Failed {
            recorded,
            facts: job.facts.clone(),
        });
    }

    /// A worker for attempt `number` of `job`, `exclude` left out: each hold waited out
    /// within one budget, a selector that restarted on this request asked once more. The
    /// dispatch is counted and logged; its [`AnswerNote`] goes with the answer. The
    /// selector's span stays joined to the caller's across the mailbox. The asks are a loop
    /// in here, not a future of their own: each level of future moves the dispatch once
    /// more (callgrind, `docs/benchmarks.md`).
    pub(crate) async fn attempt(
        &self,
        job: &Job,
        exclude: &[WorkerId],
        number: u32,
    ) -> Result<Attempt, DispatchError> {
        let span = Span::current();
        let mut may_hold = true;
        let mut restarted = false;
        // One budget for all holds of a request: its choice may move to another engine that
        // is itself still computing the prefix (a group spreading over several engines).
        let mut until: Option<actix_rt::time::Instant> = None;
        let mut d = loop {
            let answer = self
                .selector
                .send(Select {
                    facts: job.facts.clone(),
                    exclude: exclude.to_vec(),
                    span: span.clone(),
                    enqueued_at: Instant::now(),
                    may_hold,
                    first: until.is_none() && number <= 1 && !restarted,
                    attempt: number,
                })
                .instrument(span.clone())
                .await?;
            let hold = match answer {
                Ok(Selected::Go(d)) => break d,
                Ok(Selected::Hold(h)) => h,
                // The selector rebuilt its state after a failed decision: once more, on the
                // fresh state (a second failure is this request's own answer).
                Err(SelectError::Restarted) if !restarted => {
                    restarted = true;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let end = *until.get_or_insert_with(|| actix_rt::time::Instant::now() + hold.max);
            // Whether it warmed, ended or timed out, the next ask goes ahead; once the
            // budget is spent it may not hold again.
            let left = end.saturating_duration_since(actix_rt::time::Instant::now());
            let _ = actix_rt::time::timeout(left, hold.ready).await;
            may_hold = actix_rt::time::Instant::now() < end;
        };
        self.metrics.dispatched(d.decision.path, number, job.door);
        if d.decision.notes.contains(&DecisionNote::Panic) {
            self.metrics.panic_routed.inc();
        }
        // Read before the log takes the decision.
        let runners_up = match job.door {
            Door::ExtProc => d.decision.runners_up(),
            Door::Http => Vec::new(),
        };
        let note = self.decisions.decided(
            &mut d.decision,
            Decided {
                request_id: &job.request_id,
                model: d.model.clone(),
                endpoint: job.endpoint,
                attempt: number,
                worker_url: d.url.clone(),
                text: is_text(&job.facts.key),
                bytes_per_token: self.bytes_per_token,
                arrived: job.arrived,
                stream: job.facts.stream,
            },
        );
        Ok(Attempt {
            dispatch: d,
            note,
            number,
            runners_up,
        })
    }

    /// Runs `job` to an answer: an attempt, handed to `send`; on a retryable failure, with
    /// attempts, time and retry budget left, the failed worker is left out and another
    /// attempt follows after a backoff. A failure the engine may have started is retried
    /// once per request at most. Nothing of a failed attempt stays in the index.
    pub(crate) async fn run<T, F, Fut, E>(
        &self,
        job: &Job,
        deadline: Instant,
        mut send: F,
    ) -> Result<T, RunError<E>>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: std::future::Future<Output = Result<T, E>>,
        E: AttemptFailure,
    {
        let mut exclude: Vec<WorkerId> = Vec::new();
        let mut last: Option<E> = None;
        let mut number = 1;
        let mut maybe_started = false;
        self.budget.request();
        loop {
            let mut a = match self.attempt(job, &exclude, number).await {
                Ok(a) => a,
                // Every worker left was tried: the client gets the last failure.
                Err(e) => return Err(last.map_or(RunError::Dispatch(e), RunError::Failed)),
            };
            let (worker, url) = (a.dispatch.worker, a.dispatch.url.clone());
            let recorded = a.dispatch.recorded.take();
            let failure = match send(a).await {
                Ok(answer) => return Ok(answer),
                Err(f) => f,
            };
            if let Some(recorded) = recorded {
                self.forget(job, recorded);
            }
            let started = failure.kind() == FailureKind::MayHaveStarted;
            let refused = if !failure.retryable() {
                return Err(RunError::Failed(failure));
            } else if number >= self.retry.attempts() || Instant::now() >= deadline {
                Some("no retry left")
            } else if started && maybe_started {
                Some("it may have started on two engines")
            } else if !self.budget.retry() {
                self.metrics.retries_refused.inc();
                Some("the retry budget is spent")
            } else {
                None
            };
            if let Some(why) = refused {
                warn!(request_id = %job.request_id, worker = %url, attempt = number, error = %failure, "attempt failed; not retried: {why}");
                return Err(RunError::Failed(failure));
            }
            warn!(request_id = %job.request_id, worker = %url, attempt = number, error = %failure, "attempt failed; trying another worker");
            maybe_started |= started;
            exclude.push(worker);
            number += 1;
            let wait = self.retry.backoff(number, &mut rand::thread_rng());
            let left = deadline.saturating_duration_since(Instant::now());
            actix_rt::time::sleep(wait.min(left)).await;
            last = Some(failure);
        }
    }
}
