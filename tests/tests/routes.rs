//! The API surface beyond chat: every proxied route's body reaches the engine byte for byte
//! and its answer comes back byte for byte, streamed (with each API's own event names) and
//! not; other `/v1/` paths are a 404 that lists the routes, or pass through when asked; a
//! Responses conversation (`previous_response_id`) and a Messages conversation each stay
//! on one engine.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use kvgate_engine_sim::SimConfig;
use kvgate_tests::raw::{RawUpstream, Script};
use kvgate_tests::{Harness, Reply, client, finish_reply, post, post_json, test_config};
use serde_json::{Value, json};

fn gateway_for(url: &str, passthrough: bool) -> (kvgate_gateway::Gateway, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = vec![url.to_owned()];
    cfg.passthrough_unknown_routes = passthrough;
    (
        kvgate_gateway::Gateway::start(cfg).expect("gateway starts"),
        dir,
    )
}

/// `body` posted with `content_type`.
async fn post_as(url: &str, content_type: &str, body: Vec<u8>) -> Reply {
    let resp = client()
        .post(url)
        .insert_header(("content-type", content_type))
        .send_body(body)
        .await
        .expect("request sent");
    finish_reply(resp).await
}

const MULTIPART: &str = "multipart/form-data; boundary=kvgate-test-boundary";

fn multipart_body() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"--kvgate-test-boundary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n");
    // Audio bytes: not UTF-8, not JSON.
    b.extend_from_slice(&[0x52, 0x49, 0x46, 0x46, 0xff, 0x00, 0xfe, 0x80, 0x0d, 0x0a]);
    b.extend_from_slice(b"\r\n--kvgate-test-boundary\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nraw-model\r\n--kvgate-test-boundary--\r\n");
    b
}

/// Every route with a body an application sends it.
fn routes() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let json = "application/json";
    let j = |v: Value| serde_json::to_vec(&v).expect("json");
    vec![
        (
            "/v1/responses",
            json,
            j(json!({"model": "raw-model", "instructions": "Be brief.",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "héllo"}]}]})),
        ),
        (
            "/v1/messages",
            json,
            j(
                json!({"model": "raw-model", "max_tokens": 16, "system": "Be brief.",
            "messages": [{"role": "user", "content": "hi"}]}),
            ),
        ),
        (
            "/v1/embeddings",
            json,
            j(json!({"model": "raw-model", "input": ["a", "b"],
            "encoding_format": "float"})),
        ),
        (
            "/v1/rerank",
            json,
            j(json!({"model": "raw-model", "query": "q", "documents": ["a", "b"]})),
        ),
        (
            "/rerank",
            json,
            j(json!({"query": "q", "documents": ["a", "b"], "top_n": 1})),
        ),
        (
            "/v1/score",
            json,
            j(json!({"model": "raw-model", "text_1": "a", "text_2": ["b", "c"]})),
        ),
        (
            "/v1/classify",
            json,
            j(json!({"model": "raw-model", "input": "good movie"})),
        ),
        (
            "/v1/tokenize",
            json,
            j(json!({"model": "raw-model", "prompt": "hello world"})),
        ),
        (
            "/v1/detokenize",
            json,
            j(json!({"model": "raw-model", "tokens": [1, 2, 3]})),
        ),
        ("/v1/audio/transcriptions", MULTIPART, multipart_body()),
    ]
}

/// The request line and body of the last request the engine saw.
fn last_seen(up: &RawUpstream) -> (String, Vec<u8>) {
    let seen = up.seen.lock().expect("seen");
    let (head, body) = seen.last().expect("a request reached the engine").clone();
    let line = head.lines().next().unwrap_or("").to_owned();
    (line, body)
}

#[actix_rt::test]
async fn every_route_reaches_the_engine_and_comes_back_byte_for_byte() {
    let answer = br#"{"id":"x-1","object":"list","data":[{"index":0,"embedding":[0.25,-1.5]}],"usage":{"prompt_tokens":2}}"#;
    let up = RawUpstream::start(Script {
        status: 200,
        content_type: "application/json",
        chunks: vec![answer[..40].to_vec(), answer[40..].to_vec()],
        crash: false,
    });
    let (gw, _dir) = gateway_for(&up.url, false);
    for (path, content_type, body) in routes() {
        let r = post_as(&format!("{}{path}", gw.url()), content_type, body.clone()).await;
        assert_eq!(r.status.as_u16(), 200, "{path}: {}", r.text());
        assert_eq!(r.body.as_ref(), answer, "{path}: the answer changed");
        let (line, seen) = last_seen(&up);
        assert_eq!(line, format!("POST {path} HTTP/1.1"), "{path}");
        assert_eq!(seen, body, "{path}: the body changed on its way");
    }
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 10);
}

/// The events of a Responses stream and of a Messages stream, as vLLM sends them: neither
/// ends with `data: [DONE]`.
fn streams() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let responses = vec![
        b"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n".to_vec(),
        b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"caf".to_vec(),
        b"\xc3\xa9\"}\n\n".to_vec(),
        b"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\"}}\n\n".to_vec(),
    ];
    let messages = vec![
        b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\"}}\n\n".to_vec(),
        b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n".to_vec(),
        b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\nevent: message_stop\n".to_vec(),
        b"data: {\"type\":\"message_stop\"}\n\n".to_vec(),
    ];
    // vLLM streams transcriptions as chat-like chunks.
    let transcription = vec![
        b"data: {\"object\":\"transcription.chunk\",\"choices\":[{\"delta\":{\"content\":\"hel\"}}]}\n\n".to_vec(),
        b"data: {\"object\":\"transcription.chunk\",\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\ndata: [DONE]\n\n".to_vec(),
    ];
    vec![
        ("/v1/responses", responses),
        ("/v1/messages", messages),
        ("/v1/audio/transcriptions", transcription),
    ]
}

/// A transcription upload that asks for a stream.
fn streamed_upload() -> Vec<u8> {
    let mut b = multipart_body();
    let end = b"--kvgate-test-boundary--\r\n";
    b.truncate(b.len() - end.len());
    b.extend_from_slice(b"--kvgate-test-boundary\r\nContent-Disposition: form-data; name=\"stream\"\r\n\r\ntrue\r\n");
    b.extend_from_slice(end);
    b
}

#[actix_rt::test]
async fn streams_are_relayed_byte_for_byte_with_their_own_event_names() {
    for (path, chunks) in streams() {
        let expected = chunks.concat();
        let up = RawUpstream::start(Script {
            status: 200,
            content_type: "text/event-stream",
            chunks,
            crash: false,
        });
        let (gw, _dir) = gateway_for(&up.url, false);
        let url = format!("{}{path}", gw.url());
        let r = match path {
            "/v1/responses" => post_json(&url, &json!({"input": "hi", "stream": true})).await,
            "/v1/messages" => {
                let msgs = json!([{"role": "user", "content": "hi"}]);
                let body = json!({"messages": msgs, "stream": true, "max_tokens": 8});
                post_json(&url, &body).await
            }
            _ => post_as(&url, MULTIPART, streamed_upload()).await,
        };
        assert_eq!(r.status.as_u16(), 200, "{path}: {}", r.text());
        // A clean end of the body is the stream's end: no error event is added.
        assert_eq!(r.body.as_ref(), expected.as_slice(), "{path}: {}", r.text());
        assert!(
            r.header("content-type")
                .is_some_and(|c| c.starts_with("text/event-stream"))
        );
    }
}

#[actix_rt::test]
async fn a_responses_stream_cut_by_its_engine_ends_with_an_error_event() {
    let (_, mut chunks) = streams().swap_remove(0);
    chunks.truncate(2);
    let up = RawUpstream::start(Script {
        status: 200,
        content_type: "text/event-stream",
        chunks,
        crash: true,
    });
    let (gw, _dir) = gateway_for(&up.url, false);
    let r = post_json(
        &format!("{}/v1/responses", gw.url()),
        &json!({"input": "hi", "stream": true}),
    )
    .await;
    let text = r.text();
    assert!(text.starts_with("event: response.created\n"), "{text}");
    let last = text.trim_end().lines().last().unwrap_or("");
    assert!(last.contains("upstream_failed"), "{text}");
}

#[actix_rt::test]
async fn other_v1_paths_are_listed_in_a_404_or_passed_through() {
    let up = RawUpstream::start(Script {
        status: 200,
        content_type: "application/json",
        chunks: vec![b"{\"ok\":true}".to_vec()],
        crash: false,
    });
    let (gw, _dir) = gateway_for(&up.url, false);
    let r = post(&format!("{}/v1/images/generations", gw.url()), "{}").await;
    r.assert_error(404, "route_not_found");
    let msg = r.json()["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    for route in [
        "POST /v1/responses",
        "POST /v1/messages",
        "POST /v1/embeddings",
        "POST /v1/audio/transcriptions",
    ] {
        assert!(msg.contains(route), "{route} missing from: {msg}");
    }
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 0);
    drop(gw);

    let (gw, _dir) = gateway_for(&up.url, true);
    let body = br#"{"model":"raw-model","prompt":"a cat"}"#.to_vec();
    let r = post(
        &format!("{}/v1/images/generations?size=small", gw.url()),
        body.clone(),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert_eq!(r.body.as_ref(), b"{\"ok\":true}");
    let (line, seen) = last_seen(&up);
    assert_eq!(line, "POST /v1/images/generations?size=small HTTP/1.1");
    assert_eq!(seen, body);
    // Only under /v1/, and only POST: anything else is still a 404.
    post(&format!("{}/v2/other", gw.url()), "{}")
        .await
        .assert_error(404, "route_not_found");
}

/// Four engines of one model, with the gateway's `tweak`.
fn fleet(tweak: impl FnOnce(&mut kvgate_gateway::GatewayConfig)) -> Harness {
    let sim = SimConfig {
        max_running_requests: 16,
        enable_cache_report: true,
        ..SimConfig::default()
    };
    Harness::start(4, sim, tweak)
}

/// Which engines served requests, beyond `before`.
fn served_since(h: &Harness, before: &[u64]) -> Vec<u64> {
    h.split()
        .iter()
        .zip(before)
        .map(|(now, b)| now - b)
        .collect()
}

#[actix_rt::test]
async fn a_responses_conversation_stays_on_the_engine_that_holds_it() {
    // Round robin would send each turn to the next engine, which does not hold the previous
    // response and answers 404: only the pin keeps the conversation whole.
    let h = fleet(|c| c.policy.kind = kvgate_policies::PolicyKind::RoundRobin);
    let url = h.url("/v1/responses");
    let mut previous: Option<String> = None;
    for turn in 0..5 {
        let mut body = json!({"model": "kvgate-sim-model", "instructions": "You are terse.",
            "input": format!("question number {turn}"), "max_output_tokens": 4});
        if let Some(p) = &previous {
            body["previous_response_id"] = json!(p);
        }
        // Every other turn streamed: the id is read from the stream's first event too.
        body["stream"] = json!(turn % 2 == 1);
        let r = post_json(&url, &body).await;
        assert_eq!(r.status.as_u16(), 200, "turn {turn}: {}", r.text());
        let text = r.text();
        let id = if turn % 2 == 1 {
            assert!(text.starts_with("event: response.created\n"), "{text}");
            assert!(text.contains("event: response.completed\n"), "{text}");
            let data = text
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or("{}");
            serde_json::from_str::<Value>(data).expect("event")["response"]["id"].clone()
        } else {
            r.json()["id"].clone()
        };
        previous = id.as_str().map(str::to_owned);
        assert!(previous.is_some(), "turn {turn}: no id in {text}");
    }
    let split = h.split();
    assert_eq!(split.iter().sum::<u64>(), 5, "{split:?}");
    assert!(split.contains(&5), "the conversation moved: {split:?}");
    // A conversation of its own goes where the policy sends it.
    let before = h.split();
    let body = json!({"model": "kvgate-sim-model", "input": "another", "max_output_tokens": 2});
    assert_eq!(post_json(&url, &body).await.status.as_u16(), 200);
    assert_eq!(served_since(&h, &before).iter().sum::<u64>(), 1);
}

#[actix_rt::test]
async fn messages_conversations_stay_on_one_engine_each() {
    let h = fleet(|_| {});
    let url = h.url("/v1/messages");
    // Three agents, each with its own long system prompt, interleaved turn by turn.
    let system = |a: usize| {
        format!(
            "You are agent {a}. {}",
            "Follow the house rules. ".repeat(60)
        )
    };
    let mut history: Vec<Vec<Value>> = vec![Vec::new(); 3];
    let mut engines: Vec<Vec<usize>> = vec![Vec::new(); 3];
    for turn in 0..5 {
        for (a, msgs) in history.iter_mut().enumerate() {
            msgs.push(json!({"role": "user", "content": format!("agent {a} turn {turn}")}));
            let body = json!({"model": "kvgate-sim-model", "system": system(a), "messages": msgs,
                "max_tokens": 4, "stream": turn == 2});
            let before = h.split();
            let r = post_json(&url, &body).await;
            assert_eq!(r.status.as_u16(), 200, "{}", r.text());
            let reply = if turn == 2 {
                assert!(
                    r.text()
                        .ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
                    "{}",
                    r.text()
                );
                "streamed".to_owned()
            } else {
                r.json()["content"][0]["text"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            };
            msgs.push(json!({"role": "assistant", "content": reply}));
            let now = served_since(&h, &before);
            let e = now
                .iter()
                .position(|n| *n == 1)
                .expect("one engine served the turn");
            engines[a].push(e);
        }
    }
    for (a, e) in engines.iter().enumerate() {
        assert!(e.iter().all(|x| *x == e[0]), "agent {a} moved: {e:?}");
    }
    // The engines' cache reads (`cache_read_input_tokens`) reach the decision log: the
    // later turns find their agent's system prompt cached.
    let log = kvgate_tests::get(&h.url("/admin/decisions")).await.json();
    let cached: Vec<u64> = (log["decisions"].as_array().expect("decisions").iter())
        .filter(|d| d["route"] == "/v1/messages")
        .filter_map(|d| d["answer"]["reported_cached_tokens"].as_u64())
        .collect();
    assert!(
        cached.iter().filter(|n| **n > 100).count() >= 10,
        "{cached:?}"
    );
}
