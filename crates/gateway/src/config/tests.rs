use std::collections::HashMap;
use std::io::Write;

use super::*;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn toml_file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

#[test]
fn file_then_env_then_flags() {
    let f = toml_file(
        "port = 1000\nlog_level = \"debug\"\nhost = \"0.0.0.0\"\nworker_urls = [\"http://f:1\"]\n",
    );
    let from_file = GatewayConfig::load(Some(f.path()), &HashMap::new(), vec![]).unwrap();
    assert_eq!(
        (
            from_file.port,
            from_file.log_level.as_str(),
            from_file.host.as_str()
        ),
        (1000, "debug", "0.0.0.0")
    );
    assert_eq!(from_file.worker_urls, vec!["http://f:1"]);

    let e = env(&[
        ("KVGATE_PORT", "2000"),
        ("KVGATE_WORKER_URLS", "http://e:1 http://e:2"),
        ("OTHER", "x"),
    ]);
    let from_env = GatewayConfig::load(Some(f.path()), &e, vec![]).unwrap();
    assert_eq!(
        (from_env.port, from_env.log_level.as_str()),
        (2000, "debug")
    );
    assert_eq!(from_env.worker_urls, vec!["http://e:1", "http://e:2"]);

    let flags = vec![("port".to_string(), config::Value::from(3000))];
    let from_flags = GatewayConfig::load(Some(f.path()), &e, flags).unwrap();
    assert_eq!(
        (
            from_flags.port,
            from_flags.log_level.as_str(),
            from_flags.host.as_str()
        ),
        (3000, "debug", "0.0.0.0")
    );
}

#[test]
fn nested_policy_and_durations() {
    let f = toml_file("request_timeout_secs = 2.5\n[policy]\nkind = \"random\"\n");
    let c = GatewayConfig::load(Some(f.path()), &HashMap::new(), vec![]).unwrap();
    assert_eq!(c.request_timeout, Duration::from_millis(2500));
    assert_eq!(c.policy.kind, kvgate_policies::PolicyKind::Random);
    let e = env(&[("KVGATE_POLICY__KIND", "round_robin")]);
    let c = GatewayConfig::load(Some(f.path()), &e, vec![]).unwrap();
    assert_eq!(c.policy.kind, kvgate_policies::PolicyKind::RoundRobin);
    // The prefill hold: on by default, zero (off) accepted.
    assert_eq!(c.prefill_hold, Duration::from_millis(500));
    let e = env(&[("KVGATE_PREFILL_HOLD_SECS", "0")]);
    let c = GatewayConfig::load(None, &e, vec![]).unwrap();
    assert_eq!(c.prefill_hold, Duration::ZERO);
}

#[test]
fn a_policy_knob_alone_keeps_the_default_policy() {
    use kvgate_policies::PolicyKind::CacheAware;
    let flag = vec![(
        "policy.max_tree_size".to_string(),
        config::Value::from(4096),
    )];
    let c = GatewayConfig::load(None, &HashMap::new(), flag).unwrap();
    assert_eq!((c.policy.kind, c.policy.max_tree_size), (CacheAware, 4096));
    let e = env(&[("KVGATE_POLICY__CACHE_THRESHOLD", "0.5")]);
    let c = GatewayConfig::load(None, &e, vec![]).unwrap();
    assert_eq!((c.policy.kind, c.policy.cache_threshold), (CacheAware, 0.5));
    let f = toml_file("[policy]\nblock_size = 32\n");
    let c = GatewayConfig::load(Some(f.path()), &HashMap::new(), vec![]).unwrap();
    assert_eq!((c.policy.kind, c.policy.block_size), (CacheAware, 32));
}

fn load_err(file: &str, e: &[(&str, &str)]) -> String {
    let f = toml_file(file);
    GatewayConfig::load(Some(f.path()), &env(e), vec![])
        .unwrap_err()
        .to_string()
}

#[test]
fn bad_config_names_the_key() {
    assert!(load_err("prot = 1\n", &[]).contains("prot"));
    assert!(load_err("port = \"abc\"\n", &[]).contains("port"));
    assert!(load_err("", &[("KVGATE_PORT", "99999")]).contains("port"));
    assert!(load_err("", &[("KVGATE_BOGUS", "1")]).contains("bogus"));
    assert!(load_err("prefill_hold_secs = 1e19\n", &[]).contains("prefill_hold_secs"));
    assert!(load_err("snapshot_backoff = -1\n", &[]).contains("snapshot_backoff"));
    assert!(load_err("request_timeout_secs = 2592001\n", &[]).contains("request_timeout_secs"));
    // Every key of the README's table has its variable.
    let e = env(&[
        ("KVGATE_LOG_JSON", "true"),
        ("KVGATE_MAX_PAYLOAD_SIZE", "4096"),
        ("KVGATE_REQUEST_TIMEOUT_SECS", "7"),
        ("KVGATE_HEADER_READ_TIMEOUT_SECS", "3"),
        ("KVGATE_HEALTH_CHECK_INTERVAL_SECS", "2"),
    ]);
    let c = GatewayConfig::load(None, &e, vec![]).unwrap();
    assert!(c.log_json);
    assert_eq!(c.max_payload_size, 4096);
    assert_eq!(c.request_timeout, std::time::Duration::from_secs(7));
    assert_eq!(c.header_read_timeout, std::time::Duration::from_secs(3));
    assert_eq!(c.health.interval, std::time::Duration::from_secs(2));
    // The other kvgate tools' variables are not configuration and are not refused.
    let tools = env(&[
        ("KVGATE_URL", "http://127.0.0.1:30000"),
        ("KVGATE_BENCH_LOG", "debug"),
        ("KVGATE_CONFIG", "/nonexistent.toml"),
    ]);
    assert_eq!(
        GatewayConfig::load(None, &tools, vec![]).unwrap(),
        GatewayConfig::default()
    );
    assert!(load_err("worker_urls = [\"ftp://x\"]\n", &[]).contains("worker_urls"));
    assert!(
        load_err("health_check_interval_secs = 0\n", &[]).contains("health_check_interval_secs")
    );
    assert!(load_err("[policy]\nkind = \"fastest\"\n", &[]).contains("kind"));
    assert!(
        load_err("port = [\n", &[]).contains("port")
            || load_err("port = [\n", &[]).contains("TOML")
    );
}

#[test]
fn the_store_cache_is_a_budget_of_at_least_a_mebibyte() {
    let e = env(&[("KVGATE_STORE_CACHE_BYTES", "8388608")]);
    let c = GatewayConfig::load(None, &e, vec![]).unwrap();
    assert_eq!(c.store_cache_bytes, 8 << 20);
    assert_eq!(
        GatewayConfig::default().store_cache_bytes,
        kvgate_store::DEFAULT_CACHE_BYTES
    );
    assert!(load_err("store_cache_bytes = 1000\n", &[]).contains("store_cache_bytes"));
}

#[test]
fn defaults_are_valid() {
    let c = GatewayConfig::load(None, &HashMap::new(), vec![]).unwrap();
    assert_eq!(c, GatewayConfig::default());
}

#[test]
fn the_prometheus_listener_is_off_by_default_and_not_the_gateway_port() {
    let c = GatewayConfig::load(None, &HashMap::new(), vec![]).unwrap();
    assert_eq!(
        (c.prometheus_port, c.prometheus_host.as_str()),
        (None, "127.0.0.1")
    );
    let c = GatewayConfig::load(
        None,
        &env(&[
            ("KVGATE_PROMETHEUS_PORT", "29000"),
            ("KVGATE_PROMETHEUS_HOST", "0.0.0.0"),
        ]),
        vec![],
    )
    .unwrap();
    assert_eq!(
        (c.prometheus_port, c.prometheus_host.as_str()),
        (Some(29000), "0.0.0.0")
    );
    assert!(load_err("port = 9000\nprometheus_port = 9000\n", &[]).contains("prometheus_port"));
}

#[test]
fn the_kv_event_index_is_capped_and_the_cap_cannot_be_zero() {
    let c = GatewayConfig::load(None, &HashMap::new(), vec![]).unwrap();
    assert_eq!(c.events.kv_events_max_blocks, 1_000_000);
    let c = GatewayConfig::load(
        None,
        &env(&[("KVGATE_KV_EVENTS_MAX_BLOCKS", "5000")]),
        vec![],
    )
    .unwrap();
    assert_eq!(c.events.kv_events_max_blocks, 5000);
    assert!(load_err("kv_events_max_blocks = 0\n", &[]).contains("kv_events_max_blocks"));
}

#[test]
fn sections_read_their_flat_keys_and_name_them_when_bad() {
    let c = GatewayConfig::load(
        None,
        &env(&[
            ("KVGATE_CB_FAILURE_THRESHOLD", "7"),
            ("KVGATE_RETRY_MAX_RETRIES", "2"),
            ("KVGATE_QUEUE_SIZE", "9"),
            ("KVGATE_WORKER_ALLOW", "10.0.0.0/8 gpu.example"),
        ]),
        vec![],
    )
    .unwrap();
    assert_eq!(c.circuit.failure_threshold, 7);
    assert_eq!(c.retry.max_retries, 2);
    assert_eq!(c.admission.queue_size, 9);
    assert_eq!(c.access.worker_allow, ["10.0.0.0/8", "gpu.example"]);
    // A wrong type in a section, a bad value, a misspelt section key.
    assert!(load_err("cb_failure_threshold = \"x\"\n", &[]).contains("cb_failure_threshold"));
    assert!(load_err("", &[("KVGATE_CB_FAILURE_THRESHOLD", "0")]).contains("cb_failure_threshold"));
    assert!(load_err("cb_failure_treshold = 3\n", &[]).contains("cb_failure_treshold"));
    assert!(load_err("worker_allow = [\"10.0.0.0/33\"]\n", &[]).contains("worker_allow"));
    assert!(
        load_err("kv_events_config = '{\"endpoint\": \"ipc:///x\"}'\n", &[])
            .contains("kv_events_config")
    );
    // The file form keeps the flat keys the flags and variables name.
    let v = serde_json::to_value(GatewayConfig::default()).unwrap();
    for key in [
        "cb_failure_threshold",
        "retry_jitter_factor",
        "health_check_endpoint",
    ] {
        assert!(v.get(key).is_some(), "{key}");
    }
}

#[test]
fn an_embedder_cannot_start_an_invalid_gateway() {
    let mut cfg = GatewayConfig::default();
    cfg.circuit.failure_threshold = 0;
    match crate::Gateway::start(cfg) {
        Err(crate::StartError::Config(e)) => {
            assert!(e.to_string().contains("cb_failure_threshold"), "{e}")
        }
        other => panic!("started: {other:?}"),
    }
}

/// What the kubelet injects into a pod for a Service named `kvgate` whose port 30000 is
/// named `http` (and one named `kvgate-metrics`): none of it is configuration.
fn kubelet_service_links() -> Vec<(&'static str, &'static str)> {
    vec![
        ("KVGATE_SERVICE_HOST", "10.96.0.12"),
        ("KVGATE_SERVICE_PORT", "30000"),
        ("KVGATE_SERVICE_PORT_HTTP", "30000"),
        ("KVGATE_PORT", "tcp://10.96.0.12:30000"),
        ("KVGATE_PORT_30000_TCP", "tcp://10.96.0.12:30000"),
        ("KVGATE_PORT_30000_TCP_PROTO", "tcp"),
        ("KVGATE_PORT_30000_TCP_PORT", "30000"),
        ("KVGATE_PORT_30000_TCP_ADDR", "10.96.0.12"),
        ("KVGATE_METRICS_SERVICE_HOST", "10.96.0.13"),
        ("KVGATE_METRICS_SERVICE_PORT", "9090"),
        ("KVGATE_METRICS_PORT", "tcp://10.96.0.13:9090"),
        ("KVGATE_METRICS_PORT_9090_TCP", "tcp://10.96.0.13:9090"),
        ("KVGATE_METRICS_PORT_9090_TCP_PROTO", "tcp"),
        ("KVGATE_METRICS_PORT_9090_TCP_PORT", "9090"),
        ("KVGATE_METRICS_PORT_9090_TCP_ADDR", "10.96.0.13"),
    ]
}

#[test]
fn kubernetes_service_links_are_not_configuration() {
    let links = kubelet_service_links();
    let c = GatewayConfig::load(None, &env(&links), vec![]).unwrap();
    assert_eq!(c, GatewayConfig::default());
    // Beside them, kvgate's own variables still count, `KVGATE_PORT` as a number too.
    let mut with_own = links.clone();
    with_own.retain(|(k, _)| *k != "KVGATE_PORT");
    with_own.extend([("KVGATE_PORT", "31000"), ("KVGATE_PROMETHEUS_PORT", "9100")]);
    let c = GatewayConfig::load(None, &env(&with_own), vec![]).unwrap();
    assert_eq!((c.port, c.prometheus_port), (31000, Some(9100)));
    // A misspelt key is still refused by name, service links or not.
    let mut typo = links.clone();
    typo.push(("KVGATE_POLICYY", "round_robin"));
    assert!(load_err("", &typo).contains("policyy"));
    // A name of a link's shape with a value no kubelet writes is not a link.
    assert!(load_err("", &[("KVGATE_SERVICE_HOST", "not an address")]).contains("service_host"));
    assert!(load_err("", &[("KVGATE_PORT", "tcp://gateway:30000")]).contains("port"));
}

#[test]
fn the_shutdown_delay_is_a_duration_key() {
    let c =
        GatewayConfig::load(None, &env(&[("KVGATE_SHUTDOWN_DELAY_SECS", "5")]), vec![]).unwrap();
    assert_eq!(c.shutdown_delay, std::time::Duration::from_secs(5));
    assert!(load_err("shutdown_delay_secs = -1\n", &[]).contains("shutdown_delay_secs"));
}

#[test]
fn request_id_headers_are_a_list_of_header_names() {
    let c = GatewayConfig::load(None, &HashMap::new(), vec![]).unwrap();
    assert_eq!(c.request_id_headers, DEFAULT_REQUEST_ID_HEADERS.to_vec());
    let e = env(&[("KVGATE_REQUEST_ID_HEADERS", "x-a x-b")]);
    let c = GatewayConfig::load(None, &e, vec![]).unwrap();
    assert_eq!(c.request_id_headers, vec!["x-a", "x-b"]);
    let e = env(&[("KVGATE_REQUEST_ID_HEADERS", "x-a b@d")]);
    let err = GatewayConfig::load(None, &e, vec![])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("request_id_headers") && err.contains("b@d"),
        "{err}"
    );
}

#[test]
fn a_worker_can_have_its_own_kv_events_config_in_the_file() {
    let f = toml_file(
        "[kv_events_configs]\n\"HTTP://10.0.0.1:8000/\" = '{\"endpoint\": \"tcp://*:5557\"}'\n",
    );
    let c = GatewayConfig::load(Some(f.path()), &HashMap::new(), vec![]).unwrap();
    assert_eq!(
        c.events
            .worker_kv_events_config("http://10.0.0.1:8000")
            .as_deref(),
        Some("{\"endpoint\": \"tcp://*:5557\"}")
    );
    assert_eq!(
        c.events.worker_kv_events_config("http://10.0.0.2:8000"),
        None
    );
    let bad = toml_file(
        "[kv_events_configs]\n\"http://10.0.0.1:8000\" = '{\"endpoint\": \"ipc://x\"}'\n",
    );
    let err = GatewayConfig::load(Some(bad.path()), &HashMap::new(), vec![])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("kv_events_configs") && err.contains("10.0.0.1"),
        "{err}"
    );
}
