//! The tasks behind each subscription: one per rank follows its KV-event publisher (with
//! replay on connect and on gaps, and restart detection), one per rank forwards its pushed
//! load. They talk to the actor only through messages.

use std::time::Duration;

use actix::prelude::*;
use futures_util::StreamExt;
use kvgate_kv_events::{
    EventBatch, ReplayFrame, decode_load_message, decode_message, decode_replay_frame,
    encode_replay_request,
};
use kvgate_policies::WorkerId;
use zeromq::{Socket, SocketEvent, SocketRecv, SocketSend, ZmqMessage};

use super::LoadPushed;
use super::{EventsActor, Feed};

/// Longest wait for a replay's end marker.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait to connect a socket.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_FIRST: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// One rank's pushed load, forwarded to the selector as it comes; reconnected with backoff.
pub(super) async fn pushed_load(
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

pub(super) fn message_of(frames: Vec<Vec<u8>>) -> Option<ZmqMessage> {
    let mut it = frames.into_iter();
    let mut m = ZmqMessage::from(it.next()?);
    for f in it {
        m.push_back(f.into());
    }
    Some(m)
}

/// Why a replay brought nothing usable.
enum ReplayFailed {
    /// Not reached, or no whole answer in time.
    Silent,
    /// It answered with a frame kvgate cannot read.
    Malformed(String),
}

/// Asks the replay ROUTER at `endpoint` for every batch from `from`, in order.
async fn replay(endpoint: &str, from: u64) -> Result<Vec<(u64, EventBatch)>, ReplayFailed> {
    let silent = |_| ReplayFailed::Silent;
    let mut dealer = zeromq::DealerSocket::new();
    actix_rt::time::timeout(CONNECT_TIMEOUT, dealer.connect(endpoint))
        .await
        .map_err(silent)?
        .map_err(|_| ReplayFailed::Silent)?;
    let ask = message_of(encode_replay_request(from).to_vec()).ok_or(ReplayFailed::Silent)?;
    dealer.send(ask).await.map_err(|_| ReplayFailed::Silent)?;
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + REPLAY_TIMEOUT;
    loop {
        let m = tokio::time::timeout_at(deadline, dealer.recv())
            .await
            .map_err(silent)?
            .map_err(|_| ReplayFailed::Silent)?;
        let frames: Vec<&[u8]> = m.iter().map(|f| f.as_ref()).collect();
        match decode_replay_frame(&frames) {
            Ok(ReplayFrame::End) => return Ok(out),
            Ok(ReplayFrame::Batch(b)) => out.push((b.seq, b.batch)),
            // A frame it cannot read makes the replay unusable as a whole.
            Err(e) => return Err(ReplayFailed::Malformed(e.to_string())),
        }
    }
}

/// What a failed replay at `ep` says of the rank, and counts as malformed.
fn replay_failure(me: &Addr<EventsActor>, worker: WorkerId, ep: &str, f: ReplayFailed) -> String {
    match f {
        ReplayFailed::Silent => format!("replay at {ep} did not answer"),
        ReplayFailed::Malformed(why) => {
            let reason = format!("replay at {ep} answered a frame kvgate cannot read: {why}");
            me.do_send(Feed::Malformed {
                worker,
                reason: reason.clone(),
            });
            reason
        }
    }
}

/// What one rank's subscription follows.
pub(super) struct RankFeed {
    pub(super) me: Addr<EventsActor>,
    pub(super) worker: WorkerId,
    pub(super) rank: u32,
    pub(super) endpoint: String,
    pub(super) replay_at: Option<String>,
    pub(super) topic: String,
    /// The first sequence wanted.
    pub(super) from: u64,
    /// No batch for this long makes the task ask whether the publisher is still there.
    pub(super) silence: Duration,
}

/// Where a rank's subscription stands.
#[derive(Clone, Copy, Default)]
struct Cursor {
    /// The next sequence wanted.
    next: u64,
    /// The stamp (`ts`, as bits) of the batch before `next`, when this task applied it: the
    /// same publisher sends that batch again on request with this stamp, a new process
    /// numbering from 0 does not.
    last_ts: Option<u64>,
}

impl Cursor {
    fn applied(&mut self, seq: u64, batch: &EventBatch) {
        self.next = seq + 1;
        self.last_ts = Some(batch.ts.to_bits());
    }
}

/// One rank's subscription, for as long as the actor keeps it.
pub(super) async fn subscribe(feed: RankFeed) {
    let RankFeed {
        me,
        worker,
        rank,
        endpoint,
        replay_at,
        topic,
        from,
        silence,
    } = feed;
    let mut backoff = BACKOFF_FIRST;
    // From 0 for a new subscription; from a snapshot's position for one resumed.
    let mut at = Cursor {
        next: from,
        last_ts: None,
    };
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
        // The socket reconnects on its own; each reconnection is told here.
        let mut monitor = sub.monitor();
        // Every batch this socket receives was published after it subscribed, so after
        // the batch `floor - 1` that was already applied: a lower sequence on it is a new
        // publisher numbering from 0 again (the engine restarted), not a replayed one.
        let mut floor = at.next;
        let mut last_live: Option<u64> = None;
        // What was published before this subscription took effect comes by replay.
        catch_up(&me, worker, rank, replay_at.as_deref(), &mut at, None).await;
        loop {
            let received = tokio::select! {
                // A SUB socket whose publisher died blocks rather than fails: silence is
                // asked about instead.
                r = actix_rt::time::timeout(silence, sub.recv()) => r,
                Some(event) = monitor.next() => {
                    // Back after a dropped connection: the publisher may be a new process,
                    // and what it sent meanwhile reached nobody.
                    if let (SocketEvent::Connected(..), Some(ep)) = (event, replay_at.as_deref())
                        && recheck_or_stall(&me, worker, rank, ep, &mut at, None).await
                    {
                        (floor, last_live) = (0, None);
                    }
                    continue;
                }
            };
            let Ok(received) = received else {
                if silent(&me, worker, rank, replay_at.as_deref(), &mut at, silence).await {
                    (floor, last_live) = (0, None);
                }
                continue;
            };
            let Ok(m) = received else {
                me.do_send(Feed::State {
                    worker,
                    rank,
                    live: false,
                    reason: Some(format!("the publisher at {endpoint} went away")),
                });
                break;
            };
            let frames: Vec<&[u8]> = m.iter().map(|f| f.as_ref()).collect();
            let msg = match decode_message(&frames) {
                Ok(msg) => msg,
                Err(e) => {
                    let reason = format!("a frame from {endpoint} kvgate cannot read: {e}");
                    me.do_send(Feed::Malformed { worker, reason });
                    continue;
                }
            };
            // One publisher sends in order on one connection: a step back is a new one.
            let restarted = msg.seq < floor || last_live.is_some_and(|l| msg.seq <= l);
            last_live = Some(msg.seq);
            if restarted {
                me.do_send(Feed::Restarted { worker, rank });
                (at, floor) = (Cursor::default(), 0);
            }
            if msg.seq < at.next {
                continue; // already applied through replay
            }
            if msg.seq > at.next {
                catch_up(
                    &me,
                    worker,
                    rank,
                    replay_at.as_deref(),
                    &mut at,
                    Some(msg.seq),
                )
                .await;
                if msg.seq < at.next {
                    continue;
                }
            }
            at.applied(msg.seq, &msg.batch);
            me.do_send(Feed::Batch {
                worker,
                rank,
                seq: msg.seq,
                batch: msg.batch,
            });
        }
        actix_rt::time::sleep(backoff).await;
    }
}

/// Replays from `at.next`; with `gap_to`, a live batch of that sequence has arrived past a
/// gap. A gap replay cannot cover resets the rank and moves on.
async fn catch_up(
    me: &Addr<EventsActor>,
    worker: WorkerId,
    rank: u32,
    replay_at: Option<&str>,
    at: &mut Cursor,
    gap_to: Option<u64>,
) {
    let replayed = match replay_at {
        Some(ep) => replay(ep, at.next).await.map_err(|f| Some((ep, f))),
        None => Err(None),
    };
    match replayed {
        Ok(batches) => take_replay(me, worker, rank, batches, at, gap_to),
        Err(failed) => {
            if let Some(g) = gap_to {
                me.do_send(Feed::Reset { worker, rank });
                *at = Cursor {
                    next: g,
                    last_ts: None,
                };
            }
            // Without replay, live batches alone tell the state.
            me.do_send(Feed::State {
                worker,
                rank,
                live: replay_at.is_none(),
                reason: failed.map(|(ep, f)| replay_failure(me, worker, ep, f)),
            });
        }
    }
}

/// Applies a replay's batches from `at.next`; with `gap_to`, past a gap up to that
/// sequence. The rank is live again after it.
fn take_replay(
    me: &Addr<EventsActor>,
    worker: WorkerId,
    rank: u32,
    batches: Vec<(u64, EventBatch)>,
    at: &mut Cursor,
    gap_to: Option<u64>,
) {
    me.do_send(Feed::Replayed { worker });
    for (seq, batch) in batches {
        if seq < at.next {
            continue;
        }
        if seq > at.next {
            // What was missed is gone from the replay buffer too: rebuild from here.
            me.do_send(Feed::Reset { worker, rank });
        }
        at.applied(seq, &batch);
        me.do_send(Feed::Batch {
            worker,
            rank,
            seq,
            batch,
        });
    }
    if let Some(g) = gap_to
        && at.next < g
    {
        me.do_send(Feed::Reset { worker, rank });
        *at = Cursor {
            next: g,
            last_ts: None,
        };
    }
    me.do_send(Feed::State {
        worker,
        rank,
        live: true,
        reason: None,
    });
}

/// No batch for `silence`. With replay, a request for the last batch applied and what
/// came since tells a quiet publisher (it answers, maybe with batches missed) from a dead
/// one (no answer: the rank is stalled) and from a new process (see [`recheck`]). Without,
/// silence is judged by the actor against the engine's load. True when the publisher was
/// found restarted.
async fn silent(
    me: &Addr<EventsActor>,
    worker: WorkerId,
    rank: u32,
    replay_at: Option<&str>,
    at: &mut Cursor,
    silence: Duration,
) -> bool {
    let secs = silence.as_secs_f64();
    let Some(ep) = replay_at else {
        me.do_send(Feed::Silent { worker, rank, secs });
        return false;
    };
    recheck_or_stall(me, worker, rank, ep, at, Some(secs)).await
}

/// [`recheck`], and a rank marked stalled with the reason when the replay fails; `silent`:
/// how long nothing came, when that is why it is asked. True when the publisher was found
/// restarted.
async fn recheck_or_stall(
    me: &Addr<EventsActor>,
    worker: WorkerId,
    rank: u32,
    ep: &str,
    at: &mut Cursor,
    silent: Option<f64>,
) -> bool {
    let f = match recheck(me, worker, rank, ep, at).await {
        Ok(restarted) => return restarted,
        Err(f) => f,
    };
    let why = match (silent, f) {
        (Some(secs), ReplayFailed::Silent) => {
            format!("no KV event for {secs} s and no answer to a replay request at {ep}")
        }
        (Some(secs), f) => format!(
            "no KV event for {secs} s; {}",
            replay_failure(me, worker, ep, f)
        ),
        (None, f) => format!("reconnected; {}", replay_failure(me, worker, ep, f)),
    };
    me.do_send(Feed::State {
        worker,
        rank,
        live: false,
        reason: Some(why),
    });
    false
}

/// Asks the replay at `ep` for the last batch applied and every one after it. The publisher
/// that sent it answers with it first, stamped as before (the rest is applied); a new
/// process numbering from 0 has no such batch, or another one under its number: the rank
/// is then counted restarted and rebuilt from the new process's batch 0. A publisher whose
/// buffer dropped that batch is taken for a new one too: the rank is rebuilt either way.
/// True when it was found restarted.
async fn recheck(
    me: &Addr<EventsActor>,
    worker: WorkerId,
    rank: u32,
    ep: &str,
    at: &mut Cursor,
) -> Result<bool, ReplayFailed> {
    let Some(last) = at.next.checked_sub(1) else {
        let batches = replay(ep, 0).await?;
        take_replay(me, worker, rank, batches, at, None);
        return Ok(false);
    };
    let batches = replay(ep, last).await?;
    let same = batches
        .first()
        .is_some_and(|(seq, b)| *seq == last && at.last_ts.is_none_or(|ts| ts == b.ts.to_bits()));
    if same {
        take_replay(me, worker, rank, batches, at, None);
        return Ok(false);
    }
    me.do_send(Feed::Restarted { worker, rank });
    *at = Cursor::default();
    catch_up(me, worker, rank, Some(ep), at, None).await;
    Ok(true)
}
