use kvgate_policies::RoutingText;
use proptest::prelude::*;

use super::*;

fn check(endpoint: Endpoint, body: &str, key: RoutingText, model: Option<&str>, stream: bool) {
    let facts = request_facts(endpoint, body.as_bytes()).unwrap();
    assert_eq!(facts.key, key, "body: {body}");
    assert_eq!(facts.model.as_deref(), model);
    assert_eq!(facts.stream, stream);
}

fn text(s: &str) -> RoutingText {
    RoutingText::Text(s.to_owned())
}

#[test]
fn extracts_routing_facts() {
    check(
        Endpoint::Chat,
        r#"{"model":"m","messages":[{"role":"system","content":"be nice"},{"role":"user","content":"hi"}],"stream":true}"#,
        text("<|system|>\nbe nice\n<|user|>\nhi\n"),
        Some("m"),
        true,
    );
    check(
        Endpoint::Chat,
        r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]},{"role":"assistant","content":null}]}"#,
        text("<|user|>\nab\n<|assistant|>\n\n"),
        None,
        false,
    );
    check(
        Endpoint::Completions,
        r#"{"prompt":"hello"}"#,
        text("hello"),
        None,
        false,
    );
    check(
        Endpoint::Completions,
        r#"{"prompt":["a","b"]}"#,
        text("a\nb"),
        None,
        false,
    );
    check(
        Endpoint::Completions,
        r#"{"prompt":[1,2,3],"model":"x"}"#,
        RoutingText::Tokens(vec![1, 2, 3]),
        Some("x"),
        false,
    );
    check(
        Endpoint::Completions,
        r#"{"prompt":[[1,2],[3]]}"#,
        RoutingText::Tokens(vec![1, 2, 3]),
        None,
        false,
    );
    check(
        Endpoint::Generate,
        r#"{"text":"hey","sampling_params":{"max_new_tokens":4},"stream":false}"#,
        text("hey"),
        None,
        false,
    );
    check(
        Endpoint::Generate,
        r#"{"input_ids":[5,6],"stream":true}"#,
        RoutingText::Tokens(vec![5, 6]),
        None,
        true,
    );
    check(
        Endpoint::Chat,
        r#"{"messages":[{"role":"user","content":"caf\u00e9"}]}"#,
        text("<|user|>\ncafé\n"),
        None,
        false,
    );
}

#[test]
fn roles_are_part_of_the_key() {
    let a = request_facts(
        Endpoint::Chat,
        br#"{"messages":[{"role":"user","content":"x"}]}"#,
    )
    .unwrap();
    let b = request_facts(
        Endpoint::Chat,
        br#"{"messages":[{"role":"assistant","content":"x"}]}"#,
    )
    .unwrap();
    assert_ne!(a.key, b.key);
}

fn check_err(endpoint: Endpoint, body: &[u8], want_json_error: bool) {
    let shown: String = String::from_utf8_lossy(body).chars().take(120).collect();
    match request_facts(endpoint, body) {
        Err(ApiError::InvalidJson(_)) => assert!(want_json_error, "{shown:?}"),
        Err(ApiError::BadRequest(_)) => assert!(!want_json_error, "{shown:?}"),
        other => panic!("expected a 400 for {shown:?}, got {other:?}"),
    }
}

#[test]
fn rejects_bad_bodies_cleanly() {
    check_err(Endpoint::Chat, b"", true);
    check_err(Endpoint::Chat, b"{", true);
    check_err(Endpoint::Chat, b"[1,2]", false);
    check_err(Endpoint::Chat, b"\"str\"", false);
    check_err(Endpoint::Chat, br#"{"messages":"no"}"#, false);
    check_err(Endpoint::Chat, br#"{"messages":[],"stream":"yes"}"#, false);
    check_err(Endpoint::Chat, br#"{"model":5,"messages":[]}"#, false);
    check_err(Endpoint::Completions, br#"{}"#, false);
    check_err(Endpoint::Completions, br#"{"prompt":[1,"a"]}"#, false);
    check_err(Endpoint::Generate, br#"{"sampling_params":{}}"#, false);
    check_err(Endpoint::Generate, br#"{"input_ids":"abc"}"#, false);
    // Invalid UTF-8 in a field routing never reads is refused too.
    check_err(
        Endpoint::Completions,
        b"{\"prompt\":\"x\",\"user\":\"\xff\"}",
        true,
    );
    check_err(Endpoint::Chat, b"\"\xff\"", true);
    // Invalid UTF-8 inside a string.
    check_err(Endpoint::Completions, b"{\"prompt\":\"\xff\xfe\"}", true);
    // A 200k-deep document must be refused, not overflow the stack.
    let deep = format!(
        "{{\"prompt\":\"x\",\"extra\":{}{}}}",
        "[".repeat(200_000),
        "]".repeat(200_000)
    );
    check_err(Endpoint::Completions, deep.as_bytes(), true);
    let deep_obj = format!("{}{}", "{\"a\":".repeat(200_000), "}".repeat(200_000));
    check_err(Endpoint::Chat, deep_obj.as_bytes(), true);
    // Brackets inside strings are not nesting.
    let in_string = format!("{{\"prompt\":\"{}\"}}", "[".repeat(1000));
    assert!(request_facts(Endpoint::Completions, in_string.as_bytes()).is_ok());
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        for e in [Endpoint::Chat, Endpoint::Completions, Endpoint::Generate] {
            let _ = request_facts(e, &body);
        }
    }

    #[test]
    fn arbitrary_json_never_panics(s in "\\{(\"(model|messages|prompt|text|input_ids|stream|role|content)\"|[\\[\\]{}:,0-9]|\"[a-z]{0,3}\"|true|null){0,40}") {
        for e in [Endpoint::Chat, Endpoint::Completions, Endpoint::Generate] {
            let _ = request_facts(e, s.as_bytes());
        }
    }
}
