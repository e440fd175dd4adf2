//! One decision: the policy over the candidates, then the booking of what it chose.

use std::sync::Arc;

use actix::prelude::*;
use kvgate_policies::{
    Decision, DecisionNote, DecisionPath, MatchSource, PrefixMatches, RequestFacts, RoutingText,
    SelectInput, WorkerId, WorkerView,
};
use tracing::debug;

use super::{Booking, Dispatch, Outcome, Recorded, Release, SelectError, SelectorActor};
use crate::actors::index::IndexActor;

/// What `decide` chose.
pub(super) struct Chosen {
    /// The chosen target's place in `views`.
    pub(super) idx: Option<usize>,
    pub(super) decision: Decision,
    /// The request's model, as the fleet's own name for it.
    pub(super) model: Option<Arc<str>>,
}

/// What `dispatch` did.
#[expect(
    clippy::large_enum_variant,
    reason = "made and matched at once on the stack; a box would allocate per request"
)]
pub(super) enum Dispatched {
    Go(Dispatch),
    /// The caller builds the [`Hold`] around this.
    Hold(tokio::sync::oneshot::Receiver<()>),
}

impl SelectorActor {
    /// Runs the policy over the candidates for `facts`; returns the member index chosen.
    pub(super) fn decide(
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
        let (model, mut indices) = match &facts.model {
            Some(model) => match self.by_model.get_key_value(model.as_str()) {
                Some((name, ix)) => (Some(name.clone()), Some(ix)),
                None => return Err(self.unknown_model(model)),
            },
            None => (None, None),
        };
        // An adapter named apart from the model (SGLang's `lora_path`) goes to the engines
        // that list it, where any does; otherwise every engine of the model may load it.
        if let Some(a) = facts.adapter.as_deref()
            && facts.model.as_deref() != Some(a)
            && let Some(ix) = self.by_model.get(a)
        {
            indices = Some(ix);
        }
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
        let mut decision = kvgate_policies::select(&self.policy, &input, &mut self.rng);
        if self.panic {
            // Said for dispatches and explains alike.
            decision.notes.push(DecisionNote::Panic);
        }
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

    /// Decides and books the dispatch: in-flight and credit go up on the chosen worker.
    /// With `may_hold`, a request whose chosen worker is still prefilling its prefix for a
    /// streamed request books nothing and is told to wait.
    pub(super) fn dispatch(
        &mut self,
        me: Addr<SelectorActor>,
        facts: &Arc<RequestFacts>,
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
            // Only cache_aware shows `recent` and reads `last_start`; the others skip the
            // pass over the fleet.
            for v in &mut self.views {
                v.recent *= self.recent_keep;
            }
            if decision.new_prefix {
                self.starts += 1;
                self.views[idx].recent += 1.0;
                self.views[idx].last_start = self.starts;
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
        let recorded = decision.record_prefix.then(|| Recorded {
            model: self.model_key(facts),
            target: self.views[idx].id,
            keep,
        });
        let meta = &mut self.meta[idx];
        let probe = meta.circuit.sent(&self.circuit, now);
        let v = &mut self.views[idx];
        if probe.is_some() {
            // A half-open circuit admits a bounded number of probes at once (in panic, any
            // ready worker is eligible; the next decision counts again).
            v.eligible = self.panic || meta.circuit.admits(&self.circuit, now);
            self.breakers_tripped = true;
        }
        v.in_flight += 1;
        v.credit = self.ledger.credit(v.id);
        if let Some(own) = &mut v.own {
            own.unprefilled_tokens += decision.credit_tokens;
        }
        debug!(worker = %v.url, decision = %decision, probe = probe.is_some(), "selected");
        let booking = Booking {
            selector: me,
            release: Some(Release {
                worker: v.id,
                incarnation: meta.incarnation,
                booked_at,
                credit_tokens: decision.credit_tokens,
                booking,
                warmed: false,
                probe,
                outcome: Outcome::Neutral,
                refused: None,
            }),
            prefilling: true,
        };
        // A watch fired for earlier requests (a circuit since closed) must not cancel this one.
        if *meta.down.borrow() {
            meta.down = tokio::sync::watch::channel(false).0;
        }
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
            rank_via: meta.rank_via,
            model: served,
        }))
    }

    pub(super) fn index_for(&self, facts: &RequestFacts) -> Option<&Addr<IndexActor>> {
        if !self.policy.kind.needs_prefix_matches() || matches!(facts.key, RoutingText::Empty) {
            return None;
        }
        self.index.as_ref()
    }
}
