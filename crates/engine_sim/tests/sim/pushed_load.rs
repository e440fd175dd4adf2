//! Pushed load over real ZMQ sockets: what a SUB socket on a rank's load port receives,
//! decoded with the gateway's own decoder, against what `/v1/loads` reports.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::time::Duration;

use kvgate_engine_sim::{SimConfig, SimFleet};
use kvgate_kv_events::{LoadMessage, decode_load_message};
use serde_json::{Value, json};
use zeromq::{Socket, SocketRecv, SubSocket};

use crate::scheduling::ids;
use crate::support::{endless, fast, get_json, one, post, post_json, wait_until};

const TOPIC: &str = "load";

fn pushing() -> SimConfig {
    SimConfig {
        kv_events_port: Some(0),
        load_publish_port: Some(0),
        // Short, so idle tests do not sit through SGLang's one second.
        load_heartbeat: Duration::from_millis(50),
        ..fast()
    }
}

/// `/server_info`'s `kv_events` block, checked for the load fields.
async fn descriptor(url: &str) -> Value {
    let d = get_json(&format!("{url}/server_info")).await["kv_events"].clone();
    assert_eq!(d["load_topic"], TOPIC);
    assert!(d["endpoint_port_base"].is_u64(), "{d}");
    d
}

fn load_port(d: &Value) -> u16 {
    u16::try_from(d["load_endpoint_port_base"].as_u64().unwrap()).unwrap()
}

async fn subscribe(port: u16) -> SubSocket {
    let mut sub = SubSocket::new();
    sub.connect(&format!("tcp://127.0.0.1:{port}"))
        .await
        .unwrap();
    sub.subscribe(TOPIC).await.unwrap();
    sub
}

/// The next pushed load; a missing one fails the test instead of hanging it.
async fn next(sub: &mut SubSocket) -> LoadMessage {
    let frames = tokio::time::timeout(Duration::from_secs(10), sub.recv())
        .await
        .expect("timed out waiting for a pushed load")
        .unwrap()
        .into_vec();
    let msg = decode_load_message(&frames).unwrap();
    assert_eq!(msg.topic, TOPIC.as_bytes());
    msg
}

/// The first pushed load for which `cond` holds.
async fn next_where(sub: &mut SubSocket, cond: impl Fn(&LoadMessage) -> bool) -> LoadMessage {
    for _ in 0..10_000 {
        let msg = next(sub).await;
        if cond(&msg) {
            return msg;
        }
    }
    panic!("no pushed load matched");
}

#[actix_rt::test]
async fn an_idle_rank_heartbeats_with_consecutive_sequence_numbers() {
    let (_fleet, url) = one(pushing());
    let d = descriptor(&url).await;
    let mut sub = subscribe(load_port(&d)).await;
    // Messages before the subscription reached the publisher are dropped: any seq may come
    // first, but the next is the one after it.
    let first = next(&mut sub).await;
    let second = next(&mut sub).await;
    assert_eq!(second.seq, first.seq + 1);
    for msg in [&first, &second] {
        let s = msg.stat;
        assert_eq!(
            (s.num_running_reqs, s.num_waiting_reqs, s.num_tokens),
            (0, 0, 0)
        );
        assert_eq!(s.attn_dp_rank, 0);
        assert_eq!(s.max_total_num_tokens, 200_000);
        assert_eq!(s.max_running_requests, Some(16));
    }
}

#[actix_rt::test]
async fn a_running_request_is_pushed_with_the_figures_v1_loads_reports() {
    let (fleet, url) = one(SimConfig {
        load_publish_every_steps: 2,
        // No heartbeat in the way: what arrives comes from scheduler steps.
        load_heartbeat: Duration::from_secs(60),
        cache_capacity_tokens: 40_000,
        max_running_requests: 3,
        kv_events_port: Some(0),
        load_publish_port: Some(0),
        ..endless()
    });
    let d = descriptor(&url).await;
    let mut sub = subscribe(load_port(&d)).await;
    let client = {
        let url = url.clone();
        let body = json!({"input_ids": ids(0, 20), "rid": "r0"});
        actix_rt::spawn(async move { post_json(&format!("{url}/generate"), &body).await })
    };
    let engine = fleet.engine(0);
    wait_until("the request runs", || engine.stats().running == 1).await;

    let pushed = next_where(&mut sub, |m| m.stat.num_running_reqs == 1).await;
    let load = &get_json(&format!("{url}/v1/loads")).await["loads"][0];
    let s = pushed.stat;
    assert_eq!(load["num_running_reqs"], s.num_running_reqs);
    assert_eq!(load["num_waiting_reqs"], s.num_waiting_reqs);
    assert_eq!(load["max_total_num_tokens"], s.max_total_num_tokens);
    assert_eq!(
        load["max_running_requests"],
        s.max_running_requests.unwrap()
    );
    assert_eq!(
        (s.max_total_num_tokens, s.max_running_requests),
        (40_000, Some(3))
    );
    assert_eq!(s.attn_dp_rank, 0);
    // In use: the whole prompt and the output so far, which only grows until the poll.
    assert!(s.num_tokens >= 20, "{s:?}");
    assert!(
        s.num_tokens <= load["num_used_tokens"].as_u64().unwrap(),
        "{s:?} {load}"
    );
    assert_eq!(s.num_total_tokens, Some(s.num_tokens));

    let (status, _) = post(&format!("{url}/abort_request"), &json!({"rid": "r0"})).await;
    assert!(status.is_success());
    let answer = client.await.unwrap();
    assert_eq!(answer["meta_info"]["finish_reason"]["type"], "abort");
}

#[actix_rt::test]
async fn each_rank_pushes_on_its_own_port_with_its_own_rank() {
    let (_fleet, url) = one(SimConfig {
        dp_size: 2,
        ..pushing()
    });
    let d = descriptor(&url).await;
    let base = load_port(&d);
    for rank in 0u16..2 {
        let mut sub = subscribe(base + rank).await;
        let msg = next(&mut sub).await;
        assert_eq!(msg.stat.attn_dp_rank, u32::from(rank));
    }
}

#[actix_rt::test]
async fn server_info_advertises_the_bound_load_ports_and_topic() {
    let kv = free_port_pair();
    let (_fleet, url) = one(SimConfig {
        kv_events_port: Some(kv),
        load_publish_port: Some(kv + 1),
        load_topic: TOPIC.to_owned(),
        ..pushing()
    });
    let d = descriptor(&url).await;
    assert_eq!(d["endpoint_port_base"], kv);
    assert_eq!(d["load_endpoint_port_base"], kv + 1);
    // Receiving proves the advertised port is the bound one.
    let mut sub = subscribe(load_port(&d)).await;
    assert_eq!(next(&mut sub).await.stat.attn_dp_rank, 0);

    // Without pushed load the descriptor has no load fields.
    let (_plain, plain_url) = one(SimConfig {
        kv_events_port: Some(0),
        ..fast()
    });
    let plain = get_json(&format!("{plain_url}/server_info")).await["kv_events"].clone();
    assert!(plain["load_endpoint_port_base"].is_null(), "{plain}");
    assert!(plain["load_topic"].is_null(), "{plain}");
}

#[actix_rt::test]
async fn pushed_load_needs_kv_events_and_its_own_ports() {
    let alone = SimConfig {
        load_publish_port: Some(0),
        ..fast()
    };
    let err = SimFleet::start(1, alone).unwrap_err();
    assert!(
        err.to_string()
            .contains("load_publish_port needs kv_events_port"),
        "{err}"
    );
    for (replay, load, clash) in [
        (None, 40_001, "kv_events_port"),
        (Some(40_010), 40_011, "kv_events_replay_port"),
    ] {
        let overlap = SimConfig {
            dp_size: 2,
            kv_events_port: Some(40_000),
            kv_events_replay_port: replay,
            load_publish_port: Some(load),
            ..fast()
        };
        let err = SimFleet::start(1, overlap).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("overlaps the {clash} ranks")),
            "{err}"
        );
    }
    let never = SimConfig {
        load_publish_every_steps: 0,
        ..pushing()
    };
    let err = SimFleet::start(1, never).unwrap_err();
    assert!(
        err.to_string().contains("load_publish_every_steps"),
        "{err}"
    );
}

/// Two consecutive ports free right now (a fixed-port test can still race another
/// process; the OS rarely hands out the same ports again at once).
fn free_port_pair() -> u16 {
    for _ in 0..50 {
        let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = a.local_addr().unwrap().port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
    panic!("no two consecutive free ports");
}
