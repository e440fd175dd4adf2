//! Data-parallel ranks: round robin by default, pinning by `routed_dp_rank`, SGLang's refusal
//! of a rank out of range.

use awc::http::StatusCode;
use kvgate_engine_sim::{LoadBalanceMethod, SimConfig};
use serde_json::{Value, json};

use crate::scheduling::{cached, ids};
use crate::support::{fast, get_json, one, post, post_json, sse_data};

fn two_ranks() -> SimConfig {
    SimConfig {
        dp_size: 2,
        report_prefill_counters: true,
        ..fast()
    }
}

/// Each rank's cumulative uncached prefill tokens.
async fn prefilled(url: &str) -> Vec<u64> {
    let loads = get_json(&format!("{url}/v1/loads")).await;
    loads["loads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["total_prefill_uncached_tokens"].as_u64().unwrap())
        .collect()
}

fn req(start: u32, len: u32) -> Value {
    json!({"input_ids": ids(start, len), "sampling_params": {"max_new_tokens": 1}})
}

#[actix_rt::test]
async fn unpinned_requests_go_round_robin_over_the_ranks() {
    let (_fleet, url) = one(two_ranks());
    // The same prompt four times: ranks 0, 1, 0, 1, so each rank misses once, then hits.
    let mut hits = Vec::new();
    for _ in 0..4 {
        hits.push(cached(&url, req(0, 20)).await);
    }
    assert_eq!(hits, vec![0, 0, 19, 19]);
    assert_eq!(prefilled(&url).await, vec![21, 21], "2:2");
    let loads = get_json(&format!("{url}/v1/loads")).await;
    for load in loads["loads"].as_array().unwrap() {
        let rate = load["cache_hit_rate"].as_f64().unwrap();
        assert!((rate - 19.0 / 40.0).abs() < 1e-9, "{load}");
    }
    // A batch's prompts are dispatched one by one too.
    let batch = json!({"prompt": [ids(100, 10), ids(200, 30)], "max_tokens": 1});
    post_json(&format!("{url}/v1/completions"), &batch).await;
    assert_eq!(prefilled(&url).await, vec![31, 51]);
}

#[actix_rt::test]
async fn shortest_queue_stays_reachable() {
    let (_fleet, url) = one(SimConfig {
        load_balance_method: LoadBalanceMethod::ShortestQueue,
        ..two_ranks()
    });
    // Idle ranks tie, and the tie goes to rank 0 every time.
    let mut hits = Vec::new();
    for _ in 0..4 {
        hits.push(cached(&url, req(0, 20)).await);
    }
    assert_eq!(hits, vec![0, 19, 19, 19]);
    assert_eq!(prefilled(&url).await, vec![23, 0]);
}

#[actix_rt::test]
async fn a_pinned_request_goes_to_its_rank_and_leaves_the_round_robin_alone() {
    let (_fleet, url) = one(two_ranks());
    let pinned = |route: &str, field: &str, rank: u64, len: u32| {
        let mut body = match route {
            "/generate" => req(0, len),
            "/v1/completions" => json!({"prompt": ids(0, len), "max_tokens": 1}),
            _ => {
                json!({"messages": [{"role": "user", "content": "x".repeat(len as usize)}], "max_tokens": 1})
            }
        };
        body[field] = json!(rank);
        (route.to_owned(), body)
    };
    for (route, body) in [
        pinned("/generate", "routed_dp_rank", 1, 10),
        pinned("/v1/completions", "data_parallel_rank", 1, 10),
        pinned("/v1/chat/completions", "routed_dp_rank", 1, 10),
    ] {
        post_json(&format!("{url}{route}"), &body).await;
    }
    let after_pins = prefilled(&url).await;
    assert_eq!(after_pins[0], 0);
    assert!(after_pins[1] > 0);
    // The next unpinned request still starts the round robin at rank 0.
    cached(&url, req(1000, 40)).await;
    cached(&url, req(2000, 7)).await;
    assert_eq!(prefilled(&url).await, vec![40, after_pins[1] + 7]);
}

#[actix_rt::test]
async fn a_rank_out_of_range_is_refused_as_sglang_refuses_it() {
    let (fleet, url) = one(two_ranks());
    let cases = [
        (
            "/generate",
            json!({"input_ids": [1, 2], "routed_dp_rank": 2}),
            2,
        ),
        (
            "/generate",
            json!({"text": "hi", "data_parallel_rank": -1}),
            -1,
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "routed_dp_rank": 7}),
            7,
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "data_parallel_rank": 2}),
            2,
        ),
    ];
    for (path, body, rank) in &cases {
        let (status, raw) = post(&format!("{url}{path}"), body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}");
        let err: Value = serde_json::from_slice(&raw).unwrap();
        assert_eq!(
            err["error"]["message"],
            format!("routed_dp_rank={rank} out of range [0, 2)"),
            "{path}"
        );
    }
    // Streamed, the error is the stream's one event, as SGLang raises it in its generator.
    for (path, body, rank) in &cases {
        let mut body = body.clone();
        body["stream"] = json!(true);
        let (status, raw) = post(&format!("{url}{path}"), &body).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let data = sse_data(&raw);
        assert_eq!(data.len(), 2, "{data:?}");
        let err: Value = serde_json::from_str(&data[0]).unwrap();
        assert_eq!(
            err["error"]["message"],
            format!("routed_dp_rank={rank} out of range [0, 2)")
        );
        assert_eq!(data[1], "[DONE]");
    }
    assert_eq!(fleet.engine(0).stats().requests, 0);

    // One rank: rank 0 is accepted (SGLang ignores it), rank 1 is not.
    let (_fleet, url) = one(fast());
    let ok = post_json(
        &format!("{url}/generate"),
        &json!({"text": "hi", "routed_dp_rank": 0}),
    )
    .await;
    assert_eq!(ok["meta_info"]["completion_tokens"], 4);
    let (status, raw) = post(
        &format!("{url}/generate"),
        &json!({"text": "hi", "routed_dp_rank": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let err: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(
        err["error"]["message"],
        "routed_dp_rank=1 out of range [0, 1)"
    );
}
