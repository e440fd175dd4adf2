//! Workers that restart, leave and come back while requests are in flight.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]
#![expect(
    clippy::disallowed_methods,
    reason = "a request in flight across a worker's restart; the test awaits it"
)]

use std::time::Duration;

use futures_util::StreamExt;
use kvgate_engine_sim::SimConfig;
use kvgate_tests::{Harness, get, post_json, wait_for, wait_for_async};
use serde_json::{Value, json};

fn long_sim() -> SimConfig {
    SimConfig {
        default_max_new_tokens: 20_000,
        ..SimConfig::default()
    }
}

async fn in_flight(h: &Harness, url: &str) -> Value {
    let w = get(&h.url("/workers")).await.json();
    w["workers"]
        .as_array()
        .expect("a worker list")
        .iter()
        .find(|w| w["url"] == url)
        .map_or(Value::Null, |w| w["in_flight"].clone())
}

/// How many answers the decision log has recorded with `outcome`.
async fn answers(h: &Harness, outcome: &str) -> usize {
    let log = get(&h.url("/admin/decisions")).await.json();
    log["decisions"].as_array().map_or(0, |d| {
        d.iter()
            .filter(|r| r["answer"]["outcome"] == outcome)
            .count()
    })
}

/// A streamed request that runs until dropped, once its first event arrived.
async fn long_stream(
    h: &Harness,
) -> awc::ClientResponse<
    impl futures_util::Stream<Item = Result<bytes::Bytes, awc::error::PayloadError>>,
> {
    let mut resp = kvgate_tests::client()
        .post(h.url("/generate"))
        .send_json(&json!({"text": "a long story", "stream": true, "sampling_params": {"max_new_tokens": 20000}}))
        .await
        .expect("the stream starts");
    let mut seen = Vec::new();
    while !seen.windows(6).any(|w| w == b"data: ") {
        let chunk = resp
            .next()
            .await
            .expect("more of the stream")
            .expect("a chunk");
        seen.extend_from_slice(&chunk);
    }
    resp
}

#[actix_rt::test]
async fn a_worker_removed_and_added_again_keeps_an_exact_in_flight_count() {
    // The removal's drain gives up at once, so the old stream outlives its registration.
    let h = Harness::start(1, long_sim(), |c| c.shutdown_grace_period = Duration::ZERO);
    let url = h.fleet.urls()[0].clone();
    let old = long_stream(&h).await;
    assert_eq!(in_flight(&h, &url).await, 1);
    let encoded = url.replace(':', "%3A").replace('/', "%2F");
    assert_eq!(
        kvgate_tests::delete(&h.url(&format!("/workers/{encoded}")))
            .await
            .status
            .as_u16(),
        200
    );
    assert_eq!(
        post_json(&h.url("/workers"), &json!({"url": url}))
            .await
            .status
            .as_u16(),
        201
    );
    assert_eq!(
        in_flight(&h, &url).await,
        0,
        "a new registration starts empty"
    );
    let new = long_stream(&h).await;
    assert_eq!(in_flight(&h, &url).await, 1);
    // The stream from the old registration ends: the new count must not move.
    drop(old);
    let engine = h.fleet.engine(0);
    wait_for(10, "the old stream's abort", || engine.stats().aborted == 1).await;
    // The relay drops its booking (the selector's Release) before its note, which records
    // the answer in the log (the order of `Relay`'s fields, http/proxy.rs): once the log
    // has it, the Release is ahead of `/workers`' ask in the selector's mailbox.
    wait_for_async(10, "the old stream's end in the decision log", || async {
        answers(&h, "abandoned").await == 1
    })
    .await;
    assert_eq!(in_flight(&h, &url).await, 1);
    drop(new);
    wait_for(10, "the new stream's abort", || engine.stats().aborted == 2).await;
    let (h, url) = (&h, &url);
    wait_for_async(10, "in_flight back to 0", || async move {
        in_flight(h, url).await == 0
    })
    .await;
}

#[actix_rt::test]
async fn a_client_that_leaves_before_any_byte_aborts_the_engine_request() {
    let h = Harness::start(1, long_sim(), |_| {});
    let url = h.url("/v1/completions");
    // Non-streaming: nothing comes back until the whole answer is done.
    let req = actix_rt::spawn(async move {
        let _ = kvgate_tests::client()
            .post(url)
            .send_json(&json!({"prompt": "write a very long essay", "max_tokens": 20000}))
            .await;
    });
    let engine = h.fleet.engine(0);
    wait_for(10, "the request to run on the engine", || {
        engine.stats().running == 1
    })
    .await;
    assert_eq!(in_flight(&h, &h.fleet.urls()[0]).await, 1);
    req.abort();
    wait_for(10, "the engine to abort it", || engine.stats().aborted == 1).await;
    let (h, worker) = (&h, &h.fleet.urls()[0]);
    wait_for_async(10, "in_flight back to 0", || async move {
        in_flight(h, worker).await == 0
    })
    .await;
}

#[actix_rt::test]
async fn an_engine_restart_at_run_time_empties_its_index_entries() {
    let h = Harness::start(2, SimConfig::default(), |c| {
        c.health.interval = Duration::from_millis(50)
    });
    for i in 0..8 {
        let body = json!({"prompt": format!("prefix number {i} ").repeat(40), "max_tokens": 1});
        assert_eq!(
            post_json(&h.url("/v1/completions"), &body)
                .await
                .status
                .as_u16(),
            200
        );
    }
    let ids: Vec<String> = {
        let w = get(&h.url("/workers")).await.json();
        h.fleet
            .urls()
            .iter()
            .map(|u| {
                w["workers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|w| w["url"] == u.as_str())
                    .unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };
    let units = |v: &Value, id: &str| -> u64 {
        v["models"][0]["per_worker"].as_array().map_or(0, |ws| {
            ws.iter()
                .filter(|w| w["worker"] == id)
                .map(|w| w["units"].as_u64().unwrap_or(0))
                .sum()
        })
    };
    let before = get(&h.url("/admin/index")).await.json();
    // Pick an engine that holds something; the other keeps its entries.
    let victim = (0..2).find(|e| units(&before, &ids[*e]) > 0).unwrap();
    let other = 1 - victim;
    h.fleet.engine(victim).restart();
    let url = h.url("/admin/index");
    let id = ids[victim].clone();
    wait_for_async(10, "the restarted engine's entries to go", || {
        let url = url.clone();
        let id = id.clone();
        async move { units(&get(&url).await.json(), &id) == 0 }
    })
    .await;
    let after = get(&h.url("/admin/index")).await.json();
    assert_eq!(units(&after, &ids[other]), units(&before, &ids[other]));
}
