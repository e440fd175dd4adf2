//! A model's own tokenizer (`tokenizer_path`): the simulator encodes chats and texts as
//! transformers does (the fixture's expected ids), reports the path, publishes those ids in
//! its KV events, and refuses what the chat template refuses.

use std::path::PathBuf;

use kvgate_engine_sim::SimConfig;
use serde_json::{Value, json};

use crate::events::{descriptor_port, first_store_after_sync};
use crate::support::{fast, get_json, one, post, post_json};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer")
}

fn expected() -> Value {
    let s = std::fs::read_to_string(fixture().join("expected.json")).unwrap();
    serde_json::from_str(&s).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| u32::try_from(x.as_u64().unwrap()).unwrap())
        .collect()
}

fn with_tokenizer() -> SimConfig {
    SimConfig {
        tokenizer_path: Some(fixture()),
        ..fast()
    }
}

#[actix_rt::test]
async fn prompts_count_the_tokens_transformers_gives_and_the_path_is_reported() {
    let (_fleet, url) = one(with_tokenizer());
    let want = expected();
    for case in want["chats"].as_array().unwrap() {
        let body = json!({"messages": case["messages"], "max_tokens": 2});
        let answer = post_json(&format!("{url}/v1/chat/completions"), &body).await;
        assert_eq!(answer["usage"]["prompt_tokens"], ids(&case["ids"]).len());
    }
    for case in want["texts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["text"] != "")
    {
        let body = json!({"prompt": case["text"], "max_tokens": 2});
        let answer = post_json(&format!("{url}/v1/completions"), &body).await;
        assert_eq!(answer["usage"]["prompt_tokens"], ids(&case["ids"]).len());
    }
    let path = fixture().to_string_lossy().into_owned();
    assert_eq!(
        get_json(&format!("{url}/model_info")).await["tokenizer_path"],
        path
    );
    assert_eq!(
        get_json(&format!("{url}/server_info")).await["tokenizer_path"],
        path
    );
}

#[actix_rt::test]
async fn kv_events_carry_the_model_tokenizers_ids() {
    let (_fleet, url) = one(SimConfig {
        page_size: 4,
        kv_events_port: Some(0),
        kv_events_topic: crate::events::TOPIC.to_owned(),
        ..with_tokenizer()
    });
    let mut sub = descriptor_port(&url).await;
    let case = &expected()["chats"][1];
    let body = json!({"messages": case["messages"], "max_tokens": 2});
    let stored = first_store_after_sync(&url, &mut sub, async {
        post_json(&format!("{url}/v1/chat/completions"), &body).await;
    })
    .await;
    let want = ids(&case["ids"]);
    assert_eq!(stored.token_ids, want[..want.len() / 4 * 4]);
}

#[actix_rt::test]
async fn a_role_the_template_refuses_is_a_400_with_its_message() {
    let (_fleet, url) = one(with_tokenizer());
    let body = json!({"messages": [{"role": "robot", "content": "x"}]});
    let (status, bytes) = post(&format!("{url}/v1/chat/completions"), &body).await;
    assert_eq!(status.as_u16(), 400);
    let err: Value = serde_json::from_slice(&bytes).unwrap();
    assert!(err.to_string().contains("Unknown role: robot"), "{err}");
}

#[test]
fn a_tokenizer_that_cannot_be_loaded_fails_the_start() {
    let cfg = SimConfig {
        tokenizer_path: Some(fixture().join("missing")),
        ..fast()
    };
    let Err(e) = kvgate_engine_sim::SimFleet::start(1, cfg) else {
        panic!("a missing tokenizer was accepted");
    };
    assert!(e.to_string().contains("missing"), "{e}");
}
