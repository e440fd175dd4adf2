//! Helpers shared by the simulator's HTTP tests.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use awc::http::StatusCode;
use bytes::Bytes;
use kvgate_engine_sim::{SimConfig, SimFleet};
use serde_json::Value;

/// A config whose requests finish in a few milliseconds.
pub(crate) fn fast() -> SimConfig {
    SimConfig {
        decode_step_base: Duration::from_millis(2),
        decode_step_per_req: Duration::from_micros(500),
        default_max_new_tokens: 4,
        ..SimConfig::default()
    }
}

/// A config whose requests stay running until aborted.
pub(crate) fn endless() -> SimConfig {
    SimConfig {
        default_max_new_tokens: 30_000,
        ..fast()
    }
}

pub(crate) fn one(cfg: SimConfig) -> (SimFleet, String) {
    let fleet = SimFleet::start(1, cfg).unwrap();
    let url = fleet.urls()[0].clone();
    (fleet, url)
}

fn client() -> awc::Client {
    awc::Client::builder()
        .timeout(Duration::from_secs(20))
        .finish()
}

pub(crate) async fn get(url: &str) -> (StatusCode, Bytes) {
    let mut resp = client().get(url).send().await.unwrap();
    let body = resp.body().limit(1 << 22).await.unwrap();
    (resp.status(), body)
}

pub(crate) async fn get_json(url: &str) -> Value {
    let (status, body) = get(url).await;
    assert_eq!(status, StatusCode::OK, "GET {url}: {body:?}");
    serde_json::from_slice(&body).unwrap()
}

pub(crate) async fn post(url: &str, body: &Value) -> (StatusCode, Bytes) {
    let mut resp = client().post(url).send_json(body).await.unwrap();
    let body = resp.body().limit(1 << 22).await.unwrap();
    (resp.status(), body)
}

pub(crate) async fn post_json(url: &str, body: &Value) -> Value {
    let (status, bytes) = post(url, body).await;
    assert_eq!(status, StatusCode::OK, "POST {url}: {bytes:?}");
    serde_json::from_slice(&bytes).unwrap()
}

/// The payloads of an SSE body's `data:` lines.
pub(crate) fn sse_data(body: &[u8]) -> Vec<String> {
    std::str::from_utf8(body)
        .unwrap()
        .split("\n\n")
        .filter(|frame| !frame.is_empty())
        .map(|frame| frame.strip_prefix("data: ").unwrap().to_owned())
        .collect()
}

/// Polls `cond` every 5 ms for up to 10 s; panics with `what` if it never holds.
pub(crate) async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2_000 {
        if cond() {
            return;
        }
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting until {what}");
}

/// Waits until the monotonic clock has passed `deadline`. Engines time their throughput
/// windows with that clock on runtimes of their own, out of reach of paused tokio time, so a
/// test that needs a gap in a window waits until the instant that makes it, and no longer.
pub(crate) async fn wait_past(deadline: Instant) {
    // Checked against the clock itself, whatever the timer's rounding.
    while Instant::now() < deadline {
        actix_rt::time::sleep_until(deadline.into()).await;
    }
}

/// Sends a raw HTTP/1.1 POST and returns the open connection, so a test can read
/// byte-exact answers or hang up.
pub(crate) fn raw_post(url: &str, path: &str, body: &Value) -> TcpStream {
    let addr = url.strip_prefix("http://").unwrap();
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let body = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(body.as_bytes()).unwrap();
    conn
}

/// Reads until the peer closes (or a read fails, as after a reset).
pub(crate) fn read_to_close(conn: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = conn.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads until `needle` has arrived.
pub(crate) fn read_until(conn: &mut TcpStream, needle: &str) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&out).contains(needle) {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "connection closed before {needle:?}");
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}
