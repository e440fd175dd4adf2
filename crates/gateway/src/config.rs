//! The gateway's one configuration type, loaded as file < environment < flags. The parts
//! that configure one piece of the gateway are sections (`config/`), each reading its own
//! keys and checking its own values; this module imports nothing from the rest of the
//! crate, which imports its sections from here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kvgate_policies::PolicyConfig;
use kvgate_poller::PollerConfig;
use serde::{Deserialize, Serialize};
use thiserror::Error;

mod access;
mod admission;
mod circuit;
mod discovery;
mod events;
mod health;
mod picker;
mod retry;
mod section;
mod snapshot;
mod tls;

pub use access::AccessConfig;
pub(crate) use access::Allowed;
pub use admission::AdmissionConfig;
pub use circuit::CircuitConfig;
pub use discovery::DiscoverySection;
pub(crate) use events::EventsConfig;
pub use events::{EventsConfigError, EventsSection, TokenizerPaths};
pub use health::HealthConfig;
pub use picker::PickerConfig;
pub use retry::RetryConfig;
pub use section::Section;
pub use snapshot::SnapshotConfig;
pub use tls::TlsConfig;

use section::{duration, invalid, take};

/// A configuration that cannot be used; the message names the key.
#[derive(Debug, Error)]
pub enum ConfigError {
    // The inner errors are shown in the message and not given as sources, so a report of
    // the chain does not print them twice.
    #[error("config: {0}")]
    Load(config::ConfigError),
    #[error("config: invalid value for '{key}': {reason}")]
    Invalid { key: &'static str, reason: String },
    #[error("config: {0}")]
    Policy(kvgate_policies::ConfigError),
}

impl From<config::ConfigError> for ConfigError {
    fn from(e: config::ConfigError) -> Self {
        ConfigError::Load(e)
    }
}

impl From<kvgate_policies::ConfigError> for ConfigError {
    fn from(e: kvgate_policies::ConfigError) -> Self {
        ConfigError::Policy(e)
    }
}

/// Everything the gateway reads at startup. Keys are the flag names with `_` for `-`;
/// the sections' keys are flat too (`cb_failure_threshold`), each section reading and
/// checking its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    pub host: String,
    pub port: u16,
    /// Workers registered at startup (more can be added through the admin API).
    pub worker_urls: Vec<String>,
    /// Where persistent state lives.
    pub data_dir: PathBuf,
    /// The most memory the store's page cache (sled) may hold, in bytes.
    pub store_cache_bytes: u64,
    /// The log filter (`info`, `debug`, per-module directives); the binary reads it,
    /// the library only carries it.
    pub log_level: String,
    pub log_json: bool,
    /// Write the log to `kvgate.log` in this directory instead of stdout (the binary's;
    /// the library only carries it).
    pub log_dir: Option<PathBuf>,
    /// One `info` line per answered request (target `kvgate::access`).
    pub access_log: bool,
    /// Request headers whose first one present becomes the request id (the reference
    /// gateway's `--request-id-headers`); otherwise the gateway makes one.
    pub request_id_headers: Vec<String>,
    /// Request headers whose first one present names the request's session (besides
    /// OpenAI's `prompt_cache_key` body field, which comes first): in cost mode a session's
    /// request that no prefix decides goes where the session went last.
    pub session_headers: Vec<String>,
    /// Any other path under `/v1/` is forwarded (routed by load) instead of answered 404.
    pub passthrough_unknown_routes: bool,
    /// An OTLP/gRPC collector (`http://host:4317`): each proxied request is exported as a
    /// span, continuing the client's `traceparent`. Without it no span is made.
    pub otlp_endpoint: Option<String>,
    /// Largest request body accepted, in bytes (413 above it).
    pub max_payload_size: usize,
    /// Total time allowed for one upstream request, streams included.
    #[serde(rename = "request_timeout_secs", with = "kvgate_core::secs")]
    pub request_timeout: Duration,
    #[serde(rename = "connect_timeout_secs", with = "kvgate_core::secs")]
    pub connect_timeout: Duration,
    /// Time a client has to send its request body (408 after it). A slot is taken only
    /// once the body is read, so slow uploads hold none.
    #[serde(rename = "body_read_timeout_secs", with = "kvgate_core::secs")]
    pub body_read_timeout: Duration,
    /// Time a client has to send its request head; stalled connections are closed.
    #[serde(rename = "header_read_timeout_secs", with = "kvgate_core::secs")]
    pub header_read_timeout: Duration,
    /// A streamed request whose first byte has not come within this is abandoned and
    /// tried elsewhere.
    #[serde(rename = "stream_first_token_timeout_secs", with = "kvgate_core::secs")]
    pub stream_first_token_timeout: Duration,
    /// A non-streamed request whose answer has not begun within this (its head comes when
    /// generation ends) counts as a failure of the worker and is tried elsewhere once:
    /// long enough for the longest generation, short of the request timeout, so an engine
    /// that hangs while its health passes is left.
    #[serde(rename = "first_byte_timeout_secs", with = "kvgate_core::secs")]
    pub first_byte_timeout: Duration,
    /// Longest wait of a request held behind a streamed request that is still prefilling
    /// the prefix both share on the worker they go to; 0 turns holds off.
    #[serde(rename = "prefill_hold_secs", with = "kvgate_core::secs")]
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
    /// After SIGTERM: how long in-flight requests may take to finish.
    #[serde(rename = "shutdown_grace_period_secs", with = "kvgate_core::secs")]
    pub shutdown_grace_period: Duration,
    /// After SIGTERM: how long the listener keeps accepting, readiness already 503, before
    /// the drain begins, so load balancers (a Kubernetes Service's endpoints) stop sending
    /// first; 0: drain at once.
    #[serde(rename = "shutdown_delay_secs", with = "kvgate_core::secs")]
    pub shutdown_delay: Duration,
    /// Seeds the selector's tie-breaking RNG (tests, reproducible benchmarks); `None`
    /// draws from the OS.
    pub seed: Option<u64>,
    /// Run simulated engines in-process and route to them.
    pub demo: bool,
    pub demo_engines: usize,
    /// `[policy]`: the routing policy and its knobs.
    pub policy: PolicyConfig,
    /// `[poller]`: load polling (`--load-monitor-interval` is `poller.interval_secs`).
    pub poller: PollerConfig,
    #[serde(flatten, skip_deserializing)]
    pub retry: RetryConfig,
    #[serde(flatten, skip_deserializing)]
    pub circuit: CircuitConfig,
    #[serde(flatten, skip_deserializing)]
    pub health: HealthConfig,
    #[serde(flatten, skip_deserializing)]
    pub admission: AdmissionConfig,
    #[serde(flatten, skip_deserializing)]
    pub access: AccessConfig,
    #[serde(flatten, skip_deserializing)]
    pub events: EventsSection,
    #[serde(flatten, skip_deserializing)]
    pub snapshot: SnapshotConfig,
    #[serde(flatten, skip_deserializing)]
    pub discovery: DiscoverySection,
    #[serde(flatten, skip_deserializing)]
    pub picker: PickerConfig,
    #[serde(flatten, skip_deserializing)]
    pub tls: TlsConfig,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            host: "127.0.0.1".into(),
            port: 30000,
            worker_urls: Vec::new(),
            data_dir: PathBuf::from("./kvgate-data"),
            store_cache_bytes: kvgate_store::DEFAULT_CACHE_BYTES,
            log_level: "info".into(),
            log_json: false,
            log_dir: None,
            access_log: true,
            request_id_headers: DEFAULT_REQUEST_ID_HEADERS
                .iter()
                .map(|h| (*h).to_owned())
                .collect(),
            session_headers: vec!["x-session-id".to_owned()],
            passthrough_unknown_routes: false,
            otlp_endpoint: None,
            max_payload_size: 64 * 1024 * 1024,
            request_timeout: Duration::from_secs(1800),
            connect_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(60),
            stream_first_token_timeout: Duration::from_secs(600),
            first_byte_timeout: Duration::from_secs(300),
            prefill_hold: Duration::from_millis(500),
            http_workers: Some(1),
            prometheus_port: None,
            prometheus_host: "127.0.0.1".into(),
            shutdown_grace_period: Duration::from_secs(30),
            shutdown_delay: Duration::ZERO,
            seed: None,
            demo: false,
            demo_engines: 4,
            policy: PolicyConfig::with_kind(kvgate_policies::PolicyKind::CacheAware),
            poller: PollerConfig::default(),
            retry: RetryConfig::default(),
            circuit: CircuitConfig::default(),
            health: HealthConfig::default(),
            admission: AdmissionConfig::default(),
            access: AccessConfig::default(),
            events: EventsSection::default(),
            snapshot: SnapshotConfig::default(),
            discovery: DiscoverySection::default(),
            picker: PickerConfig::default(),
            tls: TlsConfig::default(),
        }
    }
}

/// The request-id headers looked for by default, the reference gateway's list.
pub(crate) const DEFAULT_REQUEST_ID_HEADERS: [&str; 4] = [
    "x-request-id",
    "x-correlation-id",
    "x-trace-id",
    "request-id",
];

/// Overrides given on the command line, as `key → value` in config-key form.
pub type Overrides = Vec<(String, config::Value)>;

/// `KVGATE_` variables that belong to the kvgate tools rather than to this configuration:
/// the config file's path, `kvgatectl`'s gateway URL and admin key, and `kvgate-bench`'s
/// log filter. A shell that exports them for those tools can still start the gateway;
/// any other unknown `KVGATE_` variable is refused as a likely typo.
const NOT_CONFIG_VARS: [&str; 4] = [
    "KVGATE_CONFIG",
    "KVGATE_URL",
    "KVGATE_ADMIN_KEY",
    "KVGATE_BENCH_LOG",
];

/// Whether `name=value` is one of the variables the kubelet injects for each Service in
/// the pod's namespace (`<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT[_<PORTNAME>]`,
/// `<NAME>_PORT`, `<NAME>_PORT_<N>_<PROTO>[_PROTO|_PORT|_ADDR]`), told apart from a
/// kvgate key by its value as well as its name: a Service named `kvgate` makes
/// `KVGATE_PORT=tcp://10.96.0.12:30000`, where kvgate's own `KVGATE_PORT` is a number.
fn service_link(name: &str, value: &str) -> bool {
    let is_ip = |v: &str| v.parse::<std::net::IpAddr>().is_ok();
    let is_port = |v: &str| v.parse::<u16>().is_ok();
    let is_proto = |v: &str| matches!(v, "tcp" | "udp" | "sctp");
    // `tcp://10.96.0.12:30000`, `udp://[fd00::1]:53`
    let is_link = |v: &str| {
        let p = kvgate_core::split_url(v);
        p.scheme.is_some_and(is_proto)
            && is_ip(p.host.trim_matches(['[', ']']))
            && p.port.is_some_and(is_port)
            && p.path.is_empty()
    };
    if name.ends_with("_SERVICE_HOST") {
        return is_ip(value);
    }
    if name.ends_with("_SERVICE_PORT") || name.contains("_SERVICE_PORT_") {
        return is_port(value);
    }
    // `<NAME>_PORT_<N>_<PROTO>` and its three suffixes, looked at from the right.
    let parts: Vec<&str> = name.rsplitn(4, '_').collect();
    let link_at = |i: usize| {
        parts
            .get(i)
            .is_some_and(|p| is_proto(&p.to_ascii_lowercase()))
            && parts.get(i + 1).is_some_and(|n| is_port(n))
            && parts.get(i + 2).is_some_and(|n| n.ends_with("PORT"))
    };
    match parts.first().copied() {
        Some("PROTO") if link_at(1) => is_proto(value),
        Some("PORT") if link_at(1) => is_port(value),
        Some("ADDR") if link_at(1) => is_ip(value),
        Some(_) if link_at(0) => is_link(value),
        Some("PORT") => is_link(value),
        _ => false,
    }
}

impl GatewayConfig {
    /// Loads from an optional TOML file, then `KVGATE_*` variables from `env`, then
    /// `overrides` (the flags), and checks every value. Nested keys use `__` in
    /// variables: `KVGATE_POLICY__KIND`.
    pub fn load(
        file: Option<&Path>,
        env: &HashMap<String, String>,
        overrides: Overrides,
    ) -> Result<GatewayConfig, ConfigError> {
        // A `[policy]` table that names knobs but no kind deserializes from the library's
        // default (round_robin); the gateway's default kind must hold there too.
        let mut b = config::Config::builder()
            .set_default("policy.kind", GatewayConfig::default().policy.kind.name())?;
        if let Some(path) = file {
            b = b.add_source(config::File::from(path).format(config::FileFormat::Toml));
        }
        let vars: HashMap<String, String> = env
            .iter()
            .filter(|(k, _)| k.starts_with("KVGATE_") && !NOT_CONFIG_VARS.contains(&k.as_str()))
            .filter(|(k, v)| {
                let link = service_link(k, v);
                if link {
                    tracing::debug!(variable = %k, "ignored: a Kubernetes service-link variable");
                }
                !link
            })
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
                .with_list_parse_key("trusted_proxies")
                .with_list_parse_key("request_id_headers")
                .with_list_parse_key("session_headers")
                .with_list_parse_key("selector")
                .source(Some(vars)),
        );
        for (k, v) in overrides {
            b = b.set_override(k, v)?;
        }
        let mut table: HashMap<String, config::Value> = b.build()?.try_deserialize()?;
        // Each section takes its own keys; what is left is the gateway's own, and a key
        // nobody took is refused by name.
        let retry = take(&mut table)?;
        let circuit = take(&mut table)?;
        let health = take(&mut table)?;
        let admission = take(&mut table)?;
        let access = take(&mut table)?;
        let events = take(&mut table)?;
        let snapshot = take(&mut table)?;
        let discovery = take(&mut table)?;
        let picker = take(&mut table)?;
        let tls = take(&mut table)?;
        let own: GatewayConfig =
            config::Value::new(None, config::ValueKind::Table(table.into_iter().collect()))
                .try_deserialize()?;
        let cfg = GatewayConfig {
            retry,
            circuit,
            health,
            admission,
            access,
            events,
            snapshot,
            discovery,
            picker,
            tls,
            ..own
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks every value: the gateway's own, then each section's.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.host.is_empty() {
            return invalid("host", "must not be empty");
        }
        for u in &self.worker_urls {
            if let Err(e) = kvgate_core::WorkerUrl::parse(u) {
                return invalid("worker_urls", e.to_string());
            }
        }
        for h in &self.session_headers {
            if actix_web::http::header::HeaderName::from_bytes(h.as_bytes()).is_err() {
                return invalid("session_headers", format!("{h:?} is not a header name"));
            }
        }
        for h in &self.request_id_headers {
            if actix_web::http::header::HeaderName::from_bytes(h.as_bytes()).is_err() {
                return invalid("request_id_headers", format!("{h:?} is not a header name"));
            }
        }
        if self.store_cache_bytes < 1024 * 1024 {
            return invalid("store_cache_bytes", "must be at least 1 MiB (1048576)");
        }
        if self.max_payload_size == 0 {
            return invalid("max_payload_size", "must be at least 1 byte");
        }
        for (key, d, zero_ok) in [
            ("request_timeout_secs", self.request_timeout, false),
            ("connect_timeout_secs", self.connect_timeout, false),
            ("header_read_timeout_secs", self.header_read_timeout, false),
            ("body_read_timeout_secs", self.body_read_timeout, false),
            (
                "stream_first_token_timeout_secs",
                self.stream_first_token_timeout,
                false,
            ),
            ("first_byte_timeout_secs", self.first_byte_timeout, false),
            ("prefill_hold_secs", self.prefill_hold, true),
            (
                "shutdown_grace_period_secs",
                self.shutdown_grace_period,
                true,
            ),
            ("shutdown_delay_secs", self.shutdown_delay, true),
        ] {
            duration(key, d, zero_ok)?;
        }
        if self.http_workers == Some(0) {
            return invalid("http_workers", "must be at least 1");
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
        self.policy.validate()?;
        self.poller.validate().map_err(|e| ConfigError::Invalid {
            key: "poller",
            reason: e.to_string(),
        })?;
        self.retry.validate()?;
        self.circuit.validate()?;
        self.health.validate()?;
        self.admission.validate()?;
        self.access.validate()?;
        self.events.validate()?;
        self.snapshot.validate()?;
        self.discovery.validate()?;
        self.tls.validate()?;
        if self
            .picker
            .ext_proc_port
            .is_some_and(|p| p != 0 && p == self.port)
            && self.picker.ext_proc_host == self.host
        {
            return invalid("ext_proc_port", "must differ from the gateway's port");
        }
        self.picker.validate()
    }
}

#[cfg(test)]
mod tests;
