//! A KV-event publisher that goes silent while its engine serves on is seen (stalled, with
//! the reason, routed by the approximate index) and recovers when it answers again; a gap
//! in a live stream that replay cannot cover is counted and the rank rebuilt.
#![expect(
    clippy::disallowed_methods,
    reason = "a long request in flight while the publisher is silent; the test awaits it"
)]
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::time::Duration;

use kvgate_engine_sim::{SimConfig, SimFleet};
use kvgate_gateway::Gateway;
use kvgate_tests::{post_json, test_config, until_workers};
use serde_json::{Value, json};

fn engine(replay: bool) -> SimConfig {
    SimConfig {
        max_running_requests: 16,
        kv_events_port: Some(0),
        kv_events_replay_port: replay.then_some(0),
        ..SimConfig::default()
    }
}

fn prefix(k: u32, n: u32) -> Vec<u32> {
    (0..n).map(|i| 1000 + k * 5000 + i).collect()
}

/// A gateway in front of `fleet` whose ranks are asked about after 300 ms of silence.
fn gateway(fleet: &SimFleet, dir: &tempfile::TempDir) -> Gateway {
    let mut cfg = test_config(dir);
    cfg.worker_urls = fleet.urls();
    cfg.events.kv_events_silence = Duration::from_millis(300);
    cfg.poller.interval = Duration::from_millis(100);
    Gateway::start(cfg).expect("gateway")
}

/// A request straight to the engine: its cache changes, the gateway routes nothing.
async fn on_engine(url: &str, k: u32, tokens: u32) {
    let r = post_json(
        &format!("{url}/generate"),
        &json!({"input_ids": prefix(k, 64), "sampling_params": {"max_new_tokens": tokens}}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
}

fn events(ws: &[Value]) -> Value {
    ws.first().map_or(Value::Null, |w| w["events"].clone())
}

#[actix_rt::test]
async fn a_publisher_silent_while_its_engine_serves_is_stalled_then_replayed_when_it_answers() {
    let fleet = SimFleet::start_each("127.0.0.1", 0, vec![engine(true)]).expect("fleet");
    let url = fleet.urls()[0].clone();
    let dir = tempfile::tempdir().expect("dir");
    let gw = gateway(&fleet, &dir);
    on_engine(&url, 1, 1).await;
    let ws = until_workers(&gw, "live events with the first blocks", |ws| {
        events(ws)["state"] == "live" && events(ws)["blocks"].as_u64() > Some(0)
    })
    .await;
    let before = events(&ws)["blocks"].as_u64().unwrap_or(0);
    // Quiet but alive: the silence probe is answered and the rank stays live.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let ws = until_workers(&gw, "still live", |ws| events(ws)["state"] == "live").await;
    assert!(events(&ws)["replays"].as_u64() >= Some(2), "{ws:?}");
    // The probe asked for the last batch applied and got it back as it was: the same
    // process, not a restarted one.
    assert_eq!(events(&ws)["restarts"], 0, "{ws:?}");

    fleet.engine(0).mute_kv_events(true);
    on_engine(&url, 2, 1).await;
    let ws = until_workers(&gw, "the silent publisher stalled", |ws| {
        events(ws)["state"] == "stalled"
    })
    .await;
    let reason = events(&ws)["reason"].as_str().unwrap_or("").to_owned();
    assert!(reason.contains("no answer to a replay request"), "{reason}");
    // Routed meanwhile, and matched by the approximate index.
    let ask = json!({"input_ids": prefix(3, 64), "sampling_params": {"max_new_tokens": 1}});
    let r = post_json(&format!("{}/generate", gw.url()), &ask).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let e = post_json(&format!("{}/admin/explain/generate", gw.url()), &ask)
        .await
        .json();
    assert_eq!(e["candidates"][0]["events"], "stalled", "{e}");
    assert_eq!(e["candidates"][0]["matched_by"], "index", "{e}");

    // Back: the next probe is answered and what it published meanwhile is replayed.
    fleet.engine(0).mute_kv_events(false);
    let ws = until_workers(&gw, "live again with the missed blocks", |ws| {
        events(ws)["state"] == "live" && events(ws)["blocks"].as_u64() > Some(before)
    })
    .await;
    assert_eq!(events(&ws)["resets"], 0, "{ws:?}");
    assert_eq!(events(&ws)["restarts"], 0, "{ws:?}");
    assert!(events(&ws)["reason"].is_null(), "{ws:?}");
    gw.stop();
}

#[actix_rt::test]
async fn a_gap_replay_cannot_cover_is_counted_and_the_rank_recovers() {
    let fleet = SimFleet::start_each("127.0.0.1", 0, vec![engine(true)]).expect("fleet");
    let url = fleet.urls()[0].clone();
    let dir = tempfile::tempdir().expect("dir");
    let gw = gateway(&fleet, &dir);
    on_engine(&url, 1, 1).await;
    until_workers(&gw, "live events", |ws| {
        events(ws)["state"] == "live" && events(ws)["blocks"].as_u64() > Some(0)
    })
    .await;
    // One batch in the middle of the stream is lost for good, replay buffer included.
    fleet.engine(0).lose_kv_events(1);
    on_engine(&url, 2, 1).await;
    on_engine(&url, 3, 1).await;
    let ws = until_workers(&gw, "the gap counted", |ws| {
        events(ws)["resets"].as_u64() >= Some(1)
    })
    .await;
    let batches = events(&ws)["batches"].as_u64().unwrap_or(0);
    // Rebuilt from what comes: live, and new blocks are applied again.
    on_engine(&url, 4, 1).await;
    let ws = until_workers(&gw, "live after the gap", |ws| {
        events(ws)["state"] == "live"
            && events(ws)["batches"].as_u64() > Some(batches)
            && events(ws)["blocks"].as_u64() > Some(0)
    })
    .await;
    assert_eq!(events(&ws)["resets"], 1, "{ws:?}");
    gw.stop();
}

#[actix_rt::test]
async fn without_replay_a_publisher_silent_while_its_engine_works_is_stalled() {
    let fleet = SimFleet::start_each("127.0.0.1", 0, vec![engine(false)]).expect("fleet");
    let url = fleet.urls()[0].clone();
    let dir = tempfile::tempdir().expect("dir");
    let gw = gateway(&fleet, &dir);
    on_engine(&url, 1, 1).await;
    until_workers(&gw, "live events", |ws| events(ws)["state"] == "live").await;
    // Idle and silent: nothing to judge, it stays live.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let ws = until_workers(&gw, "still live", |ws| events(ws)["state"] == "live").await;
    assert!(events(&ws)["reason"].is_null(), "{ws:?}");

    fleet.engine(0).mute_kv_events(true);
    // A long request keeps the engine reporting a running request.
    let long = actix_rt::spawn({
        let url = url.clone();
        async move { on_engine(&url, 2, 300).await }
    });
    let ws = until_workers(&gw, "stalled while the engine works", |ws| {
        events(ws)["state"] == "stalled"
    })
    .await;
    let reason = events(&ws)["reason"].as_str().unwrap_or("").to_owned();
    assert!(reason.contains("running requests"), "{reason}");
    long.await.expect("the long request");
    fleet.engine(0).mute_kv_events(false);
    on_engine(&url, 3, 1).await;
    until_workers(&gw, "live with its next batch", |ws| {
        events(ws)["state"] == "live"
    })
    .await;
    gw.stop();
}
