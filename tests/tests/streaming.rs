//! SSE relay: byte for byte, disconnects abort upstream, broken upstreams end with an error
//! event; and what of a request reaches the worker.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::io::{Read, Write};
use std::time::Duration;

use futures_util::StreamExt;
use kvgate_engine_sim::{Fault, SimConfig};
use kvgate_tests::raw::{RawUpstream, Script};
use kvgate_tests::{Harness, Reply, get, post, post_json, sse_events, test_config, wait_for};
use serde_json::json;

fn gateway_for(url: &str) -> (kvgate_gateway::Gateway, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = vec![url.to_owned()];
    (
        kvgate_gateway::Gateway::start(cfg).expect("gateway starts"),
        dir,
    )
}

/// A gateway in front of a scripted event-stream worker, and its answer to one streamed
/// request on `path`. The worker (and with it the gateway) stays up for later checks.
struct Relayed {
    reply: Reply,
    gw: kvgate_gateway::Gateway,
    _up: RawUpstream,
    _dir: tempfile::TempDir,
}

async fn relay(chunks: Vec<Vec<u8>>, crash: bool, path: &str, body: &str) -> Relayed {
    let up = RawUpstream::start(Script {
        status: 200,
        content_type: "text/event-stream",
        chunks,
        crash,
    });
    let (gw, dir) = gateway_for(&up.url);
    let reply = post(&format!("{}{path}", gw.url()), body.to_owned()).await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    Relayed {
        reply,
        gw,
        _up: up,
        _dir: dir,
    }
}

#[actix_rt::test]
async fn sse_is_relayed_byte_for_byte() {
    // Events split across chunks, a multi-byte character split between chunks, comments,
    // CRLF line ends: all must arrive exactly as sent.
    let chunks: Vec<Vec<u8>> = vec![
        b"data: {\"a\":1}\n\n".to_vec(),
        b"data: {\"text\":\"caf".to_vec(),
        vec![0xC3],
        vec![0xA9, b'"', b'}', b'\n'],
        b"\n: keep-alive comment\n\n".to_vec(),
        b"data: {\"b\":2}\r\n\r\n".to_vec(),
        b"data: [DONE]\n\n".to_vec(),
    ];
    let expected: Vec<u8> = chunks.concat();
    let r = relay(
        chunks,
        false,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"x"}],"stream":true}"#,
    )
    .await
    .reply;
    assert_eq!(r.body.as_ref(), expected.as_slice());
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
}

#[actix_rt::test]
async fn upstream_death_mid_stream_ends_with_an_error_event() {
    let chunks = vec![
        b"data: {\"n\":1}\n\n".to_vec(),
        b"data: {\"n\":2}\n\n".to_vec(),
    ];
    let Relayed { reply: r, gw, .. } =
        relay(chunks, true, "/generate", r#"{"text":"x","stream":true}"#).await;
    let text = r.text();
    assert!(
        text.starts_with("data: {\"n\":1}\n\ndata: {\"n\":2}\n\n"),
        "{text}"
    );
    let (events, done) = sse_events(&text);
    assert!(!done);
    let last = events.last().unwrap();
    assert_eq!(last["error"]["code"], "upstream_failed", "{text}");
    let w = get(&format!("{}/workers", gw.url())).await.json();
    assert_eq!(w["workers"][0]["in_flight"], 0);
}

#[actix_rt::test]
async fn a_death_inside_an_event_leaves_the_error_event_parseable() {
    let chunks = vec![
        b"data: {\"n\":1}\n\ndata: {\"n\"".to_vec(),
        b":2}\n\ndata: {\"n\":3,\"te".to_vec(),
    ];
    let r = relay(
        chunks,
        true,
        "/v1/completions",
        r#"{"prompt":"x","stream":true}"#,
    )
    .await
    .reply;
    let text = r.text();
    // Whole events pass unchanged; the unfinished third is dropped, not glued to the error.
    let (head, error) = text
        .split_once("\n\ndata: {\"error\"")
        .unwrap_or_else(|| panic!("no error event: {text}"));
    assert_eq!(head, "data: {\"n\":1}\n\ndata: {\"n\":2}", "{text}");
    assert!(error.ends_with("}\n\n"), "{text}");
    let (events, done) = sse_events(&text);
    assert!(!done);
    assert_eq!(events.len(), 3, "{text}");
    assert_eq!(events[1]["n"], 2);
    assert_eq!(events[2]["error"]["code"], "upstream_failed", "{text}");
}

#[actix_rt::test]
async fn a_finished_stream_without_a_last_blank_line_arrives_whole() {
    let chunks = vec![
        b"data: {\"a\":1}\n\n".to_vec(),
        b"data: [DO".to_vec(),
        b"NE]\n".to_vec(),
    ];
    let expected = chunks.concat();
    let r = relay(
        chunks,
        false,
        "/v1/completions",
        r#"{"prompt":"x","stream":true}"#,
    )
    .await
    .reply;
    assert_eq!(r.body.as_ref(), expected.as_slice());
}

#[actix_rt::test]
async fn simulated_engine_crash_mid_stream_is_reported() {
    let h = Harness::start(1, SimConfig::default(), |_| {});
    h.fleet
        .engine(0)
        .set_fault(Fault::CrashMidStream { after_chunks: 2 });
    let r = post_json(
        &h.url("/v1/chat/completions"),
        &json!({"messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": 16}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200);
    let (events, done) = sse_events(&r.text());
    assert!(!done, "{}", r.text());
    assert_eq!(
        events.last().unwrap()["error"]["type"],
        "upstream_error",
        "{}",
        r.text()
    );
}

#[actix_rt::test]
async fn client_disconnect_frees_the_worker_and_aborts_upstream() {
    let sim = SimConfig {
        default_max_new_tokens: 20_000,
        ..SimConfig::default()
    };
    let h = Harness::start(1, sim, |_| {});
    let client = kvgate_tests::client();
    let mut resp = client
        .post(h.url("/generate"))
        .send_json(&json!({"text": "a long story", "stream": true, "sampling_params": {"max_new_tokens": 20000}}))
        .await
        .unwrap();
    // Read until the first event, so the request is running on the engine.
    let mut seen = Vec::new();
    while !seen.windows(6).any(|w| w == b"data: ") {
        seen.extend_from_slice(&resp.next().await.unwrap().unwrap());
    }
    let workers = get(&h.url("/workers")).await.json();
    assert_eq!(workers["workers"][0]["in_flight"], 1);
    assert_eq!(h.fleet.engine(0).stats().running, 1);
    drop(resp);
    drop(client);
    let engine = h.fleet.engine(0);
    wait_for(10, "the engine to abort the request", || {
        engine.stats().aborted == 1
    })
    .await;
    assert_eq!(engine.stats().running, 0);
    for _ in 0..250 {
        let w = get(&h.url("/workers")).await.json();
        if w["workers"][0]["in_flight"] == 0 {
            return;
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("in_flight never returned to 0");
}

#[actix_rt::test]
async fn stalled_clients_do_not_block_others() {
    let h = Harness::start(1, SimConfig::default(), |c| {
        c.header_read_timeout = Duration::from_millis(500)
    });
    let addr = h.gw.addr();
    // Connections that send half a request head and then stall.
    let mut stalled: Vec<std::net::TcpStream> = (0..64)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            s
        })
        .collect();
    let r = post_json(
        &h.url("/v1/completions"),
        &json!({"prompt": "still served", "max_tokens": 1}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200);
    // The server closes each stalled connection once its head is overdue.
    for s in &mut stalled {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)
            .expect("the server closes a stalled connection");
        let text = String::from_utf8_lossy(&buf);
        assert!(buf.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");
    }
}

#[actix_rt::test]
async fn the_worker_gets_the_body_unchanged_and_every_end_to_end_header() {
    let up = RawUpstream::start(Script {
        status: 200,
        content_type: "application/json",
        chunks: vec![b"{}".to_vec()],
        crash: false,
    });
    let (gw, _dir) = gateway_for(&up.url);
    // Odd spacing and escapes: the gateway parses the body but forwards the bytes it got.
    let body = "{\"messages\":[{\"role\":\"user\",\"content\":\"caf\u{e9} \\u00e9\"}],  \"max_tokens\" : 3 }";
    let trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let r = kvgate_tests::client()
        .post(format!("{}/v1/chat/completions", gw.url()))
        .insert_header(("content-type", "application/json"))
        .insert_header(("authorization", "Bearer k1"))
        .insert_header(("traceparent", trace))
        .insert_header(("x-request-id", "req-abc"))
        .insert_header(("cookie", "session=secret"))
        .insert_header(("x-tenant-id", "t-7"))
        .insert_header(("x-session-id", "s-9"))
        .insert_header(("accept", "application/json"))
        // Hop-by-hop: for the client's connection to the gateway only.
        .insert_header(("keep-alive", "timeout=5"))
        .insert_header(("proxy-authorization", "Basic cHJveHk="))
        .insert_header(("te", "trailers"))
        .send_body(body)
        .await
        .expect("sent");
    assert_eq!(r.status().as_u16(), 200);
    let seen = up.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    let (head, got) = &seen[0];
    assert_eq!(got.as_slice(), body.as_bytes());
    let head = head.to_ascii_lowercase();
    assert!(
        head.starts_with("post /v1/chat/completions http/1.1\r\n"),
        "{head}"
    );
    let authority = up.url.trim_start_matches("http://");
    let wanted = [
        format!("host: {authority}"),
        format!("content-length: {}", body.len()),
        "content-type: application/json".into(),
        "authorization: bearer k1".into(),
        format!("traceparent: {trace}"),
        "x-request-id: req-abc".into(),
        "cookie: session=secret".into(),
        "x-tenant-id: t-7".into(),
        "x-session-id: s-9".into(),
        "accept: application/json".into(),
    ];
    for want in wanted {
        assert!(
            head.contains(&format!("\r\n{want}\r\n")),
            "{want} in {head}"
        );
    }
    for never in [
        "connection",
        "keep-alive",
        "proxy-authorization",
        "te",
        "transfer-encoding",
    ] {
        assert!(
            !head.contains(&format!("\r\n{never}:")),
            "{never} in {head}"
        );
    }
    // A header the client's `Connection` names is hop-by-hop too (awc writes its own
    // `Connection`, so this request goes out raw).
    let mut raw = std::net::TcpStream::connect(gw.addr()).expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nX-Kept: 2\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    raw.write_all(head.as_bytes()).expect("sent raw");
    let mut answer = [0u8; 12];
    raw.read_exact(&mut answer).expect("an answer");
    assert_eq!(&answer, b"HTTP/1.1 200");
    let seen = up.seen.lock().expect("lock").clone();
    let head = seen
        .last()
        .map(|(h, _)| h.to_ascii_lowercase())
        .unwrap_or_default();
    assert!(head.contains("\r\nx-kept: 2\r\n"), "{head}");
    assert!(!head.contains("\r\nx-hop:"), "{head}");
}
