//! What the selector learns between decisions: requests that ended (their circuit
//! outcome, their credit), fleet changes from the registry, load reports from the poller;
//! and what it tells about its view.

use actix::prelude::*;
use kvgate_policies::{CreditLedger, WorkerId, WorkerLoad, WorkerView};
use kvgate_poller::LoadsPolled;
use tracing::warn;

use std::time::Duration;

use super::{GetViews, GetWorkerStates, Outcome, Release, SelectorActor, Warmed, WorkerState};
use crate::actors::events::{EngineBusy, EventsLive, LoadPushed};
use crate::actors::registry::{FleetChanged, WorkerFailed};

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
        if !msg.warmed {
            prefilled(v, msg.credit_tokens);
        }
        let meta = &mut self.meta[i];
        if msg.outcome == Outcome::Success {
            meta.progress = now;
        }
        // An open circuit stops new traffic; what already runs there goes on.
        if meta
            .circuit
            .ended(&self.circuit, now, msg.outcome, msg.probe)
        {
            warn!(worker = %meta.url, "circuit open: repeated failures; no traffic until it is probed");
            // Real failures: the requests still waiting there are tried elsewhere.
            meta.down.send_replace(true);
        }
        if let (Some(reason), Some(registry)) = (msg.refused, &self.registry) {
            registry.do_send(WorkerFailed {
                worker: meta.worker,
                incarnation: msg.incarnation,
                reason,
            });
        }
        self.refresh_eligibility(now);
    }
}

impl SelectorActor {
    /// A worker out on its health checks keeps its waiting requests while it shows
    /// progress; one that has shown none for `stall_grace` since it went out is frozen, and
    /// they are tried elsewhere.
    pub(super) fn release_frozen(&mut self) {
        let now = self.now();
        for (v, m) in self.views.iter().zip(&mut self.meta) {
            let Some(out) = m.out_since else { continue };
            if v.in_flight == 0 || *m.down.borrow() {
                continue;
            }
            if now.saturating_sub(out.max(m.progress)) >= self.stall_grace {
                warn!(worker = %m.url, "out on its health checks and no progress: its waiting requests go elsewhere");
                m.down.send_replace(true);
            }
        }
    }
}

impl Handler<Warmed> for SelectorActor {
    type Result = ();

    fn handle(&mut self, Warmed(msg): Warmed, _: &mut Context<Self>) {
        self.holds.warmed(msg.booking);
        if let Some(i) = self.views.iter().position(|v| v.id == msg.worker)
            && self.meta[i].incarnation == msg.incarnation
        {
            self.meta[i].progress = self.now();
            // The Release at the end finds this dispatch gone and releases no credit.
            self.ledger
                .release(msg.worker, msg.booked_at, msg.credit_tokens);
            self.views[i].credit = self.ledger.credit(msg.worker);
            prefilled(&mut self.views[i], msg.credit_tokens);
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
        // An engine at work, or whose cache changed, should be publishing: the events
        // actor judges a silent publisher by it.
        if let (Some(events), Some(l)) = (&self.events, &load) {
            let used = |ranks: &[kvgate_policies::RankLoad]| -> u64 {
                ranks.iter().map(|r| r.num_used_tokens).sum()
            };
            let before: Option<u64> = (self.views.iter().zip(&self.meta))
                .filter(|(_, m)| m.worker == id)
                .map(|(v, _)| v.load.as_ref().map(|l| used(&l.ranks)))
                .sum();
            let changed = before.is_some_and(|b| b != used(&l.ranks));
            if changed || l.ranks.iter().any(|r| r.num_running_reqs > 0) {
                events.do_send(EngineBusy(id));
            }
        }
        for (v, m) in self.views.iter_mut().zip(&self.meta) {
            if m.worker != id {
                continue;
            }
            // A rank target sees its own rank's figures; a rank the report lacks is
            // unknown.
            let load = match (m.rank, &load) {
                (Some(r), Some(l)) => Some(WorkerLoad {
                    ranks: l.ranks.iter().filter(|x| x.dp_rank == r).cloned().collect(),
                    sampled_at: l.sampled_at,
                    adapters: l.adapters.clone(),
                })
                .filter(|l| !l.ranks.is_empty()),
                (_, l) => l.clone(),
            };
            // An unknown report is scored as unknown, never as the last good one; the
            // credit stays until a report that covers it arrives.
            if let Some(l) = &load {
                self.ledger.on_report(v.id, Some(l.sampled_at));
                if let Some(own) = &mut v.own {
                    own.requests_at_sample = at_sample(v.in_flight, &self.ledger, v.id);
                }
            }
            v.load = load;
            v.credit = self.ledger.credit(v.id);
        }
    }
}

impl Handler<EventsLive> for SelectorActor {
    type Result = ();

    fn handle(&mut self, msg: EventsLive, _: &mut Context<Self>) {
        self.events_live = msg.0;
    }
}

impl Handler<LoadPushed> for SelectorActor {
    type Result = ();

    fn handle(&mut self, msg: LoadPushed, _: &mut Context<Self>) {
        let LoadPushed {
            worker: id,
            rank,
            stat,
        } = msg;
        let now = self.now();
        let at = (self.views.iter_mut().zip(&self.meta))
            .find(|(_, m)| m.worker == id && m.rank.is_none_or(|r| r == rank));
        let Some((v, _)) = at else {
            return;
        };
        // A poll gives the ranks and their gen_throughput first; pushes refresh the rest.
        let Some(load) = v.load.as_mut() else {
            return;
        };
        let Some(r) = load.ranks.iter_mut().find(|r| r.dp_rank == rank) else {
            return;
        };
        r.num_running_reqs = stat.num_running_reqs;
        r.num_waiting_reqs = stat.num_waiting_reqs;
        r.num_waiting_uncached_tokens = stat.num_waiting_uncached_tokens.unwrap_or(0);
        r.num_used_tokens = stat.num_tokens;
        if stat.max_total_num_tokens > 0 {
            r.max_total_num_tokens = stat.max_total_num_tokens;
            r.token_usage = stat.num_tokens as f64 / stat.max_total_num_tokens as f64;
        }
        if let Some(m) = stat.max_running_requests {
            r.max_running_requests = m;
        }
        self.pushed.insert((id, rank), now);
        // The report is as fresh as its least recently pushed rank: only then does the
        // credit of what was dispatched before it go.
        let oldest = load
            .ranks
            .iter()
            .map(|r| self.pushed.get(&(id, r.dp_rank)).copied())
            .collect::<Option<Vec<Duration>>>()
            .and_then(|t| t.into_iter().min());
        if let Some(at) = oldest
            && at > load.sampled_at
        {
            load.sampled_at = at;
            self.ledger.on_report(v.id, Some(at));
            v.credit = self.ledger.credit(v.id);
            if let Some(own) = &mut v.own {
                own.requests_at_sample = at_sample(v.in_flight, &self.ledger, v.id);
            }
        }
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
                worker: m.worker,
                rank: m.rank,
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

/// Test builds only: the handler itself panics, outside the guarded decision, to show the
/// supervisor restarts the actor.
#[cfg(feature = "fault-injection")]
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Crash;

#[cfg(feature = "fault-injection")]
impl Handler<Crash> for SelectorActor {
    type Result = ();

    fn handle(&mut self, _: Crash, _: &mut Context<Self>) {
        panic!("injected panic in a selector handler");
    }
}

/// A dispatch to `v` reached its first token, or ended before one: its booked tokens
/// leave `Own::unprefilled_tokens`.
fn prefilled(v: &mut WorkerView, tokens: u64) {
    if let Some(own) = &mut v.own {
        own.unprefilled_tokens = own.unprefilled_tokens.saturating_sub(tokens);
    }
}

/// This gateway's requests on `worker` that a report sampled before the ones the ledger
/// still credits can have counted: those in flight, less those sent after the sample.
fn at_sample(in_flight: u64, ledger: &CreditLedger, worker: WorkerId) -> u64 {
    in_flight.saturating_sub(ledger.credit(worker).requests)
}
