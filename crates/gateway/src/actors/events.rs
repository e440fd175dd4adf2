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
//! Each worker has an event state (`GET /workers` `events`): `off` (it publishes none),
//! `connecting`, `live` (a batch or a replay arrived on every rank), `stalled` (the
//! publisher is unreachable: routing falls back to the approximate index, visibly).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use actix::prelude::*;
use kvgate_kv_events::{
    EventBatch, KvEvent, KvEventsDescriptor, Medium, ReplayFrame, decode_load_message,
    decode_message, decode_replay_frame, encode_replay_request, rank_endpoints,
};
use kvgate_kv_index::{ChainConfig, ChainIndex, ChainStats, ChainStore};
use kvgate_policies::WorkerId;
use serde::Serialize;
use tracing::{debug, info, warn};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::actors::registry::FleetChanged;
use crate::actors::selector::{EventsLive, LoadPushed};

/// Longest wait for a replay's end marker.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait to connect a socket.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_FIRST: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// One worker's event state, as `GET /workers` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventState {
    Off,
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
    /// Why it is stalled or off, when it is.
    pub reason: Option<String>,
}

#[derive(Debug)]
struct Worker {
    url: String,
    /// The engine's `/server_info` `startup_time` when subscribed: a new one means a new
    /// process, whose sequence numbers start again at 0 and whose cache is empty.
    startup_time: Option<f64>,
    desc: KvEventsDescriptor,
    ranks: BTreeMap<u32, RankState>,
    tasks: Vec<SpawnHandle>,
    reason: Option<String>,
    batches: u64,
    malformed: u64,
    replays: u64,
    resets: u64,
    restarts: u64,
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

/// The actor.
#[derive(Debug)]
pub struct EventsActor {
    index: ChainIndex<WorkerId>,
    /// The selector: where pushed load goes, and whether any worker's events are live.
    selector: Option<SelectorLink>,
    /// What the selector was last told: whether any worker is live.
    told_live: bool,
    workers: HashMap<WorkerId, Worker>,
    /// Workers whose `kv_events` could not be used, and why.
    off: HashMap<WorkerId, String>,
}

impl EventsActor {
    pub fn new(max_blocks: Option<usize>, selector: Option<SelectorLink>) -> EventsActor {
        EventsActor {
            index: ChainIndex::new(ChainConfig { max_blocks }),
            selector,
            told_live: false,
            workers: HashMap::new(),
            off: HashMap::new(),
        }
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
                        namespace: namespace(s.lora_id, s.cache_salt.as_deref()),
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
                }
            }
        }
    }

    fn start_worker(
        &mut self,
        ctx: &mut Context<Self>,
        id: WorkerId,
        url: &str,
        startup_time: Option<f64>,
        raw: &serde_json::Value,
    ) {
        let desc = match serde_json::from_value::<KvEventsDescriptor>(raw.clone()) {
            Ok(d) => d,
            Err(e) => {
                self.off.insert(id, format!("kv_events unreadable: {e}"));
                return;
            }
        };
        let endpoints = match rank_endpoints(url, &desc) {
            Ok(e) => e,
            Err(e) => {
                self.off.insert(id, e.to_string());
                return;
            }
        };
        info!(worker = %url, ranks = endpoints.len(), "subscribing to KV events");
        let me = ctx.address();
        let mut ranks = BTreeMap::new();
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
            let h = ctx.spawn(
                fut::wrap_future::<_, Self>(subscribe(
                    me, id, ep.rank, ep.events, ep.replay, topic,
                ))
                .map(|_, _, _| ()),
            );
            tasks.push(h);
        }
        self.off.remove(&id);
        self.workers.insert(
            id,
            Worker {
                url: url.to_owned(),
                startup_time,
                desc,
                ranks,
                tasks,
                reason: None,
                batches: 0,
                malformed: 0,
                replays: 0,
                resets: 0,
                restarts: 0,
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
            debug!(worker = %w.url, "KV event subscription ended");
        }
    }
}

/// The chain namespace of an adapter and salt: requests must use the same.
fn namespace(lora: Option<i64>, salt: Option<&str>) -> u64 {
    match (lora, salt) {
        (None, None) => 0,
        (l, s) => {
            let mut b = l.unwrap_or(0).to_le_bytes().to_vec();
            b.extend_from_slice(s.unwrap_or("").as_bytes());
            xxhash_rust::xxh3::xxh3_64(&b) | 1
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
        ctx.set_mailbox_capacity(4096);
    }
}

impl Handler<FleetChanged> for EventsActor {
    type Result = ();

    fn handle(&mut self, msg: FleetChanged, ctx: &mut Context<Self>) {
        let fleet = msg.0;
        let present: HashMap<WorkerId, &crate::actors::registry::WorkerRecord> =
            fleet.iter().map(|w| (w.id, w)).collect();
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
        self.off.retain(|id, _| present.contains_key(id));
        for w in fleet.iter() {
            match &w.kv_events {
                Some(raw) if w.healthy() && !self.workers.contains_key(&w.id) => {
                    self.start_worker(ctx, w.id, w.url.as_str(), w.startup_time, raw);
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
    },
    Replayed {
        worker: WorkerId,
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
                batch,
            } => {
                let Some(w) = self.workers.get_mut(&worker) else {
                    return;
                };
                w.batches += 1;
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
                }
            }
            Feed::Restarted { worker, rank } => {
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.restarts += 1;
                    info!(worker = %w.url, rank, "KV events: the publisher started again from sequence 0; the rank is rebuilt from it");
                    self.index.clear(worker, rank);
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
            Feed::Malformed { worker } => {
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.malformed += 1;
                }
            }
            Feed::Replayed { worker } => {
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.replays += 1;
                }
            }
        }
    }
}

/// Each worker's event state and counts.
#[derive(Message, Debug)]
#[rtype(result = "HashMap<WorkerId, WorkerEvents>")]
pub struct GetEventStates;

impl Handler<GetEventStates> for EventsActor {
    type Result = MessageResult<GetEventStates>;

    fn handle(&mut self, _: GetEventStates, _: &mut Context<Self>) -> Self::Result {
        let blocks: HashMap<WorkerId, usize> = self.index.blocks_per_worker().into_iter().collect();
        let mut out: HashMap<WorkerId, WorkerEvents> = self
            .workers
            .iter()
            .map(|(id, w)| {
                let state = if w.live() {
                    EventState::Live
                } else if w.ranks.values().any(|r| *r == RankState::Stalled) {
                    EventState::Stalled
                } else {
                    EventState::Connecting
                };
                (
                    *id,
                    WorkerEvents {
                        state,
                        block_size: w.desc.block_size,
                        blocks: blocks.get(id).copied().unwrap_or(0),
                        batches: w.batches,
                        malformed: w.malformed,
                        replays: w.replays,
                        resets: w.resets,
                        restarts: w.restarts,
                        reason: w.reason.clone(),
                    },
                )
            })
            .collect();
        for (id, why) in &self.off {
            out.insert(
                *id,
                WorkerEvents {
                    state: EventState::Off,
                    block_size: None,
                    blocks: 0,
                    batches: 0,
                    malformed: 0,
                    replays: 0,
                    resets: 0,
                    restarts: 0,
                    reason: Some(why.clone()),
                },
            );
        }
        MessageResult(out)
    }
}

/// Per worker, the leading blocks of `tokens` its best rank holds, at `block_size`; only
/// workers whose events are live on every rank.
#[derive(Message, Debug)]
#[rtype(result = "ChainAnswer")]
pub struct MatchChain {
    pub tokens: Vec<u32>,
}

/// The answer to [`MatchChain`].
#[derive(Debug, Default)]
pub struct ChainAnswer {
    /// Whole blocks of the request, per live worker's block size.
    pub per_worker: Vec<(WorkerId, usize, u32)>,
    pub stats: ChainStats,
}

impl Handler<MatchChain> for EventsActor {
    type Result = MessageResult<MatchChain>;

    fn handle(&mut self, msg: MatchChain, _: &mut Context<Self>) -> Self::Result {
        let mut per_worker = Vec::new();
        // One walk per block size in the fleet, not one per worker.
        let mut walks = Vec::new();
        for (id, w) in &self.workers {
            let Some(bs) = w.desc.block_size.filter(|b| *b > 0) else {
                continue;
            };
            if !w.live() {
                continue;
            }
            let at = match walks.iter().position(|(b, _)| *b == bs) {
                Some(i) => i,
                None => {
                    walks.push((bs, self.index.match_tokens(&msg.tokens, bs as usize, 0)));
                    walks.len() - 1
                }
            };
            let m = &walks[at].1;
            let best = w
                .ranks
                .keys()
                .map(|r| m.matched_by(*id, *r))
                .max()
                .unwrap_or(0);
            per_worker.push((*id, best, bs));
        }
        per_worker.sort();
        MessageResult(ChainAnswer {
            per_worker,
            stats: self.index.stats(),
        })
    }
}

/// One rank's pushed load, forwarded to the selector as it comes; reconnected with backoff.
async fn pushed_load(
    sink: Recipient<LoadPushed>,
    worker: WorkerId,
    rank: u32,
    endpoint: String,
    topic: String,
) {
    let mut backoff = BACKOFF_FIRST;
    loop {
        let mut sub = zeromq::SubSocket::new();
        let ok = match actix_rt::time::timeout(CONNECT_TIMEOUT, sub.connect(&endpoint)).await {
            Ok(Ok(())) => sub.subscribe(&topic).await.is_ok(),
            _ => false,
        };
        if ok {
            backoff = BACKOFF_FIRST;
            while let Ok(m) = sub.recv().await {
                let frames: Vec<&[u8]> = m.iter().map(|f| f.as_ref()).collect();
                // A frame that is not a LoadStat is skipped: the next one will do.
                if let Ok(msg) = decode_load_message(&frames) {
                    sink.do_send(LoadPushed {
                        worker,
                        rank,
                        stat: msg.stat,
                    });
                }
            }
        }
        actix_rt::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

fn message_of(frames: Vec<Vec<u8>>) -> Option<ZmqMessage> {
    let mut it = frames.into_iter();
    let mut m = ZmqMessage::from(it.next()?);
    for f in it {
        m.push_back(f.into());
    }
    Some(m)
}

/// Asks the replay ROUTER at `endpoint` for every batch from `from`, in order; `None` when
/// it cannot be reached or does not answer whole.
async fn replay(endpoint: &str, from: u64) -> Option<Vec<(u64, EventBatch)>> {
    let mut dealer = zeromq::DealerSocket::new();
    actix_rt::time::timeout(CONNECT_TIMEOUT, dealer.connect(endpoint))
        .await
        .ok()?
        .ok()?;
    dealer
        .send(message_of(encode_replay_request(from).to_vec())?)
        .await
        .ok()?;
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + REPLAY_TIMEOUT;
    loop {
        let m = tokio::time::timeout_at(deadline, dealer.recv())
            .await
            .ok()?
            .ok()?;
        let frames: Vec<&[u8]> = m.iter().map(|f| f.as_ref()).collect();
        match decode_replay_frame(&frames) {
            Ok(ReplayFrame::End) => return Some(out),
            Ok(ReplayFrame::Batch(b)) => out.push((b.seq, b.batch)),
            // A frame it cannot read makes the replay unusable as a whole.
            Err(_) => return None,
        }
    }
}

/// One rank's subscription, for as long as the actor keeps it.
async fn subscribe(
    me: Addr<EventsActor>,
    worker: WorkerId,
    rank: u32,
    endpoint: String,
    replay_at: Option<String>,
    topic: String,
) {
    let mut backoff = BACKOFF_FIRST;
    let mut next: u64 = 0;
    loop {
        let mut sub = zeromq::SubSocket::new();
        let connected = actix_rt::time::timeout(CONNECT_TIMEOUT, sub.connect(&endpoint)).await;
        let subscribed = match connected {
            Ok(Ok(())) => sub.subscribe(&topic).await.is_ok(),
            _ => false,
        };
        if !subscribed {
            me.do_send(Feed::State {
                worker,
                rank,
                live: false,
                reason: Some(format!("cannot connect to {endpoint}")),
            });
            actix_rt::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
            continue;
        }
        backoff = BACKOFF_FIRST;
        // Every batch this socket receives was published after it subscribed, so after
        // the batch `floor - 1` that was already applied: a lower sequence on it is a new
        // publisher numbering from 0 again (the engine restarted), not a replayed one.
        let mut floor = next;
        let mut last_live: Option<u64> = None;
        // What was published before this subscription took effect comes by replay.
        catch_up(&me, worker, rank, replay_at.as_deref(), &mut next, None).await;
        loop {
            let Ok(m) = sub.recv().await else {
                me.do_send(Feed::State {
                    worker,
                    rank,
                    live: false,
                    reason: Some(format!("the publisher at {endpoint} went away")),
                });
                break;
            };
            let frames: Vec<&[u8]> = m.iter().map(|f| f.as_ref()).collect();
            let Ok(msg) = decode_message(&frames) else {
                me.do_send(Feed::Malformed { worker });
                continue;
            };
            // One publisher sends in order on one connection: a step back is a new one.
            let restarted = msg.seq < floor || last_live.is_some_and(|l| msg.seq <= l);
            last_live = Some(msg.seq);
            if restarted {
                me.do_send(Feed::Restarted { worker, rank });
                (next, floor) = (0, 0);
            }
            if msg.seq < next {
                continue; // already applied through replay
            }
            if msg.seq > next {
                catch_up(
                    &me,
                    worker,
                    rank,
                    replay_at.as_deref(),
                    &mut next,
                    Some(msg.seq),
                )
                .await;
                if msg.seq < next {
                    continue;
                }
            }
            next = msg.seq + 1;
            me.do_send(Feed::Batch {
                worker,
                rank,
                batch: msg.batch,
            });
        }
        actix_rt::time::sleep(backoff).await;
    }
}

/// Replays from `*next`; with `gap_to`, a live batch of that sequence has arrived past a
/// gap. A gap replay cannot cover resets the rank and moves on.
async fn catch_up(
    me: &Addr<EventsActor>,
    worker: WorkerId,
    rank: u32,
    replay_at: Option<&str>,
    next: &mut u64,
    gap_to: Option<u64>,
) {
    let replayed = match replay_at {
        Some(ep) => replay(ep, *next).await,
        None => None,
    };
    match replayed {
        Some(batches) => {
            me.do_send(Feed::Replayed { worker });
            for (seq, batch) in batches {
                if seq < *next {
                    continue;
                }
                if seq > *next {
                    // What was missed is gone from the replay buffer too: rebuild from here.
                    me.do_send(Feed::Reset { worker, rank });
                }
                *next = seq + 1;
                me.do_send(Feed::Batch {
                    worker,
                    rank,
                    batch,
                });
            }
            if let Some(g) = gap_to
                && *next < g
            {
                me.do_send(Feed::Reset { worker, rank });
                *next = g;
            }
            me.do_send(Feed::State {
                worker,
                rank,
                live: true,
                reason: None,
            });
        }
        None => {
            if let Some(g) = gap_to {
                me.do_send(Feed::Reset { worker, rank });
                *next = g;
            }
            // Without replay, live batches alone tell the state.
            me.do_send(Feed::State {
                worker,
                rank,
                live: replay_at.is_none(),
                reason: replay_at.map(|ep| format!("replay at {ep} did not answer")),
            });
        }
    }
}

#[cfg(test)]
mod tests;
