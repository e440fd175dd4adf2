//! A routing actor that panics (on a request, or anywhere else in it) is restarted with
//! its state rebuilt and routing goes on; one that cannot be restarted fails liveness and
//! readiness.

use std::time::Duration;

use kvgate_engine_sim::SimConfig;
use kvgate_gateway::testing::inject::{
    HoldRebuild, IndexCrash, IndexPanic, SelectorCrash, SelectorPanic,
};
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

#[actix_rt::test]
async fn a_panic_anywhere_in_a_routing_actor_restarts_it_and_routing_resumes() {
    let (h, before) = with_a_committed_prefix().await;
    // Outside the guarded decision and lookup: a handler of each actor panics.
    h.gw.actors().selector.do_send(SelectorCrash);
    h.gw.actors().index.do_send(IndexCrash);
    for i in 0..4 {
        let r = post_json(&h.url("/v1/chat/completions"), &chat(&format!("after {i}"))).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    let live = get(&h.url("/liveness")).await;
    assert_eq!(live.status.as_u16(), 200, "{}", live.text());
    assert!(
        live.json()["actor_restarts"].as_u64() >= Some(2),
        "{}",
        live.text()
    );
    assert_eq!(get(&h.url("/readiness")).await.status.as_u16(), 200);
    // The selector rebuilt its view from the registry, the index from its snapshot.
    assert_eq!(get(&h.url("/workers")).await.json()["total"], 2);
    wait_for_async(10, "the index restored from the snapshot", || async {
        units(&get(&h.url("/admin/index")).await.json()) >= before
    })
    .await;
}

#[actix_rt::test]
async fn an_actor_that_keeps_panicking_fails_liveness_and_readiness() {
    let h = Harness::start(1, SimConfig::default(), |_| {});
    assert_eq!(get(&h.url("/liveness")).await.status.as_u16(), 200);
    for _ in 0..11 {
        h.gw.actors().selector.do_send(SelectorCrash);
    }
    wait_for_async(10, "liveness failing", || async {
        get(&h.url("/liveness")).await.status.as_u16() == 503
    })
    .await;
    let live = get(&h.url("/liveness")).await.json();
    assert_eq!(live["actors"][0], "selector", "{live}");
    let ready = get(&h.url("/readiness")).await;
    assert_eq!(ready.status.as_u16(), 503, "{}", ready.text());
}
