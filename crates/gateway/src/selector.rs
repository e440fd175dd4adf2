//! The selector actor: owns the policy, the current view of the fleet (registry state,
//! loads, in-flight counts, credit) and turns each request's facts into a decision.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kvgate_policies::{Decision, PolicyConfig, RequestFacts, SelectInput, WorkerId, WorkerView};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use thiserror::Error;
use tracing::{Instrument, Span, debug, trace};

use crate::registry::{Fleet, FleetChanged};

/// Why no worker could be chosen.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum SelectError {
    #[error("the model '{0}' is not served by any worker")]
    UnknownModel(String),
    #[error("no worker is registered")]
    NoWorkers,
    #[error("no healthy worker is available")]
    NoHealthy,
}

/// A worker chosen for one request.
#[derive(Debug, Clone)]
pub struct Dispatch {
    pub worker: WorkerId,
    pub url: Arc<str>,
    pub decision: Decision,
}

/// Asks for a worker; on success the worker's in-flight count is already raised and the
/// caller must send [`Release`] when the response ends (see `proxy::InFlight`).
#[derive(Message, Debug)]
#[rtype(result = "Result<Dispatch, SelectError>")]
pub struct Select {
    pub facts: RequestFacts,
    /// Workers to leave out (a retry elsewhere).
    pub exclude: Vec<WorkerId>,
    /// The request's span, so the selector's logs join the request's.
    pub span: Span,
    pub enqueued_at: Instant,
}

/// A dry run: the decision the policy would make now, with nothing dispatched or credited.
#[derive(Message, Debug)]
#[rtype(result = "Result<Decision, SelectError>")]
pub struct Explain {
    pub facts: RequestFacts,
}

/// A dispatched request finished (completed, failed or was abandoned by its client).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Release {
    pub worker: WorkerId,
}

/// The selector's current per-worker view (for `/workers` and inspection).
#[derive(Message, Debug)]
#[rtype(result = "Vec<WorkerView>")]
pub struct GetViews;

pub struct SelectorActor {
    policy: PolicyConfig,
    /// One view per registered worker, in registry order; policies read it in place.
    views: Vec<WorkerView>,
    /// Which views serve each model, rebuilt on every fleet change.
    by_model: HashMap<String, Vec<usize>>,
    rng: SmallRng,
    seq: u64,
    epoch: Instant,
    scratch: Vec<WorkerView>,
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
    pub fn new(policy: PolicyConfig, seed: Option<u64>, epoch: Instant) -> Self {
        SelectorActor {
            policy,
            views: Vec::new(),
            by_model: HashMap::new(),
            rng: seed.map_or_else(SmallRng::from_entropy, SmallRng::seed_from_u64),
            seq: 0,
            epoch,
            scratch: Vec::new(),
        }
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn apply_fleet(&mut self, fleet: &Fleet) {
        let mut old: HashMap<WorkerId, WorkerView> =
            self.views.drain(..).map(|v| (v.id, v)).collect();
        self.by_model.clear();
        for (i, rec) in fleet.iter().enumerate() {
            let mut view = old
                .remove(&rec.id)
                .unwrap_or_else(|| WorkerView::new(rec.id, rec.url.as_str()));
            view.eligible = rec.healthy();
            self.views.push(view);
            for model in &rec.models {
                self.by_model.entry(model.clone()).or_default().push(i);
            }
        }
    }

    /// Runs the policy over the candidates for `facts`; returns the member index chosen.
    fn decide(
        &mut self,
        facts: &RequestFacts,
        exclude: &[WorkerId],
        seq: u64,
    ) -> Result<(Option<usize>, Decision), SelectError> {
        if self.views.is_empty() {
            return Err(SelectError::NoWorkers);
        }
        let now = self.now();
        let indices: Option<&Vec<usize>> = match &facts.model {
            Some(model) => match self.by_model.get(model) {
                Some(ix) => Some(ix),
                None => return Err(SelectError::UnknownModel(model.clone())),
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
                Some(ix) => self.scratch.extend(ix.iter().map(|i| self.views[*i].clone())),
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
            matches: None,
            seq,
            now,
            ring: None,
        };
        let decision = kvgate_policies::select(&self.policy, &input, &mut self.rng);
        let Some(worker) = decision.worker else {
            return Err(SelectError::NoHealthy);
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

impl Handler<Select> for SelectorActor {
    type Result = Result<Dispatch, SelectError>;

    fn handle(&mut self, msg: Select, _: &mut Context<Self>) -> Self::Result {
        let _enter = msg.span.enter();
        trace!(queued_us = msg.enqueued_at.elapsed().as_micros() as u64, "select");
        self.seq = self.seq.wrapping_add(1);
        let (idx, decision) = self.decide(&msg.facts, &msg.exclude, self.seq)?;
        let idx = idx.ok_or(SelectError::NoHealthy)?;
        let v = &mut self.views[idx];
        v.in_flight += 1;
        v.credit.tokens += decision.credit_tokens;
        v.credit.requests += 1;
        debug!(worker = %v.url, path = ?decision.path, "selected");
        Ok(Dispatch {
            worker: v.id,
            url: v.url.clone(),
            decision,
        })
    }
}

impl Handler<Explain> for SelectorActor {
    type Result = Result<Decision, SelectError>;

    fn handle(&mut self, msg: Explain, _: &mut Context<Self>) -> Self::Result {
        let seq = self.seq.wrapping_add(1);
        self.decide(&msg.facts, &[], seq).map(|(_, d)| d)
    }
}

impl Handler<Release> for SelectorActor {
    type Result = ();

    fn handle(&mut self, msg: Release, _: &mut Context<Self>) {
        if let Some(v) = self.views.iter_mut().find(|v| v.id == msg.worker) {
            v.in_flight = v.in_flight.saturating_sub(1);
        }
    }
}

impl Handler<FleetChanged> for SelectorActor {
    type Result = ();

    fn handle(&mut self, msg: FleetChanged, _: &mut Context<Self>) {
        self.apply_fleet(&msg.0);
    }
}

impl Handler<GetViews> for SelectorActor {
    type Result = MessageResult<GetViews>;

    fn handle(&mut self, _: GetViews, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.views.clone())
    }
}

/// Keeps the selector's span joined to the caller's across the mailbox.
pub async fn select(
    selector: &Addr<SelectorActor>,
    facts: RequestFacts,
    exclude: Vec<WorkerId>,
) -> Result<Result<Dispatch, SelectError>, MailboxError> {
    let span = Span::current();
    selector
        .send(Select {
            facts,
            exclude,
            span: span.clone(),
            enqueued_at: Instant::now(),
        })
        .instrument(span)
        .await
}
