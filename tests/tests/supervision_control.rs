//! The actors beside the routing ones (the registry, the load poller, the KV-event
//! subscriber, the tokenizer loader) are restarted after a panic with their work resumed:
//! health checks, polls and subscriptions go on, and the gateway stays live.

use std::time::Duration;

use kvgate_engine_sim::SimConfig;
use kvgate_gateway::testing::inject::{ActorCrash, crash_tokenizer};
use kvgate_tests::{
    Harness, generate_on, get, post_json, publishing_engine, unique_tokens, until_workers,
    wait_for_async,
};
use serde_json::{Value, json};

async fn restarts(h: &Harness) -> u64 {
    let live = get(&h.url("/liveness")).await;
    assert_eq!(live.status.as_u16(), 200, "{}", live.text());
    live.json()["actor_restarts"].as_u64().unwrap_or(0)
}

async fn wait_for_restarts(h: &Harness, n: u64) {
    wait_for_async(10, "the actor restarted", || async {
        restarts(h).await >= n
    })
    .await;
}

async fn chat_ok(h: &Harness, text: &str) {
    let body = json!({"messages": [{"role": "user", "content": text}], "max_tokens": 2});
    let r = post_json(&h.url("/v1/chat/completions"), &body).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
}

fn healthy(ws: &[Value], url: &str) -> Option<bool> {
    let w = ws.iter().find(|w| w["url"] == url)?;
    w["healthy"].as_bool()
}

#[actix_rt::test]
async fn a_panicking_registry_restarts_and_health_checks_go_on() {
    let h = Harness::start(2, SimConfig::default(), |c| {
        c.health.interval = Duration::from_millis(100);
        c.health.failure_threshold = 1;
    });
    let victim = h.fleet.urls()[0].clone();
    h.gw.actors().registry.do_send(ActorCrash);
    wait_for_restarts(&h, 1).await;
    // Its workers survived the restart.
    let ws = until_workers(&h.gw, "both workers listed", |ws| ws.len() == 2).await;
    assert_eq!(healthy(&ws, &victim), Some(true), "{ws:?}");
    chat_ok(&h, "after the registry's panic").await;
    // The health timer runs again: a dead engine is seen.
    h.fleet.handle(0).kill().await;
    until_workers(&h.gw, "the killed engine marked unhealthy", |ws| {
        healthy(ws, &victim) == Some(false)
    })
    .await;
    assert_eq!(restarts(&h).await, 1);
}

fn sampled_at(ws: &[Value]) -> Vec<f64> {
    ws.iter()
        .map(|w| w["load"]["sampled_at_secs"].as_f64().unwrap_or(-1.0))
        .collect()
}

#[actix_rt::test]
async fn a_panicking_poller_restarts_and_polls_go_on() {
    let h = Harness::start(2, SimConfig::default(), |c| {
        c.poller.interval = Duration::from_millis(100);
    });
    h.wait_for_load_reports().await;
    h.gw.actors().poller.do_send(ActorCrash);
    wait_for_restarts(&h, 1).await;
    let before = sampled_at(&kvgate_tests::workers(&h.gw).await);
    until_workers(&h.gw, "a fresh load report for every worker", |ws| {
        let now = sampled_at(ws);
        now.len() == before.len() && now.iter().zip(&before).all(|(n, b)| n > b)
    })
    .await;
    chat_ok(&h, "after the poller's panic").await;
}

fn events_of(ws: &[Value], url: &str) -> (String, u64) {
    let w = ws.iter().find(|w| w["url"] == url);
    (
        w.and_then(|w| w["events"]["state"].as_str())
            .unwrap_or("")
            .to_owned(),
        w.and_then(|w| w["events"]["blocks"].as_u64()).unwrap_or(0),
    )
}

#[actix_rt::test]
async fn a_panicking_event_subscriber_restarts_and_replays_what_engines_hold() {
    let h = Harness::start(1, publishing_engine(), |_| {});
    let url = h.fleet.urls()[0].clone();
    until_workers(&h.gw, "events live", |ws| events_of(ws, &url).0 == "live").await;
    generate_on(&h.gw, unique_tokens(1, 160), 1).await;
    let held = until_workers(&h.gw, "the prompt's blocks indexed", |ws| {
        events_of(ws, &url).1 >= 9
    })
    .await;
    let blocks = events_of(&held, &url).1;
    h.gw.actors().events.do_send(ActorCrash);
    wait_for_restarts(&h, 1).await;
    // Subscribed again and replayed from the engine's first batch: the same blocks.
    until_workers(&h.gw, "the blocks replayed after the restart", |ws| {
        events_of(ws, &url) == ("live".to_owned(), blocks)
    })
    .await;
    generate_on(&h.gw, unique_tokens(2, 160), 1).await;
    until_workers(&h.gw, "new blocks indexed after the restart", |ws| {
        events_of(ws, &url).1 > blocks
    })
    .await;
}

#[actix_rt::test]
async fn a_panicking_tokenizer_loader_restarts() {
    let h = Harness::start(1, SimConfig::default(), |_| {});
    crash_tokenizer(h.gw.actors());
    wait_for_restarts(&h, 1).await;
    chat_ok(&h, "after the loader's panic").await;
    let ready = get(&h.url("/readiness")).await;
    assert_eq!(ready.status.as_u16(), 200, "{}", ready.text());
}
