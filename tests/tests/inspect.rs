//! Inspection end to end: `POST /admin/explain` answers for a body as a client would send
//! it, without dispatching; `GET /admin/decisions` shows what was decided and what the
//! engine then reported.

use kvgate_engine_sim::{SimConfig, engine_of};
use kvgate_tests::{Harness, get, post_json, sse_events};
use serde_json::{Value, json};

fn sim() -> SimConfig {
    SimConfig {
        max_running_requests: 16,
        enable_cache_report: true,
        ..SimConfig::default()
    }
}

async fn fleet(n: usize) -> Harness {
    let h = Harness::start(n, sim(), |c| c.seed = Some(3));
    h.wait_for_load_reports().await;
    h
}

fn chat(system: &str, question: &str) -> Value {
    json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}], "max_tokens": 2})
}

#[actix_rt::test]
async fn explain_names_the_worker_the_path_and_every_candidates_figures_and_dispatches_nothing() {
    let h = fleet(2).await;
    let urls = h.fleet.urls();
    let system = "You are the explain test's assistant. ".repeat(30);
    let mut body = chat(&system, "first question");
    body["route"] = json!("/v1/chat/completions");
    let miss = post_json(&h.url("/admin/explain"), &body).await;
    assert_eq!(miss.status.as_u16(), 200, "{}", miss.text());
    let miss = miss.json();
    assert_eq!(miss["path"], "miss", "{miss}");
    assert_eq!(miss["dispatched"], false);
    assert_eq!(miss["route"], "/v1/chat/completions");
    assert_eq!(miss["prompt"]["kind"], "text");
    assert!(urls.iter().any(|u| miss["worker"] == *u.as_str()), "{miss}");
    let cands = miss["candidates"].as_array().unwrap();
    assert_eq!(cands.len(), 2, "{miss}");
    for c in cands {
        assert!(urls.iter().any(|u| c["worker"] == *u.as_str()), "{c}");
        assert!(
            c["score"].is_number() && c["expected_wait"].is_number(),
            "{c}"
        );
        assert_eq!(c["load"]["running"], 0, "{c}");
        assert_eq!(c["prefill_rate"]["source"], "configured", "{c}");
    }
    assert_eq!(
        cands.iter().filter(|c| c["chosen"] == true).count(),
        1,
        "{miss}"
    );
    assert!(
        miss["notes"]
            .as_array()
            .unwrap()
            .contains(&json!("prefill_rate_configured"))
    );
    // A new prefix says its place in the rendezvous ranking every replica computes.
    assert!(
        miss["notes"]
            .as_array()
            .unwrap()
            .contains(&json!("rendezvous"))
            && miss["reason"]
                .as_str()
                .is_some_and(|r| r.contains("note=rendezvous(")),
        "{miss}"
    );
    assert_eq!(h.split(), vec![0, 0], "explain dispatched nothing");

    // A real request; then the follow-up is explained as a hit on the engine that served it.
    let served = post_json(
        &h.url("/v1/chat/completions"),
        &chat(&system, "first question"),
    )
    .await;
    assert_eq!(served.status.as_u16(), 200, "{}", served.text());
    let holder = engine_of(served.json()["id"].as_str().unwrap()).unwrap();
    // The path suffix says the route this time.
    let hit = post_json(
        &h.url("/admin/explain/v1/chat/completions"),
        &chat(&system, "second question"),
    )
    .await
    .json();
    assert_eq!(hit["path"], "hit", "{hit}");
    assert_eq!(hit["worker"], *urls[holder].as_str(), "{hit}");
    let held = hit["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["worker"] == *urls[holder].as_str())
        .unwrap();
    assert!(held["matched"].as_u64().unwrap() > 1000, "{held}");
    assert_eq!(h.split().iter().sum::<u64>(), 1, "still one request served");

    // Short names and the other routes.
    for (suffix, body) in [
        ("completions", json!({"prompt": "hello", "max_tokens": 1})),
        ("generate", json!({"input_ids": [1, 2, 3]})),
    ] {
        let r = post_json(&h.url(&format!("/admin/explain/{suffix}")), &body).await;
        assert_eq!(r.status.as_u16(), 200, "{suffix}: {}", r.text());
    }
    let tokens = post_json(
        &h.url("/admin/explain/generate"),
        &json!({"input_ids": [1, 2, 3]}),
    )
    .await
    .json();
    assert_eq!(
        tokens["prompt"],
        json!({"kind": "tokens", "tokens": 3, "tokens_from": {"source": "request"}})
    );
}

#[actix_rt::test]
async fn explain_refuses_what_it_cannot_read_with_an_error_body() {
    let h = fleet(1).await;
    let url = h.url("/admin/explain");
    // No route named.
    post_json(&url, &chat("s", "q"))
        .await
        .assert_error(400, "invalid_request");
    // A route that does not exist.
    post_json(
        &h.url("/admin/explain/v1/images/generations"),
        &chat("s", "q"),
    )
    .await
    .assert_error(400, "invalid_request");
    let mut body = chat("s", "q");
    body["route"] = json!(7);
    post_json(&url, &body)
        .await
        .assert_error(400, "invalid_request");
    // The body as the route itself would refuse it.
    post_json(
        &h.url("/admin/explain/chat"),
        &json!({"messages": "not a list"}),
    )
    .await
    .assert_error(400, "invalid_request");
    kvgate_tests::post(&url, "{not json")
        .await
        .assert_error(400, "invalid_request");
    assert_eq!(h.split(), vec![0]);
}

#[actix_rt::test]
async fn the_decision_log_shows_each_decision_and_what_the_engine_reported() {
    let h = fleet(2).await;
    let urls = h.fleet.urls();
    let system = "You are the decision log test's assistant. ".repeat(30);
    let url = h.url("/v1/chat/completions");
    let first = post_json(&url, &chat(&system, "one")).await;
    let mut streamed = chat(&system, "two");
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let second = post_json(&url, &streamed).await;
    let third = post_json(
        &h.url("/v1/completions"),
        &json!({"prompt": "unrelated", "max_tokens": 1}),
    )
    .await;
    let ids: Vec<String> = [&first, &second, &third]
        .iter()
        .map(|r| r.header("x-request-id").unwrap())
        .collect();
    let second_usage = sse_events(&second.text()).0.last().unwrap()["usage"].clone();
    let engines = [
        engine_of(first.json()["id"].as_str().unwrap()).unwrap(),
        engine_of(sse_events(&second.text()).0[0]["id"].as_str().unwrap()).unwrap(),
        engine_of(third.json()["id"].as_str().unwrap()).unwrap(),
    ];

    let log_url = h.url("/admin/decisions");
    let complete = |log: &Value| {
        log["decisions"]
            .as_array()
            .is_some_and(|d| d.len() == 3 && d.iter().all(|r| !r["answer"].is_null()))
    };
    let mut log = get(&log_url).await.json();
    for _ in 0..500 {
        if complete(&log) {
            break;
        }
        actix_rt::time::sleep(std::time::Duration::from_millis(20)).await;
        log = get(&log_url).await.json();
    }
    assert!(complete(&log), "{log}");
    let d = log["decisions"].as_array().unwrap();
    for (i, r) in d.iter().enumerate() {
        assert_eq!(r["request_id"], *ids[i].as_str(), "{r}");
        assert_eq!(r["worker"], *urls[engines[i]].as_str(), "{r}");
        assert_eq!(r["answer"]["outcome"], "ok", "{r}");
        assert_eq!(r["answer"]["status"], 200, "{r}");
        assert!(r["answer"]["ttft_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert!(
            r["candidates"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["worker"].is_string()),
            "{r}"
        );
    }
    assert_eq!(d[0]["route"], "/v1/chat/completions");
    assert_eq!(d[2]["route"], "/v1/completions");
    assert_eq!(d[0]["path"], "miss");
    // The second shares the first's long system prompt: predicted and reported agree that
    // most of it was cached.
    assert_eq!(d[1]["path"], "hit", "{}", d[1]);
    let predicted = d[1]["predicted_cached_tokens"].as_u64().unwrap();
    let reported = d[1]["answer"]["reported_cached_tokens"].as_u64().unwrap();
    assert_eq!(
        reported,
        second_usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    );
    assert!(predicted > 200 && reported > 200, "{}", d[1]);
    // Nothing was cached for the first: the engine leaves the field out.
    assert!(
        d[0]["answer"]["reported_cached_tokens"].is_null(),
        "{}",
        d[0]
    );

    // Following: after a sequence number, and a limit.
    let s0 = d[0]["seq"].as_u64().unwrap();
    let after = get(&h.url(&format!("/admin/decisions?since={s0}&limit=1")))
        .await
        .json();
    assert_eq!(after["decisions"].as_array().unwrap().len(), 1);
    assert_eq!(after["decisions"][0]["seq"], d[1]["seq"]);
    assert_eq!(after["last_seq"], d[1]["seq"]);
    let newest = get(&h.url("/admin/decisions?limit=1")).await.json();
    assert_eq!(newest["decisions"][0]["seq"], d[2]["seq"]);
    get(&h.url("/admin/decisions?limit=0"))
        .await
        .assert_error(400, "invalid_request");
    get(&h.url("/admin/decisions?limit=x"))
        .await
        .assert_error(400, "invalid_request");
}

#[actix_rt::test]
async fn the_gateway_keeps_the_charts_last_fifteen_minutes() {
    let h = fleet(2).await;
    // A sample is taken at start, so a page opened now already has one.
    let first = get(&h.url("/admin/history")).await.json();
    assert_eq!(first["step_secs"], 5, "{first}");
    assert!(
        !first["samples"].as_array().expect("samples").is_empty(),
        "{first}"
    );
    for stream in [true, true, false, false, false] {
        let mut body = chat("You keep the history.", "q");
        body["stream"] = json!(stream);
        let r = post_json(&h.url("/v1/chat/completions"), &body).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    // The next sample (within 5 s) counts the five answers, streamed and whole apart;
    // each answer is in the one sample of the step it ended in.
    let mut samples = Vec::new();
    for _ in 0..400 {
        let h = get(&h.url("/admin/history")).await.json();
        samples = h["samples"].as_array().cloned().unwrap_or_default();
        if samples.last().is_some_and(|s| s["requests_total"] == 5) {
            break;
        }
        actix_rt::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let last = samples.last().expect("a sample");
    assert_eq!(last["requests_total"], 5, "{samples:?}");
    let sum = |key: &str| -> u64 { samples.iter().filter_map(|s| s[key]["n"].as_u64()).sum() };
    assert_eq!(
        (sum("ttft_ms"), sum("whole_answer_ms")),
        (2, 3),
        "{samples:?}"
    );
    assert!(
        (samples.iter()).any(|s| s["ttft_ms"]["p99"].as_f64().is_some_and(|ms| ms > 0.0)),
        "{samples:?}"
    );
}

/// Explains `body` on `route`, then sends it: the worker each named.
async fn explained_then_sent(h: &Harness, route: &str, body: &Value) -> (String, String) {
    let e = post_json(&h.url(&format!("/admin/explain{route}")), body)
        .await
        .json();
    let r = post_json(&h.url(route), body).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap_or("").to_owned();
    let sent = engine_of(&id).map(|i| h.fleet.urls()[i].clone());
    (
        e["worker"].as_str().unwrap_or("").to_owned(),
        sent.unwrap_or_default(),
    )
}

#[actix_rt::test]
async fn explain_names_the_worker_the_same_request_is_then_sent_to() {
    // The random policy draws on every decision: an explain that drew too would move the
    // dispatch after it. Cache-aware: shared prefixes and new ones, hits and misses.
    for policy in [
        kvgate_policies::PolicyKind::Random,
        kvgate_policies::PolicyKind::CacheAware,
    ] {
        let h = Harness::start(4, sim(), |c| {
            c.seed = Some(11);
            c.policy.kind = policy;
        });
        h.wait_for_load_reports().await;
        let systems: Vec<String> = (0..4)
            .map(|g| format!("Group {g} of the agreement test. ").repeat(25))
            .collect();
        for i in 0..20 {
            let body = chat(&systems[i % 4], &format!("question {i}"));
            let (explained, sent) = explained_then_sent(&h, "/v1/chat/completions", &body).await;
            assert!(!sent.is_empty());
            assert_eq!(explained, sent, "{policy:?}, request {i}");
        }
    }
}
