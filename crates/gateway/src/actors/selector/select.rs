//! Answering `Select` and `Explain`: the index lookup (and the chain index's, for token
//! requests to workers with live KV events), the decision on its answer, the record that
//! follows, and `Failed`, which takes a failed dispatch's record back.

use std::time::Duration;

use actix::prelude::*;
use kvgate_policies::{MatchSource, PrefixMatches, RequestFacts, RoutingText, WorkerId};
use tracing::trace;

use super::decide::Dispatched;
use super::{Explain, Explained, Failed, Hold, Select, SelectError, Selected, SelectorActor};
use crate::actors::events::{ChainAnswer, EventsActor, MatchChain};
use crate::actors::index::{ForgetPrefix, IndexActor, MatchPrefix, RecordPrefix};

/// How long what the gateway routed to a target counts as held there even where its
/// engine's KV events do not say so yet: an engine publishes a prompt's blocks when its
/// prefill ends, so a burst on a new prefix would otherwise find no holder until then and
/// start it on every engine. Longer than a prefill waits and runs on a busy engine;
/// past it the events alone tell (an eviction since included).
const ROUTED_LATELY: Duration = Duration::from_secs(10);

/// What a lookup found: the index's matches, what each target was routed lately, for a
/// token request the chain index's answer for the workers whose KV events are live, and
/// the lookup's ticket for the record that follows.
type Found = (
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
        (RoutingText::Tokens(_), Some(e)) => Some(e.send(MatchChain {
            facts: ask.facts.clone(),
        })),
        _ => None,
    };
    let ask = MatchPrefix {
        recent: chain.is_some().then_some(ROUTED_LATELY),
        ..ask
    };
    let matched = index.send(ask);
    async move {
        let (m, lately, ticket) = matched.await?;
        let c = match chain {
            Some(c) => c.await.ok(),
            None => None,
        };
        Ok((m, lately, c, ticket))
    }
}

impl SelectorActor {
    /// Lays exact chain holdings (blocks × block size, in tokens) over a token tree's
    /// matches: per rank for a rank target, the worker's best rank for a whole worker;
    /// what a target was routed lately (`lately`, [`ROUTED_LATELY`]) counts too, as its
    /// engine has not published it yet.
    /// Answers the targets whose holdings came from their events.
    fn overlay(
        &self,
        m: &mut PrefixMatches,
        lately: &[(WorkerId, usize)],
        c: Option<&ChainAnswer>,
        scoped: bool,
    ) -> Vec<WorkerId> {
        let mut from_events = Vec::new();
        let Some(c) = c else {
            return from_events;
        };
        if m.source != MatchSource::TokenTree {
            return from_events;
        }
        // An adapter's or a salt's blocks no engine's events hold: the events may not name
        // the scope (an engine that sends only `lora_id`, say), so what kvgate routed
        // stays the answer rather than nothing.
        if scoped && c.per_rank.iter().all(|&(_, _, blocks, _)| blocks == 0) {
            return from_events;
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
            from_events.push(v.id);
            if let Some((_, n)) = lately.iter().find(|(t, _)| *t == v.id) {
                best = best.max(*n);
            }
            m.per_worker.retain(|(x, _)| *x != v.id);
            let held = best.min(m.input_len);
            if held > 0 {
                m.per_worker.push((v.id, held));
            }
        }
        from_events
    }
}

/// The answer to a [`Select`]: at once when no index is asked (no allocation, no wait on
/// the context), or after the lookup, atomically: no other selection runs between the
/// index lookup and the record, so a burst of one prefix sees its own earlier decisions
/// (the fused match-then-insert).
#[expect(
    clippy::large_enum_variant,
    reason = "the answer is sent at once; a box would cost an allocation per request"
)]
pub enum SelectAnswer {
    Now(Result<Selected, SelectError>),
    Looked(AtomicResponse<SelectorActor, Result<Selected, SelectError>>),
}

impl std::fmt::Debug for SelectAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SelectAnswer::Now(r) => f.debug_tuple("Now").field(r).finish(),
            SelectAnswer::Looked(_) => f.write_str("Looked"),
        }
    }
}

impl actix::dev::MessageResponse<SelectorActor, Select> for SelectAnswer {
    fn handle(
        self,
        ctx: &mut Context<SelectorActor>,
        tx: Option<actix::dev::OneshotSender<Result<Selected, SelectError>>>,
    ) {
        match self {
            SelectAnswer::Now(r) => {
                if let Some(tx) = tx {
                    // The asker gone (its client left) needs no answer.
                    let _ = tx.send(r);
                }
            }
            SelectAnswer::Looked(a) => {
                actix::dev::MessageResponse::<SelectorActor, Select>::handle(a, ctx, tx);
            }
        }
    }
}

impl Handler<Select> for SelectorActor {
    type Result = SelectAnswer;

    fn handle(&mut self, mut msg: Select, ctx: &mut Context<Self>) -> Self::Result {
        msg.facts = self.with_adapter(msg.facts);
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
            return SelectAnswer::Now(Err(e));
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
            return SelectAnswer::Now(r);
        };
        let model = self.model_key(&msg.facts);
        let exclude = msg.exclude;
        let may_hold = msg.may_hold;
        let attempt = msg.attempt;
        let facts = msg.facts;
        let ask = lookup(
            index,
            self.events.as_ref().filter(|_| self.events_live),
            MatchPrefix {
                model: model.clone(),
                facts: facts.clone(),
                count: msg.first,
                recent: None,
            },
        );
        SelectAnswer::Looked(AtomicResponse::new(Box::pin(ask.into_actor(self).map(
            move |answer, act, _| {
                let _enter = span.enter();
                let (matches, ticket) = match answer {
                    Ok((mut m, lately, chain, ticket)) => {
                        act.overlay(&mut m, &lately, chain.as_ref(), facts.scoped());
                        act.session_of(&facts, &mut m);
                        (Some(m), ticket)
                    }
                    // The index is gone (shutdown).
                    Err(_) => return Err(SelectError::NoHealthy),
                };
                let dispatched = act.guarded(|s| {
                    s.dispatch(me, &facts, matches.as_ref(), &exclude, may_hold, attempt)
                })?;
                let d = match dispatched {
                    Dispatched::Go(d) => d,
                    Dispatched::Hold(ready) => {
                        return Ok(Selected::Hold(Hold {
                            ready,
                            max: act.holds.max,
                        }));
                    }
                };
                if let Some(s) = &facts.session {
                    act.sessions.sent(s, d.target);
                }
                if d.decision.record_prefix
                    && let Some(index) = &act.index
                {
                    // do_send keeps order with the next lookup, which this actor sends later.
                    index.do_send(RecordPrefix {
                        model,
                        facts,
                        worker: d.target,
                        ticket,
                    });
                }
                Ok(Selected::Go(d))
            },
        ))))
    }
}

impl SelectorActor {
    /// Says in `m` where the request's session went last.
    fn session_of(&self, facts: &RequestFacts, m: &mut PrefixMatches) {
        m.session_holder = (facts.session.as_deref()).and_then(|s| self.sessions.holder(s));
    }

    /// The decision for `facts` on these matches, the random generator left as it was.
    fn dry_run(
        &mut self,
        facts: &RequestFacts,
        matches: Option<&PrefixMatches>,
        from_events: Vec<WorkerId>,
    ) -> Result<Explained, SelectError> {
        let seq = self.seq.wrapping_add(1);
        let rng = self.rng.clone();
        let decided = self.guarded(|s| s.decide(facts, matches, &[], seq));
        self.rng = rng;
        decided.map(|c| Explained {
            decision: c.decision,
            from_events,
        })
    }
}

impl Handler<Explain> for SelectorActor {
    type Result = AtomicResponse<Self, Result<Explained, SelectError>>;

    fn handle(&mut self, mut msg: Explain, _: &mut Context<Self>) -> Self::Result {
        msg.facts = self.with_adapter(msg.facts);
        let Some(index) = self.index_for(&msg.facts) else {
            let r = self.dry_run(&msg.facts, None, Vec::new());
            return AtomicResponse::new(Box::pin(fut::ready(r)));
        };
        let ask = lookup(
            index,
            self.events.as_ref().filter(|_| self.events_live),
            MatchPrefix {
                model: self.model_key(&msg.facts),
                facts: msg.facts.clone(),
                count: false,
                recent: None,
            },
        );
        let msg_facts = msg.facts;
        AtomicResponse::new(Box::pin(ask.into_actor(self).map(move |answer, act, _| {
            let (mut matches, lately, chain, _) = answer.map_err(|_| SelectError::NoHealthy)?;
            let from_events =
                act.overlay(&mut matches, &lately, chain.as_ref(), msg_facts.scoped());
            act.session_of(&msg_facts, &mut matches);
            act.dry_run(&msg_facts, Some(&matches), from_events)
        })))
    }
}

impl Handler<Failed> for SelectorActor {
    type Result = ();

    fn handle(&mut self, msg: Failed, _: &mut Context<Self>) {
        let Failed { recorded, facts } = msg;
        if let Some(index) = &self.index {
            index.do_send(ForgetPrefix {
                model: recorded.model,
                facts,
                worker: recorded.target,
                keep: recorded.keep,
            });
        }
    }
}
