//! The gateway's one configuration type, loaded as file < environment < flags.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kvgate_policies::PolicyConfig;
use kvgate_poller::PollerConfig;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A configuration that cannot be used; the message names the key.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("config: {0}")]
    Load(#[from] config::ConfigError),
    #[error("config: invalid value for '{key}': {reason}")]
    Invalid { key: &'static str, reason: String },
    #[error("config: {0}")]
    Policy(#[from] kvgate_policies::ConfigError),
}

/// Everything the gateway reads at startup. Keys are the flag names with `_` for `-`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    pub host: String,
    pub port: u16,
    /// Workers registered at startup (more can be added through the admin API).
    pub worker_urls: Vec<String>,
    /// Where persistent state lives.
    pub data_dir: PathBuf,
    pub log_level: String,
    pub log_json: bool,
    /// Largest request body accepted, in bytes (413 above it).
    pub max_payload_size: usize,
    /// Total time allowed for one upstream request, streams included.
    #[serde(rename = "request_timeout_secs", with = "kvgate_policies::serde_secs")]
    pub request_timeout: Duration,
    #[serde(rename = "connect_timeout_secs", with = "kvgate_policies::serde_secs")]
    pub connect_timeout: Duration,
    /// Time a client has to send its request body once admitted (408 after it), so slow
    /// uploads cannot hold the concurrency slots.
    #[serde(
        rename = "body_read_timeout_secs",
        with = "kvgate_policies::serde_secs"
    )]
    pub body_read_timeout: Duration,
    /// Time a client has to send its request head; stalled connections are closed.
    #[serde(
        rename = "header_read_timeout_secs",
        with = "kvgate_policies::serde_secs"
    )]
    pub header_read_timeout: Duration,
    #[serde(
        rename = "health_check_interval_secs",
        with = "kvgate_policies::serde_secs"
    )]
    pub health_check_interval: Duration,
    #[serde(
        rename = "health_check_timeout_secs",
        with = "kvgate_policies::serde_secs"
    )]
    pub health_check_timeout: Duration,
    /// Consecutive failed checks before a worker is marked unhealthy.
    pub health_failure_threshold: u32,
    /// Consecutive passing checks before an unhealthy worker is healthy again.
    pub health_success_threshold: u32,
    /// How often a changed prefix index is written to the store under `data_dir`.
    #[serde(
        rename = "snapshot_interval_secs",
        with = "kvgate_policies::serde_secs"
    )]
    pub snapshot_interval: Duration,
    /// After a snapshot that took `t`, the timer's next one waits until `t × this` after
    /// it, so a large index that stays dirty is not rewritten back to back; 0 turns it off.
    pub snapshot_backoff: f64,
    /// Longest wait of a request held behind a streamed request that is still prefilling
    /// the prefix both share on the worker they go to; 0 turns holds off.
    #[serde(rename = "prefill_hold_secs", with = "kvgate_policies::serde_secs")]
    pub prefill_hold: Duration,
    /// HTTP worker threads (`None`, from code only: one per core). The default is one:
    /// the routing actors run on its thread, so a dispatch is a chain of same-thread queue
    /// pushes, while a request on another thread reaches them with a cross-thread wake-up
    /// each way (a 32-request burst's time to first token rose by 1-5 ms at p99 with two
    /// threads). One thread proxied about 48k small requests per second on one vCPU
    /// (docs/benchmarks.md), far more than a GPU fleet of tens of engines serves; raise it
    /// when the gateway's own CPU is the limit (long prompts at high rates, or a fleet of
    /// hundreds of engines), and check `kvgate-bench proxy` on the machine it runs on.
    pub http_workers: Option<usize>,
    /// A second listener serving only `GET /metrics`, without a key (the reference's
    /// flag); `None`: metrics only on the gateway port, behind the admin key.
    pub prometheus_port: Option<u16>,
    /// Where that listener binds; loopback unless Prometheus scrapes from elsewhere.
    pub prometheus_host: String,
    /// Blocks the KV-event chain index holds, over every worker and rank, before it
    /// evicts the oldest chain ends (about 170 bytes each).
    pub kv_events_max_blocks: usize,
    /// The model's Hugging Face tokenizer (a directory with `tokenizer.json`, or the file),
    /// for text requests to workers that publish KV events; without it, each worker's
    /// `tokenizer_path` from `/server_info` or `/model_info` is used when it is a local path.
    pub tokenizer_path: Option<PathBuf>,
    /// The KV-event publisher settings the engines were started with (the JSON of their
    /// own `--kv-events-config`: `endpoint`, `replay_endpoint`, `topic`; plus `block_size`
    /// and `dp_size` when the workers do not report them), for workers whose
    /// `/server_info` advertises no `kv_events` (vLLM has none). The endpoint's wildcard
    /// host is each worker's own host.
    pub kv_events_config: Option<String>,
    pub policy: PolicyConfig,
    /// Load polling (`--load-monitor-interval` is `poller.interval_secs`).
    pub poller: PollerConfig,
    /// Seeds the selector's tie-breaking RNG (tests, reproducible benchmarks); `None`
    /// draws from the OS.
    pub seed: Option<u64>,
    /// Run simulated engines in-process and route to them.
    pub demo: bool,
    pub demo_engines: usize,

    /// Attempts in all for one request, the first included (1: never retried). A retry is
    /// decided again with the failed workers left out.
    pub retry_max_retries: u32,
    /// Turns retries off (as `retry_max_retries = 1`).
    pub disable_retries: bool,
    /// Backoff before the second attempt; each later one doubles it, up to the maximum.
    #[serde(
        rename = "retry_initial_backoff_secs",
        with = "kvgate_policies::serde_secs"
    )]
    pub retry_initial_backoff: Duration,
    #[serde(
        rename = "retry_max_backoff_secs",
        with = "kvgate_policies::serde_secs"
    )]
    pub retry_max_backoff: Duration,
    /// Each backoff is drawn within ± this fraction of its nominal value.
    pub retry_jitter_factor: f64,
    /// Failures within `cb_window_duration_secs` that open a worker's circuit.
    pub cb_failure_threshold: u32,
    /// Successful probes that close a half-open circuit.
    pub cb_success_threshold: u32,
    /// How long an open circuit admits nothing before it is half-open.
    #[serde(
        rename = "cb_timeout_duration_secs",
        with = "kvgate_policies::serde_secs"
    )]
    pub cb_timeout_duration: Duration,
    #[serde(
        rename = "cb_window_duration_secs",
        with = "kvgate_policies::serde_secs"
    )]
    pub cb_window_duration: Duration,
    /// Probe requests a half-open circuit admits at once.
    pub cb_half_open_max_requests: u32,
    pub disable_circuit_breaker: bool,
    /// The route health checks ask (any 2xx passes).
    pub health_check_endpoint: String,
    /// A streamed request whose first byte has not come within this is abandoned and
    /// tried elsewhere.
    #[serde(
        rename = "stream_first_token_timeout_secs",
        with = "kvgate_policies::serde_secs"
    )]
    pub stream_first_token_timeout: Duration,
    /// Inference requests served at once; `None`: no limit.
    pub max_concurrent_requests: Option<usize>,
    /// Requests waiting for a slot beyond `max_concurrent_requests`; more are refused (429).
    pub queue_size: usize,
    /// Longest wait for a slot (503 after it).
    #[serde(rename = "queue_timeout_secs", with = "kvgate_policies::serde_secs")]
    pub queue_timeout: Duration,
    /// Inference requests per second per client (per API key when keys are set, else per
    /// client address), as a token bucket holding one second's worth; `None`: no limit.
    pub rate_limit_tokens_per_second: Option<f64>,
    /// Keys a client must present (`Authorization: Bearer`) on the inference routes and
    /// `/v1/models`; empty: open.
    pub api_keys: Vec<Secret>,
    /// Keys of the admin routes (`id:name:role:key` is accepted, its last part used);
    /// empty: admin is open, which a non-loopback `host` refuses without `allow_open_admin`.
    pub control_plane_api_keys: Vec<Secret>,
    pub allow_open_admin: bool,
    /// Hosts, IP addresses and CIDR ranges that workers added through the API must be in;
    /// empty: any. Workers from `worker_urls` are trusted.
    pub worker_allow: Vec<String>,
    /// Sent as `Authorization: Bearer` to every worker (inference, probes, polls), in
    /// place of the client's.
    pub worker_api_key: Option<Secret>,
    /// After SIGTERM: how long in-flight requests may take to finish.
    #[serde(
        rename = "shutdown_grace_period_secs",
        with = "kvgate_policies::serde_secs"
    )]
    pub shutdown_grace_period: Duration,
}

/// A key or password: never printed, never serialized back.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            host: "127.0.0.1".into(),
            port: 30000,
            worker_urls: Vec::new(),
            data_dir: PathBuf::from("./kvgate-data"),
            log_level: "info".into(),
            log_json: false,
            max_payload_size: 64 * 1024 * 1024,
            request_timeout: Duration::from_secs(1800),
            connect_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(60),
            health_check_interval: Duration::from_secs(5),
            health_check_timeout: Duration::from_secs(3),
            health_failure_threshold: 3,
            health_success_threshold: 2,
            snapshot_interval: Duration::from_secs(5),
            snapshot_backoff: 4.0,
            prefill_hold: Duration::from_millis(500),
            http_workers: Some(1),
            prometheus_port: None,
            prometheus_host: "127.0.0.1".into(),
            kv_events_max_blocks: 1_000_000,
            tokenizer_path: None,
            kv_events_config: None,
            policy: PolicyConfig::with_kind(kvgate_policies::PolicyKind::CacheAware),
            poller: PollerConfig::default(),
            seed: None,
            demo: false,
            demo_engines: 4,
            retry_max_retries: 3,
            disable_retries: false,
            retry_initial_backoff: Duration::from_millis(50),
            retry_max_backoff: Duration::from_secs(1),
            retry_jitter_factor: 0.2,
            cb_failure_threshold: 5,
            cb_success_threshold: 2,
            cb_timeout_duration: Duration::from_secs(30),
            cb_window_duration: Duration::from_secs(60),
            cb_half_open_max_requests: 1,
            disable_circuit_breaker: false,
            health_check_endpoint: "/health".into(),
            stream_first_token_timeout: Duration::from_secs(600),
            max_concurrent_requests: None,
            queue_size: 100,
            queue_timeout: Duration::from_secs(60),
            rate_limit_tokens_per_second: None,
            api_keys: Vec::new(),
            control_plane_api_keys: Vec::new(),
            allow_open_admin: false,
            worker_allow: Vec::new(),
            worker_api_key: None,
            shutdown_grace_period: Duration::from_secs(30),
        }
    }
}

/// Overrides given on the command line, as `key → value` in config-key form.
pub type Overrides = Vec<(String, config::Value)>;

/// `KVGATE_` variables that belong to the kvgate tools rather than to this configuration:
/// the config file's path, `kvgatectl`'s gateway URL and admin key, and `kvgate-bench`'s
/// log filter. A
/// shell that exports them for those tools can still start the gateway; any other unknown
/// `KVGATE_` variable is refused as a likely typo.
const NOT_CONFIG_VARS: [&str; 4] = [
    "KVGATE_CONFIG",
    "KVGATE_URL",
    "KVGATE_ADMIN_KEY",
    "KVGATE_BENCH_LOG",
];

/// Longest duration any setting takes.
const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

impl GatewayConfig {
    /// Loads from an optional TOML file, then `KVGATE_*` variables from `env`, then
    /// `overrides` (the flags). Nested keys use `__` in variables: `KVGATE_POLICY__KIND`.
    pub fn load(
        file: Option<&Path>,
        env: &HashMap<String, String>,
        overrides: Overrides,
    ) -> Result<GatewayConfig, ConfigError> {
        let mut b = config::Config::builder();
        if let Some(path) = file {
            b = b.add_source(config::File::from(path).format(config::FileFormat::Toml));
        }
        let vars: HashMap<String, String> = env
            .iter()
            .filter(|(k, _)| k.starts_with("KVGATE_") && !NOT_CONFIG_VARS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        b = b.add_source(
            config::Environment::with_prefix("KVGATE")
                .prefix_separator("_")
                .separator("__")
                .try_parsing(true)
                .list_separator(" ")
                .with_list_parse_key("worker_urls")
                .with_list_parse_key("api_keys")
                .with_list_parse_key("control_plane_api_keys")
                .with_list_parse_key("worker_allow")
                .source(Some(vars)),
        );
        for (k, v) in overrides {
            b = b.set_override(k, v)?;
        }
        let cfg: GatewayConfig = b.build()?.try_deserialize()?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks every value once, at startup.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: &str| {
            Err(ConfigError::Invalid {
                key,
                reason: reason.to_owned(),
            })
        };
        if self.host.is_empty() {
            return invalid("host", "must not be empty");
        }
        for u in &self.worker_urls {
            if let Err(e) = kvgate_poller::WorkerUrl::parse(u) {
                return Err(ConfigError::Invalid {
                    key: "worker_urls",
                    reason: e.to_string(),
                });
            }
        }
        if self.max_payload_size == 0 {
            return invalid("max_payload_size", "must be at least 1 byte");
        }
        // Deadlines are `now + d`: an absurd value must be refused here, not overflow later.
        for (key, d, zero_ok) in [
            ("request_timeout_secs", self.request_timeout, false),
            ("connect_timeout_secs", self.connect_timeout, false),
            ("header_read_timeout_secs", self.header_read_timeout, false),
            ("body_read_timeout_secs", self.body_read_timeout, false),
            (
                "health_check_interval_secs",
                self.health_check_interval,
                false,
            ),
            (
                "health_check_timeout_secs",
                self.health_check_timeout,
                false,
            ),
            ("snapshot_interval_secs", self.snapshot_interval, false),
            ("prefill_hold_secs", self.prefill_hold, true),
            (
                "retry_initial_backoff_secs",
                self.retry_initial_backoff,
                true,
            ),
            ("retry_max_backoff_secs", self.retry_max_backoff, true),
            ("cb_timeout_duration_secs", self.cb_timeout_duration, false),
            ("cb_window_duration_secs", self.cb_window_duration, false),
            (
                "stream_first_token_timeout_secs",
                self.stream_first_token_timeout,
                false,
            ),
            ("queue_timeout_secs", self.queue_timeout, false),
            (
                "shutdown_grace_period_secs",
                self.shutdown_grace_period,
                true,
            ),
        ] {
            if d.is_zero() && !zero_ok {
                return invalid(key, "must be greater than 0");
            }
            if d > MAX_DURATION {
                return invalid(key, "must be at most 30 days (2592000 s)");
            }
        }
        if !(0.0..=1000.0).contains(&self.snapshot_backoff) {
            return invalid("snapshot_backoff", "must be a number from 0 to 1000");
        }
        if self.health_failure_threshold == 0 {
            return invalid("health_failure_threshold", "must be at least 1");
        }
        if self.health_success_threshold == 0 {
            return invalid("health_success_threshold", "must be at least 1");
        }
        for (key, n) in [
            ("retry_max_retries", self.retry_max_retries),
            ("cb_failure_threshold", self.cb_failure_threshold),
            ("cb_success_threshold", self.cb_success_threshold),
            ("cb_half_open_max_requests", self.cb_half_open_max_requests),
        ] {
            if n == 0 {
                return Err(ConfigError::Invalid {
                    key,
                    reason: "must be at least 1".into(),
                });
            }
        }
        if !(0.0..=1.0).contains(&self.retry_jitter_factor) {
            return invalid("retry_jitter_factor", "must be a number from 0 to 1");
        }
        if !self.health_check_endpoint.starts_with('/')
            || !self
                .health_check_endpoint
                .bytes()
                .all(|b| b.is_ascii_graphic())
        {
            return invalid(
                "health_check_endpoint",
                "must be a path starting with / (visible ASCII)",
            );
        }
        if self.max_concurrent_requests == Some(0) {
            return invalid(
                "max_concurrent_requests",
                "must be at least 1 (leave it out for no limit)",
            );
        }
        if self
            .rate_limit_tokens_per_second
            .is_some_and(|r| !(r.is_finite() && r > 0.0))
        {
            return invalid(
                "rate_limit_tokens_per_second",
                "must be a positive number (leave it out for no limit)",
            );
        }
        let worker_key: Vec<Secret> = self.worker_api_key.iter().cloned().collect();
        for (key, keys) in [
            ("api_keys", &self.api_keys),
            ("control_plane_api_keys", &self.control_plane_api_keys),
            ("worker_api_key", &worker_key),
        ] {
            for k in keys {
                if !crate::http::auth::usable_key(crate::http::auth::key_part(k.expose())) {
                    return invalid(key, "a key must be non-empty visible ASCII");
                }
            }
        }
        if self
            .control_plane_api_keys
            .iter()
            .any(|k| crate::http::auth::user_role(k.expose()))
        {
            return invalid(
                "control_plane_api_keys",
                "a 'user' role entry is not an admin key: give client keys with --api-key",
            );
        }
        if let Err(e) = crate::http::auth::AllowList::parse(&self.worker_allow) {
            return Err(ConfigError::Invalid {
                key: "worker_allow",
                reason: e.to_string(),
            });
        }
        if self.http_workers == Some(0) {
            return invalid("http_workers", "must be at least 1");
        }
        if self.kv_events_max_blocks == 0 {
            return invalid("kv_events_max_blocks", "must be at least 1");
        }
        if let Some(c) = &self.kv_events_config
            && let Err(reason) = crate::actors::registry::EventsConfig::parse(c)
        {
            return Err(ConfigError::Invalid {
                key: "kv_events_config",
                reason,
            });
        }
        if self
            .prometheus_port
            .is_some_and(|p| p != 0 && p == self.port)
            && self.prometheus_host == self.host
        {
            return invalid("prometheus_port", "must differ from the gateway's port");
        }
        if self.demo && self.demo_engines == 0 {
            return invalid("demo_engines", "must be at least 1");
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log_level) {
            return Err(ConfigError::Invalid {
                key: "log_level",
                reason: e.to_string(),
            });
        }
        self.policy.validate()?;
        self.poller.validate().map_err(|e| ConfigError::Invalid {
            key: "poller",
            reason: e.to_string(),
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
