//! LoRA adapters and cache salts: a request under an adapter goes to an engine that has
//! it, its prefixes are matched under that adapter alone (an adapter's KV cache is not
//! its base model's), and requests with different salts never share a prefix.

use kvgate_engine_sim::{Flavor, SimConfig, SimFleet, engine_of};
use kvgate_gateway::Gateway;
use kvgate_tests::{
    Harness, Reply, add_with_events, port_free_on, post_json, publishing_engine, test_config,
    until_workers,
};
use serde_json::{Value, json};

fn engine(adapters: &[&str]) -> SimConfig {
    SimConfig {
        max_running_requests: 16,
        enable_cache_report: true,
        lora_adapters: adapters.iter().map(|a| (*a).to_owned()).collect(),
        ..SimConfig::default()
    }
}

fn chat(model: &str, system: &str, question: &str) -> Value {
    json!({"model": model, "max_tokens": 2, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question}]})
}

fn landed(r: &Reply) -> usize {
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    engine_of(r.json()["id"].as_str().unwrap_or("")).unwrap_or(usize::MAX)
}

fn cached(r: &Reply) -> u64 {
    r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

/// Every request of `runs` landed on one engine of `allowed`, the first with nothing
/// cached and every later one a hit there.
fn kept_inside(name: &str, runs: &[(usize, u64)], allowed: &[usize]) {
    let first = runs[0].0;
    assert!(allowed.contains(&first), "{name}: {runs:?}");
    assert!(
        runs.iter().all(|(e, _)| *e == first),
        "{name} moved: {runs:?}"
    );
    assert_eq!(
        runs[0].1, 0,
        "{name}'s first request found a cache: {runs:?}"
    );
    assert!(runs[1..].iter().all(|(_, c)| *c > 0), "{name}: {runs:?}");
}

#[actix_rt::test]
async fn each_adapter_lands_where_it_is_loaded_and_its_hits_stay_inside_it() {
    // Two adapters over one base model on four engines, each adapter on two.
    let sims = vec![
        engine(&["sql"]),
        engine(&["sql"]),
        engine(&["chat"]),
        engine(&["chat"]),
    ];
    let h = Harness::start_each(sims, |c| c.seed = Some(11));
    h.wait_for_load_reports().await;
    // One system prompt shared by both adapters' requests.
    let system = "You answer questions about the quarterly report. ".repeat(40);
    let (mut sql, mut chat_runs) = (Vec::new(), Vec::new());
    for i in 0..20 {
        for (model, runs) in [("sql", &mut sql), ("chat", &mut chat_runs)] {
            let r = post_json(
                &h.url("/v1/chat/completions"),
                &chat(model, &system, &format!("question {i} for {model}")),
            )
            .await;
            runs.push((landed(&r), cached(&r)));
        }
    }
    // kvgate's model list keeps each adapter's base, as vLLM's does.
    let models = kvgate_tests::get(&h.url("/v1/models")).await.json();
    let card = |id: &str| {
        (models["data"].as_array().into_iter().flatten())
            .find(|m| m["id"] == id)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(card("sql")["parent"], "kvgate-sim-model", "{models}");
    assert_eq!(card("kvgate-sim-model")["parent"], Value::Null, "{models}");
    kept_inside("sql", &sql, &[0, 1]);
    kept_inside("chat", &chat_runs, &[2, 3]);
    // One index, the base model's, holds both adapters' prefixes (kept apart by their
    // keys' scope): adapters and salts add no index of their own.
    let index = kvgate_tests::get(&h.url("/admin/index")).await.json();
    let models = index["models"].as_array().cloned().unwrap_or_default();
    assert_eq!(models.len(), 1, "{index}");
    assert_eq!(models[0]["model"], "kvgate-sim-model", "{index}");
    assert_eq!(
        models[0]["per_worker"].as_array().map(Vec::len),
        Some(2),
        "one holder per adapter: {index}"
    );
}

#[actix_rt::test]
async fn the_base_models_prefix_is_not_a_hit_for_an_adapter_nor_one_salts_for_another() {
    // Both engines serve the base model and the adapter.
    let h = Harness::start_each(vec![engine(&["sql"]), engine(&["sql"])], |c| {
        c.seed = Some(4)
    });
    h.wait_for_load_reports().await;
    let model = "kvgate-sim-model";
    let system = "Shared instructions for every tenant and adapter. ".repeat(40);
    let base = post_json(
        &h.url("/v1/chat/completions"),
        &chat(model, &system, "base question"),
    )
    .await;
    let holder = landed(&base);
    let explain = |body: Value| {
        let url = h.url("/admin/explain/v1/chat/completions");
        async move { post_json(&url, &body).await.json() }
    };
    // The base model's prefix is a hit for the base model only.
    let again = explain(chat(model, &system, "another base question")).await;
    assert_eq!(again["path"], "hit", "{again}");
    for body in [
        chat("sql", &system, "adapter question"),
        json!({"model": model, "lora_path": "sql", "max_tokens": 2,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "q"}]}),
        json!({"model": model, "cache_salt": "tenant-a", "max_tokens": 2,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "q"}]}),
    ] {
        let e = explain(body.clone()).await;
        assert_eq!(e["path"], "miss", "{body}: {e}");
    }
    // Under the adapter, the adapter's own prefix is a hit; the engine agrees.
    let first = post_json(
        &h.url("/v1/chat/completions"),
        &chat("sql", &system, "adapter question"),
    )
    .await;
    let at = landed(&first);
    assert_eq!(
        cached(&first),
        0,
        "the engine keeps the adapter's cache apart"
    );
    let second = post_json(
        &h.url("/v1/chat/completions"),
        &json!({"model": model, "lora_path": "sql", "max_tokens": 2,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "q2"}]}),
    )
    .await;
    assert_eq!(
        landed(&second),
        at,
        "SGLang's lora_path names the same adapter"
    );
    assert!(cached(&second) > 0);
    // Salts: tenant a's prefix is a hit for tenant a only.
    let salted = |salt: &str, q: &str| {
        json!({"model": model, "cache_salt": salt, "max_tokens": 2,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}]})
    };
    let a = post_json(&h.url("/v1/chat/completions"), &salted("tenant-a", "q")).await;
    assert_eq!(cached(&a), 0);
    let a_again = explain(salted("tenant-a", "q3")).await;
    assert_eq!(a_again["path"], "hit", "{a_again}");
    let b = explain(salted("tenant-b", "q3")).await;
    assert_eq!(b["path"], "miss", "{b}");
    let _ = holder;
}

#[actix_rt::test]
async fn an_adapter_goes_only_to_the_engines_that_list_it() {
    let h = Harness::start_each(vec![engine(&["sql"]), engine(&[])], |c| c.seed = Some(2));
    h.wait_for_load_reports().await;
    // Listed by engine 0 alone: every request goes there.
    for i in 0..6 {
        let r = post_json(
            &h.url("/v1/chat/completions"),
            &chat("sql", "p", &format!("q{i}")),
        )
        .await;
        assert_eq!(landed(&r), 0);
    }
    // A model nobody serves is kvgate's 404, named.
    let r = post_json(&h.url("/v1/chat/completions"), &chat("nope", "p", "q")).await;
    r.assert_error(404, "model_not_found");
}

#[actix_rt::test]
async fn with_vllm_events_an_adapters_blocks_are_matched_under_the_adapter() {
    let host = ["127.0.0.1"];
    let ports: Vec<u16> = (0..4).map(|_| port_free_on(&host)).collect();
    let vllm = |k: usize| SimConfig {
        flavor: Flavor::Vllm,
        page_size: 16,
        lora_adapters: vec!["sql".into()],
        kv_events_port: Some(ports[2 * k]),
        kv_events_replay_port: Some(ports[2 * k + 1]),
        ..publishing_engine()
    };
    let fleet = SimFleet::start_each(host[0], 0, vec![vllm(0), vllm(1)]).expect("engines");
    let urls = fleet.urls();
    let prompt: Vec<u32> = (0..256).map(|i| 100 + i).collect();
    let completion = |model: &str, tail: u32| {
        let mut p = prompt.clone();
        p.push(tail);
        json!({"model": model, "prompt": p, "max_tokens": 1})
    };
    // The same tokens: under the base model on engine 0, under the adapter on engine 1,
    // sent before the gateway knows them (replay brings both).
    for (u, model) in [(&urls[0], "kvgate-sim-model"), (&urls[1], "sql")] {
        let r = post_json(&format!("{u}/v1/completions"), &completion(model, 1)).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    // Other tokens under a tenant's salt on engine 1 (vLLM sends the salt only in the
    // first block's extra_keys).
    let salted = |salt: &str, tail: u32| {
        let mut p: Vec<u32> = (0..256).map(|i| 3000 + i).collect();
        p.push(tail);
        json!({"prompt": p, "max_tokens": 1, "cache_salt": salt})
    };
    let r = post_json(
        &format!("{}/v1/completions", urls[1]),
        &salted("tenant-a", 1),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let dir = tempfile::tempdir().expect("dir");
    let gw = Gateway::start(test_config(&dir)).expect("gateway");
    for (k, u) in urls.iter().enumerate() {
        add_with_events(&gw, u, ports[2 * k], ports[2 * k + 1]).await;
    }
    until_workers(&gw, "both engines' events live, with their blocks", |ws| {
        ws.len() == 2
            && ws.iter().all(|w| {
                w["events"]["state"] == "live" && w["events"]["blocks"].as_u64() >= Some(16)
            })
            && ws
                .iter()
                .any(|w| w["events"]["blocks"].as_u64() >= Some(32))
    })
    .await;
    let explain = |body: Value| {
        let url = format!("{}/admin/explain/v1/completions", gw.url());
        async move { post_json(&url, &body).await.json() }
    };
    // Each request is matched on the blocks of its own scope, from the events.
    for (model, holder) in [("sql", 1), ("kvgate-sim-model", 0)] {
        let e = explain(completion(model, 2)).await;
        assert_eq!(e["path"], "hit", "{model}: {e}");
        assert_eq!(e["worker"], *urls[holder].as_str(), "{model}: {e}");
        let held = e["candidates"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["worker"] == *urls[holder].as_str()))
            .cloned()
            .unwrap_or_default();
        assert_eq!(held["matched_by"], "kv_events", "{model}: {e}");
        assert!(held["matched"].as_u64() >= Some(256), "{model}: {e}");
        let notes = e["notes"].to_string();
        assert_eq!(notes.contains("adapter"), model == "sql", "{e}");
    }
    // The tenant's prefix is matched for the tenant alone.
    let a = explain(salted("tenant-a", 2)).await;
    assert_eq!(a["path"], "hit", "{a}");
    assert_eq!(a["worker"], *urls[1].as_str(), "{a}");
    let b = explain(salted("tenant-b", 2)).await;
    assert_eq!(b["path"], "miss", "{b}");
    gw.stop();
}

#[actix_rt::test]
async fn a_lora_path_sent_to_vllm_engines_is_routed_as_the_base_model() {
    // vLLM reads no `lora_path`: it runs the base model, so the base model's prefix is the
    // request's own, and no adapter narrows the engines.
    let vllm = SimConfig {
        flavor: Flavor::Vllm,
        ..engine(&["sql"])
    };
    let h = Harness::start_each(vec![vllm.clone(), vllm], |c| c.seed = Some(6));
    h.wait_for_load_reports().await;
    let model = "kvgate-sim-model";
    let system = "Instructions every request shares, base model only. ".repeat(40);
    let base = post_json(&h.url("/v1/chat/completions"), &chat(model, &system, "q1")).await;
    let holder = landed(&base);
    let body = json!({"model": model, "lora_path": "sql", "max_tokens": 2,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "q2"}]});
    let e = post_json(&h.url("/admin/explain/v1/chat/completions"), &body)
        .await
        .json();
    assert_eq!(e["path"], "hit", "{e}");
    assert_eq!(e["worker"], *h.fleet.urls()[holder].as_str(), "{e}");
    assert!(!e["notes"].to_string().contains("adapter"), "{e}");
    let r = post_json(&h.url("/v1/chat/completions"), &body).await;
    assert_eq!(landed(&r), holder);
    assert!(
        cached(&r) > 0,
        "the engine ran the base model: {}",
        r.text()
    );
}
