//! Support for kvgate's end-to-end tests: a simulated fleet, a gateway in front of it on
//! loopback, and a small HTTP client. Every server binds 127.0.0.1 on an OS-picked port.
#![expect(
    clippy::expect_used,
    reason = "the suite's helpers: a panic there is a failed test"
)]

pub mod envoy;
pub mod kube;
pub mod raw;
pub mod tls;

use std::time::Duration;

use awc::http::StatusCode;
use bytes::Bytes;
use kvgate_engine_sim::{SimConfig, SimFleet};
use kvgate_gateway::{Gateway, GatewayConfig, HealthConfig};
use serde_json::Value;

/// A gateway in front of a simulated fleet, with its own data dir.
pub struct Harness {
    pub fleet: SimFleet,
    pub gw: Gateway,
    pub dir: tempfile::TempDir,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("gw", &self.gw.url())
            .finish()
    }
}

/// An engine that publishes KV events (and answers replays) on OS-picked ports and reports
/// cached tokens in its answers.
pub fn publishing_engine() -> SimConfig {
    SimConfig {
        max_running_requests: 16,
        enable_cache_report: true,
        kv_events_port: Some(0),
        kv_events_replay_port: Some(0),
        ..SimConfig::default()
    }
}

/// A vLLM engine (no `/server_info`: it advertises nothing) publishing KV events on
/// `port`, replay on `replay`, topic `kv-events`, in vLLM's own form (hashes as integers,
/// or as bytes with `hash_bytes`). The gateway learns where from [`vllm_events_config`].
pub fn vllm_publisher(port: u16, replay: u16, hash_bytes: bool) -> SimConfig {
    SimConfig {
        flavor: kvgate_engine_sim::Flavor::Vllm,
        kv_event_hash_bytes: hash_bytes,
        page_size: 16,
        kv_events_port: Some(port),
        kv_events_replay_port: Some(replay),
        kv_events_topic: "kv-events".into(),
        ..publishing_engine()
    }
}

/// vLLM's `--kv-events-config` for [`vllm_publisher`]'s ports, as a fleet would be started
/// with it (no block size: the stored blocks tell it).
pub fn vllm_events_config(port: u16, replay: u16) -> String {
    format!(
        r#"{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:{port}",
            "replay_endpoint": "tcp://*:{replay}", "topic": "kv-events"}}"#
    )
}

/// A one-token completion of `prompt` (text, or token ids) at `url` (an engine or a
/// gateway), which must answer 200.
pub async fn complete_on(url: &str, prompt: impl Into<Value>) {
    let r = post_json(
        &format!("{url}/v1/completions"),
        &serde_json::json!({"prompt": prompt.into(), "max_tokens": 1}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
}

/// A prompt of `n` token ids that no prompt of another `k` starts with.
pub fn unique_tokens(k: u32, n: u32) -> Vec<u32> {
    (0..n).map(|i| 1000 + k * 5000 + i).collect()
}

/// A gateway config for tests: loopback, OS-picked port, one HTTP thread, a temp data dir.
pub fn test_config(dir: &tempfile::TempDir) -> GatewayConfig {
    GatewayConfig {
        port: 0,
        http_workers: Some(1),
        data_dir: dir.path().join("data"),
        health: HealthConfig {
            interval: Duration::from_secs(3600),
            ..HealthConfig::default()
        },
        ..GatewayConfig::default()
    }
}

impl Harness {
    /// `n` simulated engines with `sim`, and a gateway routing to all of them.
    pub fn start(n: usize, sim: SimConfig, tweak: impl FnOnce(&mut GatewayConfig)) -> Harness {
        Harness::start_each(vec![sim; n], tweak)
    }

    /// One simulated engine per config, in order, and a gateway routing to all of them.
    pub fn start_each(sims: Vec<SimConfig>, tweak: impl FnOnce(&mut GatewayConfig)) -> Harness {
        let fleet = SimFleet::start_each("127.0.0.1", 0, sims).expect("simulated fleet starts");
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cfg = test_config(&dir);
        cfg.worker_urls = fleet.urls();
        tweak(&mut cfg);
        let gw = Gateway::start(cfg).expect("gateway starts");
        Harness { fleet, gw, dir }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.gw.url())
    }

    /// Asks for a poll now and waits until the selector has a load report from every
    /// engine.
    pub async fn wait_for_load_reports(&self) {
        self.gw.actors().poller.do_send(kvgate_poller::PollNow);
        let sel = self.gw.actors().selector.clone();
        wait_for_async(10, "a load report from every engine", || {
            let sel = sel.clone();
            async move {
                sel.send(kvgate_gateway::testing::GetViews)
                    .await
                    .is_ok_and(|v| v.iter().all(|w| w.load.is_some()))
            }
        })
        .await;
    }

    /// `n` unrelated completions at once (the seed's burst), each answered 200.
    pub async fn burst(&self, n: usize) {
        let reqs = (0..n).map(|i| {
            let url = self.url("/v1/completions");
            async move {
                let prompt = format!("unrelated prompt number {i} about topic {}", i * 7919);
                let body = serde_json::json!({"prompt": prompt, "max_tokens": 8});
                let r = post_json(&url, &body).await;
                assert_eq!(r.status.as_u16(), 200, "{}", r.text());
            }
        });
        futures_util::future::join_all(reqs).await;
    }

    /// Requests each engine has accepted, in fleet order.
    pub fn split(&self) -> Vec<u64> {
        (0..self.fleet.len())
            .map(|i| self.fleet.engine(i).stats().requests)
            .collect()
    }
}

/// A response as the tests look at it.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: awc::http::header::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    /// Asserts an OpenAI-style error body with the given status and code.
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.text());
        let j = self.json();
        assert_eq!(j["error"]["code"], code, "body: {j}");
        assert!(
            j["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{j}"
        );
        assert!(j["error"]["type"].as_str().is_some(), "{j}");
        assert!(self.header("x-request-id").is_some());
    }
}

pub fn client() -> awc::Client {
    awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish()
}

/// Reads a whole answer.
pub async fn finish_reply(
    resp: awc::ClientResponse<
        impl futures_util::Stream<Item = Result<Bytes, awc::error::PayloadError>> + Unpin,
    >,
) -> Reply {
    finish(resp).await
}

async fn finish(
    mut resp: awc::ClientResponse<
        impl futures_util::Stream<Item = Result<Bytes, awc::error::PayloadError>> + Unpin,
    >,
) -> Reply {
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.body().limit(64 * 1024 * 1024).await.expect("body");
    Reply {
        status,
        headers,
        body,
    }
}

pub async fn post(url: &str, body: impl Into<Bytes>) -> Reply {
    let resp = client()
        .post(url)
        .insert_header(("content-type", "application/json"))
        .send_body(body.into())
        .await
        .expect("request sent");
    finish(resp).await
}

pub async fn post_json(url: &str, body: &Value) -> Reply {
    post(url, serde_json::to_vec(body).expect("json")).await
}

pub async fn get(url: &str) -> Reply {
    finish(client().get(url).send().await.expect("request sent")).await
}

pub async fn delete(url: &str) -> Reply {
    finish(client().delete(url).send().await.expect("request sent")).await
}

/// Polls `cond` every 20 ms until it holds; panics after `secs` seconds. For waiting on
/// state, never for asserting time.
pub async fn wait_for(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..secs * 50 {
        if cond() {
            return;
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Sends `/generate` with `input_ids` through the gateway and answers which simulated
/// engine served it (from the answer's id).
pub async fn generate_on(gw: &Gateway, ids: Vec<u32>, max_new_tokens: u32) -> usize {
    let body = serde_json::json!({"input_ids": ids, "sampling_params": {"max_new_tokens": max_new_tokens}});
    let r = post_json(&format!("{}/generate", gw.url()), &body).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    kvgate_engine_sim::engine_of(r.json()["meta_info"]["id"].as_str().unwrap_or(""))
        .expect("an engine id")
}

/// The gateway's `GET /workers` list.
pub async fn workers(gw: &Gateway) -> Vec<Value> {
    get(&format!("{}/workers", gw.url())).await.json()["workers"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Reads `GET /workers` every 20 ms until `ok` holds of it, and returns it; panics after
/// 10 s. For waiting on state, never for asserting time.
pub async fn until_workers(gw: &Gateway, what: &str, ok: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    for _ in 0..500 {
        let w = workers(gw).await;
        if ok(&w) {
            return w;
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}: {:?}", workers(gw).await);
}

/// The JSON objects in an SSE body's `data:` lines, and whether it ended with `[DONE]`.
pub fn sse_events(body: &str) -> (Vec<Value>, bool) {
    let mut events = Vec::new();
    let mut done = false;
    for line in body.lines() {
        if let Some(data) = line.strip_prefix("data: ") {
            if data == "[DONE]" {
                done = true;
            } else {
                events.push(
                    serde_json::from_str(data)
                        .unwrap_or_else(|e| panic!("bad SSE data {data:?}: {e}")),
                );
            }
        }
    }
    (events, done)
}

/// Like [`wait_for`], for a condition that needs to await (an actor's answer).
pub async fn wait_for_async<F, Fut>(secs: u64, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..secs * 50 {
        if cond().await {
            return;
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A port free on every one of `hosts` when asked (each bound and released), for
/// simulated engines that must share one port on distinct loopback addresses, as the
/// pods of a Deployment do.
pub fn port_free_on(hosts: &[&str]) -> u16 {
    for _ in 0..100 {
        let first = std::net::TcpListener::bind((hosts[0], 0)).expect("bind a loopback address");
        let port = first.local_addr().expect("addr").port();
        let rest: Vec<_> = (hosts[1..].iter())
            .map(|h| std::net::TcpListener::bind((*h, port)))
            .collect();
        if rest.iter().all(Result::is_ok) {
            return port;
        }
    }
    panic!("no port free on all of {hosts:?}");
}

/// One simulated engine listening on `host:port` (a pod's IP and the discovery port).
pub fn engine_at(host: &str, port: u16) -> SimFleet {
    SimFleet::start_each(host, port, vec![SimConfig::default()]).expect("simulated engine starts")
}

/// Registers `url` with `gw` through `POST /workers`, its engine publishing KV events on
/// `port` and answering replays on `replay` (on the worker's host): how a vLLM engine,
/// which advertises none, is followed.
pub async fn add_with_events(gw: &Gateway, url: &str, port: u16, replay: u16) {
    let events = serde_json::json!({"publisher": "zmq", "endpoint": format!("tcp://*:{port}"),
        "replay_endpoint": format!("tcp://*:{replay}")});
    let r = post_json(
        &format!("{}/workers", gw.url()),
        &serde_json::json!({"url": url, "kv_events_config": events}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
}
