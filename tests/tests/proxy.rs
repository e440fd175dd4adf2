//! The gateway proxies every inference route, streamed and not, to simulated engines.

use kvgate_engine_sim::SimConfig;
use kvgate_tests::{Harness, get, post_json, sse_events};
use serde_json::{Value, json};

fn sim() -> SimConfig {
    SimConfig::default()
}

async fn check_route(h: &Harness, path: &str, body: Value) {
    let r = post_json(&h.url(path), &body).await;
    assert_eq!(r.status.as_u16(), 200, "{path}: {}", r.text());
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("application/json")),
        "{path}"
    );
    let j = r.json();
    if path == "/generate" {
        assert!(j["text"].is_string(), "{j}");
        assert!(
            j["meta_info"]["prompt_tokens"]
                .as_u64()
                .is_some_and(|n| n > 0),
            "{j}"
        );
    } else {
        assert!(
            j["choices"].as_array().is_some_and(|c| !c.is_empty()),
            "{j}"
        );
        assert!(
            j["usage"]["prompt_tokens"].as_u64().is_some_and(|n| n > 0),
            "{j}"
        );
    }

    let mut body = body;
    body["stream"] = json!(true);
    let r = post_json(&h.url(path), &body).await;
    assert_eq!(r.status.as_u16(), 200, "{path} stream: {}", r.text());
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream")),
        "{path}"
    );
    let (events, done) = sse_events(&r.text());
    assert!(done, "{path}: stream must end with [DONE]: {}", r.text());
    assert!(events.len() >= 2, "{path}: {}", r.text());
    assert!(
        events.iter().all(|e| e.get("error").is_none()),
        "{path}: {}",
        r.text()
    );
}

#[actix_rt::test]
async fn every_inference_route_streams_and_not() {
    let h = Harness::start(2, sim(), |_| {});
    let model = "kvgate-sim-model";
    check_route(&h, "/v1/chat/completions", json!({"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4})).await;
    check_route(
        &h,
        "/v1/completions",
        json!({"model": model, "prompt": "once upon a time", "max_tokens": 4}),
    )
    .await;
    check_route(
        &h,
        "/v1/completions",
        json!({"model": model, "prompt": ["one two"], "max_tokens": 4}),
    )
    .await;
    check_route(
        &h,
        "/v1/completions",
        json!({"model": model, "prompt": [1, 2, 3, 4, 5], "max_tokens": 4}),
    )
    .await;
    check_route(
        &h,
        "/generate",
        json!({"text": "the quick brown fox", "sampling_params": {"max_new_tokens": 4}}),
    )
    .await;
    check_route(
        &h,
        "/generate",
        json!({"input_ids": [7, 8, 9], "sampling_params": {"max_new_tokens": 4}}),
    )
    .await;
    let total: u64 = h.split().iter().sum();
    assert_eq!(total, 12, "every request reached exactly one engine");
    // Nothing is left in flight once every response has ended.
    let w = get(&h.url("/workers")).await.json();
    for worker in w["workers"].as_array().unwrap() {
        assert_eq!(worker["in_flight"], 0, "{worker}");
    }
}

#[actix_rt::test]
async fn a_batch_of_prompts_goes_whole_to_one_engine() {
    let h = Harness::start(2, sim(), |_| {});
    let body = json!({"prompt": ["alpha beta", "gamma delta", "epsilon"], "max_tokens": 3});
    let r = post_json(&h.url("/v1/completions"), &body).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let index: Vec<u64> = r.json()["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(index, vec![0, 1, 2]);

    let mut body = body;
    body["stream"] = json!(true);
    let r = post_json(&h.url("/v1/completions"), &body).await;
    let (events, done) = sse_events(&r.text());
    assert!(done, "{}", r.text());
    for i in 0..3 {
        assert!(
            events.iter().any(|e| e["choices"][0]["index"] == i),
            "prompt {i}: {}",
            r.text()
        );
    }
    // Each request, with its three prompts, reached exactly one engine.
    let split = h.split();
    assert_eq!(split.iter().sum::<u64>(), 6, "{split:?}");
    assert!(split.iter().all(|n| n % 3 == 0), "{split:?}");
}

#[actix_rt::test]
async fn round_robin_spreads_evenly() {
    let h = Harness::start(4, sim(), |c| {
        c.policy.kind = kvgate_policies::PolicyKind::RoundRobin
    });
    for i in 0..40 {
        let r = post_json(
            &h.url("/v1/completions"),
            &json!({"prompt": format!("prompt {i}"), "max_tokens": 1}),
        )
        .await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    assert_eq!(h.split(), vec![10, 10, 10, 10]);
}

#[actix_rt::test]
async fn random_uses_every_worker() {
    // Seeded, so the draws are the same on every run; which engine is first in the fleet
    // follows its URL's id, and the ports change from run to run.
    let h = Harness::start(2, sim(), |c| {
        c.policy.kind = kvgate_policies::PolicyKind::Random;
        c.seed = Some(7);
    });
    for i in 0..40 {
        let r = post_json(
            &h.url("/v1/completions"),
            &json!({"prompt": format!("p{i}"), "max_tokens": 1}),
        )
        .await;
        assert_eq!(r.status.as_u16(), 200);
    }
    let mut split = h.split();
    split.sort_unstable();
    assert_eq!(split, vec![14, 26]);
}

#[actix_rt::test]
async fn request_ids_are_echoed_or_made() {
    let h = Harness::start(1, sim(), |_| {});
    let r = kvgate_tests::client()
        .post(h.url("/v1/completions"))
        .insert_header(("x-request-id", "my-id-42"))
        .send_json(&json!({"prompt": "hi", "max_tokens": 1}))
        .await
        .unwrap();
    assert_eq!(r.headers().get("x-request-id").unwrap(), "my-id-42");
    let r = get(&h.url("/health")).await;
    let id = r.header("x-request-id").unwrap();
    assert!(id.starts_with("req-") && id.len() == 28, "{id}");
    assert!(id[4..].bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
    let next = get(&h.url("/health")).await;
    assert_ne!(next.header("x-request-id").unwrap(), id);
    // An id that is not visible ASCII or too long is replaced.
    let long = "x".repeat(200);
    let r = kvgate_tests::client()
        .get(h.url("/health"))
        .insert_header(("x-request-id", long.as_str()))
        .send()
        .await
        .unwrap();
    assert_ne!(
        r.headers().get("x-request-id").unwrap().to_str().unwrap(),
        long
    );
}

async fn id_for(h: &Harness, headers: &[(&str, &str)]) -> String {
    let mut req = kvgate_tests::client().post(h.url("/v1/completions"));
    for (k, v) in headers {
        req = req.insert_header((*k, *v));
    }
    let sent = req.send_json(&json!({"prompt": "hi", "max_tokens": 1}));
    let Ok(r) = sent.await else {
        panic!("the request was not sent");
    };
    assert_eq!(r.status().as_u16(), 200);
    let id = r.headers().get("x-request-id").map(|v| v.to_str());
    id.and_then(Result::ok).unwrap_or_default().to_owned()
}

#[actix_rt::test]
async fn the_request_id_comes_from_the_first_listed_header_the_client_sends() {
    // The default list: the reference gateway's.
    let h = Harness::start(1, sim(), |_| {});
    assert_eq!(
        id_for(&h, &[("x-correlation-id", "corr-1")]).await,
        "corr-1"
    );
    let both = [("request-id", "later"), ("x-trace-id", "trace-2")];
    assert_eq!(id_for(&h, &both).await, "trace-2");
    // `--request-id-headers x-my-id`: only that header names the request.
    let h = Harness::start(1, sim(), |c| c.request_id_headers = vec!["X-My-Id".into()]);
    assert_eq!(id_for(&h, &[("x-my-id", "mine-3")]).await, "mine-3");
    let theirs = id_for(&h, &[("x-request-id", "not-this")]).await;
    assert!(theirs.starts_with("req-"), "{theirs}");
    // The decision log carries the id.
    let log = get(&h.url("/admin/decisions")).await.json();
    assert!(log.to_string().contains("mine-3"), "{log}");
}

#[actix_rt::test]
async fn models_are_the_union_of_workers() {
    let a = kvgate_engine_sim::SimFleet::start(
        1,
        SimConfig {
            model: "model-a".into(),
            ..sim()
        },
    )
    .unwrap();
    let b = kvgate_engine_sim::SimFleet::start(
        1,
        SimConfig {
            model: "model-b".into(),
            ..sim()
        },
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = kvgate_tests::test_config(&dir);
    cfg.worker_urls = vec![a.urls()[0].clone(), b.urls()[0].clone()];
    let gw = kvgate_gateway::Gateway::start(cfg).unwrap();
    let m = get(&format!("{}/v1/models", gw.url())).await.json();
    let mut ids: Vec<&str> = m["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["model-a", "model-b"]);
    assert_eq!(m["object"], "list");
    // `model` picks among the workers that serve it.
    for _ in 0..3 {
        let r = post_json(
            &format!("{}/v1/completions", gw.url()),
            &json!({"model": "model-b", "prompt": "x", "max_tokens": 1}),
        )
        .await;
        assert_eq!(r.status.as_u16(), 200);
    }
    assert_eq!(
        (a.engine(0).stats().requests, b.engine(0).stats().requests),
        (0, 3)
    );
}
