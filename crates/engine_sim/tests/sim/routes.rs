//! Each route's shape, per flavour.

use awc::http::StatusCode;
use kvgate_engine_sim::tokenizer::{encode, render_chat};
use kvgate_engine_sim::{EngineStats, Flavor, SimConfig, SimFleet, Tokenizer};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::support::{fast, get, get_json, one, post, post_json, sse_data};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/sglang-0.5.23/v1_loads_two_ranks.json"
);

/// The token ids of a generated text (a JSON string), as a JSON list.
fn words(text: &Value) -> Value {
    json!(encode(Tokenizer::WordPieces, text.as_str().unwrap()))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Same keys, and each value of the same JSON kind, as `want`.
fn assert_same_shape(got: &Value, want: &Value) {
    let (got, want) = (got.as_object().unwrap(), want.as_object().unwrap());
    let keys = |m: &serde_json::Map<String, Value>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(got), keys(want));
    for (k, w) in want {
        assert_eq!(kind(&got[k]), kind(w), "field {k}");
    }
}

#[actix_rt::test]
async fn v1_loads_has_the_fixture_shape_per_rank() {
    let (_fleet, url) = one(SimConfig {
        dp_size: 2,
        ..fast()
    });
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();
    let body = get_json(&format!("{url}/v1/loads?include=core")).await;

    let top = |v: &Value| {
        let mut v = v.clone();
        v.as_object_mut().unwrap().remove("accelerator"); // null here, a name on a GPU
        v.as_object_mut().unwrap().remove("loads");
        v
    };
    assert_same_shape(&top(&body), &top(&fixture));
    let loads = body["loads"].as_array().unwrap();
    assert_eq!(loads.len(), 2);
    for (rank, load) in loads.iter().enumerate() {
        assert_same_shape(load, &fixture["loads"][0]);
        assert_eq!(load["dp_rank"], rank);
        assert_eq!(load["max_running_requests"], 16);
    }
    assert_eq!(body["version"], "0.5.23");

    // A consumer's typed view of the fixture reads ours too.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    #[expect(dead_code, reason = "only deserialisation is checked")]
    struct RankLoad {
        timestamp: f64,
        dp_rank: u32,
        num_running_reqs: u64,
        num_waiting_reqs: u64,
        num_waiting_uncached_tokens: u64,
        num_used_tokens: u64,
        num_total_tokens: u64,
        num_active_tokens: u64,
        num_prealloc_ready_tokens: u64,
        max_total_num_tokens: u64,
        max_running_requests: u64,
        token_usage: f64,
        gen_throughput: f64,
        cache_hit_rate: f64,
        utilization: f64,
        total_prefill_uncached_tokens: u64,
        total_prefill_busy_us: u64,
        decode_moments: Option<Vec<f64>>,
    }
    for load in [&fixture["loads"][1], &loads[1]] {
        serde_json::from_value::<RankLoad>(load.clone()).unwrap();
    }

    let rank1 = get_json(&format!("{url}/v1/loads?dp_rank=1")).await;
    assert_eq!(rank1["loads"].as_array().unwrap().len(), 1);
    assert_eq!(rank1["loads"][0]["dp_rank"], 1);
    let (status, _) = get(&format!("{url}/v1/loads?dp_rank=2")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, text) = get(&format!("{url}/v1/loads?format=prometheus")).await;
    assert_eq!(status, StatusCode::OK);
    let text = std::str::from_utf8(&text).unwrap();
    assert!(
        text.contains("sglang_num_running_reqs{dp_rank=\"1\"} 0\n"),
        "{text}"
    );
}

#[actix_rt::test]
async fn info_and_health_routes_answer_sglang_shapes() {
    let (_fleet, url) = one(SimConfig {
        dp_size: 2,
        page_size: 32,
        enable_metrics: true,
        ..fast()
    });
    for path in ["/health", "/ready", "/health_generate"] {
        let (status, body) = get(&format!("{url}{path}")).await;
        assert_eq!((status, body.len()), (StatusCode::OK, 0), "{path}");
    }
    for path in ["/server_info", "/get_server_info"] {
        let info = get_json(&format!("{url}{path}")).await;
        assert_eq!(info["model_path"], "kvgate-sim-model");
        assert_eq!(
            (info["tp_size"].as_u64(), info["dp_size"].as_u64()),
            (Some(1), Some(2))
        );
        assert_eq!(info["page_size"], 32);
        assert_eq!(info["max_running_requests"], 16);
        assert_eq!(info["max_total_num_tokens"], 200_000);
        assert_eq!(info["context_length"], 32_768);
        assert_eq!(info["disaggregation_mode"], "null");
        assert!(info["startup_time"].is_f64());
        assert_eq!(info["internal_states"].as_array().unwrap().len(), 2);
        assert_eq!(info["version"], "0.5.23");
        assert!(info["kv_events"].is_null());
    }
    for path in ["/model_info", "/get_model_info"] {
        let info = get_json(&format!("{url}{path}")).await;
        assert_eq!(info["model_path"], "kvgate-sim-model");
        assert_eq!(info["is_generation"], true);
    }
    let models = get_json(&format!("{url}/v1/models")).await;
    assert_eq!(models["object"], "list");
    let m = &models["data"][0];
    assert_eq!(
        (m["id"].as_str(), m["object"].as_str()),
        (Some("kvgate-sim-model"), Some("model"))
    );
    assert_eq!(
        (m["owned_by"].as_str(), m["root"].as_str()),
        (Some("sglang"), Some("kvgate-sim-model"))
    );
    assert_eq!(m["max_model_len"], 32_768);

    let (status, text) = get(&format!("{url}/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    let text = std::str::from_utf8(&text).unwrap();
    for gauge in [
        "num_running_reqs",
        "num_queue_reqs",
        "token_usage",
        "gen_throughput",
        "cache_hit_rate",
    ] {
        let line = format!("sglang_{gauge}{{model_name=\"kvgate-sim-model\",dp_rank=\"1\"}} ");
        assert!(text.contains(&line), "{line} missing from\n{text}");
    }
}

#[actix_rt::test]
async fn generate_answers_whole_and_streamed() {
    let (_fleet, url) = one(fast());
    let text = "The quick brown fox jumps over the lazy dog";
    let body = post_json(
        &format!("{url}/generate"),
        &json!({"text": text, "sampling_params": {"max_new_tokens": 3}}),
    )
    .await;
    assert_eq!(body["output_ids"].as_array().unwrap().len(), 3);
    // The answer's text is exactly its tokens.
    assert_eq!(words(&body["text"]), json!(body["output_ids"]));
    let meta = &body["meta_info"];
    assert_eq!(
        meta["prompt_tokens"],
        encode(Tokenizer::WordPieces, text).len()
    );
    assert_eq!(meta["completion_tokens"], 3);
    assert_eq!(meta["cached_tokens"], 0);
    assert_eq!(
        meta["finish_reason"],
        json!({"type": "length", "length": 3})
    );
    assert!(meta["id"].is_string() && meta["e2e_latency"].is_f64());

    let ids = post_json(
        &format!("{url}/generate"),
        &json!({"input_ids": [5, 6, 7], "rid": "mine"}),
    )
    .await;
    assert_eq!(
        (
            ids["meta_info"]["prompt_tokens"].as_u64(),
            ids["meta_info"]["id"].as_str()
        ),
        (Some(3), Some("mine"))
    );
    assert_eq!(ids["meta_info"]["completion_tokens"], 4); // the default

    let (status, raw) = post(
        &format!("{url}/generate"),
        &json!({"text": text, "stream": true, "sampling_params": {"max_new_tokens": 3}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let data = sse_data(&raw);
    assert_eq!(data.len(), 4);
    assert_eq!(data[3], "[DONE]");
    let chunks: Vec<Value> = data[..3]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(
            words(&c["text"]).as_array().unwrap().len(),
            i + 1,
            "text is cumulative"
        );
        assert_eq!(c["meta_info"]["completion_tokens"], i + 1);
    }
    assert!(chunks[1]["meta_info"]["finish_reason"].is_null());
    assert_eq!(chunks[2]["meta_info"]["finish_reason"]["type"], "length");
}

#[actix_rt::test]
async fn completions_answer_whole_and_streamed() {
    let (_fleet, url) = one(fast());
    let endpoint = format!("{url}/v1/completions");
    for prompt in [
        json!("abcdefgh"),
        json!(["abcdefgh"]),
        json!([1, 2]),
        json!([[1, 2]]),
    ] {
        let body = post_json(&endpoint, &json!({"prompt": prompt, "max_tokens": 2})).await;
        assert_eq!(body["object"], "text_completion");
        assert_eq!(body["model"], "kvgate-sim-model");
        let choice = &body["choices"][0];
        assert_eq!(
            (choice["index"].as_u64(), choice["finish_reason"].as_str()),
            (Some(0), Some("length"))
        );
        assert_eq!(words(&choice["text"]).as_array().unwrap().len(), 2);
        let usage = &body["usage"];
        let prompt_tokens = match &prompt {
            Value::Array(v) if v[0].is_number() => 2,
            Value::Array(v) if v[0].is_array() => 2,
            _ => encode(Tokenizer::WordPieces, "abcdefgh").len(),
        };
        assert_eq!(
            (
                usage["prompt_tokens"].as_u64(),
                usage["completion_tokens"].as_u64()
            ),
            (Some(prompt_tokens as u64), Some(2))
        );
        assert_eq!(usage["total_tokens"], prompt_tokens + 2);
        // No cache report by default.
        assert!(usage["prompt_tokens_details"].is_null(), "{usage}");
    }

    let req = json!({"prompt": "abcd", "max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}});
    let (_, raw) = post(&endpoint, &req).await;
    let data = sse_data(&raw);
    assert_eq!(
        data.len(),
        5,
        "two tokens, the finish, usage, [DONE]: {data:?}"
    );
    let chunks: Vec<Value> = data[..4]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    assert_eq!(
        words(&chunks[0]["choices"][0]["text"])
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[3]["usage"]["completion_tokens"], 2);
    assert_eq!(chunks[3]["choices"], json!([]));
    assert_eq!(data[4], "[DONE]");
}

#[actix_rt::test]
async fn a_batch_of_prompts_is_one_job_each_and_one_answer() {
    let (_fleet, url) = one(SimConfig {
        tokenizer: Tokenizer::FourBytes,
        ..fast()
    });
    let endpoint = format!("{url}/v1/completions");
    // Two prompts of 2 and 1 tokens (4 characters a token).
    for prompt in [json!(["abcdefgh", "abcd"]), json!([[1, 2], [3]])] {
        let body = post_json(&endpoint, &json!({"prompt": prompt, "max_tokens": 2})).await;
        let choices = body["choices"].as_array().unwrap();
        let index: Vec<u64> = choices
            .iter()
            .map(|c| c["index"].as_u64().unwrap())
            .collect();
        assert_eq!(index, vec![0, 1]);
        assert!(choices.iter().all(|c| c["finish_reason"] == "length"));
        let usage = &body["usage"];
        assert_eq!(
            (
                usage["prompt_tokens"].as_u64(),
                usage["completion_tokens"].as_u64(),
                usage["total_tokens"].as_u64()
            ),
            (Some(3), Some(4), Some(7))
        );
    }
    let stats: EngineStats =
        serde_json::from_value(get_json(&format!("{url}/sim/stats")).await).unwrap();
    assert_eq!((stats.requests, stats.prompt_tokens), (4, 6));

    // Streamed: each prompt's chunks carry its index; one usage chunk and one [DONE] close it.
    let req = json!({"prompt": ["abcdefgh", "abcd"], "max_tokens": 2, "stream": true,
        "stream_options": {"include_usage": true}});
    let (status, raw) = post(&endpoint, &req).await;
    assert_eq!(status, StatusCode::OK);
    let data = sse_data(&raw);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1);
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let (usage, tokens) = chunks.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["prompt_tokens"], 3);
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    for i in [0, 1] {
        let mine: Vec<&Value> = tokens
            .iter()
            .filter(|c| c["choices"][0]["index"] == i)
            .collect();
        assert_eq!(mine.len(), 3, "two tokens and the finish of prompt {i}");
        assert_eq!(mine[2]["choices"][0]["finish_reason"], "length");
    }

    // /generate answers a batch with a list, one result per prompt.
    let body = post_json(
        &format!("{url}/generate"),
        &json!({"text": ["abcdefgh", "abcd"], "sampling_params": {"max_new_tokens": 2}}),
    )
    .await;
    let prompts: Vec<u64> = body
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["meta_info"]["prompt_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(prompts, vec![2, 1]);
    let (status, _) = post(
        &format!("{url}/generate"),
        &json!({"text": ["a", "b"], "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[actix_rt::test]
async fn chat_answers_whole_and_streamed() {
    let (_fleet, url) = one(fast());
    let endpoint = format!("{url}/v1/chat/completions");
    let messages = json!([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]},
    ]);
    let body = post_json(
        &endpoint,
        &json!({"messages": messages, "max_completion_tokens": 3}),
    )
    .await;
    assert_eq!(body["object"], "chat.completion");
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(
        words(&choice["message"]["content"])
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert_eq!(choice["finish_reason"], "length");
    // Text parts are joined; the rest of the content is not text.
    let prompt = render_chat([("system", "be brief"), ("user", "hi")]);
    assert_eq!(
        body["usage"]["prompt_tokens"],
        encode(Tokenizer::WordPieces, &prompt).len()
    );
    assert!(body["usage"]["prompt_tokens_details"].is_null());

    let req = json!({"messages": messages, "max_tokens": 2, "stream": true});
    let (_, raw) = post(&endpoint, &req).await;
    let data = sse_data(&raw);
    assert_eq!(
        data.len(),
        5,
        "role, two tokens, the finish, [DONE]: {data:?}"
    );
    let chunks: Vec<Value> = data[..4]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(
        words(&chunks[1]["choices"][0]["delta"]["content"])
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert!(chunks[1]["choices"][0]["finish_reason"].is_null());
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(data[4], "[DONE]");
}

#[actix_rt::test]
async fn contract_errors_are_400_with_an_error_body() {
    let (_fleet, url) = one(SimConfig {
        dp_size: 2,
        context_length: 64,
        ..fast()
    });
    let cases = [
        ("/v1/completions", json!({"max_tokens": 2})),
        ("/v1/completions", json!({"prompt": []})),
        ("/v1/completions", json!({"prompt": ""})),
        ("/v1/completions", json!({"prompt": "x", "max_tokens": 64})),
        (
            "/v1/completions",
            json!({"prompt": "x", "routed_dp_rank": 2}),
        ),
        ("/v1/chat/completions", json!({"messages": []})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"content": "no role"}]}),
        ),
        (
            "/generate",
            json!({"sampling_params": {"max_new_tokens": 1}}),
        ),
        ("/generate", json!({"text": "a", "input_ids": [1]})),
        ("/abort_request", json!({})),
    ];
    for (path, body) in cases {
        let (status, raw) = post(&format!("{url}{path}"), &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}");
        let err: Value = serde_json::from_slice(&raw).unwrap();
        assert!(err["error"]["message"].is_string(), "{err}");
        assert_eq!(
            (err["error"]["type"].as_str(), err["error"]["code"].as_u64()),
            (Some("BadRequestError"), Some(400))
        );
    }
    let resp = awc::Client::default()
        .post(format!("{url}/v1/chat/completions"))
        .content_type("application/json")
        .send_body("{not json")
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);

    let (status, body) = get(&format!("{url}/no/such/route")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap(),
        json!({"detail": "Not Found"})
    );
    let (status, _) = get(&format!("{url}/generate")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

#[actix_rt::test]
async fn legacy_sglang_serves_load_only_on_metrics() {
    let (_fleet, url) = one(SimConfig {
        flavor: Flavor::SglangLegacy,
        enable_metrics: true,
        ..fast()
    });
    assert_eq!(
        get(&format!("{url}/v1/loads")).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&format!("{url}/server_info")).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&format!("{url}/get_server_info")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        get(&format!("{url}/get_model_info")).await.0,
        StatusCode::OK
    );
    let (_, text) = get(&format!("{url}/metrics")).await;
    let text = std::str::from_utf8(&text).unwrap();
    assert!(
        text.contains("sglang:num_running_reqs{model_name=\"kvgate-sim-model\",dp_rank=\"0\"} 0\n"),
        "{text}"
    );
    assert!(!text.contains("sglang_"));
}

#[actix_rt::test]
async fn vllm_serves_openai_routes_and_vllm_metrics() {
    let (_fleet, url) = one(SimConfig {
        flavor: Flavor::Vllm,
        ..fast()
    });
    let models = get_json(&format!("{url}/v1/models")).await;
    assert_eq!(models["data"][0]["owned_by"], "vllm");
    for path in ["/v1/loads", "/server_info", "/get_server_info"] {
        assert_eq!(
            get(&format!("{url}{path}")).await.0,
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
    assert_eq!(
        post(&format!("{url}/generate"), &json!({"text": "a"}))
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert!(get_json(&format!("{url}/version")).await["version"].is_string());

    let body = post_json(
        &format!("{url}/v1/completions"),
        &json!({"prompt": vec![1; 40], "max_tokens": 3}),
    )
    .await;
    assert_eq!(body["usage"]["completion_tokens"], 3);
    let (_, text) = get(&format!("{url}/metrics")).await;
    let text = std::str::from_utf8(&text).unwrap();
    let label = "{model_name=\"kvgate-sim-model\",engine=\"0\"}";
    for (name, value) in [
        ("num_requests_running", "0"),
        ("num_requests_waiting", "0"),
        ("kv_cache_usage_perc", "0"),
        ("prompt_tokens_total", "40"),
        ("generation_tokens_total", "3"),
        ("prefix_cache_queries_total", "40"),
        ("prefix_cache_hits_total", "0"),
    ] {
        let line = format!("vllm:{name}{label} {value}\n");
        assert!(text.contains(&line), "{line} missing from\n{text}");
    }
}

#[actix_rt::test]
async fn fixed_response_answers_without_scheduling() {
    // A decode step this slow would never finish within the test if it were scheduled.
    let cfg = SimConfig {
        fixed_response: true,
        decode_step_base: std::time::Duration::from_secs(3600),
        ..fast()
    };
    let (fleet, url) = one(cfg);
    let body = post_json(
        &format!("{url}/v1/chat/completions"),
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    let (_, raw) = post(
        &format!("{url}/generate"),
        &json!({"text": "hi", "stream": true}),
    )
    .await;
    assert_eq!(sse_data(&raw).last().unwrap(), "[DONE]");
    let stats = fleet.engine(0).stats();
    assert_eq!(
        (stats.requests, stats.completed, stats.prompt_tokens),
        (2, 2, 0)
    );
}

#[actix_rt::test]
async fn control_routes_drive_an_engine_over_http() {
    let fleet = SimFleet::start(2, fast()).unwrap();
    let url = &fleet.urls()[1];
    post_json(&format!("{url}/v1/completions"), &json!({"prompt": "abcd"})).await;
    let stats: EngineStats =
        serde_json::from_value(get_json(&format!("{url}/sim/stats")).await).unwrap();
    assert_eq!(stats, fleet.engine(1).stats());
    assert_eq!((stats.requests, stats.completed), (1, 1));
    assert_eq!(fleet.engine(0).stats().requests, 0);

    post_json(&format!("{url}/sim/fault"), &json!({"kind": "health_down"})).await;
    assert_eq!(
        get(&format!("{url}/health")).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    post_json(&format!("{url}/sim/fault"), &json!({"kind": "none"})).await;
    assert_eq!(get(&format!("{url}/health")).await.0, StatusCode::OK);
    for bad in [
        json!({"kind": "sideways"}),
        json!({"kind": "error_status", "status": 1000}),
    ] {
        assert_eq!(
            post(&format!("{url}/sim/fault"), &bad).await.0,
            StatusCode::BAD_REQUEST
        );
    }

    let before = get_json(&format!("{url}/server_info")).await["startup_time"]
        .as_f64()
        .unwrap();
    let answer = post_json(&format!("{url}/sim/restart"), &json!({})).await;
    let after = get_json(&format!("{url}/server_info")).await["startup_time"]
        .as_f64()
        .unwrap();
    assert!(after > before);
    assert_eq!(answer["startup_time"].as_f64(), Some(after));
    assert_eq!(fleet.engine(1).stats().restarts, 1);
}

#[actix_rt::test]
async fn response_ids_say_which_engine_answered() {
    let fleet = SimFleet::start(3, fast()).unwrap();
    for i in 0..3 {
        let url = format!("{}/v1/chat/completions", fleet.urls()[i]);
        let req = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        let whole = post_json(&url, &req).await;
        assert_eq!(
            kvgate_engine_sim::engine_of(whole["id"].as_str().unwrap()),
            Some(i)
        );
        let mut streamed = req.clone();
        streamed["stream"] = json!(true);
        let (_, raw) = post(&url, &streamed).await;
        let first: Value = serde_json::from_str(&sse_data(&raw)[0]).unwrap();
        assert_eq!(
            kvgate_engine_sim::engine_of(first["id"].as_str().unwrap()),
            Some(i)
        );
        let generate = post_json(
            &format!("{}/generate", fleet.urls()[i]),
            &json!({"text": "hi", "sampling_params": {"max_new_tokens": 1}}),
        )
        .await;
        let rid = generate["meta_info"]["id"].as_str().unwrap();
        assert_eq!(kvgate_engine_sim::engine_of(rid), Some(i));
    }
    assert_eq!(kvgate_engine_sim::engine_of("client-given-rid"), None);
}

#[actix_rt::test]
async fn lora_adapters_are_listed_with_their_parent_and_keep_their_own_cache() {
    let (_fleet, url) = one(SimConfig {
        flavor: Flavor::Vllm,
        enable_cache_report: true,
        lora_adapters: vec!["sql".into()],
        max_loras: 2,
        ..fast()
    });
    let models = get_json(&format!("{url}/v1/models")).await;
    assert_eq!(models["data"][0]["parent"], Value::Null, "{models}");
    assert_eq!(models["data"][1]["id"], "sql", "{models}");
    assert_eq!(models["data"][1]["parent"], "kvgate-sim-model", "{models}");
    let ask = |model: &str, salt: Option<&str>| {
        let mut b = json!({"model": model, "prompt": vec![7; 64], "max_tokens": 1});
        if let Some(s) = salt {
            b["cache_salt"] = json!(s);
        }
        b
    };
    let cached = |v: &Value| {
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0)
    };
    let url_c = format!("{url}/v1/completions");
    // The same prompt under the base model, the adapter and a salt: three caches.
    for (model, salt) in [
        ("kvgate-sim-model", None),
        ("sql", None),
        ("kvgate-sim-model", Some("t1")),
    ] {
        let first = post_json(&url_c, &ask(model, salt)).await;
        assert_eq!(cached(&first), 0, "{model} {salt:?}: {first}");
        let again = post_json(&url_c, &ask(model, salt)).await;
        assert!(cached(&again) > 0, "{model} {salt:?}: {again}");
    }
    // vLLM reads no `lora_path`: the base model runs; a model it does not serve is a 404.
    let via_path = json!({"lora_path": "nope", "prompt": vec![7; 64], "max_tokens": 1});
    assert!(cached(&post_json(&url_c, &via_path).await) > 0);
    let (status, _) = post(
        &url_c,
        &json!({"model": "nope", "prompt": [1], "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, text) = get(&format!("{url}/metrics")).await;
    let text = std::str::from_utf8(&text).unwrap_or("");
    assert!(
        text.contains("vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"}"),
        "{text}"
    );
}

#[actix_rt::test]
async fn sglang_names_an_adapter_by_lora_path() {
    let (_fleet, url) = one(SimConfig {
        enable_cache_report: true,
        lora_adapters: vec!["sql".into()],
        ..fast()
    });
    let url_c = format!("{url}/v1/completions");
    let cached = |v: &Value| {
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0)
    };
    let by_model = json!({"model": "sql", "prompt": vec![9; 64], "max_tokens": 1});
    assert_eq!(cached(&post_json(&url_c, &by_model).await), 0);
    // `lora_path` names the same adapter: its cache.
    let by_path = json!({"lora_path": "sql", "prompt": vec![9; 64], "max_tokens": 1});
    assert!(cached(&post_json(&url_c, &by_path).await) > 0);
    // Not under the base model.
    let base = json!({"prompt": vec![9; 64], "max_tokens": 1});
    assert_eq!(cached(&post_json(&url_c, &base).await), 0);
    let (status, _) = post(
        &url_c,
        &json!({"lora_path": "nope", "prompt": [1], "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}
