//! Text requests for a model the gateway has no tokenizer for, matched on the engines' KV
//! events through the engines' own render routes (vLLM's `/v1/chat/completions/render` and
//! `/v1/completions/render`): the gateway asks an engine for the prompt's ids, once per
//! body.

use std::path::PathBuf;

use kvgate_engine_sim::{Flavor, SimConfig, SimFleet};
use kvgate_gateway::Gateway;
use kvgate_tests::{
    add_with_events, port_free_on, post_json, publishing_engine, test_config, until_workers,
};
use serde_json::{Value, json};

fn vllm(port: u16, replay: u16) -> SimConfig {
    SimConfig {
        flavor: Flavor::Vllm,
        page_size: 16,
        kv_events_port: Some(port),
        kv_events_replay_port: Some(replay),
        tokenizer_path: Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/tokenizer")),
        ..publishing_engine()
    }
}

fn chat(k: usize) -> Value {
    json!({"max_tokens": 2, "messages": [
        {"role": "system", "content": format!("Harbour {k}'s logbook. {}", "Answer from the logbook only. ".repeat(20))},
        {"role": "user", "content": format!("What happened at harbour {k}?")}]})
}

#[actix_rt::test]
async fn without_a_tokenizer_here_the_engines_render_text_prompts_for_matching() {
    let host = ["127.0.0.1"];
    let ports: Vec<u16> = (0..4).map(|_| port_free_on(&host)).collect();
    let fleet = SimFleet::start_each(
        host[0],
        0,
        vec![vllm(ports[0], ports[1]), vllm(ports[2], ports[3])],
    )
    .expect("engines");
    let urls = fleet.urls();
    // Conversation k served first by engine k % 2, before the gateway knows them.
    for k in 0..4 {
        let r = post_json(&format!("{}/v1/chat/completions", urls[k % 2]), &chat(k)).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    let dir = tempfile::tempdir().expect("dir");
    let gw = Gateway::start(test_config(&dir)).expect("gateway");
    for (k, u) in urls.iter().enumerate() {
        add_with_events(&gw, u, ports[2 * k], ports[2 * k + 1]).await;
    }
    let ws = until_workers(&gw, "live events, prompts rendered by the engines", |ws| {
        ws.len() == 2
            && ws.iter().all(|w| {
                w["events"]["state"] == "live"
                    && w["events"]["blocks"].as_u64() > Some(0)
                    && w["tokenizer"]["state"] == "render"
            })
    })
    .await;
    assert!(ws[0]["tokenizer"]["reason"].is_string(), "{ws:?}");
    let renders = |i: usize| fleet.engine(i).stats().renders;
    for k in 0..4 {
        let before = renders(0) + renders(1);
        let e = post_json(
            &format!("{}/admin/explain/v1/chat/completions", gw.url()),
            &chat(k),
        )
        .await
        .json();
        assert_eq!(e["prompt"]["kind"], "tokens", "{k}: {e}");
        assert_eq!(e["prompt"]["tokens_from"]["source"], "render", "{k}: {e}");
        assert_eq!(e["path"], "hit", "{k}: {e}");
        assert_eq!(e["worker"], *urls[k % 2].as_str(), "{k}: {e}");
        // The same body sent: matched on the same ids, rendered once.
        let r = post_json(&format!("{}/v1/chat/completions", gw.url()), &chat(k)).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        let cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
        assert!(
            cached >= Some(100),
            "{k} reused its first turn: {}",
            r.text()
        );
        assert_eq!(renders(0) + renders(1), before + 1, "{k}");
    }
    // A conversation's next turn is routed at once on its first turn's render (a prefix of
    // its own), and its whole render is asked off the request path for the turn after.
    let mut next = chat(1);
    if let Some(m) = next["messages"].as_array_mut() {
        m.push(json!({"role": "assistant", "content": "The logbook notes a storm."}));
        m.push(json!({"role": "user", "content": "And after the storm?"}));
    }
    let before = renders(0) + renders(1);
    let url = format!("{}/admin/explain/v1/chat/completions", gw.url());
    let e = post_json(&url, &next).await.json();
    assert_eq!(e["prompt"]["tokens_from"]["source"], "render", "{e}");
    assert_eq!(e["prompt"]["tokens_from"]["prefix_messages"], 2, "{e}");
    assert_eq!(e["path"], "hit", "{e}");
    assert_eq!(e["worker"], *urls[1].as_str(), "{e}");
    kvgate_tests::wait_for_async(10, "the whole turn rendered in the background", || {
        let (url, next) = (url.clone(), next.clone());
        async move {
            let e = post_json(&url, &next).await.json();
            e["prompt"]["tokens_from"]["cached"] == true
                && e["prompt"]["tokens_from"]["prefix_messages"].is_null()
        }
    })
    .await;
    assert_eq!(renders(0) + renders(1), before + 1);
    // A completion's string prompt goes through the completions render.
    let prompt = "A string prompt about the lighthouse keeper's diary. ".repeat(10);
    let body = json!({"prompt": prompt, "max_tokens": 1});
    let r = post_json(&format!("{}/v1/completions", gw.url()), &body).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let e = post_json(&format!("{}/admin/explain/v1/completions", gw.url()), &body)
        .await
        .json();
    assert_eq!(e["prompt"]["tokens_from"]["source"], "render", "{e}");
    assert_eq!(e["prompt"]["tokens_from"]["cached"], true, "{e}");
    gw.stop();
}

#[actix_rt::test]
async fn engines_without_the_render_routes_are_asked_once() {
    let host = ["127.0.0.1"];
    let ports: Vec<u16> = (0..2).map(|_| port_free_on(&host)).collect();
    let no_render = SimConfig {
        render_routes: false,
        ..vllm(ports[0], ports[1])
    };
    let fleet = SimFleet::start_each(host[0], 0, vec![no_render]).expect("engine");
    let url = fleet.urls()[0].clone();
    let dir = tempfile::tempdir().expect("dir");
    let gw = Gateway::start(test_config(&dir)).expect("gateway");
    add_with_events(&gw, &url, ports[0], ports[1]).await;
    until_workers(&gw, "events live, render offered", |ws| {
        ws.first()
            .is_some_and(|w| w["events"]["state"] == "live" && w["tokenizer"]["state"] == "render")
    })
    .await;
    let explain = format!("{}/admin/explain/v1/chat/completions", gw.url());
    let first = post_json(&explain, &chat(0)).await.json();
    let why = first["prompt"]["tokens_from"]["reason"].to_string();
    assert!(why.contains("404"), "{first}");
    // Not asked again: the model is now without a way to tokenize, and says so.
    let again = post_json(&explain, &chat(1)).await.json();
    let why = again["prompt"]["tokens_from"]["reason"].to_string();
    assert!(why.contains("no render route"), "{again}");
    let ws = kvgate_tests::workers(&gw).await;
    assert_eq!(ws[0]["tokenizer"]["state"], "missing", "{ws:?}");
    gw.stop();
}
