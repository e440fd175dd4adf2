//! Flags of the front door: the listener, state, logs and traces, request limits and
//! timeouts, the workers at start and their health checks.

use super::{Flag, Kind, POLICIES};

pub(in crate::cli) const SERVING: &[Flag] = &[
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
];
