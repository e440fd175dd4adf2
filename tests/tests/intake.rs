//! Inference bodies read at the socket (`http/intake.rs`), seen from a client's raw
//! connection: pipelined requests, chunked bodies, `Expect: 100-continue` and a client's own
//! `x-kvgate-body` header all reach the engine as sent, each answered in order.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use kvgate_tests::raw::{RawUpstream, Script};
use kvgate_tests::test_config;

struct Gw {
    gw: kvgate_gateway::Gateway,
    _dir: tempfile::TempDir,
}

fn setup() -> (RawUpstream, Gw) {
    setup_with(|_| {})
}

fn setup_with(tune: impl FnOnce(&mut kvgate_gateway::GatewayConfig)) -> (RawUpstream, Gw) {
    let up = RawUpstream::start(Script {
        status: 200,
        content_type: "application/json",
        chunks: vec![br#"{"id":"x","choices":[]}"#.to_vec()],
        crash: false,
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = vec![up.url.clone()];
    tune(&mut cfg);
    let gw = kvgate_gateway::Gateway::start(cfg).expect("gateway starts");
    (up, Gw { gw, _dir: dir })
}

fn body(n: usize, tag: &str) -> Vec<u8> {
    format!(
        r#"{{"messages":[{{"role":"user","content":"{tag} {}"}}],"max_tokens":1}}"#,
        "x".repeat(n)
    )
    .into_bytes()
}

fn post_head(path: &str, len: usize, extra: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n{extra}\
         content-length: {len}\r\n\r\n"
    )
    .into_bytes()
}

/// Writes `sent` on one connection, then reads until the peer closes; returns the text.
fn exchange(url: &str, sent: &[u8], expect_continue: bool) -> String {
    let addr = url.trim_start_matches("http://");
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(20))).ok();
    if expect_continue {
        // The head alone, then the body once the gateway says to go on.
        let cut = sent.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
        c.write_all(&sent[..cut]).expect("write head");
        let mut first = [0u8; 25];
        c.read_exact(&mut first).expect("100 Continue");
        assert_eq!(&first, b"HTTP/1.1 100 Continue\r\n\r\n");
        c.write_all(&sent[cut..]).expect("write body");
    } else {
        c.write_all(sent).expect("write");
    }
    let mut out = Vec::new();
    c.read_to_end(&mut out).expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

/// [`exchange`] with the gateway, off the test's own thread.
async fn send(gw: &Gw, sent: Vec<u8>, expect_continue: bool) -> String {
    let url = gw.gw.url().to_string();
    actix_rt::task::spawn_blocking(move || exchange(&url, &sent, expect_continue))
        .await
        .expect("client")
}

#[actix_rt::test]
async fn pipelined_requests_are_each_answered_and_forwarded_byte_for_byte() {
    let (up, gw) = setup();
    let (a, b) = (body(300_000, "first"), body(20_000, "second"));
    let mut sent = post_head("/v1/chat/completions", a.len(), "");
    sent.extend_from_slice(&a);
    // Sent before the first is answered: it comes through actix-http's own payload.
    sent.extend_from_slice(&post_head("/v1/chat/completions", b.len(), ""));
    sent.extend_from_slice(&b);
    sent.extend_from_slice(b"GET /health HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n");
    let text = send(&gw, sent, false).await;
    assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 3, "{text}");
    let first = text.find(r#"{"id":"x""#).unwrap_or(usize::MAX);
    let health = text.find(r#""status":"ok""#).unwrap_or(0);
    assert!(first < health, "answers out of order: {text}");
    let seen = up.seen.lock().expect("seen");
    let bodies: Vec<&Vec<u8>> = seen.iter().map(|(_, b)| b).collect();
    assert_eq!(bodies, vec![&a, &b]);
    assert!(seen.iter().all(|(h, _)| !h.contains("x-kvgate-body")));
}

#[actix_rt::test]
async fn chunked_bodies_and_a_clients_own_token_header_pass_as_sent() {
    let (up, gw) = setup();
    let b = body(50_000, "chunked");
    let (x, y) = b.split_at(20_000);
    let mut sent = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n\
        x-kvgate-body: 1\r\ntransfer-encoding: chunked\r\n\r\n"
        .to_vec();
    for part in [x, y] {
        sent.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        sent.extend_from_slice(part);
        sent.extend_from_slice(b"\r\n");
    }
    sent.extend_from_slice(b"0\r\n\r\n");
    // A taken body whose head names a token of the client's own: it is replaced.
    let c = body(40_000, "spoofed");
    sent.extend_from_slice(&post_head(
        "/v1/chat/completions",
        c.len(),
        "x-kvgate-body: 12345\r\nconnection: close\r\n",
    ));
    sent.extend_from_slice(&c);
    let text = send(&gw, sent, false).await;
    assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 2, "{text}");
    let seen = up.seen.lock().expect("seen");
    let bodies: Vec<&Vec<u8>> = seen.iter().map(|(_, b)| b).collect();
    assert_eq!(bodies, vec![&b, &c]);
}

#[actix_rt::test]
async fn expect_continue_is_answered_then_the_body_forwarded() {
    let (up, gw) = setup();
    let b = body(100_000, "continue");
    let mut sent = post_head(
        "/v1/chat/completions",
        b.len(),
        "expect: 100-continue\r\nconnection: close\r\n",
    );
    sent.extend_from_slice(&b);
    let text = send(&gw, sent, true).await;
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    let seen = up.seen.lock().expect("seen");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].1, b);
}

#[actix_rt::test]
async fn a_request_refused_before_its_body_is_read_closes_its_connection() {
    let (up, gw) =
        setup_with(|c| c.access.api_keys = vec![kvgate_gateway::Secret::new("sk-client")]);
    let b = body(200_000, "refused");
    // No key: refused at once. Without `connection: close` from the client, the gateway
    // closes the connection itself rather than reading the body it will never use.
    let mut sent = post_head("/v1/chat/completions", b.len(), "");
    sent.extend_from_slice(&b);
    let text = send(&gw, sent, false).await;
    assert!(text.starts_with("HTTP/1.1 401"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    assert!(
        text.contains("invalid_api_key") || text.contains("error"),
        "{text}"
    );
    assert!(up.seen.lock().expect("seen").is_empty());
}

/// A request of 96 header lines, the most actix-http parses, one of them its length: the
/// intake has no room for its two lines, so it passes the request as sent, which is
/// answered (its rewrite, of 97, was refused with 400).
#[actix_rt::test]
async fn a_request_with_the_most_headers_actix_http_parses_is_answered() {
    let (up, gw) = setup();
    let b = body(1_000, "crowded");
    let mut extra = String::new();
    // With host, content-type and content-length: 96 lines.
    for i in 0..92 {
        extra.push_str(&format!("x-pad-{i}: p\r\n"));
    }
    extra.push_str("connection: close\r\n");
    let mut sent = post_head("/v1/chat/completions", b.len(), &extra);
    sent.extend_from_slice(&b);
    let text = send(&gw, sent, false).await;
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    let seen = up.seen.lock().expect("seen");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].1, b);
}
