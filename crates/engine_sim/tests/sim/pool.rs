//! One KV pool per rank, shared by running requests and the prefix cache.

use kvgate_engine_sim::SimConfig;
use serde_json::{Value, json};

use crate::scheduling::{cached, ids};
use crate::support::{fast, get_json, one, post, post_json, raw_post, wait_until};

fn ids_req(start: u32, len: u32, max_new: u64) -> Value {
    json!({"input_ids": ids(start, len), "sampling_params": {"max_new_tokens": max_new}})
}

#[actix_rt::test]
async fn a_pool_full_of_cached_prefixes_is_evicted_lru_to_admit_a_request() {
    let (fleet, url) = one(SimConfig {
        cache_capacity_tokens: 100,
        ..fast()
    });
    let (a, b, c, d) = (
        ids_req(0, 30, 1),
        ids_req(100, 30, 1),
        ids_req(200, 30, 1),
        ids_req(300, 30, 1),
    );
    for req in [&a, &b, &c] {
        assert_eq!(cached(&url, req.clone()).await, 0);
    }
    assert_eq!(fleet.engine(0).stats().cache_tokens, 90);
    assert_eq!(cached(&url, a.clone()).await, 29); // a is now more recent than b and c
    // d needs 31 tokens (its prompt and one of output) where 10 are free: b, the least
    // recently used prefix, goes.
    assert_eq!(cached(&url, d).await, 0);
    assert_eq!(fleet.engine(0).stats().cache_tokens, 90);
    assert_eq!(cached(&url, c).await, 29);
    assert_eq!(cached(&url, a).await, 29);
    assert_eq!(cached(&url, b).await, 0);
}

#[actix_rt::test]
async fn a_request_that_does_not_fit_waits_until_another_finishes() {
    let (fleet, url) = one(SimConfig {
        cache_capacity_tokens: 40_000,
        context_length: 100_000,
        ..fast()
    });
    let engine = fleet.engine(0);
    let spawn = |body: Value| {
        let url = url.clone();
        actix_rt::spawn(async move { post_json(&format!("{url}/generate"), &body).await })
    };
    // x reserves 30 010 of 40 000 tokens; y needs 20 010 and waits; z would fit, but the
    // queue is FIFO.
    let mut x = ids_req(0, 10, 30_000);
    x["rid"] = json!("x");
    let x = spawn(x);
    wait_until("x runs", || engine.stats().running == 1).await;
    let mut y = ids_req(100, 10, 20_000);
    y["rid"] = json!("y");
    let y = spawn(y);
    wait_until("y waits", || engine.stats().waiting == 1).await;
    let z = spawn(ids_req(200, 5, 2));
    wait_until("z waits", || engine.stats().waiting == 2).await;
    let load = &get_json(&format!("{url}/v1/loads")).await["loads"][0];
    assert_eq!(
        (
            load["num_running_reqs"].as_u64(),
            load["num_waiting_reqs"].as_u64()
        ),
        (Some(1), Some(2))
    );
    assert_eq!(load["num_waiting_uncached_tokens"], 15);

    // x's end frees its reservation: y and z run, and z finishes.
    post(&format!("{url}/abort_request"), &json!({"rid": "x"})).await;
    assert_eq!(
        x.await.unwrap()["meta_info"]["finish_reason"]["type"],
        "abort"
    );
    let z = z.await.unwrap();
    assert_eq!(z["meta_info"]["completion_tokens"], 2);
    assert_eq!(engine.stats().running, 1, "y runs");
    post(&format!("{url}/abort_request"), &json!({"rid": "y"})).await;
    assert_eq!(
        y.await.unwrap()["meta_info"]["finish_reason"]["type"],
        "abort"
    );

    // One that could never fit is refused up front.
    let (status, body) = post(&format!("{url}/generate"), &ids_req(0, 10, 39_991)).await;
    assert_eq!(status, 400);
    let err: Value = serde_json::from_slice(&body).unwrap();
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("max_total_num_tokens") && message.contains("40001"),
        "{message}"
    );
}

#[actix_rt::test]
async fn used_tokens_are_running_requests_kv_not_the_evictable_cache() {
    let (fleet, url) = one(SimConfig {
        cache_capacity_tokens: 1000,
        ..fast()
    });
    let busy = raw_post(&url, "/generate", &ids_req(0, 100, 800));
    wait_until("it is past its prefill", || {
        let s = fleet.engine(0).stats();
        s.running == 1 && s.generated_tokens > 0
    })
    .await;
    let load = &get_json(&format!("{url}/v1/loads")).await["loads"][0];
    let used = load["num_used_tokens"].as_u64().unwrap();
    assert!(
        (101..=900).contains(&used),
        "its prompt and its output so far: {used}"
    );
    let usage = load["token_usage"].as_f64().unwrap();
    assert!((usage - used as f64 / 1000.0).abs() < 1e-9);
    drop(busy);
    wait_until("it is gone", || fleet.engine(0).stats().running == 0).await;
    let load = &get_json(&format!("{url}/v1/loads")).await["loads"][0];
    assert_eq!(
        (
            load["num_used_tokens"].as_u64(),
            load["token_usage"].as_f64()
        ),
        (Some(0), Some(0.0))
    );
    assert!(
        fleet.engine(0).stats().cache_tokens >= 100,
        "still cached, but evictable"
    );
}

#[actix_rt::test]
async fn a_prompt_always_recomputes_its_last_token() {
    for (page_size, want) in [(1, 31), (16, 16)] {
        let (_fleet, url) = one(SimConfig {
            page_size,
            ..fast()
        });
        let req = ids_req(0, 32, 1);
        assert_eq!(cached(&url, req.clone()).await, 0);
        // 31 of 32 may come from the cache, rounded down to whole pages.
        assert_eq!(cached(&url, req).await, want, "page size {page_size}");
    }
    let long = "many words in a prompt ".repeat(8);
    for (page_size, text) in [
        (1, "a prompt of a few words, sent twice"),
        (16, long.as_str()),
    ] {
        let (_fleet, url) = one(SimConfig {
            page_size,
            ..fast()
        });
        let req = json!({"text": text, "sampling_params": {"max_new_tokens": 1}});
        post_json(&format!("{url}/generate"), &req).await;
        let meta = &post_json(&format!("{url}/generate"), &req).await["meta_info"];
        let prompt = meta["prompt_tokens"].as_u64().unwrap();
        let page = page_size as u64;
        assert!(prompt > 2 * page, "{prompt}");
        assert_eq!(meta["cached_tokens"], (prompt - 1) / page * page);
    }
}

#[actix_rt::test]
async fn the_next_turn_of_a_conversation_hits_the_last_answer() {
    let (_fleet, url) = one(SimConfig {
        enable_cache_report: true,
        ..fast()
    });
    let endpoint = format!("{url}/v1/chat/completions");
    let system = json!({"role": "system", "content": "You answer questions about caches."});
    let q1 = json!({"role": "user", "content": "What does a prefix cache keep?"});
    let turn1 = post_json(
        &endpoint,
        &json!({"messages": [system, q1], "max_tokens": 8}),
    )
    .await;
    let p1 = turn1["usage"]["prompt_tokens"].as_u64().unwrap();
    let answer = turn1["choices"][0]["message"]["content"].clone();
    let messages = json!([system, q1, {"role": "assistant", "content": answer},
        {"role": "user", "content": "And what does it evict?"}]);
    let turn2 = post_json(&endpoint, &json!({"messages": messages, "max_tokens": 8})).await;
    // All of turn 1 but its last output token, whose KV was never computed.
    assert_eq!(
        turn2["usage"]["prompt_tokens_details"]["cached_tokens"],
        p1 + 8 - 1
    );
}
