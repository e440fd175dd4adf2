//! Text requests matched on engine KV events: engines with a model's own tokenizer (the
//! byte-level BPE of `tests/fixtures/tokenizer`, or the word-level one of
//! `tests/fixtures/tokenizer-words`) publish the blocks of the chats they served; the
//! gateway loads the same tokenizer from the path the engines advertise, renders each
//! chat with its chat template and sends it where its blocks are. Without a tokenizer the
//! text goes to the approximate index, and explain says why.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::path::PathBuf;

use kvgate_engine_sim::{SimConfig, SimFleet, engine_of};
use kvgate_gateway::Gateway;
use kvgate_tests::{post_json, test_config, until_workers};
use serde_json::{Value, json};

/// The byte-level BPE fixture, or with `words` the word-level one.
fn fixture(words: bool) -> PathBuf {
    let dir = if words {
        "fixtures/tokenizer-words"
    } else {
        "fixtures/tokenizer"
    };
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(dir)
}

fn engine(tokenizer: PathBuf) -> SimConfig {
    SimConfig {
        max_running_requests: 16,
        enable_cache_report: true,
        page_size: 16,
        kv_events_port: Some(0),
        kv_events_replay_port: Some(0),
        tokenizer_path: Some(tokenizer),
        ..SimConfig::default()
    }
}

/// A conversation no other starts like: a system prompt and a first question.
fn conversation(k: usize) -> Vec<Value> {
    let topic = format!("Conversation {k} is about the {k}th harbour and its lighthouse.");
    vec![
        json!({"role": "system", "content": format!("{topic} {}", "Answer briefly and cite the logbook. ".repeat(12))}),
        json!({"role": "user", "content": format!("What happened at harbour {k} in the winter storm? {}", "Give dates. ".repeat(8))}),
    ]
}

/// Which engine serves each conversation first: no alternation a load balancer could hit.
const HOLDER: [usize; 8] = [1, 1, 0, 1, 0, 0, 0, 1];

fn served_by(answer: &Value) -> usize {
    engine_of(answer["id"].as_str().unwrap_or("")).expect("an engine's id")
}

/// Both workers' events live with blocks, and their tokenizer loaded.
fn both_ready(ws: &[Value]) -> bool {
    ws.len() == 2
        && ws.iter().all(|w| {
            w["events"]["state"] == "live"
                && w["events"]["blocks"].as_u64() > Some(0)
                && w["tokenizer"]["state"] == "ready"
        })
}

#[actix_rt::test]
async fn chats_go_where_the_engines_events_hold_their_tokens() {
    chats_follow_the_events(fixture(false)).await;
}

#[actix_rt::test]
async fn chats_go_where_the_events_say_with_a_word_level_tokenizer() {
    chats_follow_the_events(fixture(true)).await;
}

async fn chats_follow_the_events(tokenizer: PathBuf) {
    let engines = vec![engine(tokenizer.clone()), engine(tokenizer.clone())];
    let fleet = SimFleet::start_each("127.0.0.1", 0, engines).expect("fleet");
    let urls = fleet.urls();
    // Before any gateway: eight conversations, each served by a chosen engine directly.
    for (k, &holder) in HOLDER.iter().enumerate() {
        let body = json!({"messages": conversation(k), "max_tokens": 2});
        let r = post_json(&format!("{}/v1/chat/completions", urls[holder]), &body).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = urls.clone();
    cfg.seed = Some(5);
    // No --tokenizer-path: the engines' advertised tokenizer_path is a local path.
    let gw = Gateway::start(cfg).expect("gateway");
    let ws = until_workers(&gw, "live events and a loaded tokenizer", both_ready).await;
    assert_eq!(
        ws[0]["tokenizer"]["path"],
        *tokenizer.to_string_lossy(),
        "{ws:?}"
    );

    // Each conversation's second turn goes to the engine that served its first: 8 of 8,
    // where the approximate index knows none of them (chance is 1 in 256).
    for (k, &holder) in HOLDER.iter().enumerate() {
        let mut messages = conversation(k);
        messages.push(json!({"role": "assistant", "content": "The logbook says little."}));
        messages.push(json!({"role": "user", "content": "Then what does it say?"}));
        let body = json!({"messages": messages, "max_tokens": 2});
        let r = post_json(&format!("{}/v1/chat/completions", gw.url()), &body).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        let j = r.json();
        assert_eq!(served_by(&j), holder, "conversation {k}: {j}");
        let cached = j["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
        assert!(
            cached >= Some(100),
            "conversation {k} reused its first turn: {j}"
        );
    }

    // Explain: tokenized by the model's tokenizer, matched on the holder's events.
    let e = post_json(
        &format!("{}/admin/explain/v1/chat/completions", gw.url()),
        &json!({"messages": conversation(2)}),
    )
    .await
    .json();
    assert_eq!(e["worker"], *urls[HOLDER[2]].as_str(), "{e}");
    assert_eq!(e["prompt"]["kind"], "tokens", "{e}");
    assert_eq!(e["prompt"]["tokens_from"]["source"], "tokenizer", "{e}");
    let holder = e["candidates"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["worker"] == *urls[HOLDER[2]].as_str()))
        .cloned()
        .unwrap_or_default();
    assert_eq!(holder["matched_by"], "kv_events", "{e}");
    assert!(holder["matched"].as_u64() >= Some(96), "{e}");

    // A second replica, started now with its own empty index and another seed, agrees:
    // both read the same engines' events.
    let dir2 = tempfile::tempdir().expect("dir");
    let mut cfg2 = test_config(&dir2);
    cfg2.worker_urls = urls.clone();
    cfg2.seed = Some(99);
    let gw2 = Gateway::start(cfg2).expect("second gateway");
    until_workers(&gw2, "the replica's events and tokenizer", |ws| {
        ws.len() == 2
            && ws
                .iter()
                .all(|w| w["events"]["state"] == "live" && w["tokenizer"]["state"] == "ready")
    })
    .await;
    for (k, &holder) in HOLDER.iter().enumerate() {
        let body = json!({"messages": conversation(k)});
        let mut chosen = Vec::new();
        for g in [&gw, &gw2] {
            let e = post_json(
                &format!("{}/admin/explain/v1/chat/completions", g.url()),
                &body,
            )
            .await
            .json();
            chosen.push(e["worker"].clone());
        }
        assert_eq!(chosen, vec![json!(urls[holder]); 2], "conversation {k}");
    }
    gw2.stop();
    gw.stop();
}

#[actix_rt::test]
async fn without_a_tokenizer_text_uses_the_approximate_index_and_explain_says_why() {
    let fleet = SimFleet::start_each("127.0.0.1", 0, vec![engine(fixture(false))]).expect("fleet");
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = fleet.urls();
    cfg.events.tokenizer_path =
        kvgate_gateway::TokenizerPaths::all(fixture(false).join("no-such-tokenizer.json"));
    let gw = Gateway::start(cfg).expect("gateway");
    let ws = until_workers(&gw, "the failed load", |ws| {
        ws.first()
            .is_some_and(|w| w["tokenizer"]["state"] == "failed")
    })
    .await;
    assert!(
        ws[0]["tokenizer"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no-such-tokenizer.json")),
        "{ws:?}"
    );
    let e = post_json(
        &format!("{}/admin/explain/v1/chat/completions", gw.url()),
        &json!({"messages": conversation(1)}),
    )
    .await
    .json();
    assert_eq!(e["prompt"]["kind"], "text", "{e}");
    assert_eq!(e["prompt"]["tokens_from"]["source"], "text", "{e}");
    assert!(
        e["prompt"]["tokens_from"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("tokenizer not loaded")),
        "{e}"
    );
    assert!(
        e["candidates"][0]["matched_by"] == "index",
        "text is matched on the approximate index: {e}"
    );
    // The request itself is served as ever.
    let r = post_json(
        &format!("{}/v1/chat/completions", gw.url()),
        &json!({"messages": conversation(1), "max_tokens": 2}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    gw.stop();
}

#[actix_rt::test]
async fn each_model_is_tokenized_with_its_own_configured_tokenizer() {
    // Two models with different tokenizers, the gateway told both: a path for every model
    // and one for `m-words`. With one path for both, `m-words`' chats would be encoded
    // with the wrong vocabulary and match none of its engine's blocks.
    let model = |name: &str, words: bool| SimConfig {
        model: name.into(),
        ..engine(fixture(words))
    };
    // `w-lora`, an adapter of `m-words`, has no tokenizer of its own: it takes its base's.
    let words = SimConfig {
        lora_adapters: vec!["w-lora".into()],
        ..model("m-words", true)
    };
    let fleet =
        SimFleet::start_each("127.0.0.1", 0, vec![model("m-bpe", false), words]).expect("fleet");
    let urls = fleet.urls();
    for (u, m) in urls.iter().zip(["m-bpe", "m-words"]) {
        let body = json!({"model": m, "messages": conversation(3), "max_tokens": 2});
        let r = post_json(&format!("{u}/v1/chat/completions"), &body).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = urls.clone();
    let mut paths = kvgate_gateway::TokenizerPaths::all(fixture(false));
    paths.per_model.insert("m-words".into(), fixture(true));
    cfg.events.tokenizer_path = paths;
    let gw = Gateway::start(cfg).expect("gateway");
    let ws = until_workers(&gw, "live events and both tokenizers", both_ready).await;
    for (k, w) in ws.iter().enumerate() {
        let want = fixture(w["models"][0] == "m-words");
        assert_eq!(
            w["tokenizer"]["path"],
            *want.to_string_lossy(),
            "{k}: {ws:?}"
        );
    }
    for (holder, m) in ["m-bpe", "m-words"].iter().enumerate() {
        let e = post_json(
            &format!("{}/admin/explain/v1/chat/completions", gw.url()),
            &json!({"model": m, "messages": conversation(3)}),
        )
        .await
        .json();
        assert_eq!(
            e["prompt"]["tokens_from"]["source"], "tokenizer",
            "{m}: {e}"
        );
        assert_eq!(e["worker"], *urls[holder].as_str(), "{m}: {e}");
        assert_eq!(e["path"], "hit", "{m}: {e}");
        let c = &e["candidates"][0];
        assert_eq!(c["matched_by"], "kv_events", "{m}: {e}");
        assert!(c["matched"].as_u64() >= Some(100), "{m}: {e}");
    }
    let e = post_json(
        &format!("{}/admin/explain/v1/chat/completions", gw.url()),
        &json!({"model": "w-lora", "messages": conversation(3)}),
    )
    .await
    .json();
    assert_eq!(
        e["prompt"]["tokens_from"]["tokenizer"],
        *fixture(true).to_string_lossy(),
        "{e}"
    );
    gw.stop();
}
