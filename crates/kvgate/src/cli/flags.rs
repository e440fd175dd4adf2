//! The table of flags, over 600 lines because it is one table read whole (a flag every
//! five lines): `(flag, config key, kind, help)`, one row a flag, data that `cli` turns
//! into the clap command and reads back into config overrides.

/// How a flag's value is read.
#[derive(Debug, Clone, Copy)]
pub(super) enum Kind {
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
    /// One of these names: a wrong one is refused naming the flag and listing them.
    OneOf(&'static [&'static str]),
    /// Milliseconds, for a key in seconds (the reference gateway's `_ms` flags).
    Millis,
    /// Accepted for the reference gateway's scripts and without effect; the text says why,
    /// in the log at start.
    Accepted(&'static str),
    /// As `Accepted`, with a value.
    AcceptedValue(&'static str),
}

/// `--policy`'s values (`PolicyKind::ALL`'s names; a test keeps them in step).
pub(super) const POLICIES: &[&str] = &[
    "random",
    "round_robin",
    "power_of_two",
    "least_load",
    "cache_aware",
    "prefix_hash",
    "consistent_hashing",
];

/// `(flag, config key, kind, help)`. Flag names are the reference gateway's where it has
/// one.
pub(super) const FLAGS: &[(&str, &str, Kind, &str)] = &[
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
        Kind::OneOf(POLICIES),
        "Routing policy: cache_aware, least_load, power_of_two, round_robin, random, prefix_hash, consistent_hashing",
    ),
    (
        "data-dir",
        "data_dir",
        Kind::Text,
        "Where the prefix index and the worker registry are kept (sled)",
    ),
    (
        "store-cache-bytes",
        "store_cache_bytes",
        Kind::Int,
        "Most memory the store's page cache (sled) holds, in bytes",
    ),
    (
        "log-level",
        "log_level",
        Kind::Text,
        "A tracing filter: error, warn, info, debug, trace, or per-target directives",
    ),
    ("log-json", "log_json", Kind::Switch, "Log as JSON lines"),
    (
        "access-log",
        "access_log",
        Kind::OneOf(&["on", "off"]),
        "One info line per answered request: id, route, model, worker, decision path, status, TTFT, duration, prompt and cached tokens, retries",
    ),
    (
        "request-id-headers",
        "request_id_headers",
        Kind::Texts,
        "Request headers, space-separated, the first of which the client sends becomes the request id (logged, echoed as x-request-id, sent to the worker)",
    ),
    (
        "session-headers",
        "session_headers",
        Kind::Texts,
        "Request headers, space-separated, the first of which the client sends names its session (after the body's prompt_cache_key): a session's requests that no prefix decides follow it",
    ),
    (
        "otlp-endpoint",
        "otlp_endpoint",
        Kind::Text,
        "An OTLP/gRPC collector (http://host:4317): each request is a span exported there, the child of the client's traceparent; the engine gets the gateway's span as parent",
    ),
    (
        "passthrough-unknown-routes",
        "passthrough_unknown_routes",
        Kind::Switch,
        "Forward any other path under /v1/ to a worker chosen by load (otherwise 404 listing the routes served)",
    ),
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
        "Time a request has to send its body (408 after it; no slot is held meanwhile), seconds",
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
        Kind::OneOf(&["cost", "threshold"]),
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
        "eviction-interval",
        "policy.eviction_interval_secs",
        Kind::Float,
        "The reference gateway's spelling of --eviction-interval-secs",
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
        Kind::OneOf(&["tree", "hash"]),
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
        Kind::OneOf(&["expected_wait", "requests", "least_requests"]),
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
        "kv-events-silence-secs",
        "kv_events_silence_secs",
        Kind::Float,
        "A rank silent this long has its KV-event publisher asked (replay); no answer shows it stalled, seconds",
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
        "model-path",
        "tokenizer_path",
        Kind::Text,
        "The reference gateway's spelling of --tokenizer-path (a local path; nothing is downloaded)",
    ),
    (
        "backend",
        "",
        Kind::AcceptedValue(
            "--backend: kvgate detects each worker's runtime (SGLang, vLLM, or OpenAI-compatible) from the worker itself; the flag changes nothing",
        ),
        "Accepted for the reference gateway's scripts: each worker's runtime is detected",
    ),
    (
        "runtime",
        "",
        Kind::AcceptedValue(
            "--runtime: kvgate detects each worker's runtime (SGLang, vLLM, or OpenAI-compatible) from the worker itself; the flag changes nothing",
        ),
        "Accepted for the reference gateway's scripts (its other spelling of --backend): each worker's runtime is detected",
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
        "Wait before the first retry, multiplied by --retry-backoff-multiplier for each later one, seconds",
    ),
    (
        "retry-max-backoff-secs",
        "retry_max_backoff_secs",
        Kind::Float,
        "Longest wait between two attempts, seconds",
    ),
    (
        "retry-initial-backoff-ms",
        "retry_initial_backoff_secs",
        Kind::Millis,
        "The reference gateway's spelling of --retry-initial-backoff-secs, in milliseconds",
    ),
    (
        "retry-max-backoff-ms",
        "retry_max_backoff_secs",
        Kind::Millis,
        "The reference gateway's spelling of --retry-max-backoff-secs, in milliseconds",
    ),
    (
        "retry-backoff-multiplier",
        "retry_backoff_multiplier",
        Kind::Float,
        "Each retry's wait is this many times the one before (at least 1)",
    ),
    (
        "dp-aware",
        "",
        Kind::Accepted(
            "--dp-aware: kvgate is always rank-aware (each data-parallel rank of a worker is routed to and counted on its own); the flag changes nothing",
        ),
        "Accepted for the reference gateway's scripts: kvgate is always rank-aware",
    ),
    (
        "log-dir",
        "log_dir",
        Kind::Text,
        "Write the log to kvgate.log in this directory (created if missing) instead of stdout",
    ),
    (
        "retry-jitter-factor",
        "retry_jitter_factor",
        Kind::Float,
        "Each wait is drawn within this fraction of its nominal value",
    ),
    (
        "retry-budget-percent",
        "retry_budget_percent",
        Kind::Float,
        "Retries across all requests within this percent of the requests of the last 10 s...",
    ),
    (
        "retry-budget-min-per-sec",
        "retry_budget_min_per_sec",
        Kind::Int,
        "...plus this many per second of those 10 s (a floor for quiet traffic)",
    ),
    (
        "cb-failure-threshold",
        "cb_failure_threshold",
        Kind::Int,
        "Failures within the window that open a worker's circuit",
    ),
    (
        "cb-consecutive-5xx",
        "cb_consecutive_5xx",
        Kind::Int,
        "5xx answers (a relayed 500 included) or failures in a row that open a worker's circuit",
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
        "first-byte-timeout-secs",
        "first_byte_timeout_secs",
        Kind::Float,
        "A plain (non-streamed) answer not begun by then is a failure, tried elsewhere once, seconds",
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
        "worker-ca-cert",
        "worker_ca_cert",
        Kind::Text,
        "PEM CA certificates that https:// workers are verified against, instead of the system's",
    ),
    (
        "worker-client-cert",
        "worker_client_cert",
        Kind::Text,
        "PEM client certificate chain shown to https:// workers that ask for one (with --worker-client-key)",
    ),
    (
        "worker-client-key",
        "worker_client_key",
        Kind::Text,
        "PEM private key of --worker-client-cert",
    ),
    (
        "tls-cert-path",
        "tls_cert_path",
        Kind::Text,
        "PEM certificate chain: the gateway's port speaks TLS (with --tls-key-path; reloaded on SIGHUP or change)",
    ),
    (
        "tls-key-path",
        "tls_key_path",
        Kind::Text,
        "PEM private key of --tls-cert-path",
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
        "inference-pool",
        "inference_pool",
        Kind::Text,
        "Take the engines' labels and port from this InferencePool (inference.networking.k8s.io/v1) and follow it",
    ),
    (
        "ext-proc-port",
        "ext_proc_port",
        Kind::Int,
        "Serve as an Envoy ext_proc endpoint picker (gRPC, h2c) on this port",
    ),
    (
        "ext-proc-host",
        "ext_proc_host",
        Kind::Text,
        "Where the --ext-proc-port and --grpc-health-port listeners bind (default 127.0.0.1)",
    ),
    (
        "ext-proc-tls-cert",
        "ext_proc_tls_cert",
        Kind::Text,
        "PEM certificate chain: the ext_proc port speaks TLS (with --ext-proc-tls-key)",
    ),
    (
        "ext-proc-tls-key",
        "ext_proc_tls_key",
        Kind::Text,
        "PEM private key of --ext-proc-tls-cert",
    ),
    (
        "http-inference",
        "http_inference",
        Kind::Switch,
        "With --ext-proc-port, keep serving the inference routes on the HTTP port too",
    ),
    (
        "grpc-health-port",
        "grpc_health_port",
        Kind::Int,
        "Also serve grpc.health.v1.Health alone on this port (needs --ext-proc-port)",
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

/// The reference gateway's flags with no kvgate equivalent, and what to use instead: a
/// migrating script that passes one is told so in one line, not by clap's guess.
pub(super) const NO_EQUIVALENT: &[(&str, &str)] = &[
    (
        "pd-disaggregation",
        "prefill/decode disaggregation is not served yet; list regular workers with --worker-urls",
    ),
    (
        "prefill",
        "prefill/decode disaggregation is not served yet; list regular workers with --worker-urls",
    ),
    (
        "decode",
        "prefill/decode disaggregation is not served yet; list regular workers with --worker-urls",
    ),
    (
        "prefill-policy",
        "prefill/decode disaggregation is not served yet; the one policy is --policy",
    ),
    (
        "decode-policy",
        "prefill/decode disaggregation is not served yet; the one policy is --policy",
    ),
    (
        "prefill-selector",
        "prefill/decode disaggregation is not served yet; pods are chosen by --selector",
    ),
    (
        "decode-selector",
        "prefill/decode disaggregation is not served yet; pods are chosen by --selector",
    ),
    (
        "worker-startup-timeout-secs",
        "a worker stays pending until it answers, checked every --health-check-interval-secs",
    ),
    (
        "worker-startup-check-interval",
        "a pending worker is checked every --health-check-interval-secs",
    ),
    (
        "model",
        "only the reference's OpenAI-backend mode used it; kvgate routes each model to the workers that list it",
    ),
    (
        "enable-igw",
        "not needed: each model is routed to the workers that serve it",
    ),
    (
        "cors-allowed-origins",
        "kvgate sends no CORS headers; a browser app reaches it through its own backend or ingress",
    ),
    (
        "reasoning-parser",
        "answers are relayed byte for byte; parse them in the client",
    ),
    (
        "tool-call-parser",
        "answers are relayed byte for byte; parse them in the client",
    ),
    (
        "chat-template",
        "the engine applies its own chat template; --tokenizer-path names the model's for matching",
    ),
];
