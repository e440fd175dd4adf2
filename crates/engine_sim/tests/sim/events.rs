//! KV events over real ZMQ sockets: what a SUB socket and a replay DEALER receive from the
//! simulator, decoded with the gateway's own decoder.

use std::time::Duration;

use bytes::Bytes;
use kvgate_engine_sim::tokenizer::{encode, render_chat};
use kvgate_engine_sim::{SimConfig, SimFleet, Tokenizer};
use kvgate_kv_events::{
    BlockStored, EngineHash, EventMessage, KvEvent, Medium, ReplayFrame, decode_message,
    decode_replay_frame, encode_replay_request,
};
use serde_json::{Value, json};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use crate::scheduling::ids;
use crate::support::{fast, get_json, one, post, post_json};

pub(crate) const TOPIC: &str = "kv";

fn publishing() -> SimConfig {
    SimConfig {
        page_size: 4,
        kv_events_port: Some(0),
        kv_events_topic: TOPIC.to_owned(),
        kv_events_replay_port: Some(0),
        ..fast()
    }
}

/// The advertised descriptor, checked for SGLang's shape.
async fn descriptor(url: &str) -> Value {
    let info = get_json(&format!("{url}/server_info")).await;
    let d = info["kv_events"].clone();
    assert_eq!(d["publisher"], "zmq");
    assert_eq!(d["endpoint_host"], "*");
    assert_eq!(d["topic"], TOPIC);
    assert_eq!(d["block_size"], info["page_size"]);
    assert_eq!(d["dp_size"], info["dp_size"]);
    let legacy = get_json(&format!("{url}/get_server_info")).await;
    assert_eq!(legacy["kv_events"], d);
    d
}

fn port(d: &Value, key: &str) -> u16 {
    u16::try_from(d[key].as_u64().unwrap()).unwrap()
}

/// Bounds a wait so a missing message fails the test instead of hanging it.
async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

async fn subscribe(port: u16) -> SubSocket {
    let mut sub = SubSocket::new();
    sub.connect(&format!("tcp://127.0.0.1:{port}"))
        .await
        .unwrap();
    sub.subscribe(TOPIC).await.unwrap();
    sub
}

/// Flushes the (still empty) cache until every subscriber has received a batch, so their
/// subscriptions have reached the publishers; returns the flushes sent, which is the
/// sequence number of every rank's next batch (each flush is one batch per rank).
async fn sync(url: &str, subs: &mut [SubSocket]) -> u64 {
    let mut flushes = 0;
    for sub in subs.iter_mut() {
        loop {
            let (status, _) = post(&format!("{url}/flush_cache"), &json!({})).await;
            assert!(status.is_success());
            flushes += 1;
            let got = tokio::time::timeout(Duration::from_millis(100), sub.recv()).await;
            if got.is_ok() {
                break;
            }
            assert!(flushes < 100, "no subscription reached the publisher");
        }
    }
    flushes
}

/// The next message with `seq >= from` (earlier ones are the sync's clears).
async fn next(sub: &mut SubSocket, from: u64) -> EventMessage {
    loop {
        let frames = within("a kv event", sub.recv()).await.unwrap().into_vec();
        let msg = decode_message(&frames).unwrap();
        assert_eq!(msg.topic, TOPIC.as_bytes());
        if msg.seq < from {
            assert_eq!(msg.batch.events, vec![KvEvent::AllBlocksCleared]);
            continue;
        }
        return msg;
    }
}

/// Every batch the replay socket at `port` holds from `start`, up to its end marker.
async fn replay(port: u16, start: u64) -> Vec<EventMessage> {
    let mut dealer = DealerSocket::new();
    dealer
        .connect(&format!("tcp://127.0.0.1:{port}"))
        .await
        .unwrap();
    let [empty, seq] = encode_replay_request(start);
    let mut req = ZmqMessage::from(empty);
    req.push_back(Bytes::from(seq));
    dealer.send(req).await.unwrap();
    let mut out = Vec::new();
    loop {
        let frames = within("a replay frame", dealer.recv())
            .await
            .unwrap()
            .into_vec();
        match decode_replay_frame(&frames).unwrap() {
            ReplayFrame::Batch(msg) => out.push(msg),
            ReplayFrame::End => return out,
        }
    }
}

/// A subscriber on rank 0 of the engine at `url`, as advertised.
pub(crate) async fn descriptor_port(url: &str) -> SubSocket {
    let d = descriptor(url).await;
    subscribe(port(&d, "endpoint_port_base")).await
}

/// Syncs `sub`, runs `traffic`, and returns the first block store published after it.
pub(crate) async fn first_store_after_sync(
    url: &str,
    sub: &mut SubSocket,
    traffic: impl Future<Output = ()>,
) -> BlockStored {
    let from = sync(url, std::slice::from_mut(sub)).await;
    traffic.await;
    only_store(&next(sub, from).await)
}

fn only_store(msg: &EventMessage) -> BlockStored {
    match msg.batch.events.as_slice() {
        [KvEvent::BlockStored(s)] => s.clone(),
        other => panic!("expected one BlockStored, got {other:?}"),
    }
}

#[actix_rt::test]
async fn a_chat_prompt_and_its_answer_are_published_as_chained_blocks_and_replayed() {
    let (_fleet, url) = one(publishing());
    let d = descriptor(&url).await;
    // Connecting and receiving proves the advertised ports are the bound ones.
    let mut sub = subscribe(port(&d, "endpoint_port_base")).await;
    let from = sync(&url, std::slice::from_mut(&mut sub)).await;

    let content = "the quick brown fox jumps over the lazy dog, twice over";
    let chat = json!({"messages": [{"role": "user", "content": content}], "max_tokens": 9});
    let answer = post_json(&format!("{url}/v1/chat/completions"), &chat).await;
    let prompt = encode(Tokenizer::WordPieces, &render_chat([("user", content)]));
    assert_eq!(answer["usage"]["prompt_tokens"], prompt.len());
    let whole = prompt.len() / 4 * 4;

    // Prefill stores the prompt's whole pages, from the start of a sequence.
    let first = next(&mut sub, from).await;
    assert_eq!((first.seq, first.batch.attn_dp_rank), (from, Some(0)));
    let s = only_store(&first);
    assert_eq!(s.token_ids, prompt[..whole]);
    assert_eq!((s.parent_block_hash, s.block_size), (None, 4));
    assert_eq!(s.block_hashes.len(), whole / 4);
    assert_eq!((s.lora_id, s.medium.clone()), (None, Some(Medium::Gpu)));

    // The request's end stores the rest: the prompt's tail and the 8 computed answer tokens,
    // chained to the prompt's last block.
    let second = next(&mut sub, from).await;
    assert_eq!(second.seq, from + 1);
    let t = only_store(&second);
    assert_eq!(t.parent_block_hash, s.block_hashes.last().copied());
    assert_eq!(t.token_ids.len(), (prompt.len() + 8) / 4 * 4 - whole);
    assert_eq!(t.token_ids[..prompt.len() - whole], prompt[whole..]);
    assert_eq!(t.block_hashes.len(), t.token_ids.len() / 4);

    // Replay from 0 gives the sync's clears and both stores, as published.
    let replay_port = port(&d, "replay_endpoint_port_base");
    let all = replay(replay_port, 0).await;
    let seqs: Vec<u64> = all.iter().map(|m| m.seq).collect();
    assert_eq!(
        seqs,
        (0..from + 2).collect::<Vec<_>>(),
        "consecutive from 0"
    );
    assert_eq!(all[usize::try_from(from).unwrap()], first);
    assert_eq!(all[usize::try_from(from).unwrap() + 1], second);
    assert_eq!(replay(replay_port, from + 1).await, vec![second]);
    assert!(
        replay(replay_port, from + 2).await.is_empty(),
        "only the end marker"
    );
}

#[actix_rt::test]
async fn an_eviction_removes_exactly_the_evicted_blocks_and_a_flush_clears_all() {
    let (fleet, url) = one(SimConfig {
        cache_capacity_tokens: 48,
        ..publishing()
    });
    let d = descriptor(&url).await;
    let mut sub = subscribe(port(&d, "endpoint_port_base")).await;
    let from = sync(&url, std::slice::from_mut(&mut sub)).await;
    let generate = |start, len| json!({"input_ids": ids(start, len), "sampling_params": {"max_new_tokens": 1}});

    post_json(&format!("{url}/generate"), &generate(0, 21)).await;
    let a = only_store(&next(&mut sub, from).await);
    assert_eq!(a.token_ids, (0..20).collect::<Vec<_>>());

    // 41 tokens plus one of output need 42 of the 48: the first prompt's 20 must go.
    post_json(&format!("{url}/generate"), &generate(1000, 41)).await;
    let evicted = next(&mut sub, from).await;
    assert_eq!(evicted.seq, from + 1);
    let [KvEvent::BlockRemoved(r)] = evicted.batch.events.as_slice() else {
        panic!("expected one BlockRemoved, got {:?}", evicted.batch.events);
    };
    assert_eq!(r.block_hashes, a.block_hashes);
    let b = only_store(&next(&mut sub, from).await);
    assert_eq!(b.token_ids, (1000..1040).collect::<Vec<_>>());
    assert_eq!(fleet.engine(0).stats().cache_tokens, 40);

    let (status, _) = post(&format!("{url}/flush_cache"), &json!({})).await;
    assert!(status.is_success());
    let cleared = next(&mut sub, from).await;
    assert_eq!(cleared.seq, from + 3);
    assert_eq!(cleared.batch.events, vec![KvEvent::AllBlocksCleared]);

    // A restart is a new process: its publisher numbers from 0 again, the old one's clear
    // is never sent, and replay holds only what the new one published.
    fleet.engine(0).restart();
    post_json(&format!("{url}/generate"), &generate(2000, 9)).await;
    let fresh = next(&mut sub, 0).await;
    assert_eq!(fresh.seq, 0);
    assert_eq!(
        only_store(&fresh).token_ids,
        (2000..2008).collect::<Vec<_>>()
    );
    let replayed = replay(port(&d, "replay_endpoint_port_base"), 0).await;
    assert_eq!(replayed.first(), Some(&fresh));
}

#[actix_rt::test]
async fn each_rank_publishes_on_its_own_port_with_its_own_rank() {
    let (_fleet, url) = one(SimConfig {
        dp_size: 2,
        ..publishing()
    });
    let d = descriptor(&url).await;
    let base = port(&d, "endpoint_port_base");
    let mut subs = [subscribe(base).await, subscribe(base + 1).await];
    let from = sync(&url, &mut subs).await;

    for rank in [1u32, 0] {
        let body = json!({"input_ids": ids(100 * rank, 9), "routed_dp_rank": rank,
                          "sampling_params": {"max_new_tokens": 1}});
        post_json(&format!("{url}/generate"), &body).await;
    }
    for (rank, sub) in (0u32..).zip(subs.iter_mut()) {
        let msg = next(sub, from).await;
        assert_eq!((msg.seq, msg.batch.attn_dp_rank), (from, Some(rank)));
        let s = only_store(&msg);
        assert_eq!(
            s.token_ids,
            (100 * rank..100 * rank + 8).collect::<Vec<_>>()
        );
    }
    // Replay is per rank as well.
    let replay_base = port(&d, "replay_endpoint_port_base");
    for rank in [0u16, 1] {
        let got = replay(replay_base + rank, from).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].batch.attn_dp_rank, Some(u32::from(rank)));
    }
}

#[actix_rt::test]
async fn the_same_tokens_get_the_same_engine_hashes_on_every_engine() {
    let fleet = SimFleet::start(2, publishing()).unwrap();
    let mut stores = Vec::new();
    for url in fleet.urls() {
        let d = descriptor(&url).await;
        let mut sub = subscribe(port(&d, "endpoint_port_base")).await;
        let from = sync(&url, std::slice::from_mut(&mut sub)).await;
        let body = json!({"input_ids": ids(7, 13), "sampling_params": {"max_new_tokens": 1}});
        post_json(&format!("{url}/generate"), &body).await;
        stores.push(only_store(&next(&mut sub, from).await).block_hashes);
    }
    assert_eq!(stores[0], stores[1], "engine hashes depend on content only");
    let distinct: std::collections::HashSet<&EngineHash> = stores[0].iter().collect();
    assert_eq!(distinct.len(), 3);
}

#[actix_rt::test]
async fn a_revived_engine_publishes_from_seq_0_on_the_same_ports() {
    let mut fleet = SimFleet::start(1, publishing()).unwrap();
    let url = fleet.urls()[0].clone();
    let d = descriptor(&url).await;
    let body = json!({"input_ids": ids(0, 9), "sampling_params": {"max_new_tokens": 1}});
    post_json(&format!("{url}/generate"), &body).await;
    let replay_port = port(&d, "replay_endpoint_port_base");
    assert_eq!(replay(replay_port, 0).await.len(), 1);

    fleet.revive(0).unwrap();
    assert_eq!(descriptor(&url).await, d, "the same ports");
    post_json(&format!("{url}/generate"), &body).await;
    let after = replay(replay_port, 0).await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].seq, 0, "a new process numbers from 0");
}

#[actix_rt::test]
async fn events_are_off_by_default_and_replay_needs_a_publisher() {
    let (_fleet, url) = one(fast());
    let info = get_json(&format!("{url}/server_info")).await;
    assert!(info["kv_events"].is_null());
    let bad = SimConfig {
        kv_events_replay_port: Some(0),
        ..fast()
    };
    let err = SimFleet::start(1, bad).unwrap_err();
    assert!(err.to_string().contains("kv_events_replay_port"), "{err}");
    let overlap = SimConfig {
        dp_size: 2,
        kv_events_port: Some(40_000),
        kv_events_replay_port: Some(40_001),
        ..fast()
    };
    let err = SimFleet::start(1, overlap).unwrap_err();
    assert!(err.to_string().contains("overlaps"), "{err}");
}
