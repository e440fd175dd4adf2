//! The ids Hugging Face transformers computes for the fixture's tokenizer and chat template
//! (`tests/fixtures/tokenizer/expected.json`, made by `make_fixture.py` there), against ours.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::path::PathBuf;

use kvgate_tokenize::ModelTokenizer;
use serde_json::{Value, json};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer")
}

fn expected() -> Value {
    let s = std::fs::read_to_string(dir().join("expected.json")).expect("expected.json");
    serde_json::from_str(&s).expect("expected.json is JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn tokenizer() -> ModelTokenizer {
    ModelTokenizer::from_path(&dir()).expect("the fixture loads")
}

#[test]
fn chats_render_and_encode_as_transformers_does() {
    let tok = tokenizer();
    assert!(tok.has_chat_template());
    assert!(
        tok.segmented(),
        "a byte-level BPE is cut at its added tokens"
    );
    for case in expected()["chats"].as_array().expect("chats") {
        let body =
            serde_json::to_vec(&json!({"model": "m", "messages": case["messages"]})).expect("body");
        let text = tok.render_chat(&body).expect("renders");
        assert_eq!(
            text,
            case["text"].as_str().expect("text"),
            "{}",
            case["messages"]
        );
        assert_eq!(
            tok.chat_ids(&body).expect("encodes"),
            ids(&case["ids"]),
            "{}",
            case["messages"]
        );
    }
}

#[test]
fn texts_encode_as_transformers_does_with_the_bos_it_adds() {
    let tok = tokenizer();
    for case in expected()["texts"].as_array().expect("texts") {
        let text = case["text"].as_str().expect("text");
        assert_eq!(
            tok.encode(text, true).expect("encodes"),
            ids(&case["ids"]),
            "{text:?}"
        );
    }
}

#[test]
fn a_tokenizer_file_finds_its_config_beside_it() {
    let tok = ModelTokenizer::from_path(&dir().join("tokenizer.json")).expect("loads");
    assert!(tok.has_chat_template());
}

#[test]
fn later_turns_reuse_the_segments_of_earlier_ones() {
    let tok = tokenizer();
    let turn1 = json!({"messages": [
        {"role": "system", "content": "A long system prompt that every turn repeats."},
        {"role": "user", "content": "first question"}]});
    let first = tok
        .chat_ids(&serde_json::to_vec(&turn1).expect("body"))
        .expect("encodes");
    let before = tok.cache_stats();
    let turn2 = json!({"messages": [
        {"role": "system", "content": "A long system prompt that every turn repeats."},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "second question"}]});
    let second = tok
        .chat_ids(&serde_json::to_vec(&turn2).expect("body"))
        .expect("encodes");
    let after = tok.cache_stats();
    // The second turn's ids start with the first turn's, less its generation prompt.
    let shared = first.len() - 5;
    assert_eq!(first[..shared], second[..shared]);
    // Segments run between added tokens: "system", "\n\n<system prompt>", "user",
    // "\n\nfirst question", "assistant", "\n\n" were seen; only the answer and the second
    // question are new.
    assert_eq!(after.misses - before.misses, 2, "{before:?} -> {after:?}");
    assert_eq!(after.hits - before.hits, 8, "{before:?} -> {after:?}");
}

#[test]
fn bad_bodies_and_missing_files_are_errors_not_panics() {
    let tok = tokenizer();
    assert!(tok.chat_ids(b"{\"messages\": 3").is_err());
    assert!(tok.chat_ids(b"{}").is_err());
    let e = ModelTokenizer::from_path(&dir().join("nope")).expect_err("no such file");
    assert!(e.to_string().contains("nope"), "{e}");
    // A role the template refuses: its raise_exception message is the error.
    let e = tok
        .chat_ids(br#"{"messages": [{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}]}"#)
        .expect_err("refused");
    assert!(e.to_string().contains("Unknown role: robot"), "{e}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Cut at added tokens and cached, or whole: the same ids, for any text with added
    /// tokens anywhere (at the edges, back to back, between spaces and newlines).
    #[test]
    fn encoding_by_segment_gives_the_tokenizers_own_ids(
        parts in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::string::string_regex("[ a-zé\\n\\t0-9.,!]{0,12}").expect("regex"),
                proptest::sample::select(vec![
                    "<|eot_id|>".to_owned(),
                    "<|begin_of_text|>".to_owned(),
                    "<|start_header_id|>".to_owned(),
                    " <|end_header_id|> ".to_owned(),
                    "<|eot_id".to_owned(),
                ]),
            ],
            0..10,
        ),
        special in proptest::bool::ANY,
    ) {
        static TOKS: std::sync::LazyLock<(ModelTokenizer, tokenizers::Tokenizer)> =
            std::sync::LazyLock::new(|| {
                let whole = tokenizers::Tokenizer::from_file(dir().join("tokenizer.json"));
                (tokenizer(), whole.expect("loads"))
            });
        let (tok, whole) = &*TOKS;
        let text = parts.concat();
        let want = whole.encode_fast(text.as_str(), special).expect("encodes");
        // Twice: the second reads the cache.
        for _ in 0..2 {
            proptest::prop_assert_eq!(tok.encode(&text, special).expect("encodes"), want.get_ids().to_vec());
        }
    }
}

#[test]
fn the_generation_prompt_follows_the_request() {
    let tok = tokenizer();
    let messages = json!([
        {"role": "user", "content": "Where is the harbour?"},
        {"role": "assistant", "content": "It lies to the"}
    ]);
    let render = |extra: serde_json::Value| {
        let mut body = json!({"model": "m", "messages": messages});
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            body[k] = v;
        }
        tok.render_chat(&serde_json::to_vec(&body).expect("body"))
            .expect("renders")
    };
    let opening = "<|start_header_id|>assistant<|end_header_id|>\n\n";
    let default = render(json!({}));
    assert!(default.ends_with(opening), "{default}");
    let without = render(json!({"add_generation_prompt": false}));
    assert!(without.ends_with("<|eot_id|>"), "{without}");
    assert_eq!(format!("{without}{opening}"), default);
    // vLLM's own kwargs win over the request's fields.
    let kwargs = render(json!({"add_generation_prompt": true,
        "chat_template_kwargs": {"add_generation_prompt": false}}));
    assert_eq!(kwargs, without);
    // The final message left open: no end of turn after it, no new opening.
    let open = render(json!({"continue_final_message": true, "add_generation_prompt": false}));
    assert!(open.ends_with("It lies to the"), "{open}");
    assert!(without.starts_with(&open));
}
