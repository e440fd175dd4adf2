//! KV events across restarts, end to end: the gateway's chain index outlives a gateway
//! restart (sled snapshot with each rank's sequence, then replay from there), holdings of
//! an engine that restarted meanwhile are dropped, and an engine restarted between two
//! health checks is seen in its publisher's sequence starting again from 0, or, when its
//! first batches went out before the gateway reconnected, in its replay.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use kvgate_engine_sim::{SimConfig, SimFleet};
use kvgate_gateway::{Gateway, GatewayConfig};
use kvgate_tests::{
    complete_on, generate_on, post_json, publishing_engine, test_config, unique_tokens,
    until_workers, vllm_events_config, vllm_publisher,
};
use serde_json::{Value, json};

/// Engines that keep only `buffer` batches per rank for replay.
fn engine(buffer: usize) -> SimConfig {
    SimConfig {
        kv_events_replay_buffer: buffer,
        ..publishing_engine()
    }
}

fn prefix(k: u32, n: u32) -> Vec<u32> {
    unique_tokens(k, n)
}

fn events_of<'a>(ws: &'a [Value], url: &str) -> &'a Value {
    ws.iter()
        .find(|w| w["url"] == url)
        .map_or(&Value::Null, |w| &w["events"])
}

fn blocks_of(ws: &[Value], url: &str) -> u64 {
    events_of(ws, url)["blocks"].as_u64().unwrap_or(0)
}

fn all_live(ws: &[Value], n: usize) -> bool {
    ws.len() == n && ws.iter().all(|w| w["events"]["state"] == "live")
}

/// Caches `prefix(k, 96)` on the engine at `url`, straight from a client.
async fn cache_directly(url: &str, k: u32) {
    let r = post_json(
        &format!("{url}/generate"),
        &json!({"input_ids": prefix(k, 96), "sampling_params": {"max_new_tokens": 1}}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
}

fn gateway(dir: &tempfile::TempDir, urls: &[String]) -> Gateway {
    let cfg = GatewayConfig {
        worker_urls: urls.to_vec(),
        seed: Some(5),
        ..test_config(dir)
    };
    Gateway::start(cfg).expect("gateway")
}

/// The engine that served `prefix(k, 96)` and a new tail through the gateway.
async fn served(gw: &Gateway, k: u32) -> usize {
    let mut ids = prefix(k, 96);
    ids.extend(prefix(500 + k, 8));
    generate_on(gw, ids, 1).await
}

#[actix_rt::test]
async fn the_event_index_outlives_a_gateway_restart_and_resumes_from_its_sequence() {
    // Replay keeps 2 batches per rank, and each prefix below is one batch (its prompt's
    // blocks): a gateway that starts from nothing cannot replay the third one.
    let mut fleet =
        SimFleet::start_each("127.0.0.1", 0, vec![engine(2), engine(2), engine(2)]).expect("fleet");
    let urls = fleet.urls();
    let dir = tempfile::tempdir().expect("dir");
    let first = gateway(&dir, &urls);
    until_workers(&first, "live events", |ws| all_live(ws, 3)).await;
    // Nine prefixes cached straight on the engines while the first gateway follows.
    for k in 0..9u32 {
        cache_directly(&urls[(k % 3) as usize], k).await;
    }
    let seen = until_workers(&first, "every prefix's blocks", |ws| {
        urls.iter().all(|u| blocks_of(ws, u) >= 3 * 96)
    })
    .await;
    let held: Vec<u64> = urls.iter().map(|u| blocks_of(&seen, u)).collect();
    first.stop();

    // While no gateway runs: one more prefix on engine 0, and engine 2 restarts (a new
    // process: empty cache, new startup_time, sequence from 0).
    cache_directly(&urls[0], 9).await;
    fleet.revive(2).expect("revive");

    let second = gateway(&dir, &urls);
    let ws = until_workers(&second, "events resumed", |ws| {
        all_live(ws, 3) && blocks_of(ws, &urls[0]) > held[0]
    })
    .await;
    // Engine 0: what the snapshot held, plus what replay from its sequence brought.
    // Engine 1: exactly the snapshot's. Engine 2: nothing of the old process's.
    assert_eq!(blocks_of(&ws, &urls[1]), held[1], "{ws:?}");
    assert_eq!(blocks_of(&ws, &urls[2]), 0, "{ws:?}");
    assert_eq!(events_of(&ws, &urls[1])["resets"], 0, "{ws:?}");
    // Every prefix of the surviving engines goes back to its holder, and the one cached
    // while the gateway was down too.
    for k in [0u32, 1, 3, 4, 6, 7, 9] {
        assert_eq!(served(&second, k).await, (k % 3) as usize, "prefix {k}");
    }
    second.stop();

    // The same fleet behind a gateway with an empty data dir: replay from 0 cannot cover
    // what the engines published first, so it knows less.
    let empty = tempfile::tempdir().expect("dir");
    let fresh = gateway(&empty, &urls);
    let ws = until_workers(&fresh, "live events", |ws| all_live(ws, 3)).await;
    assert!(
        blocks_of(&ws, &urls[1]) < held[1],
        "replay alone rebuilt {} of {} blocks: {ws:?}",
        blocks_of(&ws, &urls[1]),
        held[1]
    );
    fresh.stop();
}

#[actix_rt::test]
async fn an_engine_restarted_between_health_checks_is_seen_in_its_sequence() {
    let fleet = SimFleet::start_each("127.0.0.1", 0, vec![engine(10_000)]).expect("fleet");
    let url = fleet.urls()[0].clone();
    let dir = tempfile::tempdir().expect("dir");
    // test_config's health checks are an hour apart: nothing re-reads /server_info.
    let gw = gateway(&dir, std::slice::from_ref(&url));
    until_workers(&gw, "live events", |ws| all_live(ws, 1)).await;
    cache_directly(&url, 1).await;
    let one = until_workers(&gw, "the first prefix", |ws| blocks_of(ws, &url) >= 96).await;
    let per_prefix = blocks_of(&one, &url);
    // The engine restarts; its new process caches another prefix of the same length.
    fleet.engine(0).restart();
    cache_directly(&url, 2).await;
    let ws = until_workers(&gw, "the restart seen", |ws| {
        events_of(ws, &url)["restarts"] == 1
    })
    .await;
    let ws = if blocks_of(&ws, &url) == per_prefix {
        ws
    } else {
        until_workers(&gw, "the new process's blocks", |ws| {
            blocks_of(ws, &url) == per_prefix
        })
        .await
    };
    // Only the new process's prefix is held: the old one is not matched any more.
    assert_eq!(events_of(&ws, &url)["state"], "live", "{ws:?}");
    let e = post_json(
        &format!("{}/admin/explain/generate", gw.url()),
        &json!({"input_ids": prefix(1, 96)}),
    )
    .await
    .json();
    let c = &e["candidates"][0];
    assert_eq!(c["matched_by"], "kv_events", "{e}");
    assert_eq!(c["matched"].as_u64(), Some(0), "{e}");
    gw.stop();
}

#[actix_rt::test]
async fn a_vllm_engine_restarted_between_health_checks_is_followed_from_its_first_batch() {
    // A new process on the same ports (vLLM has no startup_time, and health checks are an
    // hour apart here) publishes its first batch before the gateway's socket reconnects:
    // nobody receives it live. The reconnection asks the replay for the last batch applied,
    // which the new process does not have. The silence probe is 30 s away: only the
    // reconnection can find it within the wait.
    let port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port")
    };
    let (pub_port, replay_port) = (port(), port());
    let vllm = SimConfig {
        kv_events_replay_buffer: 10_000,
        ..vllm_publisher(pub_port, replay_port, false)
    };
    let mut fleet = SimFleet::start_each("127.0.0.1", 0, vec![vllm]).expect("fleet");
    let url = fleet.urls()[0].clone();
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = GatewayConfig {
        worker_urls: vec![url.clone()],
        ..test_config(&dir)
    };
    cfg.events.kv_events_config = Some(vllm_events_config(pub_port, replay_port));
    let gw = Gateway::start(cfg).expect("gateway");
    let complete = |k: u32| complete_on(&url, prefix(k, 96));
    until_workers(&gw, "live events", |ws| all_live(ws, 1)).await;
    complete(1).await;
    complete(2).await;
    let two = until_workers(&gw, "two prefixes", |ws| blocks_of(ws, &url) >= 12).await;
    let per_prefix = blocks_of(&two, &url) / 2;
    fleet.revive(0).expect("revive");
    complete(3).await;
    let ws = until_workers(&gw, "the new process's blocks only", |ws| {
        events_of(ws, &url)["restarts"] == 1 && blocks_of(ws, &url) == per_prefix
    })
    .await;
    assert_eq!(events_of(&ws, &url)["state"], "live", "{ws:?}");
    for (k, held) in [(1, 0), (3, 96)] {
        let e = post_json(
            &format!("{}/admin/explain/completions", gw.url()),
            &json!({"prompt": prefix(k, 96), "max_tokens": 1}),
        )
        .await
        .json();
        let c = &e["candidates"][0];
        assert_eq!(c["matched_by"], "kv_events", "{e}");
        assert_eq!(c["matched"].as_u64(), Some(held), "prefix {k}: {e}");
    }
    gw.stop();
}
