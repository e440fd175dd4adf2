//! What the index actor is asked and told: prefix lookups, records and their undoing,
//! worker clears, fleet changes, and the readiness ping.

use crate::actors::registry::{Fleet, FleetChanged};
use actix::prelude::*;
use kvgate_policies::{PrefixMatches, RequestFacts, WorkerId};
use std::sync::Arc;
use std::time::Duration;
use tracing::info;

use super::*;

/// Who holds how much of the request's prompt. The facts are shared with the request
/// (parsed once), never copied.
#[derive(Message, Debug)]
#[rtype(result = "(PrefixMatches, Vec<(WorkerId, usize)>, Option<u64>)")]
pub struct MatchPrefix {
    pub model: Arc<str>,
    pub facts: Arc<RequestFacts>,
    /// Count the lookup as traffic (a dispatch), and answer a ticket (the fourth part of
    /// the answer) for the [`RecordPrefix`] of the same key; false for a dry run.
    pub count: bool,
    /// Also answer, per tenant, what of a token prompt it was routed within this long
    /// (the third part of the answer; empty when `None`).
    pub recent: Option<Duration>,
}

impl Handler<MatchPrefix> for IndexActor {
    type Result = MessageResult<MatchPrefix>;

    fn handle(&mut self, msg: MatchPrefix, _: &mut Context<Self>) -> Self::Result {
        let (m, recent, ticket) = self
            .guarded(|s| s.lookup(&msg.model, &msg.facts.index_key(), msg.count, msg.recent))
            .unwrap_or_default();
        MessageResult((m, recent, ticket))
    }
}

/// Records that `worker` now holds the prompt (it was routed there).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct RecordPrefix {
    pub model: Arc<str>,
    pub facts: Arc<RequestFacts>,
    pub worker: WorkerId,
    /// The ticket of the counted lookup of this very key, when there was one.
    pub ticket: Option<u64>,
}

impl Handler<RecordPrefix> for IndexActor {
    type Result = ();

    fn handle(&mut self, msg: RecordPrefix, _: &mut Context<Self>) {
        let _ =
            self.guarded(|s| s.record(&msg.model, &msg.facts.index_key(), msg.worker, msg.ticket));
    }
}

/// Takes back a record of the request's key for `worker`, to the `keep` units it held
/// before: the request it was recorded for failed there, so the worker's cache did not
/// get it.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct ForgetPrefix {
    pub model: Arc<str>,
    pub facts: Arc<RequestFacts>,
    pub worker: WorkerId,
    pub keep: usize,
}

impl Handler<ForgetPrefix> for IndexActor {
    type Result = ();

    fn handle(&mut self, msg: ForgetPrefix, _: &mut Context<Self>) {
        let _ = self.guarded(|s| s.forget(msg));
    }
}

/// Answers at once: the index actor is alive and its mailbox moves (readiness).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Ping;

impl Handler<Ping> for IndexActor {
    type Result = ();

    fn handle(&mut self, _: Ping, _: &mut Context<Self>) {}
}

/// Forget everything a worker holds (its cache was flushed).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct ClearWorker(pub WorkerId);

impl Handler<ClearWorker> for IndexActor {
    type Result = ();

    fn handle(&mut self, msg: ClearWorker, _: &mut Context<Self>) {
        self.purge(msg.0);
    }
}

impl Handler<FleetChanged> for IndexActor {
    type Result = ();

    /// A removed worker is purged; a worker whose engine restarted (new `startup_time`)
    /// starts empty, like its cache. Restored workers not yet seen wait for `FleetSettled`.
    fn handle(&mut self, msg: FleetChanged, _: &mut Context<Self>) {
        self.fleet = Some(msg.0.clone());
        self.confirm(&msg.0);
    }
}

impl IndexActor {
    /// Confirms the workers of `fleet`: a removed one is purged, one whose engine
    /// restarted (new `startup_time`) starts empty, like its cache.
    pub(super) fn confirm(&mut self, fleet: &Fleet) {
        // The index's tenants are routing targets: a worker, or each of its ranks.
        let present: std::collections::HashSet<WorkerId> = (fleet.iter())
            .flat_map(|r| r.targets().into_iter().map(|(t, _)| t))
            .collect();
        let mut drop = Vec::new();
        for (w, k) in &self.known {
            if k.confirmed && !present.contains(w) {
                drop.push(*w);
            }
        }
        for rec in fleet.iter() {
            for (target, _) in rec.targets() {
                let k = self.known.entry(target).or_insert_with(|| Known {
                    url: rec.url.to_string(),
                    startup_time: rec.startup_time,
                    confirmed: true,
                });
                k.confirmed = true;
                let Some(now) = rec.startup_time else {
                    continue;
                };
                if k.startup_time.is_some_and(|before| before != now) {
                    info!(worker = %rec.url, "engine restarted (new startup_time): its index entries are dropped");
                    drop.push(target);
                }
                k.startup_time = Some(now);
            }
        }
        for w in drop {
            self.purge(w);
            if !present.contains(&w) {
                self.known.remove(&w);
            }
        }
    }
}

/// Startup registration is over: restored entries of workers that did not come back go.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct FleetSettled;

impl Handler<FleetSettled> for IndexActor {
    type Result = ();

    fn handle(&mut self, _: FleetSettled, _: &mut Context<Self>) {
        let gone: Vec<WorkerId> = self
            .known
            .iter()
            .filter(|(_, k)| !k.confirmed)
            .map(|(w, _)| *w)
            .collect();
        for w in gone {
            if let Some(k) = self.known.remove(&w) {
                info!(worker = %k.url, "worker did not come back: its restored index entries are dropped");
            }
            self.purge(w);
        }
    }
}

/// Test builds only: makes the next lookup panic, to show the index recovers.
#[cfg(feature = "fault-injection")]
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct InjectPanic;

#[cfg(feature = "fault-injection")]
impl Handler<InjectPanic> for IndexActor {
    type Result = ();

    fn handle(&mut self, _: InjectPanic, _: &mut Context<Self>) {
        self.panic_next = true;
    }
}

/// A rebuild from the last snapshot, done on the writer's thread (`None`: no snapshot
/// could be read). Records made since the restart are replaced by it.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub(super) struct Rebuilt(pub(super) Option<super::snapshot::Rebuilt>);

impl Handler<Rebuilt> for IndexActor {
    type Result = ();

    fn handle(&mut self, Rebuilt(r): Rebuilt, _: &mut Context<Self>) {
        self.rebuilding = false;
        if let Some(r) = r {
            self.install(r);
        }
        self.settle_fleet();
    }
}

/// Test builds only: the next rebuild waits, on the writer's thread, until a message comes
/// through this channel (or its sender is dropped), to show requests go on meanwhile.
#[cfg(feature = "fault-injection")]
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct HoldRebuild(pub std::sync::mpsc::Receiver<()>);

#[cfg(feature = "fault-injection")]
impl Handler<HoldRebuild> for IndexActor {
    type Result = ();

    fn handle(&mut self, msg: HoldRebuild, _: &mut Context<Self>) {
        self.hold_rebuild = Some(msg.0);
    }
}

/// Test builds only: the handler itself panics, outside the guarded lookup, to show the
/// supervisor restarts the actor.
#[cfg(feature = "fault-injection")]
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Crash;

#[cfg(feature = "fault-injection")]
impl Handler<Crash> for IndexActor {
    type Result = ();

    fn handle(&mut self, _: Crash, _: &mut Context<Self>) {
        panic!("injected panic in an index handler");
    }
}
