//! The body parsers against serde_json and each other: every shape of the three routes'
//! bodies, scripted and as properties. Over 600 lines because each case is a short body and
//! its expected facts, kept together.

use kvgate_policies::RoutingText;
use proptest::prelude::*;

use super::*;

/// [`request_facts`] of a copy of `body`.
fn facts(
    endpoint: Endpoint,
    body: impl AsRef<[u8]>,
    prompt: bool,
) -> Result<RequestFacts, FactsError> {
    request_facts(endpoint, &Bytes::copy_from_slice(body.as_ref()), prompt)
}

fn check(endpoint: Endpoint, body: &str, key: RoutingText, model: Option<&str>, stream: bool) {
    let facts = facts(endpoint, body.as_bytes(), true).unwrap();
    assert_eq!(facts.key, key, "body: {body}");
    assert_eq!(facts.model.as_deref(), model);
    assert_eq!(facts.stream, stream);
}

fn text(s: &str) -> RoutingText {
    RoutingText::Text(s.into())
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
fn without_the_prompt_the_rest_is_read_and_the_key_is_empty() {
    let body = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let f = facts(Endpoint::Chat, body, false).unwrap();
    assert_eq!(f.key, RoutingText::Empty);
    assert_eq!(f.model.as_deref(), Some("m"));
    assert!(f.stream);
    let f = facts(Endpoint::Generate, br#"{"input_ids":[1,2]}"#, false).unwrap();
    assert_eq!(f.key, RoutingText::Empty);
    assert!(facts(Endpoint::Generate, br#"{"input_ids":"x"}"#, false).is_err());
}

#[test]
fn roles_are_part_of_the_key() {
    let a = facts(
        Endpoint::Chat,
        br#"{"messages":[{"role":"user","content":"x"}]}"#,
        true,
    )
    .unwrap();
    let b = facts(
        Endpoint::Chat,
        br#"{"messages":[{"role":"assistant","content":"x"}]}"#,
        true,
    )
    .unwrap();
    assert_ne!(a.key, b.key);
}

fn check_err(endpoint: Endpoint, body: &[u8], want_json_error: bool) {
    // A policy that does not read the prompt gets the same checks.
    assert_eq!(
        facts(endpoint, body, false).err().map(|e| e.to_string()),
        facts(endpoint, body, true).err().map(|e| e.to_string()),
    );
    let shown: String = String::from_utf8_lossy(body).chars().take(120).collect();
    match facts(endpoint, body, true) {
        Err(FactsError::InvalidJson(_)) => assert!(want_json_error, "{shown:?}"),
        Err(FactsError::BadRequest(_)) => assert!(!want_json_error, "{shown:?}"),
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
    let deep_list = "[".repeat(300);
    for (e, b) in [
        (Endpoint::Completions, deep.as_bytes()),
        (Endpoint::Chat, deep_obj.as_bytes()),
        (Endpoint::Generate, deep_list.as_bytes()),
    ] {
        match facts(e, b, true) {
            Err(FactsError::InvalidJson(m)) => assert_eq!(m, "nesting deeper than 128 levels"),
            other => panic!("{other:?}"),
        }
    }
    // Deeper than the fast path reads, within the limit: serde reads it.
    let nested = format!(
        "{{\"prompt\":\"x\",\"extra\":{}{}}}",
        "[".repeat(100),
        "]".repeat(100)
    );
    assert!(facts(Endpoint::Completions, nested.as_bytes(), true).is_ok());
    // Brackets inside strings are not nesting.
    let in_string = format!("{{\"prompt\":\"{}\"}}", "[".repeat(1000));
    assert!(facts(Endpoint::Completions, in_string.as_bytes(), true).is_ok());
}

/// The depth scan byte by byte, as the model the skipping scan must agree with.
fn too_deep_bytewise(body: &[u8]) -> bool {
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    for &b in body {
        if in_str {
            match (esc, b) {
                (true, _) => esc = false,
                (false, b'\\') => esc = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

proptest! {
    #[test]
    fn the_depth_scan_agrees_with_a_byte_by_byte_one(
        parts in prop::collection::vec(prop_oneof![
            Just("[".to_string()), Just("{".to_string()), Just("]".to_string()),
            Just("}".to_string()), Just("\"".to_string()), Just("\\".to_string()),
            Just("\\\"".to_string()), "[a-z ,:]{0,4}",
            Just("[".repeat(MAX_JSON_DEPTH)),
        ], 0..60)
    ) {
        let body = parts.concat();
        prop_assert_eq!(too_deep(body.as_bytes()), too_deep_bytewise(body.as_bytes()), "{}", body);
    }

    #[test]
    fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        for e in [Endpoint::Chat, Endpoint::Completions, Endpoint::Generate] {
            let _ = facts(e, &body, true);
        }
    }

    #[test]
    fn arbitrary_json_never_panics(s in "\\{(\"(model|messages|prompt|text|input_ids|stream|role|content)\"|[\\[\\]{}:,0-9]|\"[a-z]{0,3}\"|true|null){0,40}") {
        for e in [Endpoint::Chat, Endpoint::Completions, Endpoint::Generate] {
            let _ = facts(e, s.as_bytes(), true);
        }
    }
}

/// A message content: a string with every kind of JSON escape and non-ASCII text, or a
/// list of text parts (and parts without text).
fn content() -> impl Strategy<Value = serde_json::Value> {
    let s = "[a-zA-Z0-9 \"\\\\/\n\r\t\u{0}\u{1f}\u{e9}\u{4e2d}\u{1f600}]{0,24}";
    prop_oneof![
        s.prop_map(serde_json::Value::String),
        prop::collection::vec(prop::option::of(s), 0..4).prop_map(|ps| {
            serde_json::Value::Array(
                ps.into_iter()
                    .map(|p| match p {
                        Some(t) => serde_json::json!({"type": "text", "text": t}),
                        None => serde_json::json!({"type": "image_url", "image_url": {"url": "x"}}),
                    })
                    .collect(),
            )
        }),
    ]
}

proptest! {
    /// Chat bodies as clients build them, serialized by a JSON library: the routing text
    /// is each message's role and its text, unescaped, in order; any cut of the body is
    /// refused cleanly.
    #[test]
    fn chat_bodies_give_their_unescaped_text_and_cuts_are_refused(
        msgs in prop::collection::vec(("(system|user|assistant|tool)", content()), 0..6),
        stream in any::<Option<bool>>(),
        model in prop::option::of("[a-z0-9/._-]{1,20}"),
        cut in any::<prop::sample::Index>(),
    ) {
        let messages: Vec<serde_json::Value> = msgs
            .iter()
            .map(|(r, c)| serde_json::json!({"role": r, "content": c}))
            .collect();
        let mut body = serde_json::json!({"messages": messages, "max_tokens": 3});
        if let Some(s) = stream {
            body["stream"] = serde_json::json!(s);
        }
        if let Some(m) = &model {
            body["model"] = serde_json::json!(m);
        }
        let bytes = serde_json::to_vec(&body).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let got = facts(Endpoint::Chat, &bytes, true).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut want = String::new();
        for (r, c) in &msgs {
            want.push_str(&format!("<|{r}|>\n"));
            match c {
                serde_json::Value::String(s) => want.push_str(s),
                serde_json::Value::Array(parts) => {
                    for p in parts {
                        if let Some(t) = p["text"].as_str() {
                            want.push_str(t);
                        }
                    }
                }
                _ => {}
            }
            want.push('\n');
        }
        prop_assert_eq!(got.key, RoutingText::Text(want.into()));
        prop_assert_eq!(got.stream, stream.unwrap_or(false));
        prop_assert_eq!(got.model, model);
        let at = cut.index(bytes.len());
        if at > 0 && at < bytes.len() {
            prop_assert!(facts(Endpoint::Chat, &bytes[..at], true).is_err());
        }
    }

    /// Token prompts in every shape the routes take come back as the same tokens.
    #[test]
    fn token_prompts_route_on_their_tokens(lists in prop::collection::vec(prop::collection::vec(any::<u32>(), 1..8), 1..4)) {
        let flat: Vec<u32> = lists.concat();
        let one = serde_json::to_vec(&serde_json::json!({"prompt": flat})).unwrap_or_default();
        prop_assert_eq!(facts(Endpoint::Completions, &one, true).map(|f| f.key).ok(), Some(RoutingText::Tokens(flat.clone())));
        let many = serde_json::to_vec(&serde_json::json!({"prompt": lists})).unwrap_or_default();
        prop_assert_eq!(facts(Endpoint::Completions, &many, true).map(|f| f.key).ok(), Some(RoutingText::Tokens(flat.clone())));
        let ids = serde_json::to_vec(&serde_json::json!({"input_ids": flat})).unwrap_or_default();
        prop_assert_eq!(facts(Endpoint::Generate, &ids, true).map(|f| f.key).ok(), Some(RoutingText::Tokens(flat)));
    }
}

/// A JSON value built from the pieces that matter to the fast path: the known field names,
/// every kind of string (escapes, surrogates, control characters), token-like numbers and
/// numbers that are not, nulls, and nesting.
fn json_piece() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_string()),
        Just("true".to_string()),
        Just("false".to_string()),
        Just("0".to_string()),
        Just("17".to_string()),
        Just("4294967295".to_string()),
        Just("4294967296".to_string()),
        Just("-3".to_string()),
        Just("1.5".to_string()),
        Just("2e3".to_string()),
        Just("01".to_string()),
        Just("\"user\"".to_string()),
        Just("\"caf\u{e9} \\\" \\\\ \\/ \\n \\u00e9 \\ud83d\\ude00\"".to_string()),
        Just("\"\\ud83d\"".to_string()),
        Just("\"\\x\"".to_string()),
        Just("\"tab\there\"".to_string()),
        Just("\"\"".to_string()),
        "\"[a-z ]{0,12}\"",
    ];
    let key = prop_oneof![
        Just("model"),
        Just("stream"),
        Just("messages"),
        Just("prompt"),
        Just("text"),
        Just("input_ids"),
        Just("role"),
        Just("content"),
        Just("type"),
        Just("max_tokens"),
    ];
    leaf.prop_recursive(5, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((key.clone(), inner), 0..5).prop_map(|v| {
                let members: Vec<String> = v
                    .into_iter()
                    .map(|(k, x)| format!("\"{k}\" : {x}"))
                    .collect();
                format!("{{{}}}", members.join(", "))
            }),
        ]
    })
}

/// Strings of every kind, most of them valid.
fn json_string() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "\"[a-z ]{0,12}\"",
        2 => Just("\"caf\u{e9} \\\" \\\\ \\/ \\n \\u00e9 \\ud83d\\ude00 \\t\"".to_string()),
        1 => Just("\"\\ud83d\"".to_string()),
        1 => Just("\"\\x\"".to_string()),
        1 => Just("\"tab\there\"".to_string()),
        // Longer than the vector loop's blocks, with escapes and non-ASCII text among them.
        1 => prop::collection::vec(prop_oneof![
            "[a-z ]{1,150}",
            Just("\\n".to_string()),
            Just("\\\"".to_string()),
            Just("\u{e9}\u{4e2d}".to_string()),
        ], 1..12).prop_map(|v| format!("\"{}\"", v.concat())),
    ]
}

/// A body the fast path should mostly read: a known shape, with pieces mixed in.
fn body_shape() -> impl Strategy<Value = String> {
    let content = prop_oneof![
        4 => json_string(),
        1 => Just("null".to_string()),
        1 => Just("[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image\"},{\"text\":null}]".to_string()),
        1 => json_piece(),
    ];
    let role = prop_oneof![4 => json_string(), 1 => Just("5".to_string())];
    let message = (role, content).prop_map(|(r, c)| format!("{{\"role\":{r},\"content\":{c}}}"));
    let tokens = prop::collection::vec(
        prop_oneof![8 => (0u32..100_000).prop_map(|t| t.to_string()), 1 => json_piece()],
        0..4,
    )
    .prop_map(|v| format!("[{}]", v.join(",")));
    let prompt = prop_oneof![
        3 => json_string(),
        2 => tokens.clone(),
        1 => prop::collection::vec(tokens.clone(), 0..3).prop_map(|v| format!("[{}]", v.join(","))),
        1 => prop::collection::vec(json_string(), 0..3).prop_map(|v| format!("[{}]", v.join(","))),
        1 => json_piece(),
    ];
    let stream = prop_oneof![
        3 => Just("true".to_string()),
        2 => Just("false".to_string()),
        1 => Just("null".to_string()),
        1 => json_piece(),
    ];
    prop_oneof![
        3 => (prop::collection::vec(message, 0..3), json_piece(), stream.clone()).prop_map(|(m, x, st)| format!(
            "{{\"model\":\"m\",\"messages\":[{}],\"extra\":{x},\"stream\":{st}}}",
            m.join(",")
        )),
        2 => (prompt.clone(), stream).prop_map(|(p, x)| format!("{{\"prompt\":{p},\"stream\":{x}}}")),
        2 => (prompt.clone(), tokens).prop_map(|(t, i)| format!("{{\"text\":{t},\"input_ids\":{i}}}")),
        1 => (tokens_or_piece(), json_piece()).prop_map(|(i, x)| format!("{{\"input_ids\":{i},\"sampling_params\":{x}}}")),
        1 => json_piece(),
    ]
}

fn tokens_or_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => prop::collection::vec(0u32..1000, 0..4).prop_map(|v| format!("{v:?}")),
        1 => json_piece(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn the_fast_path_reads_what_serde_reads_and_accepts_nothing_serde_refuses(
        body in body_shape(),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
        dup in any::<bool>(),
        bad_byte in prop::option::of((any::<prop::sample::Index>(), 0x80u8..=0xff)),
    ) {
        let mut body = body;
        if dup && body.starts_with('{') && body.len() > 2 {
            // A second copy of the members: duplicate fields.
            let inner = body[1..body.len() - 1].to_string();
            body = format!("{{{inner},{inner}}}");
        }
        if do_cut {
            let mut at = cut.index(body.len() + 1);
            while !body.is_char_boundary(at) {
                at -= 1;
            }
            body.truncate(at);
        }
        let mut body = body.into_bytes();
        // A byte that may break the UTF-8, anywhere: in a string, a key or the grammar.
        if let Some((at, b)) = bad_byte.filter(|_| !body.is_empty()) {
            let at = at.index(body.len());
            body[at] = b;
        }
        for endpoint in [Endpoint::Chat, Endpoint::Completions, Endpoint::Generate] {
            for prompt in [true, false] {
                if let Some(b) = fast::scan(&body, endpoint, prompt) {
                    prop_assert!(
                        serde_checked(endpoint, &body).is_ok(),
                        "fast accepted what serde refuses: {}", String::from_utf8_lossy(&body)
                    );
                    let f = facts_of(b, prompt, &Bytes::new())
                        .map(|r| r.facts)
                        .map_err(|e| e.to_string());
                    let s = serde_checked(endpoint, &body)
                        .and_then(|b| facts_of(b, prompt, &Bytes::new()))
                        .map(|r| r.facts)
                        .map_err(|e| e.to_string());
                    prop_assert_eq!(f, s, "{}", String::from_utf8_lossy(&body));
                }
            }
        }
    }
}

#[test]
fn the_fast_path_reads_the_common_shapes() {
    let read = |endpoint, body: &str| {
        fast::scan(body.as_bytes(), endpoint, true)
            .map(|b| facts_of(b, true, &Bytes::new()).ok().map(|r| r.facts))
    };
    let chat = r#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"q\n"}]}],"max_tokens":8,"stream":true}"#;
    let f = read(Endpoint::Chat, chat)
        .flatten()
        .expect("read by the fast path");
    assert_eq!(f.key, text("<|system|>\nbe brief\n<|user|>\nq\n\n"));
    assert!(f.stream);
    let f = read(
        Endpoint::Completions,
        r#"{"prompt":[1,2,3],"max_tokens":1}"#,
    )
    .flatten();
    assert_eq!(f.map(|f| f.key), Some(RoutingText::Tokens(vec![1, 2, 3])));
    let generate = r#" {"text":"hi","sampling_params":{"temperature":0.5}} "#;
    let f = read(Endpoint::Generate, generate).flatten();
    assert_eq!(f.map(|f| f.key), Some(text("hi")));
    // Left to serde: a duplicate field, a lone surrogate, an empty prompt list, a missing
    // required field.
    assert!(read(Endpoint::Chat, r#"{"messages":[],"messages":[]}"#).is_none());
    assert!(read(Endpoint::Completions, r#"{"prompt":"\ud800"}"#).is_none());
    assert!(read(Endpoint::Completions, r#"{"prompt":[]}"#).is_none());
    assert!(read(Endpoint::Chat, r#"{"model":"m"}"#).is_none());
}

#[test]
fn long_strings_of_the_routing_text_are_read_in_place_from_the_body() {
    let long = "a long system prompt, ".repeat(40);
    let body = serde_json::to_vec(&serde_json::json!({
        "messages": [
            {"role": "system", "content": long},
            {"role": "user", "content": "a \"quoted\" question\n"},
            {"role": "user", "content": [{"type": "text", "text": long}]},
        ]
    }))
    .unwrap();
    let body = Bytes::from(body);
    let want = format!("<|system|>\n{long}\n<|user|>\na \"quoted\" question\n\n<|user|>\n{long}\n");
    for (endpoint, body, want) in [
        (Endpoint::Chat, body.clone(), want.as_str()),
        (
            Endpoint::Completions,
            Bytes::from(format!(r#"{{"prompt":["{long}","{long}"]}}"#)),
            &*format!("{long}\n{long}"),
        ),
    ] {
        let RoutingText::Text(text) = request_facts(endpoint, &body, true).unwrap().key else {
            panic!("a text key");
        };
        assert_eq!(text, want);
        // Each long string is a run that points into the body: it was not copied.
        let in_body = text
            .runs()
            .filter(|r| body.as_ptr_range().contains(&r.as_ptr()))
            .count();
        assert_eq!(in_body, 2, "{endpoint:?}");
    }
}

#[test]
fn a_raw_control_character_anywhere_in_a_long_string_is_refused() {
    let long = "x".repeat(1000);
    for (at, c) in [(0, '\u{0}'), (500, '\u{1f}'), (999, '\n')] {
        let mut text = long.clone();
        text.replace_range(at..at + 1, &c.to_string());
        let body = format!(r#"{{"messages":[{{"role":"user","content":"{text}"}}]}}"#);
        for keep in [true, false] {
            assert!(
                fast::scan(body.as_bytes(), Endpoint::Chat, keep).is_none(),
                "at {at}"
            );
            let e = facts(Endpoint::Chat, body.as_bytes(), keep).unwrap_err();
            assert!(e.to_string().contains("control character"), "{e}");
        }
    }
    // DEL and everything above 0x1f are plain characters.
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"{long}{} "}}]}}"#,
        '\u{7f}'
    );
    assert!(fast::scan(body.as_bytes(), Endpoint::Chat, true).is_some());
}

#[test]
fn invalid_utf8_in_a_long_string_is_refused_wherever_it_sits() {
    let long = "x".repeat(1000);
    for at in [0, 127, 128, 500, 999] {
        for (field, shape) in [
            (
                "content",
                r#"{"messages":[{"role":"user","content":"TEXT"}]}"#,
            ),
            (
                "an unread field",
                r#"{"messages":[{"role":"user","content":"q"}],"user":"TEXT"}"#,
            ),
        ] {
            let mut body = shape.replace("TEXT", &long).into_bytes();
            let start = body
                .windows(3)
                .position(|w| w == b"xxx")
                .expect("the long string");
            body[start + at] = 0xff;
            for keep in [true, false] {
                assert!(
                    fast::scan(&body, Endpoint::Chat, keep).is_none(),
                    "{field} at {at}"
                );
                let e = facts(Endpoint::Chat, &body, keep).unwrap_err();
                assert!(e.to_string().contains("not UTF-8"), "{field} at {at}: {e}");
            }
        }
    }
    // Two- to four-byte characters in a long string are text.
    let content = format!("{long}é中😀{long}");
    let body = format!(r#"{{"messages":[{{"role":"user","content":"{content}"}}]}}"#);
    let f = facts(Endpoint::Chat, body.as_bytes(), true).unwrap();
    assert_eq!(f.key, text(&format!("<|user|>\n{content}\n")));
}

#[test]
fn a_prompt_only_checked_is_refused_where_a_prompt_read_is() {
    // Escapes valid and not, in a message's content, a part's text and an unread field.
    let strings = [
        r#"plain"#,
        r#"a\"b\\c\/d\be\ff\ng\rh\ti"#,
        r#"\u00e9\u4e2d\ud83d\ude00"#,
        r#"bad \x escape"#,
        r#"lone \ud83d high half"#,
        r#"lone \ude00 low half"#,
        r#"short \u12"#,
        r#"not hex \u12g4"#,
        r#"ends in a backslash \"#,
    ];
    for s in strings {
        for shape in [
            r#"{"messages":[{"role":"user","content":"S"}]}"#,
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"S"}]}]}"#,
            r#"{"messages":[{"role":"user","content":"q"}],"user":"S"}"#,
        ] {
            let body = shape.replace('S', s);
            let read = fast::scan(body.as_bytes(), Endpoint::Chat, true).is_some();
            let checked = fast::scan(body.as_bytes(), Endpoint::Chat, false).is_some();
            assert_eq!(read, checked, "{body}");
            let serde = serde_checked(Endpoint::Chat, body.as_bytes()).is_ok();
            assert!(
                !checked || serde,
                "fast accepted what serde refuses: {body}"
            );
        }
    }
    // The valid ones are read by the fast path in both modes.
    let body = r#"{"messages":[{"role":"user","content":"a\"b\\c\n\u00e9\ud83d\ude00"}]}"#;
    assert!(fast::scan(body.as_bytes(), Endpoint::Chat, false).is_some());
    assert_eq!(
        facts(Endpoint::Chat, body.as_bytes(), false).unwrap().key,
        RoutingText::Empty
    );
}

#[test]
fn prompt_cache_key_names_the_session_on_the_fast_path_and_serdes() {
    let chat =
        br#"{"model":"m","prompt_cache_key":"agent-7","messages":[{"role":"user","content":"q"}]}"#;
    let fast = fast::scan(chat, Endpoint::Chat, true).expect("the fast path reads it");
    let f = facts_of(fast, true, &Bytes::new()).expect("facts").facts;
    assert_eq!(f.session.as_deref(), Some("agent-7"));
    let serde = serde_checked(Endpoint::Chat, chat).expect("serde reads it");
    assert_eq!(
        facts_of(serde, true, &Bytes::new()).expect("facts").facts,
        f
    );
    let responses = Bytes::from_static(br#"{"input":"hi","prompt_cache_key":"s1"}"#);
    let r = request_facts(Endpoint::Responses, &responses, true).expect("facts");
    assert_eq!(r.session.as_deref(), Some("s1"));
    // An empty key names no session; a key that is not a string is refused.
    let empty = Bytes::from_static(br#"{"prompt":"p","prompt_cache_key":""}"#);
    assert_eq!(
        request_facts(Endpoint::Completions, &empty, true)
            .expect("facts")
            .session,
        None
    );
    let bad = Bytes::from_static(br#"{"prompt":"p","prompt_cache_key":7}"#);
    assert!(request_facts(Endpoint::Completions, &bad, true).is_err());
}

#[test]
fn lora_path_and_cache_salt_scope_the_request_on_the_fast_path_and_serdes() {
    let bodies: [(Endpoint, &[u8]); 3] = [
        (
            Endpoint::Chat,
            br#"{"model":"m","lora_path":"sql","cache_salt":"t1","messages":[{"role":"user","content":"q"}]}"#,
        ),
        (
            Endpoint::Completions,
            br#"{"prompt":[1,2],"cache_salt":"t1","lora_path":"sql"}"#,
        ),
        (
            Endpoint::Generate,
            br#"{"input_ids":[1,2],"lora_path":"sql","cache_salt":"t1"}"#,
        ),
    ];
    for (endpoint, body) in bodies {
        let fast = fast::scan(body, endpoint, true).expect("the fast path reads it");
        let f = facts_of(fast, true, &Bytes::new()).expect("facts").facts;
        assert_eq!(f.adapter.as_deref(), Some("sql"), "{endpoint:?}");
        assert_eq!(f.cache_salt.as_deref(), Some("t1"), "{endpoint:?}");
        let serde = serde_checked(endpoint, body).expect("serde reads it");
        let s = facts_of(serde, true, &Bytes::new()).expect("facts").facts;
        assert_eq!(s, f, "{endpoint:?}");
    }
    // SGLang's list of paths for a batch, a null or an empty string: no scope, no error.
    for body in [
        br#"{"text":["a","b"],"lora_path":["sql","sql"]}"#.as_slice(),
        br#"{"text":"a","lora_path":null,"cache_salt":null}"#,
        br#"{"text":"a","lora_path":"","cache_salt":""}"#,
    ] {
        let f =
            request_facts(Endpoint::Generate, &Bytes::copy_from_slice(body), true).expect("facts");
        assert_eq!((f.adapter, f.cache_salt), (None, None));
    }
}
