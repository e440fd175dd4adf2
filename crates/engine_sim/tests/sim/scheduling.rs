//! What routing depends on: the prefix cache, queueing, aborts, flushes and restarts.

use kvgate_engine_sim::{SimConfig, Tokenizer};
use serde_json::{Value, json};

use crate::support::{
    endless, fast, get_json, one, post, post_json, raw_post, read_until, wait_until,
};

pub(crate) async fn cached(url: &str, body: Value) -> u64 {
    let answer = post_json(&format!("{url}/generate"), &body).await;
    answer["meta_info"]["cached_tokens"].as_u64().unwrap()
}

pub(crate) fn ids(start: u32, len: u32) -> Value {
    json!((start..start + len).collect::<Vec<_>>())
}

#[actix_rt::test]
async fn a_repeated_prompt_reports_its_page_aligned_prefix_as_cached() {
    let (fleet, url) = one(SimConfig {
        tokenizer: Tokenizer::FourBytes,
        page_size: 16,
        enable_cache_report: true,
        ..fast()
    });
    let prompt = "0123456789".repeat(16); // 160 bytes: 40 tokens, two whole pages of 16
    let req = json!({"text": prompt, "sampling_params": {"max_new_tokens": 2}});
    assert_eq!(cached(&url, req.clone()).await, 0);
    assert_eq!(cached(&url, req).await, 32);

    let chat = json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 1});
    let first = post_json(&format!("{url}/v1/chat/completions"), &chat).await;
    let second = post_json(&format!("{url}/v1/chat/completions"), &chat).await;
    // A miss reports no details, as SGLang's usage does.
    assert!(first["usage"]["prompt_tokens_details"].is_null());
    // The chat template shifts the text, so the chat prompt shares no page with the raw one.
    assert_eq!(second["usage"]["prompt_tokens"], 46);
    assert_eq!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"],
        32
    );

    let stats = fleet.engine(0).stats();
    assert_eq!(
        (stats.prompt_tokens, stats.cached_tokens),
        (40 + 40 + 46 + 46, 64)
    );
    assert_eq!(stats.cache_tokens, 64);
}

#[actix_rt::test]
async fn requests_beyond_the_slots_wait_and_abort_request_frees_them() {
    let (fleet, url) = one(SimConfig {
        max_running_requests: 2,
        ..endless()
    });
    let mut clients = Vec::new();
    for i in 0..5 {
        let url = url.clone();
        let body = json!({"input_ids": ids(1000 * i, 20), "rid": format!("r{i}")});
        clients.push(actix_rt::spawn(async move {
            post_json(&format!("{url}/generate"), &body).await
        }));
    }
    let engine = fleet.engine(0);
    wait_until("2 run and 3 wait", || {
        let s = engine.stats();
        (s.running, s.waiting) == (2, 3)
    })
    .await;
    let load = &get_json(&format!("{url}/v1/loads")).await["loads"][0];
    assert_eq!(
        (
            load["num_running_reqs"].as_u64(),
            load["num_waiting_reqs"].as_u64()
        ),
        (Some(2), Some(3))
    );
    assert_eq!(load["num_waiting_uncached_tokens"], 60);

    for i in 0..5 {
        assert_eq!(
            post(
                &format!("{url}/abort_request"),
                &json!({"rid": format!("r{i}")})
            )
            .await
            .0,
            200
        );
    }
    for client in clients {
        let answer = client.await.unwrap();
        assert_eq!(answer["meta_info"]["finish_reason"]["type"], "abort");
    }
    let s = engine.stats();
    assert_eq!((s.running, s.waiting, s.aborted, s.completed), (0, 0, 5, 0));
}

#[actix_rt::test]
async fn a_client_that_hangs_up_is_aborted_and_frees_its_slot() {
    let (fleet, url) = one(SimConfig {
        max_running_requests: 1,
        ..endless()
    });
    let engine = fleet.engine(0);

    let mut streaming = raw_post(&url, "/generate", &json!({"text": "abcd", "stream": true}));
    read_until(&mut streaming, "data: ");
    assert_eq!(engine.stats().running, 1);
    drop(streaming);
    wait_until("the streaming request is aborted", || {
        engine.stats().aborted == 1
    })
    .await;

    let whole = raw_post(&url, "/v1/completions", &json!({"prompt": "abcd"}));
    wait_until("the whole-body request runs", || {
        engine.stats().running == 1
    })
    .await;
    drop(whole);
    wait_until("the whole-body request is aborted", || {
        let s = engine.stats();
        (s.aborted, s.running) == (2, 0)
    })
    .await;

    // The slot is free again.
    let answer = post_json(
        &format!("{url}/generate"),
        &json!({"text": "x", "sampling_params": {"max_new_tokens": 1}}),
    )
    .await;
    assert_eq!(answer["meta_info"]["completion_tokens"], 1);
}

#[actix_rt::test]
async fn flush_cache_empties_the_cache_but_only_when_idle() {
    let (fleet, url) = one(SimConfig {
        max_running_requests: 1,
        ..fast()
    });
    let req = json!({"input_ids": ids(0, 32), "sampling_params": {"max_new_tokens": 1}});
    assert_eq!(cached(&url, req.clone()).await, 0);
    assert_eq!(fleet.engine(0).stats().cache_tokens, 32);

    let (status, _) = post(&format!("{url}/flush_cache"), &json!({})).await;
    assert_eq!(status, 200);
    let stats = fleet.engine(0).stats();
    assert_eq!((stats.cache_tokens, stats.flushes), (0, 1));
    assert_eq!(cached(&url, req).await, 0);

    let busy = raw_post(
        &url,
        "/generate",
        &json!({"text": "abcd", "sampling_params": {"max_new_tokens": 30000}}),
    );
    // Running, and its prompt cached (its prefill may end a moment after it is admitted).
    wait_until("a request runs with its prompt cached", || {
        let s = fleet.engine(0).stats();
        s.running == 1 && s.cache_tokens > 32
    })
    .await;
    let before = fleet.engine(0).stats().cache_tokens;
    assert_eq!(post(&format!("{url}/flush_cache"), &json!({})).await.0, 400);
    assert_eq!(fleet.engine(0).stats().cache_tokens, before);
    drop(busy);
}

#[actix_rt::test]
async fn restart_aborts_in_flight_work_empties_the_cache_and_changes_startup_time() {
    let (fleet, url) = one(fast());
    let req = json!({"input_ids": ids(0, 32), "sampling_params": {"max_new_tokens": 1}});
    cached(&url, req.clone()).await;
    let before = get_json(&format!("{url}/server_info")).await["startup_time"]
        .as_f64()
        .unwrap();

    let url2 = url.clone();
    let long = actix_rt::spawn(async move {
        post_json(
            &format!("{url2}/generate"),
            &json!({"text": "abcd", "sampling_params": {"max_new_tokens": 30000}}),
        )
        .await
    });
    wait_until("a request runs", || fleet.engine(0).stats().running == 1).await;
    fleet.engine(0).restart();
    assert_eq!(
        long.await.unwrap()["meta_info"]["finish_reason"]["type"],
        "abort"
    );

    let after = get_json(&format!("{url}/server_info")).await["startup_time"]
        .as_f64()
        .unwrap();
    assert!(after > before);
    let stats = fleet.engine(0).stats();
    assert_eq!(
        (
            stats.cache_tokens,
            stats.restarts,
            stats.aborted,
            stats.requests
        ),
        (0, 1, 1, 2)
    );
    assert_eq!(cached(&url, req).await, 0);
}

#[actix_rt::test]
async fn dp_ranks_keep_separate_caches_and_loads() {
    let (_fleet, url) = one(SimConfig {
        dp_size: 2,
        report_prefill_counters: true,
        ..fast()
    });
    let pinned = |rank: &str, r: u64| json!({"input_ids": ids(0, 32), rank: r, "sampling_params": {"max_new_tokens": 1}});
    assert_eq!(cached(&url, pinned("routed_dp_rank", 1)).await, 0);
    assert_eq!(cached(&url, pinned("routed_dp_rank", 0)).await, 0);
    // All but the last token, at page size 1.
    assert_eq!(cached(&url, pinned("data_parallel_rank", 1)).await, 31);

    let loads = get_json(&format!("{url}/v1/loads")).await;
    let uncached = |r: usize| {
        loads["loads"][r]["total_prefill_uncached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!((uncached(0), uncached(1)), (32, 33));
    let rate = loads["loads"][1]["cache_hit_rate"].as_f64().unwrap();
    assert!((rate - 31.0 / 64.0).abs() < 1e-9, "{rate}");
}
