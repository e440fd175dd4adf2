//! A routing actor that panics on a request rebuilds its state and routing goes on;
//! readiness keeps telling the truth.

use std::time::Duration;

use kvgate_engine_sim::SimConfig;
use kvgate_gateway::testing::inject::{HoldRebuild, IndexPanic, SelectorPanic};
use kvgate_tests::{Harness, client, finish_reply, get, post_json, wait_for_async};
use serde_json::json;

fn chat(text: &str) -> serde_json::Value {
    json!({"messages": [{"role": "user", "content": text}], "max_tokens": 2})
}

#[actix_rt::test]
async fn a_panicking_decision_restarts_the_selector_and_the_request_is_served() {
    let h = Harness::start(2, SimConfig::default(), |_| {});
    h.gw.actors()
        .selector
        .send(SelectorPanic)
        .await
        .expect("selector");
    let r = post_json(&h.url("/v1/chat/completions"), &chat("after the panic")).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    // The fleet view was rebuilt from the registry: both workers route.
    let ready = get(&h.url("/readiness")).await;
    assert_eq!(ready.status.as_u16(), 200, "{}", ready.text());
    for i in 0..4 {
        let r = post_json(&h.url("/v1/chat/completions"), &chat(&format!("then {i}"))).await;
        assert_eq!(r.status.as_u16(), 200);
    }
    let workers = get(&h.url("/workers")).await.json();
    assert_eq!(workers["total"], 2, "{workers}");
}

/// A gateway whose index holds a prefix in a committed snapshot; its units.
async fn with_a_committed_prefix() -> (Harness, u64) {
    let h = Harness::start(2, SimConfig::default(), |c| {
        c.snapshot.interval = Duration::from_millis(100);
        c.snapshot.backoff = 0.0;
    });
    let system = "A system prompt long enough to be worth keeping. ".repeat(20);
    let body = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "q"}], "max_tokens": 2});
    assert_eq!(
        post_json(&h.url("/v1/chat/completions"), &body)
            .await
            .status
            .as_u16(),
        200
    );
    wait_for_async(20, "a committed snapshot of the prefix", || async {
        let v = get(&h.url("/admin/index")).await.json();
        units(&v) > 0
            && v["persistence"]["committed_generation"]
                .as_u64()
                .unwrap_or(0)
                > 0
            && v["persistence"]["pending"] == false
    })
    .await;
    let before = units(&get(&h.url("/admin/index")).await.json());
    (h, before)
}

fn units(v: &serde_json::Value) -> u64 {
    v["models"][0]["text_units"].as_u64().unwrap_or(0)
}

#[actix_rt::test]
async fn a_panicking_lookup_restores_the_index_from_its_last_snapshot() {
    let (h, before) = with_a_committed_prefix().await;
    h.gw.actors().index.send(IndexPanic).await.expect("index");
    // The panicking lookup answers "no holder"; the request is still served.
    let r = post_json(
        &h.url("/v1/chat/completions"),
        &chat("a lookup that panics"),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    wait_for_async(10, "the index restored from the snapshot", || async {
        units(&get(&h.url("/admin/index")).await.json()) >= before
    })
    .await;
    assert_eq!(get(&h.url("/readiness")).await.status.as_u16(), 200);
}

#[actix_rt::test]
async fn requests_are_answered_while_the_index_rebuilds() {
    let (h, before) = with_a_committed_prefix().await;
    let (release, held) = std::sync::mpsc::channel();
    let index = &h.gw.actors().index;
    index.send(HoldRebuild(held)).await.expect("index");
    index.send(IndexPanic).await.expect("index");
    let r = post_json(&h.url("/v1/chat/completions"), &chat("the lookup panics")).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    // The rebuild is held open on the writer's thread: routing and inspection go on.
    for i in 0..3 {
        let asked = client()
            .post(h.url("/v1/chat/completions"))
            .timeout(Duration::from_secs(5))
            .send_json(&chat(&format!("during the rebuild {i}")));
        let r = finish_reply(asked.await.expect("answered during the rebuild")).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    assert_eq!(get(&h.url("/readiness")).await.status.as_u16(), 200);
    release.send(()).expect("the rebuild waits");
    wait_for_async(10, "the index restored from the snapshot", || async {
        units(&get(&h.url("/admin/index")).await.json()) >= before
    })
    .await;
}
