//! **EventsActor**: the KV chain index, fed by the engines' own KV events over ZMQ.
//!
//! For every worker whose `/server_info` advertises `kv_events`, one subscriber task per
//! data-parallel rank connects a SUB socket at the worker URL's host and
//! `endpoint_port_base + rank` (the advertised host is often a wildcard). Each task keeps
//! the rank's sequence: on connect, and on any gap, it asks the replay ROUTER for every
//! batch from the next sequence it needs (from 0 on first connect, so blocks stored before
//! the gateway started are known). When replay cannot cover a gap the rank's holdings are
//! cleared and rebuilt from what comes. A malformed frame is counted and skipped. A
//! publisher that goes away is reconnected with backoff. Batches reach the actor in order;
//! it applies them to a [`ChainIndex`] scoped per (worker, rank), so one engine's removals
//! and clears never touch another's holdings.
//!
//! When the descriptor names a pushed-load endpoint (`load_endpoint_port_base`), a second
//! task per rank subscribes to its `LoadStat` frames and forwards them to the selector
//! (`LoadPushed`): fresher running and waiting counts than the poll's.
//!
//! A descriptor is used only within bounds (`vet`): at most 1024 ranks, and endpoints at
//! the worker's own host or at one the worker allow-list admits, so a worker cannot point
//! the gateway's sockets anywhere.
//!
//! Each worker has an event state (`GET /workers` `events`): `off` (it publishes none),
//! `refused` (its descriptor is out of bounds), `connecting`, `live` (a batch or a replay
//! arrived on every rank), `stalled` (the publisher is unreachable: routing falls back to
//! the approximate index, visibly).

use std::collections::{BTreeMap, HashMap};

use actix::prelude::*;
use kvgate_kv_events::{EventBatch, KvEvent, KvEventsDescriptor, Medium, RankEndpoints};
use kvgate_kv_index::{ChainConfig, ChainIndex, ChainStore};
use kvgate_policies::WorkerId;
use serde::Serialize;
use tracing::{debug, info, warn};

use crate::actors::index::ClearWorker;
use crate::actors::registry::{AllowList, Fleet, FleetChanged, WorkerRecord};

/// One worker's event state, as `GET /workers` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventState {
    Off,
    Refused,
    Connecting,
    Live,
    Stalled,
}

/// What `GET /workers` and the metrics show of one worker's events.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerEvents {
    pub state: EventState,
    /// The engine's event block size.
    pub block_size: Option<u32>,
    /// Blocks the chain index holds for the worker, over its ranks.
    pub blocks: usize,
    /// Batches applied, malformed frames skipped, replays asked, gaps replay could not
    /// cover (the rank was cleared), publishers seen starting again from sequence 0 (the
    /// rank was cleared and replayed from 0), since the gateway started.
    pub batches: u64,
    pub malformed: u64,
    pub replays: u64,
    pub resets: u64,
    pub restarts: u64,
    /// Why it is stalled, off or refused, when it is.
    pub reason: Option<String>,
    /// What the last frame counted in `malformed` was refused for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_malformed: Option<String>,
}

#[derive(Debug)]
struct Worker {
    url: String,
    /// The engine's `/server_info` `startup_time` when subscribed: a new one means a new
    /// process, whose sequence numbers start again at 0 and whose cache is empty.
    startup_time: Option<f64>,
    desc: KvEventsDescriptor,
    /// Routed rank by rank (`WorkerRecord::routed_ranks`): its prefix-index tenants are
    /// its ranks.
    by_rank: bool,
    ranks: BTreeMap<u32, RankState>,
    /// Per rank, the next sequence to apply: every batch below it is in the index.
    next: BTreeMap<u32, u64>,
    tasks: Vec<SpawnHandle>,
    reason: Option<String>,
    batches: u64,
    malformed: u64,
    last_malformed: Option<String>,
    replays: u64,
    resets: u64,
    restarts: u64,
    /// When the engine last reported running requests, and when a batch last came: a
    /// publisher without replay that is silent while its engine works is stalled.
    busy_at: Option<std::time::Instant>,
    last_batch: std::time::Instant,
}

impl Worker {
    /// Events live on every rank: its holdings can be trusted for routing.
    fn live(&self) -> bool {
        self.ranks.values().all(|r| *r == RankState::Live)
    }
}

/// Where the actor reaches the selector.
#[derive(Debug, Clone)]
pub struct SelectorLink {
    pub loads: Recipient<LoadPushed>,
    pub live: Recipient<EventsLive>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RankState {
    Connecting,
    Live,
    Stalled,
}

/// The events actor's mailbox. Its messages, by response type:
/// - `MatchChain` (`send`, `MessageResult`): from the selector for token requests while
///   some worker's events are live, one at a time (its `Select` is atomic);
///   `GetEventStates` (`send`) for `/workers` and the metrics.
/// - `Feed` (`do_send` from each rank's subscriber task): decoded batches and connection
///   states, in order; `FleetChanged`, `FleetSettled` (`do_send` from the registry).
///   Deep enough for every rank's burst of batches after a replay.
const MAILBOX: usize = 4096;

/// The actor.
#[derive(Debug)]
pub struct EventsActor {
    index: ChainIndex<WorkerId>,
    /// The selector: where pushed load goes, and whether any worker's events are live.
    selector: Option<SelectorLink>,
    /// What the selector was last told: whether any worker is live.
    told_live: bool,
    workers: HashMap<WorkerId, Worker>,
    /// Workers whose `kv_events` could not be used (`Off`) or may not be (`Refused`), and
    /// why.
    off: HashMap<WorkerId, (EventState, String)>,
    /// Where event endpoints may be, beside the worker's own host.
    allow: AllowList,
    /// Workers whose endpoint host is being checked against `allow`.
    vetting: HashMap<WorkerId, SpawnHandle>,
    /// Snapshots to the store, and holdings restored from one that wait for their worker.
    persist: Persistence,
    /// The prefix index: what it recorded of a rank whose cache was cleared is stale too.
    routed: Option<Recipient<ClearWorker>>,
    /// No batch for this long on a rank makes its task ask whether the publisher is there.
    silence: std::time::Duration,
    /// The registry's last fleet: after a restart the subscriptions are made again from it.
    fleet: Option<Fleet>,
}

impl EventsActor {
    pub fn new(max_blocks: Option<usize>, selector: Option<SelectorLink>) -> EventsActor {
        EventsActor {
            index: ChainIndex::new(ChainConfig { max_blocks }),
            selector,
            told_live: false,
            workers: HashMap::new(),
            off: HashMap::new(),
            allow: AllowList::default(),
            vetting: HashMap::new(),
            persist: Persistence::default(),
            routed: None,
            silence: std::time::Duration::from_secs(30),
            fleet: None,
        }
    }

    /// How long a rank may send nothing before its publisher is asked (a replay request)
    /// or, without replay, judged against its engine's reported load.
    pub fn with_silence(mut self, silence: std::time::Duration) -> Self {
        self.silence = silence;
        self
    }

    /// Tells `index` to forget what it recorded for a rank whose engine cache was cleared
    /// (`AllBlocksCleared`, a new process, a gap replay could not cover): the events
    /// overrule what the gateway counts as held because it routed it lately.
    pub fn with_prefix_index(mut self, index: Recipient<ClearWorker>) -> Self {
        self.routed = Some(index);
        self
    }

    /// Event endpoints at a host other than their worker's must be inside `allow` (and,
    /// without one, not link-local or a metadata service).
    pub(crate) fn with_allow_list(mut self, allow: AllowList) -> Self {
        self.allow = allow;
        self
    }

    fn routed_here_is_stale(&self, worker: WorkerId, rank: u32) {
        let (Some(index), Some(w)) = (&self.routed, self.workers.get(&worker)) else {
            return;
        };
        // A worker routed by rank has a tenant per rank; any other is one tenant.
        let target = if w.by_rank { worker.rank(rank) } else { worker };
        index.do_send(ClearWorker(target));
    }

    fn apply(&mut self, worker: WorkerId, rank: u32, batch: &EventBatch) {
        for e in &batch.events {
            match e {
                KvEvent::BlockStored(s) => {
                    let hashes: Vec<u64> = s.block_hashes.iter().map(|h| h.as_u64()).collect();
                    let store = ChainStore {
                        block_hashes: &hashes,
                        parent: s.parent_block_hash.map(|h| h.as_u64()),
                        token_ids: &s.token_ids,
                        block_size: s.block_size as usize,
                        namespace: stored_namespace(s),
                        tier: s.medium.as_ref().map_or(0, tier),
                    };
                    self.index.apply_stored(worker, rank, &store);
                }
                KvEvent::BlockRemoved(r) => {
                    let hashes: Vec<u64> = r.block_hashes.iter().map(|h| h.as_u64()).collect();
                    self.index
                        .apply_removed(worker, rank, &hashes, r.medium.as_ref().map(tier));
                }
                KvEvent::AllBlocksCleared => {
                    self.index.clear(worker, rank);
                    self.routed_here_is_stale(worker, rank);
                }
            }
        }
    }

    /// Subscribes to every rank of a descriptor `vet` let through.
    fn start_worker(
        &mut self,
        ctx: &mut Context<Self>,
        w: &WorkerRecord,
        desc: KvEventsDescriptor,
        endpoints: Vec<RankEndpoints>,
    ) {
        let (id, url, startup_time) = (w.id, w.url.as_str(), w.startup_time);
        let by_rank = w.routed_ranks().is_some();
        // Restored holdings resume from their sequence when they are this engine
        // process's; otherwise they go.
        let resume = match self.persist.claim(id, startup_time) {
            Some(resume) => {
                info!(worker = %url, ranks = resume.len(), "KV events resume from the snapshot's sequences");
                resume
            }
            None => {
                self.index.forget_worker(id);
                BTreeMap::new()
            }
        };
        info!(worker = %url, ranks = endpoints.len(), "subscribing to KV events");
        let me = ctx.address();
        let mut ranks = BTreeMap::new();
        let mut next = BTreeMap::new();
        let mut tasks = Vec::new();
        for ep in endpoints {
            if let (Some(load), Some(sink)) = (&ep.load, self.selector.as_ref().map(|s| &s.loads)) {
                let topic = desc.load_topic.clone().unwrap_or_else(|| "load".into());
                let h = ctx.spawn(
                    fut::wrap_future::<_, Self>(pushed_load(
                        sink.clone(),
                        id,
                        ep.rank,
                        load.clone(),
                        topic,
                    ))
                    .map(|_, _, _| ()),
                );
                tasks.push(h);
            }
            ranks.insert(ep.rank, RankState::Connecting);
            let topic = desc.topic.clone();
            let me = me.clone();
            let from = resume.get(&ep.rank).copied().unwrap_or(0);
            next.insert(ep.rank, from);
            let feed = RankFeed {
                me,
                worker: id,
                rank: ep.rank,
                endpoint: ep.events,
                replay_at: ep.replay,
                topic,
                from,
                silence: self.silence,
            };
            let h = ctx.spawn(fut::wrap_future::<_, Self>(subscribe(feed)).map(|_, _, _| ()));
            tasks.push(h);
        }
        self.off.remove(&id);
        self.workers.insert(
            id,
            Worker {
                url: url.to_owned(),
                startup_time,
                desc,
                by_rank,
                ranks,
                next,
                tasks,
                reason: None,
                batches: 0,
                malformed: 0,
                last_malformed: None,
                replays: 0,
                resets: 0,
                restarts: 0,
                busy_at: None,
                last_batch: std::time::Instant::now(),
            },
        );
    }

    /// Tells the selector when the first worker's events become live or the last one's
    /// stop, so token requests ask this actor only while some worker can answer.
    fn tell_live(&mut self) {
        let live = self.workers.values().any(Worker::live);
        if live != self.told_live
            && let Some(s) = &self.selector
        {
            s.live.do_send(EventsLive(live));
            self.told_live = live;
        }
    }

    fn stop_worker(&mut self, ctx: &mut Context<Self>, id: WorkerId) {
        if let Some(w) = self.workers.remove(&id) {
            for t in w.tasks {
                ctx.cancel_future(t);
            }
            self.index.forget_worker(id);
            self.persist.dirty = true;
            debug!(worker = %w.url, "KV event subscription ended");
        }
    }
}

fn tier(m: &Medium) -> u8 {
    match m {
        Medium::Gpu => 0,
        Medium::CpuPinned => 1,
        Medium::Disk => 2,
        Medium::External => 3,
        _ => 4,
    }
}

impl Actor for EventsActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(MAILBOX);
        self.start_snapshots(ctx);
        if let Some(fleet) = self.fleet.clone() {
            self.follow(ctx, fleet);
        }
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.final_snapshot();
    }
}

/// After a panic the subscriber tasks and the snapshot in progress are gone with the old
/// context, and the chain index may be half way through a batch: every worker's holdings
/// go and `started` subscribes again from the last fleet, each rank replayed from 0 (one
/// without replay refills as it publishes); meanwhile the approximate index routes.
impl Supervised for EventsActor {
    fn restarting(&mut self, _: &mut Context<Self>) {
        for id in self.workers.keys() {
            self.index.forget_worker(*id);
        }
        self.workers.clear();
        self.vetting.clear();
        self.abandon_snapshot();
        self.tell_live();
    }
}

impl Handler<FleetChanged> for EventsActor {
    type Result = ();

    fn handle(&mut self, msg: FleetChanged, ctx: &mut Context<Self>) {
        self.fleet = Some(msg.0.clone());
        self.follow(ctx, msg.0);
    }
}

impl EventsActor {
    /// Subscribes to the fleet's publishers and ends the subscriptions of workers gone.
    fn follow(&mut self, ctx: &mut Context<Self>, fleet: Fleet) {
        let present: HashMap<WorkerId, &WorkerRecord> = fleet.iter().map(|w| (w.id, w)).collect();
        // Gone, not routable, or restarted (a new process numbers its batches from 0 again
        // and holds nothing): the subscription ends and what it held goes with it.
        let gone: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(id, sub)| {
                present.get(id).is_none_or(|w| {
                    w.kv_events.is_none() || !w.healthy() || w.startup_time != sub.startup_time
                })
            })
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.stop_worker(ctx, id);
        }
        let unwanted: Vec<WorkerId> = (self.vetting.keys())
            .filter(|id| {
                present
                    .get(id)
                    .is_none_or(|w| w.kv_events.is_none() || !w.healthy())
            })
            .copied()
            .collect();
        for id in unwanted {
            if let Some(h) = self.vetting.remove(&id) {
                ctx.cancel_future(h);
            }
        }
        self.off.retain(|id, _| present.contains_key(id));
        self.persist.fleet_is(present.keys().copied());
        for w in fleet.iter() {
            match &w.kv_events {
                Some(raw)
                    if w.healthy()
                        && !self.workers.contains_key(&w.id)
                        && !self.vetting.contains_key(&w.id) =>
                {
                    self.admit(ctx, w, raw);
                }
                // Back without events: what it published before is of no use.
                None if w.healthy() && self.persist.discard(w.id) => {
                    self.index.forget_worker(w.id);
                }
                _ => {}
            }
        }
        self.tell_live();
    }
}

/// What a subscriber task tells the actor.
#[derive(Message, Debug)]
#[rtype(result = "()")]
enum Feed {
    Batch {
        worker: WorkerId,
        rank: u32,
        seq: u64,
        batch: EventBatch,
    },
    /// Replay could not cover a gap: forget the rank's holdings and rebuild.
    Reset {
        worker: WorkerId,
        rank: u32,
    },
    /// The rank's publisher started again from sequence 0 (a new engine process): what
    /// the old one announced is gone from the engine's cache.
    Restarted {
        worker: WorkerId,
        rank: u32,
    },
    State {
        worker: WorkerId,
        rank: u32,
        live: bool,
        reason: Option<String>,
    },
    Malformed {
        worker: WorkerId,
        reason: String,
    },
    Replayed {
        worker: WorkerId,
    },
    /// No batch for `secs` on a rank without replay.
    Silent {
        worker: WorkerId,
        rank: u32,
        secs: f64,
    },
}

impl Handler<Feed> for EventsActor {
    type Result = ();

    fn handle(&mut self, msg: Feed, _: &mut Context<Self>) {
        self.feed(msg);
        self.tell_live();
    }
}

impl EventsActor {
    fn feed(&mut self, msg: Feed) {
        match msg {
            Feed::Batch {
                worker,
                rank,
                seq,
                batch,
            } => {
                let Some(w) = self.workers.get_mut(&worker) else {
                    return;
                };
                w.batches += 1;
                w.last_batch = std::time::Instant::now();
                w.next.insert(rank, seq.saturating_add(1));
                self.persist.dirty = true;
                w.ranks.insert(rank, RankState::Live);
                w.reason = None;
                // A descriptor from config may not say: the engine's own stores do.
                if w.desc.block_size.is_none() {
                    w.desc.block_size = batch.events.iter().find_map(|e| match e {
                        KvEvent::BlockStored(s) if s.block_size > 0 => Some(s.block_size),
                        _ => None,
                    });
                }
                self.apply(worker, rank, &batch);
            }
            Feed::Reset { worker, rank } => {
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.resets += 1;
                    warn!(worker = %w.url, rank, "KV events: a gap replay could not cover; the rank is rebuilt from what comes");
                    self.index.clear(worker, rank);
                    self.persist.dirty = true;
                    self.routed_here_is_stale(worker, rank);
                }
            }
            Feed::Restarted { worker, rank } => {
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.restarts += 1;
                    info!(worker = %w.url, rank, "KV events: the publisher started again from sequence 0; the rank is rebuilt from it");
                    self.index.clear(worker, rank);
                    w.next.insert(rank, 0);
                    self.persist.dirty = true;
                    self.routed_here_is_stale(worker, rank);
                }
            }
            Feed::State {
                worker,
                rank,
                live,
                reason,
            } => {
                if let Some(w) = self.workers.get_mut(&worker) {
                    let s = if live {
                        RankState::Live
                    } else {
                        RankState::Stalled
                    };
                    w.ranks.insert(rank, s);
                    if reason.is_some() {
                        w.reason = reason;
                    }
                }
            }
            Feed::Malformed { worker, reason } => {
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.malformed += 1;
                    w.last_malformed = Some(reason);
                }
            }
            Feed::Replayed { worker } => {
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.replays += 1;
                }
            }
            Feed::Silent { worker, rank, secs } => self.silent(worker, rank, secs),
        }
    }
}

mod answers;
pub(crate) use answers::{ChainAnswer, EventsLive, GetEventStates, LoadPushed, MatchChain};
pub(crate) use silence::EngineBusy;
mod persist;
mod scope;
mod silence;
mod subscribe;
#[cfg(test)]
mod tests;
mod vet;

use persist::Persistence;
pub(crate) use persist::SnapshotSettings;
pub(crate) use scope::namespace;
use scope::stored_namespace;
use subscribe::{RankFeed, pushed_load, subscribe};
