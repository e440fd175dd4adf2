//! What an engine reports and where: cache hits in OpenAI usage, the `/v1/loads` counters,
//! and `/metrics` per flavour.

use awc::http::StatusCode;
use kvgate_engine_sim::{Flavor, SimConfig};
use serde_json::{Value, json};

use crate::support::{
    endless, fast, get, get_json, one, post, post_json, raw_post, sse_data, wait_until,
};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/sglang-0.5.23/v1_loads_two_ranks.json"
);

#[actix_rt::test]
async fn a_busy_rank_loads_with_the_fixture_fields_and_zero_prefill_counters() {
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    for report in [false, true] {
        let (fleet, url) = one(SimConfig {
            report_prefill_counters: report,
            ..endless()
        });
        let busy = raw_post(
            &url,
            "/generate",
            &json!({"text": "a busy rank", "stream": true}),
        );
        wait_until("a request runs", || fleet.engine(0).stats().running == 1).await;
        let body = get_json(&format!("{url}/v1/loads")).await;
        let load = &body["loads"][0];
        assert_eq!(keys(load), keys(&fixture["loads"][0]));
        assert_eq!(load["num_running_reqs"], 1);
        let counters = (
            load["total_prefill_uncached_tokens"].as_u64().unwrap(),
            load["total_prefill_busy_us"].as_u64().unwrap(),
        );
        if report {
            assert!(counters.0 > 0 && counters.1 > 0, "{counters:?}");
        } else {
            assert_eq!(counters, (0, 0), "as SGLang 0.5.23 reports them");
        }
        drop(busy);
    }
}

/// The usage of a whole answer and of a stream's usage chunk, after the same prompt was
/// sent once before (so it hits the cache).
async fn usages(url: &str, path: &str, body: Value) -> (Value, Value) {
    let endpoint = format!("{url}{path}");
    post_json(&endpoint, &body).await;
    let whole = post_json(&endpoint, &body).await["usage"].clone();
    let mut streamed = body;
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, raw) = post(&endpoint, &streamed).await;
    assert_eq!(status, StatusCode::OK);
    let data = sse_data(&raw);
    let usage_chunk: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    (whole, usage_chunk["usage"].clone())
}

#[actix_rt::test]
async fn cached_tokens_appear_in_openai_usage_only_with_the_cache_report() {
    let prompt = "a prompt long enough to be cached the second time it is sent";
    let routes = [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 2}),
        ),
        (
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 2}),
        ),
        (
            "/v1/completions",
            json!({"prompt": [prompt, prompt], "max_tokens": 2}),
        ),
    ];
    for report in [false, true] {
        let (_fleet, url) = one(SimConfig {
            enable_cache_report: report,
            ..fast()
        });
        for (path, body) in &routes {
            let (whole, streamed) = usages(&url, path, body.clone()).await;
            for usage in [&whole, &streamed] {
                let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
                assert!(prompt_tokens > 0);
                let details = &usage["prompt_tokens_details"];
                if report {
                    // Both prompts of the batch hit: the first two requests cached them.
                    let per_prompt = if body["prompt"].is_array() { 2 } else { 1 };
                    let cached = details["cached_tokens"].as_u64().unwrap();
                    assert_eq!(cached, prompt_tokens - per_prompt, "{path}: {usage}");
                    assert_eq!(details.as_object().unwrap().len(), 1, "{details}");
                } else {
                    assert!(
                        usage
                            .as_object()
                            .unwrap()
                            .contains_key("prompt_tokens_details")
                    );
                    assert!(details.is_null(), "{path}: {usage}");
                }
            }
        }
        // `/generate` always reports the hit.
        let req = json!({"text": prompt, "sampling_params": {"max_new_tokens": 1}});
        post_json(&format!("{url}/generate"), &req).await;
        let meta = &post_json(&format!("{url}/generate"), &req).await["meta_info"];
        assert_eq!(
            meta["cached_tokens"].as_u64(),
            meta["prompt_tokens"].as_u64().map(|p| p - 1)
        );
    }
}

#[actix_rt::test]
async fn metrics_is_served_by_sglang_only_when_enabled_and_by_vllm_always() {
    for (flavor, enabled, status) in [
        (Flavor::Sglang, false, StatusCode::NOT_FOUND),
        (Flavor::Sglang, true, StatusCode::OK),
        (Flavor::SglangLegacy, false, StatusCode::NOT_FOUND),
        (Flavor::SglangLegacy, true, StatusCode::OK),
        (Flavor::Vllm, false, StatusCode::OK),
    ] {
        let (_fleet, url) = one(SimConfig {
            flavor,
            enable_metrics: enabled,
            ..fast()
        });
        let (got, body) = get(&format!("{url}/metrics")).await;
        assert_eq!(got, status, "{flavor:?} enabled={enabled}");
        if status == StatusCode::NOT_FOUND {
            let body: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body, json!({"detail": "Not Found"}));
        }
    }
    // `/v1/loads` needs no flag.
    let (_fleet, url) = one(fast());
    assert_eq!(get(&format!("{url}/v1/loads")).await.0, StatusCode::OK);
}
