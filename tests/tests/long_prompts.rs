//! Long prompts through the proxy path: bodies reach the worker byte for byte, the routing
//! text is the unescaped content, and long answers are relayed whole.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use kvgate_policies::{RequestFacts, RoutingText};
use kvgate_tests::raw::{RawUpstream, Script};
use kvgate_tests::{post, sse_events, test_config};

/// A gateway and its data dir, dropped in that order: sled must close before its files go.
struct Gw {
    gw: kvgate_gateway::Gateway,
    _dir: tempfile::TempDir,
}

fn gateway_for(up: &RawUpstream) -> Gw {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = vec![up.url.clone()];
    cfg.max_payload_size = 4 << 20;
    Gw {
        gw: kvgate_gateway::Gateway::start(cfg).expect("gateway starts"),
        _dir: dir,
    }
}

fn json_worker() -> RawUpstream {
    RawUpstream::start(Script {
        status: 200,
        content_type: "application/json",
        chunks: vec![br#"{"id":"x","choices":[]}"#.to_vec()],
        crash: false,
    })
}

/// How much of `text` the index holds for the only worker, asked through a dry run.
async fn matched(gw: &kvgate_gateway::Gateway, text: &str) -> Option<usize> {
    use kvgate_gateway::testing::Explain;
    let facts = RequestFacts {
        key: RoutingText::Text(text.into()),
        ..RequestFacts::default()
    };
    let d = gw
        .actors()
        .selector
        .send(Explain {
            facts: std::sync::Arc::new(facts),
        })
        .await
        .expect("selector answers")
        .expect("a decision");
    d.decision.candidates.first().and_then(|c| c.matched)
}

#[actix_rt::test]
async fn a_1_mib_prompt_reaches_the_worker_byte_for_byte() {
    let up = json_worker();
    let g = gateway_for(&up);
    let gw = &g.gw;
    // Odd spacing, a field the gateway does not read, non-ASCII text across the body.
    let text: String = "prompt é 😀 "
        .chars()
        .cycle()
        .take(800_000)
        .collect::<String>();
    let body = format!(
        "{{ \"messages\" : [ {{\"role\":\"user\", \"content\":\"{text}\"}} ],\n\"extra\":{{\"k\":[1,2]}}, \"max_tokens\":1}}"
    );
    assert!(body.len() > 1 << 20, "{}", body.len());
    let r = post(&format!("{}/v1/chat/completions", gw.url()), body.clone()).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let seen = up.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].1 == body.as_bytes(), "the worker got other bytes");
    let key = format!("<|user|>\n{text}\n");
    assert_eq!(matched(gw, &key).await, Some(key.len()));
}

#[actix_rt::test]
async fn escapes_are_forwarded_as_sent_and_routed_unescaped() {
    let up = json_worker();
    let g = gateway_for(&up);
    let gw = &g.gw;
    // Every escape JSON has, a surrogate pair, raw UTF-8, and a long run between them.
    let escaped = format!(
        r#"q\" \\ \/ \b \f \n \r \t \u00e9 \ud83d\ude00 é {} end"#,
        "x".repeat(100_000)
    );
    let unescaped = format!(
        "q\" \\ / \u{8} \u{c} \n \r \t é 😀 é {} end",
        "x".repeat(100_000)
    );
    let body = format!(
        r#"{{"messages":[{{"role":"system","content":[{{"type":"text","text":"{escaped}"}}]}},{{"role":"user","content":"{escaped}"}}]}}"#
    );
    let r = post(&format!("{}/v1/chat/completions", gw.url()), body.clone()).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let seen = up.seen.lock().expect("lock").clone();
    assert!(seen[0].1 == body.as_bytes(), "the worker got other bytes");
    let key = format!("<|system|>\n{unescaped}\n<|user|>\n{unescaped}\n");
    assert_eq!(matched(gw, &key).await, Some(key.len()));
    // The escaped form is not what was recorded.
    let wrong = format!("<|system|>\n{escaped}\n");
    assert!(matched(gw, &wrong).await < Some(wrong.len()));
}

#[actix_rt::test]
async fn a_1_mib_streamed_answer_is_relayed_whole() {
    let events: Vec<Vec<u8>> = (0..64)
        .map(|i| {
            let text = format!("{i:04}").repeat(4096);
            format!("data: {{\"choices\":[{{\"text\":\"{text}\"}}]}}\n\n").into_bytes()
        })
        .chain([b"data: [DONE]\n\n".to_vec()])
        .collect();
    let whole: Vec<u8> = events.concat();
    assert!(whole.len() > 1 << 20);
    let up = RawUpstream::start(Script {
        status: 200,
        content_type: "text/event-stream",
        chunks: events,
        crash: false,
    });
    let g = gateway_for(&up);
    let gw = &g.gw;
    let r = post(
        &format!("{}/v1/completions", gw.url()),
        r#"{"prompt":"a long answer","stream":true}"#,
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert!(r.body.as_ref() == whole.as_slice(), "the answer changed");
    let (parsed, done) = sse_events(&r.text());
    assert_eq!(parsed.len(), 64);
    assert!(done);
}
