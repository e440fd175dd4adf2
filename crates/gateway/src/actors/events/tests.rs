//! The subscriber against a real ZMQ publisher and replay router on loopback, built from
//! the wire crate's encoders as an SGLang engine sends them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvgate_core::WorkerUrl;
use kvgate_kv_events::{
    BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent, decode_replay_request,
    encode_message, encode_payload, encode_replay_batch, encode_replay_end,
};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use super::subscribe::message_of;
use super::*;
use crate::actors::registry::{Runtime, WorkerRecord, WorkerSource, WorkerStatus};

const BS: u32 = 4;

fn stored(hashes: &[i64], parent: Option<i64>, tokens: std::ops::Range<u32>) -> KvEvent {
    KvEvent::BlockStored(BlockStored {
        block_hashes: hashes.iter().map(|h| EngineHash::from_i64(*h)).collect(),
        parent_block_hash: parent.map(EngineHash::from_i64),
        token_ids: tokens.collect(),
        block_size: BS,
        ..BlockStored::default()
    })
}

fn batch(events: Vec<KvEvent>) -> EventBatch {
    EventBatch {
        ts: 1.0,
        events,
        attn_dp_rank: Some(0),
        unknown_events: 0,
    }
}

fn record(id: u64, port: u16, replay: Option<u16>) -> WorkerRecord {
    let mut kv = serde_json::json!({"publisher": "zmq", "endpoint_host": "*",
        "endpoint_port_base": port, "topic": "kv", "block_size": BS, "dp_size": 1});
    if let Some(r) = replay {
        kv["replay_endpoint_port_base"] = serde_json::json!(r);
    }
    WorkerRecord {
        id: WorkerId(id),
        url: WorkerUrl::parse("http://127.0.0.1:1").expect("url"),
        models: vec!["m".into()],
        adapters: Default::default(),
        version: None,
        status: WorkerStatus::Ready,
        runtime: Runtime::Sglang,
        source: WorkerSource::Config,
        max_running_requests: None,
        dp_size: None,
        page_size: None,
        startup_time: None,
        kv_events: Some(kv),
        tokenizer_path: None,
        added_at: 0.0,
        consecutive_failures: 0,
        consecutive_successes: 0,
        last_error: None,
        refused: false,
        incarnation: 1,
        api_key: None,
        kubernetes: None,
        kv_events_config: None,
    }
}

fn msg(frames: impl IntoIterator<Item = Vec<u8>>) -> ZmqMessage {
    message_of(frames.into_iter().collect()).expect("frames")
}

fn port_of(ep: &zeromq::Endpoint) -> u16 {
    match ep {
        zeromq::Endpoint::Tcp(_, p) => *p,
        other => panic!("not tcp: {other}"),
    }
}

/// Polls `f` on the actor until it holds (state, not time, is what is asserted).
async fn until(
    a: &Addr<EventsActor>,
    what: &str,
    f: impl Fn(&HashMap<WorkerId, WorkerEvents>) -> bool,
) {
    for _ in 0..500 {
        if let Ok(s) = a.send(GetEventStates).await
            && f(&s)
        {
            return;
        }
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "timed out waiting for {what}: {:?}",
        a.send(GetEventStates).await
    );
}

/// Per live worker and rank: (worker, rank, leading blocks held, block size).
async fn blocks_of(
    a: &Addr<EventsActor>,
    tokens: impl IntoIterator<Item = u32>,
) -> Vec<(WorkerId, u32, usize, u32)> {
    let facts = kvgate_policies::RequestFacts {
        key: kvgate_policies::RoutingText::Tokens(tokens.into_iter().collect()),
        ..Default::default()
    };
    a.send(MatchChain {
        facts: std::sync::Arc::new(facts),
    })
    .await
    .expect("answer")
    .per_rank
}

/// How a test's replay router frames its answers.
#[derive(Clone, Copy, PartialEq)]
enum Framing {
    /// `[b"", topic, seq, payload]`, as SGLang sends them.
    Topic,
    /// `[b"", seq, payload]`, as vLLM's `ZmqEventPublisher` sends them.
    NoTopic,
    /// Frames no engine sends.
    Junk,
}

/// Answers replay requests from `history` (batch `i` has sequence `i`) as it is when asked.
fn serve_replay(router: zeromq::RouterSocket, history: Arc<Mutex<Vec<EventBatch>>>) {
    serve_replay_as(router, history, Framing::Topic);
}

fn serve_replay_as(
    mut router: zeromq::RouterSocket,
    history: Arc<Mutex<Vec<EventBatch>>>,
    framing: Framing,
) {
    #[expect(
        clippy::disallowed_methods,
        reason = "a test publisher; it ends with the test's runtime"
    )]
    actix_rt::spawn(async move {
        while let Ok(req) = router.recv().await {
            let frames: Vec<Vec<u8>> = req.iter().map(|f| f.to_vec()).collect();
            let (id, rest) = frames.split_first().expect("identity");
            let from = decode_replay_request(rest).expect("a replay request");
            let payloads: Vec<Vec<u8>> = history
                .lock()
                .expect("history")
                .iter()
                .map(encode_payload)
                .collect();
            let untopic = |mut f: Vec<Vec<u8>>| {
                if framing == Framing::NoTopic {
                    f.remove(1);
                }
                f
            };
            for (seq, p) in payloads.iter().enumerate().skip(from as usize) {
                let mut m = vec![id.clone()];
                match framing {
                    Framing::Junk => m.extend([vec![], b"kv".to_vec(), vec![0; 3], p.clone()]),
                    _ => m.extend(untopic(encode_replay_batch(b"kv", seq as u64, p).to_vec())),
                }
                router.send(msg(m)).await.expect("send");
            }
            let mut end = vec![id.clone()];
            end.extend(untopic(encode_replay_end().to_vec()));
            router.send(msg(end)).await.expect("send");
        }
    });
}

/// Publishes `b` as sequence `seq` until `landed` holds (the subscription may not have
/// reached the publisher yet).
async fn publish_until(
    publisher: &mut zeromq::PubSocket,
    a: &Addr<EventsActor>,
    seq: u64,
    b: &EventBatch,
    what: &str,
    landed: impl Fn(&HashMap<WorkerId, WorkerEvents>) -> bool,
) {
    for _ in 0..200 {
        publisher
            .send(msg(encode_message(b"kv", seq, b)))
            .await
            .expect("send");
        actix_rt::time::sleep(Duration::from_millis(10)).await;
        if a.send(GetEventStates).await.is_ok_and(|s| landed(&s)) {
            return;
        }
    }
    until(a, what, landed).await;
}

#[actix_rt::test]
async fn blocks_stored_before_the_gateway_come_by_replay_and_live_ones_follow() {
    // The engine has published batches 0 and 1 before anyone subscribed.
    let history = [
        batch(vec![stored(&[11, 12], None, 0..8)]),
        batch(vec![stored(&[13], Some(12), 8..12)]),
    ];
    let mut publisher = zeromq::PubSocket::new();
    let pub_ep = publisher.bind("tcp://127.0.0.1:0").await.expect("bind");
    let mut router = zeromq::RouterSocket::new();
    let rep_ep = router.bind("tcp://127.0.0.1:0").await.expect("bind");
    serve_replay(router, Arc::new(Mutex::new(history.to_vec())));
    let a = EventsActor::new(None, None).start();
    let w = WorkerId(7);
    a.do_send(FleetChanged(Arc::new(vec![record(
        7,
        port_of(&pub_ep),
        Some(port_of(&rep_ep)),
    )])));
    until(&a, "a replay", |s| {
        s.get(&w).is_some_and(|e| e.replays >= 1 && e.blocks == 3)
    })
    .await;
    assert_eq!(blocks_of(&a, 0..16).await, vec![(w, 0, 3, BS)]);
    // A request sharing only the first block matches one.
    assert_eq!(
        blocks_of(&a, (0..4).chain(90..98)).await,
        vec![(w, 0, 1, BS)]
    );

    // Live batches continue the sequence: a removal, then a clear.
    let mut seq = 2;
    let removed = batch(vec![KvEvent::BlockRemoved(BlockRemoved {
        block_hashes: vec![EngineHash::from_i64(13)],
        medium: None,
    })]);
    publish_until(&mut publisher, &a, seq, &removed, "the removal", |s| {
        s.get(&w).is_some_and(|e| e.blocks == 2)
    })
    .await;
    seq += 1;
    publisher
        .send(msg(encode_message(
            b"kv",
            seq,
            &batch(vec![KvEvent::AllBlocksCleared]),
        )))
        .await
        .expect("send");
    until(&a, "the clear", |s| {
        s.get(&w)
            .is_some_and(|e| e.blocks == 0 && e.state == EventState::Live)
    })
    .await;
    assert_eq!(blocks_of(&a, 0..16).await, vec![(w, 0, 0, BS)]);
    // A frame that is not a batch is counted and skipped.
    publisher
        .send(msg([b"kv".to_vec(), vec![0; 3], b"junk".to_vec()]))
        .await
        .expect("send");
    until(&a, "the malformed count", |s| {
        s.get(&w).is_some_and(|e| e.malformed >= 1)
    })
    .await;
}

#[actix_rt::test]
async fn a_worker_without_usable_kv_events_is_off_with_a_reason_and_one_unreachable_is_stalled() {
    let a = EventsActor::new(None, None).start();
    let mut bad = record(1, 1, None);
    bad.kv_events = Some(serde_json::json!({"publisher": "nats", "endpoint_port_base": 1}));
    // Nothing listens on this port: the subscriber keeps trying.
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_port = free.local_addr().expect("addr").port();
    drop(free);
    let dead = record(2, dead_port, Some(dead_port));
    a.do_send(FleetChanged(Arc::new(vec![bad, dead])));
    until(&a, "both states", |s| {
        s.get(&WorkerId(1))
            .is_some_and(|e| e.state == EventState::Off && e.reason.is_some())
            && s.get(&WorkerId(2))
                .is_some_and(|e| e.state != EventState::Live)
    })
    .await;
    // Routing reads no chain match from a worker that is not live.
    assert!(blocks_of(&a, 0..16).await.is_empty());
    // Gone from the fleet: gone here.
    a.do_send(FleetChanged(Arc::new(vec![])));
    until(&a, "an empty table", |s| s.is_empty()).await;
}

#[actix_rt::test]
async fn a_publisher_numbering_from_0_again_is_a_new_process_and_its_rank_is_rebuilt() {
    let old = vec![
        batch(vec![stored(&[11, 12], None, 0..8)]),
        batch(vec![stored(&[13], Some(12), 8..12)]),
    ];
    let history = Arc::new(Mutex::new(old));
    let mut publisher = zeromq::PubSocket::new();
    let pub_ep = publisher.bind("tcp://127.0.0.1:0").await.expect("bind");
    let mut router = zeromq::RouterSocket::new();
    let rep_ep = router.bind("tcp://127.0.0.1:0").await.expect("bind");
    serve_replay(router, history.clone());
    let a = EventsActor::new(None, None).start();
    let w = WorkerId(7);
    a.do_send(FleetChanged(Arc::new(vec![record(
        7,
        port_of(&pub_ep),
        Some(port_of(&rep_ep)),
    )])));
    until(&a, "the old process's blocks", |s| {
        s.get(&w).is_some_and(|e| e.blocks == 3)
    })
    .await;
    // The old process goes on a little, then a new one starts: same ports, sequence 0,
    // other content, and a replay buffer holding only its own batches. Nothing tells the
    // gateway but the sequence (no AllBlocksCleared, no health failure in between).
    let more = batch(vec![stored(&[14], Some(13), 12..16)]);
    publish_until(
        &mut publisher,
        &a,
        2,
        &more,
        "the old process's live batch",
        |s| s.get(&w).is_some_and(|e| e.blocks == 4),
    )
    .await;
    let fresh = batch(vec![stored(&[21], None, 100..104)]);
    *history.lock().expect("history") = vec![fresh.clone()];
    publisher
        .send(msg(encode_message(b"kv", 0, &fresh)))
        .await
        .expect("send");
    until(&a, "the rebuild", |s| {
        s.get(&w)
            .is_some_and(|e| e.restarts == 1 && e.blocks == 1 && e.state == EventState::Live)
    })
    .await;
    // What the old process announced is gone; the new one's block is held.
    assert_eq!(blocks_of(&a, 0..16).await, vec![(w, 0, 0, BS)]);
    assert_eq!(blocks_of(&a, 100..104).await, vec![(w, 0, 1, BS)]);
    // The new process's next batch follows on as usual.
    let next = batch(vec![stored(&[22], Some(21), 104..108)]);
    publisher
        .send(msg(encode_message(b"kv", 1, &next)))
        .await
        .expect("send");
    until(&a, "the new process's second batch", |s| {
        s.get(&w).is_some_and(|e| e.blocks == 2 && e.restarts == 1)
    })
    .await;
}

/// A publisher with `history` behind a replay router that frames as `framing`, and an
/// actor subscribed to it as worker 9.
async fn replayed_as(framing: Framing) -> (Addr<EventsActor>, zeromq::PubSocket) {
    let history = vec![batch(vec![stored(&[21, 22], None, 0..8)])];
    let mut publisher = zeromq::PubSocket::new();
    let pub_ep = publisher.bind("tcp://127.0.0.1:0").await.expect("bind");
    let mut router = zeromq::RouterSocket::new();
    let rep_ep = router.bind("tcp://127.0.0.1:0").await.expect("bind");
    serve_replay_as(router, Arc::new(Mutex::new(history)), framing);
    let a = EventsActor::new(None, None).start();
    a.do_send(FleetChanged(Arc::new(vec![record(
        9,
        port_of(&pub_ep),
        Some(port_of(&rep_ep)),
    )])));
    (a, publisher)
}

#[actix_rt::test]
async fn a_replay_without_topic_frames_is_read_as_vllm_sends_it() {
    let (a, _publisher) = replayed_as(Framing::NoTopic).await;
    let w = WorkerId(9);
    until(&a, "the replayed blocks", |s| {
        s.get(&w)
            .is_some_and(|e| e.replays >= 1 && e.blocks == 2 && e.malformed == 0)
    })
    .await;
    assert_eq!(blocks_of(&a, 0..8).await, vec![(w, 0, 2, BS)]);
}

#[actix_rt::test]
async fn a_replay_answer_kvgate_cannot_read_is_counted_as_malformed_with_its_reason() {
    let (a, _publisher) = replayed_as(Framing::Junk).await;
    let w = WorkerId(9);
    until(&a, "the malformed replay", |s| {
        s.get(&w).is_some_and(|e| e.malformed >= 1)
    })
    .await;
    let s = a.send(GetEventStates).await.expect("states");
    let e = s.get(&w).expect("the worker");
    let why = e.last_malformed.clone().unwrap_or_default();
    assert!(why.contains("answered a frame kvgate cannot read"), "{e:?}");
    // Its state says the replay answered, not that it was silent.
    assert!(
        e.reason
            .as_deref()
            .is_none_or(|r| !r.contains("did not answer")),
        "{e:?}"
    );
}
