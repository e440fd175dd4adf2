//! The `kvgate` binary's flags: one table, each flag mapped onto one config key. Help
//! lines name the key, the environment variable and the default, read from
//! `GatewayConfig::default()`, so they cannot drift from the code.

use std::path::PathBuf;

use kvgate_gateway::{GatewayConfig, Overrides};

/// How a flag's value is read.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Int,
    Float,
    Text,
    /// One or more values, space-separated after the flag.
    Texts,
    /// Comma-separated integers.
    Ints,
    /// No value: present means true.
    Switch,
    /// Given once per value (`--api-key A --api-key B`).
    Repeated,
}

/// `(flag, config key, kind, help)`. Flag names are the reference gateway's where it has
/// one.
const FLAGS: &[(&str, &str, Kind, &str)] = &[
    ("host", "host", Kind::Text, "Address to listen on"),
    ("port", "port", Kind::Int, "Port to listen on"),
    (
        "worker-urls",
        "worker_urls",
        Kind::Texts,
        "Workers to register at start, space-separated (more through POST /workers)",
    ),
    (
        "policy",
        "policy.kind",
        Kind::Text,
        "Routing policy: cache_aware, least_load, power_of_two, round_robin, random, prefix_hash, consistent_hashing",
    ),
    (
        "data-dir",
        "data_dir",
        Kind::Text,
        "Where the prefix index and the worker registry are kept (sled)",
    ),
    (
        "log-level",
        "log_level",
        Kind::Text,
        "A tracing filter: error, warn, info, debug, trace, or per-target directives",
    ),
    ("log-json", "log_json", Kind::Switch, "Log as JSON lines"),
    (
        "max-payload-size",
        "max_payload_size",
        Kind::Int,
        "Largest request body in bytes (413 above it)",
    ),
    (
        "request-timeout-secs",
        "request_timeout_secs",
        Kind::Float,
        "Longest upstream request, streams included, seconds",
    ),
    (
        "connect-timeout-secs",
        "connect_timeout_secs",
        Kind::Float,
        "Longest wait to connect to a worker, seconds",
    ),
    (
        "body-read-timeout-secs",
        "body_read_timeout_secs",
        Kind::Float,
        "Time an admitted request has to send its body (408 after it), seconds",
    ),
    (
        "header-read-timeout-secs",
        "header_read_timeout_secs",
        Kind::Float,
        "Time a client has to send its request head, seconds",
    ),
    (
        "health-check-interval-secs",
        "health_check_interval_secs",
        Kind::Float,
        "Period of the workers' health checks, seconds",
    ),
    (
        "health-check-timeout-secs",
        "health_check_timeout_secs",
        Kind::Float,
        "Timeout of one health check or detection probe, seconds",
    ),
    (
        "health-failure-threshold",
        "health_failure_threshold",
        Kind::Int,
        "Consecutive failed checks before a worker is marked unhealthy",
    ),
    (
        "health-success-threshold",
        "health_success_threshold",
        Kind::Int,
        "Consecutive passing checks before an unhealthy worker is ready again",
    ),
    (
        "cache-threshold",
        "policy.cache_threshold",
        Kind::Float,
        "Threshold mode: a hit needs matched/input strictly above this",
    ),
    (
        "cache-aware-mode",
        "policy.cache_mode",
        Kind::Text,
        "cache_aware mode: cost (threshold-free) or threshold (reference-compatible)",
    ),
    (
        "balance-abs-threshold",
        "policy.balance_abs_threshold",
        Kind::Int,
        "Count gate: a worker is too hot above the mean in-flight plus this...",
    ),
    (
        "balance-rel-threshold",
        "policy.balance_rel_threshold",
        Kind::Float,
        "...and above this multiple of the mean (both must hold)",
    ),
    (
        "balance-token-usage-threshold",
        "policy.balance_token_usage_threshold",
        Kind::Float,
        "KV pressure: a KV-usage spread above this routes by load alone",
    ),
    (
        "overload-token-usage-threshold",
        "policy.overload_token_usage_threshold",
        Kind::Float,
        "KV pressure: a worker's KV usage above this routes by load alone",
    ),
    (
        "eviction-interval-secs",
        "policy.eviction_interval_secs",
        Kind::Float,
        "Prefix-index eviction period, seconds",
    ),
    (
        "max-tree-size",
        "policy.max_tree_size",
        Kind::Int,
        "Prefix-tree budget per model and tree, in units (bytes or tokens)",
    ),
    (
        "block-size",
        "policy.block_size",
        Kind::Int,
        "Token-tree page size, in tokens",
    ),
    (
        "cache-index",
        "policy.cache_index",
        Kind::Text,
        "Index cache_aware consults: tree, or hash (token prompts only)",
    ),
    (
        "cache-ttl-secs",
        "policy.cache_ttl_secs",
        Kind::Float,
        "Hash mode: how long a recorded holder stays live, seconds",
    ),
    (
        "cache-boundaries",
        "policy.cache_boundaries",
        Kind::Ints,
        "Hash mode and prefix_hash: token positions to hash the head at",
    ),
    (
        "least-load-default-throughput",
        "policy.least_load_default_throughput",
        Kind::Float,
        "Expected wait: tok/s per rank when no candidate has a live rate",
    ),
    (
        "least-load-kv-pressure-weight",
        "policy.kv_pressure_weight",
        Kind::Float,
        "Expected wait: seconds per unit of the KV-pressure term",
    ),
    (
        "least-load-mean-prefill-tokens",
        "policy.mean_prefill_tokens",
        Kind::Int,
        "Expected wait: tokens assumed per queued request when only counts are known",
    ),
    (
        "least-load-max-waiting-requests",
        "policy.least_load_max_waiting_requests",
        Kind::Int,
        "least_load: skip workers with this many waiting requests",
    ),
    (
        "default-prefill-throughput",
        "policy.default_prefill_throughput",
        Kind::Float,
        "Cost mode: prefill tok/s when no worker reports prefill counters",
    ),
    (
        "bytes-per-token",
        "policy.bytes_per_token",
        Kind::Float,
        "UTF-8 bytes per token, to price text requests in tokens",
    ),
    (
        "min-match-tokens",
        "policy.min_match_tokens",
        Kind::Int,
        "Cost mode: holdings of fewer tokens count as none",
    ),
    (
        "affinity-margin",
        "policy.affinity_margin",
        Kind::Float,
        "Cost mode: a holder within this fraction of the cheapest cost keeps the request",
    ),
    (
        "power-of-two-load-metric",
        "policy.power_of_two_load_metric",
        Kind::Text,
        "power_of_two: expected_wait, requests or least_requests",
    ),
    (
        "prefix-token-count",
        "policy.prefix_token_count",
        Kind::Int,
        "prefix_hash: tokens of the head to hash",
    ),
    (
        "prefix-hash-load-factor",
        "policy.prefix_hash_load_factor",
        Kind::Float,
        "prefix_hash: a ring target is overloaded above this multiple of the mean...",
    ),
    (
        "prefix-hash-balance-abs-threshold",
        "policy.prefix_hash_balance_abs_threshold",
        Kind::Int,
        "...and above the mean plus this",
    ),
    (
        "load-monitor-interval",
        "poller.interval_secs",
        Kind::Float,
        "Load polling period, seconds",
    ),
    (
        "load-monitor-timeout",
        "poller.timeout_secs",
        Kind::Float,
        "Timeout of one load poll, seconds",
    ),
    (
        "snapshot-interval-secs",
        "snapshot_interval_secs",
        Kind::Float,
        "Prefix-index snapshot period, seconds",
    ),
    (
        "snapshot-backoff",
        "snapshot_backoff",
        Kind::Float,
        "The next timed snapshot waits this many times the last one's duration (0: off)",
    ),
    (
        "prefill-hold-secs",
        "prefill_hold_secs",
        Kind::Float,
        "Longest wait behind a streamed request prefilling the same prefix (0: off)",
    ),
    (
        "http-workers",
        "http_workers",
        Kind::Int,
        "HTTP threads; the routing actors share the first",
    ),
    (
        "kv-events-max-blocks",
        "kv_events_max_blocks",
        Kind::Int,
        "Blocks the KV-event chain index holds before it evicts (about 170 B each)",
    ),
    (
        "kv-events-config",
        "kv_events_config",
        Kind::Text,
        "The engines' own --kv-events-config JSON, for workers that do not advertise kv_events (vLLM)",
    ),
    (
        "tokenizer-path",
        "tokenizer_path",
        Kind::Text,
        "The model's tokenizer (directory or tokenizer.json) for matching text requests on KV events",
    ),
    (
        "prometheus-port",
        "prometheus_port",
        Kind::Int,
        "Also serve GET /metrics, without a key, on this port",
    ),
    (
        "prometheus-host",
        "prometheus_host",
        Kind::Text,
        "Where the --prometheus-port listener binds (default 127.0.0.1)",
    ),
    (
        "retry-max-retries",
        "retry_max_retries",
        Kind::Int,
        "Attempts in all for one request, the first included (1: no retry)",
    ),
    (
        "disable-retries",
        "disable_retries",
        Kind::Switch,
        "Never try a failed request on another worker",
    ),
    (
        "retry-initial-backoff-secs",
        "retry_initial_backoff_secs",
        Kind::Float,
        "Wait before the first retry, doubled for each later one, seconds",
    ),
    (
        "retry-max-backoff-secs",
        "retry_max_backoff_secs",
        Kind::Float,
        "Longest wait between two attempts, seconds",
    ),
    (
        "retry-jitter-factor",
        "retry_jitter_factor",
        Kind::Float,
        "Each wait is drawn within this fraction of its nominal value",
    ),
    (
        "cb-failure-threshold",
        "cb_failure_threshold",
        Kind::Int,
        "Failures within the window that open a worker's circuit",
    ),
    (
        "cb-success-threshold",
        "cb_success_threshold",
        Kind::Int,
        "Successful probes that close a half-open circuit",
    ),
    (
        "cb-timeout-duration-secs",
        "cb_timeout_duration_secs",
        Kind::Float,
        "How long an open circuit admits nothing before probes, seconds",
    ),
    (
        "cb-window-duration-secs",
        "cb_window_duration_secs",
        Kind::Float,
        "Window the circuit counts failures in, seconds",
    ),
    (
        "cb-half-open-max-requests",
        "cb_half_open_max_requests",
        Kind::Int,
        "Probe requests a half-open circuit admits at once",
    ),
    (
        "disable-circuit-breaker",
        "disable_circuit_breaker",
        Kind::Switch,
        "Never open a worker's circuit",
    ),
    (
        "health-check-endpoint",
        "health_check_endpoint",
        Kind::Text,
        "Route of the health checks (any 2xx passes)",
    ),
    (
        "stream-first-token-timeout-secs",
        "stream_first_token_timeout_secs",
        Kind::Float,
        "A streamed request with no first byte by then is tried elsewhere, seconds",
    ),
    (
        "max-concurrent-requests",
        "max_concurrent_requests",
        Kind::Int,
        "Inference requests served at once",
    ),
    (
        "queue-size",
        "queue_size",
        Kind::Int,
        "Requests that may wait for a slot; more get 429",
    ),
    (
        "queue-timeout-secs",
        "queue_timeout_secs",
        Kind::Float,
        "Longest wait for a slot (503 after it), seconds",
    ),
    (
        "rate-limit-tokens-per-second",
        "rate_limit_tokens_per_second",
        Kind::Float,
        "Requests per second per client (per API key when keys are set)",
    ),
    (
        "api-key",
        "api_keys",
        Kind::Repeated,
        "A client key for the inference routes and /v1/models (repeatable)",
    ),
    (
        "control-plane-api-keys",
        "control_plane_api_keys",
        Kind::Repeated,
        "An admin key, or id:name:role:key (repeatable)",
    ),
    (
        "allow-open-admin",
        "allow_open_admin",
        Kind::Switch,
        "Start on a non-loopback host with no admin key",
    ),
    (
        "worker-allow",
        "worker_allow",
        Kind::Repeated,
        "A host, IP or CIDR range that workers added through the API must be in (repeatable)",
    ),
    (
        "trusted-proxies",
        "trusted_proxies",
        Kind::Texts,
        "Proxies (addresses or CIDR ranges, space-separated) whose X-Forwarded-For or Forwarded names the client, for per-address rate limits",
    ),
    (
        "worker-api-key",
        "worker_api_key",
        Kind::Text,
        "The key sent to every worker in place of the client's",
    ),
    (
        "shutdown-grace-period-secs",
        "shutdown_grace_period_secs",
        Kind::Float,
        "After SIGTERM, how long in-flight requests may take to finish, seconds",
    ),
    (
        "shutdown-delay-secs",
        "shutdown_delay_secs",
        Kind::Float,
        "After SIGTERM, how long to keep accepting (readiness already 503) before draining, seconds",
    ),
    (
        "service-discovery",
        "service_discovery",
        Kind::Switch,
        "Add the worker pods the Kubernetes API lists (--selector), and follow them",
    ),
    (
        "selector",
        "selector",
        Kind::Texts,
        "Labels a worker pod carries, key=value, space-separated (all must match)",
    ),
    (
        "service-discovery-namespace",
        "service_discovery_namespace",
        Kind::Text,
        "Namespace of the worker pods (default: the gateway pod's own, else default)",
    ),
    (
        "service-discovery-port",
        "service_discovery_port",
        Kind::Int,
        "Port the engines listen on in every worker pod",
    ),
    (
        "service-discovery-kubeconfig",
        "service_discovery_kubeconfig",
        Kind::Text,
        "A kubeconfig file instead of KUBECONFIG or the in-cluster service account",
    ),
    (
        "demo",
        "demo",
        Kind::Switch,
        "Start simulated engines in-process and route to them (no GPU needed)",
    ),
    (
        "demo-engines",
        "demo_engines",
        Kind::Int,
        "How many simulated engines --demo starts",
    ),
];

/// The environment variable of a config key: `policy.kind` is `KVGATE_POLICY__KIND`.
pub(crate) fn env_var(key: &str) -> String {
    format!("KVGATE_{}", key.replace('.', "__").to_ascii_uppercase())
}

/// A default as the help shows it: strings bare, lists space-separated, unset as `off`.
fn shown(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null | Value::Bool(false) => "off".to_owned(),
        Value::Bool(true) => "on".to_owned(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "none".to_owned(),
        Value::Array(a) => a.iter().map(shown).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// The whole command: `--config` and every flag of the table.
pub(crate) fn command() -> clap::Command {
    let defaults = serde_json::to_value(GatewayConfig::default()).unwrap_or_default();
    let flags = FLAGS.iter().map(|(flag, key, kind, help)| {
        let default = key
            .split('.')
            .try_fold(&defaults, |v, k| v.get(k))
            .map_or_else(|| "off".to_owned(), shown);
        let arg = clap::Arg::new(*flag).long(*flag).help(format!(
            "{help} [default: {default}] [key: {key}] [env: {}]",
            env_var(key)
        ));
        match kind {
            Kind::Int => arg.value_parser(clap::value_parser!(u64)),
            Kind::Float => arg.value_parser(clap::value_parser!(f64)),
            Kind::Text => arg.value_parser(clap::value_parser!(String)),
            Kind::Texts => arg.value_parser(clap::value_parser!(String)).num_args(1..),
            Kind::Ints => arg
                .value_parser(clap::value_parser!(u64))
                .num_args(1..)
                .value_delimiter(','),
            Kind::Switch => arg.action(clap::ArgAction::SetTrue),
            Kind::Repeated => arg
                .value_parser(clap::value_parser!(String))
                .action(clap::ArgAction::Append),
        }
    });
    clap::Command::new("kvgate")
        .version(env!("CARGO_PKG_VERSION"))
        .about("A cache-aware gateway for LLM inference engines (SGLang, vLLM, OpenAI-compatible).")
        .arg(
            clap::Arg::new("config")
                .long("config")
                .env("KVGATE_CONFIG")
                .hide_env_values(true)
                .value_parser(clap::value_parser!(PathBuf))
                .help("TOML config file; flags override the environment, which overrides the file"),
        )
        .args(flags)
}

/// The config file's path, and the flags given, as config-key overrides.
pub(crate) fn parse(m: &clap::ArgMatches) -> (Option<PathBuf>, Overrides) {
    let mut o: Overrides = Vec::new();
    for (flag, key, kind, _) in FLAGS {
        let v: Option<config::Value> = match kind {
            Kind::Int => m.get_one::<u64>(flag).map(|v| (*v).into()),
            Kind::Float => m.get_one::<f64>(flag).map(|v| (*v).into()),
            Kind::Text => m.get_one::<String>(flag).map(|v| v.clone().into()),
            Kind::Texts => m
                .get_many::<String>(flag)
                .map(|vs| vs.cloned().collect::<Vec<String>>().into()),
            Kind::Ints => m
                .get_many::<u64>(flag)
                .map(|vs| vs.copied().collect::<Vec<u64>>().into()),
            Kind::Switch => m.get_flag(flag).then(|| true.into()),
            Kind::Repeated => m
                .get_many::<String>(flag)
                .map(|vs| vs.cloned().collect::<Vec<String>>().into()),
        };
        if let Some(v) = v {
            o.push(((*key).to_owned(), v));
        }
    }
    (m.get_one::<PathBuf>("config").cloned(), o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_maps_onto_a_key_of_the_config() {
        for (flag, key, kind, _) in FLAGS {
            let value: config::Value = match kind {
                Kind::Int => 1u64.into(),
                Kind::Float => 1.0.into(),
                Kind::Text => "x".into(),
                Kind::Texts => vec!["x".to_owned()].into(),
                Kind::Ints => vec![1u64].into(),
                Kind::Switch => true.into(),
                Kind::Repeated => vec!["x".to_owned()].into(),
            };
            let env = std::collections::HashMap::new();
            // The value may be refused for itself; the key must not be unknown.
            if let Err(e) = GatewayConfig::load(None, &env, vec![((*key).to_owned(), value)]) {
                assert!(!e.to_string().contains("unknown field"), "--{flag}: {e}");
            }
        }
        assert_eq!(env_var("policy.cache_mode"), "KVGATE_POLICY__CACHE_MODE");
        command().debug_assert();
    }

    fn load(args: &[&str], env: &[(&str, &str)]) -> Result<GatewayConfig, String> {
        let m = command()
            .try_get_matches_from(std::iter::once("kvgate").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        let (_, overrides) = parse(&m);
        let env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        GatewayConfig::load(None, &env, overrides).map_err(|e| e.to_string())
    }

    #[test]
    fn service_discovery_takes_the_reference_flags_and_their_variables() {
        let c = load(
            &[
                "--service-discovery",
                "--selector",
                "app=sglang",
                "tier=gpu",
                "--service-discovery-namespace",
                "ml",
                "--service-discovery-port",
                "30000",
            ],
            &[],
        )
        .unwrap();
        let d = &c.discovery;
        assert!(d.service_discovery);
        assert_eq!(d.selector, ["app=sglang", "tier=gpu"]);
        assert_eq!(d.service_discovery_namespace.as_deref(), Some("ml"));
        assert_eq!(d.service_discovery_port, 30000);
        let c = load(
            &[],
            &[
                ("KVGATE_SERVICE_DISCOVERY", "true"),
                ("KVGATE_SELECTOR", "app=vllm role=decode"),
                ("KVGATE_SERVICE_DISCOVERY_PORT", "8080"),
            ],
        )
        .unwrap();
        assert_eq!(c.discovery.selector, ["app=vllm", "role=decode"]);
        assert_eq!(c.discovery.service_discovery_port, 8080);
        assert_eq!(c.discovery.service_discovery_namespace, None);
        assert_eq!(
            GatewayConfig::default().discovery.service_discovery_port,
            8000
        );
        // Refused, naming the key.
        let e = load(&["--service-discovery"], &[]).unwrap_err();
        assert!(e.contains("'selector'"), "{e}");
        let e = load(&["--service-discovery", "--selector", "app"], &[]).unwrap_err();
        assert!(e.contains("'selector'") && e.contains("'app'"), "{e}");
        let e = load(
            &[
                "--service-discovery",
                "--selector",
                "a=b",
                "--service-discovery-port",
                "0",
            ],
            &[],
        )
        .unwrap_err();
        assert!(e.contains("service_discovery_port"), "{e}");
        let e = load(
            &[
                "--service-discovery",
                "--selector",
                "a=b",
                "--service-discovery-port",
                "70000",
            ],
            &[],
        )
        .unwrap_err();
        assert!(e.contains("service_discovery_port"), "{e}");
        let e = load(
            &[
                "--service-discovery",
                "--selector",
                "a=b",
                "--service-discovery-namespace",
                "No_Such",
            ],
            &[],
        )
        .unwrap_err();
        assert!(e.contains("service_discovery_namespace"), "{e}");
    }
}
