//! The `kvgate` binary: flags on top of env on top of the config file.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context as _;
use kvgate_gateway::{Gateway, GatewayConfig, Overrides};
use tracing_subscriber::EnvFilter;

/// A cache-aware gateway for LLM inference engines (SGLang, vLLM, OpenAI-compatible).
#[derive(Debug, clap::Parser)]
#[command(name = "kvgate", version, about)]
struct Cli {
    /// TOML config file (also KVGATE_CONFIG).
    #[arg(long, env = "KVGATE_CONFIG")]
    config: Option<PathBuf>,
    #[arg(long)]
    host: Option<String>,
    #[arg(long)]
    port: Option<u16>,
    /// One or more worker URLs, space-separated.
    #[arg(long, num_args = 1..)]
    worker_urls: Option<Vec<String>>,
    /// Routing policy: cache_aware, least_load, power_of_two, round_robin, random,
    /// prefix_hash, consistent_hashing.
    #[arg(long)]
    policy: Option<String>,
    /// Where persistent state lives.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// A tracing filter: error, warn, info, debug, trace, or per-target directives.
    #[arg(long)]
    log_level: Option<String>,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// Largest request body in bytes.
    #[arg(long)]
    max_payload_size: Option<u64>,
    #[arg(long)]
    request_timeout_secs: Option<f64>,
    #[arg(long)]
    header_read_timeout_secs: Option<f64>,
    #[arg(long)]
    health_check_interval_secs: Option<f64>,
    /// Start simulated engines in-process and route to them (no GPUs needed).
    #[arg(long)]
    demo: bool,
    /// How many simulated engines `--demo` starts.
    #[arg(long)]
    demo_engines: Option<u64>,
}

/// Routing and polling knobs: `(flag, config key, value type, help)`. Flag names are the
/// reference gateway's where it has one; each maps onto one key of the config file.
const KNOBS: &[(&str, &str, Kind, &str)] = &[
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
        "KV pressure: a KV-usage spread above this routes by load alone (off unless set)",
    ),
    (
        "overload-token-usage-threshold",
        "policy.overload_token_usage_threshold",
        Kind::Float,
        "KV pressure: a worker's KV usage above this routes by load alone (off unless set)",
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
        "Index cache_aware consults: tree or hash",
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
        Kind::IntList,
        "Hash mode and prefix_hash: token positions to hash the head at",
    ),
    (
        "least-load-default-throughput",
        "policy.least_load_default_throughput",
        Kind::Float,
        "Expected wait: tok/s when no candidate has a live rate",
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
        "least_load: skip workers with this many waiting requests (off unless set)",
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
        "load-monitor-timeout",
        "poller.timeout_secs",
        Kind::Float,
        "Timeout of one load poll, seconds",
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
];

#[derive(Debug, Clone, Copy)]
enum Kind {
    Int,
    Float,
    Text,
    IntList,
}

fn knob_args() -> Vec<clap::Arg> {
    // Defaults come from the config type itself, so the help cannot drift from them.
    let defaults = serde_json::to_value(GatewayConfig::default()).unwrap_or_default();
    KNOBS
        .iter()
        .map(|(flag, key, kind, help)| {
            let default = key
                .split('.')
                .try_fold(&defaults, |v, k| v.get(k))
                .filter(|v| !v.is_null())
                .map_or_else(|| "off".to_owned(), |v| v.to_string());
            let arg = clap::Arg::new(*flag)
                .long(*flag)
                .help(format!("{help} [config key {key}; default {default}]"));
            match kind {
                Kind::Int => arg.value_parser(clap::value_parser!(u64)),
                Kind::Float => arg.value_parser(clap::value_parser!(f64)),
                Kind::Text => arg.value_parser(clap::value_parser!(String)),
                Kind::IntList => arg
                    .value_parser(clap::value_parser!(u64))
                    .num_args(1..)
                    .value_delimiter(','),
            }
        })
        .collect()
}

fn knob_overrides(m: &clap::ArgMatches, o: &mut Overrides) {
    for (flag, key, kind, _) in KNOBS {
        let v: Option<config::Value> = match kind {
            Kind::Int => m.get_one::<u64>(flag).map(|v| (*v).into()),
            Kind::Float => m.get_one::<f64>(flag).map(|v| (*v).into()),
            Kind::Text => m.get_one::<String>(flag).map(|v| v.clone().into()),
            Kind::IntList => m
                .get_many::<u64>(flag)
                .map(|vs| vs.copied().collect::<Vec<u64>>().into()),
        };
        if let Some(v) = v {
            o.push(((*key).to_owned(), v));
        }
    }
}

impl Cli {
    fn overrides(&self) -> Overrides {
        let mut o: Overrides = Vec::new();
        let mut put = |k: &str, v: config::Value| o.push((k.to_owned(), v));
        if let Some(v) = &self.host {
            put("host", v.clone().into());
        }
        if let Some(v) = self.port {
            put("port", i64::from(v).into());
        }
        if let Some(v) = &self.worker_urls {
            put("worker_urls", v.clone().into());
        }
        if let Some(v) = &self.policy {
            put("policy.kind", v.clone().into());
        }
        if let Some(v) = &self.data_dir {
            put("data_dir", v.display().to_string().into());
        }
        if let Some(v) = &self.log_level {
            put("log_level", v.clone().into());
        }
        if self.log_json {
            put("log_json", true.into());
        }
        if let Some(v) = self.max_payload_size {
            put("max_payload_size", v.into());
        }
        for (k, v) in [
            ("request_timeout_secs", self.request_timeout_secs),
            ("header_read_timeout_secs", self.header_read_timeout_secs),
            (
                "health_check_interval_secs",
                self.health_check_interval_secs,
            ),
        ] {
            if let Some(v) = v {
                put(k, v.into());
            }
        }
        if self.demo {
            put("demo", true.into());
        }
        if let Some(v) = self.demo_engines {
            put("demo_engines", v.into());
        }
        o
    }
}

fn init_logging(cfg: &GatewayConfig) {
    let filter = EnvFilter::try_from_env("RUST_LOG")
        // The HTTP server's own start/stop lines are noise at info.
        .or_else(|_| EnvFilter::try_new(format!("{},actix_server=warn", cfg.log_level)))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    if cfg.log_json {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
}

fn wait_for_signal() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("signal runtime")?;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("SIGTERM handler")?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("SIGINT handler")?,
            _ = term.recv() => {}
        }
        Ok(())
    })
}

fn main() -> anyhow::Result<()> {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().args(knob_args()).get_matches();
    let cli = Cli::from_arg_matches(&matches)?;
    let mut overrides = cli.overrides();
    knob_overrides(&matches, &mut overrides);
    let env: HashMap<String, String> = std::env::vars().collect();
    let mut cfg = GatewayConfig::load(cli.config.as_deref(), &env, overrides)?;
    init_logging(&cfg);

    let fleet = demo_fleet(&mut cfg)?;

    let gw = Gateway::start(cfg.clone())?;
    if fleet.is_some() {
        print_demo(&gw, &cfg);
    }
    wait_for_signal()?;
    tracing::info!("shutting down: draining in-flight requests");
    gw.stop();
    if let Some(f) = fleet {
        f.stop();
    }
    Ok(())
}

/// The simulated engines of `--demo`, added to the configured workers.
#[cfg(feature = "demo")]
fn demo_fleet(cfg: &mut GatewayConfig) -> anyhow::Result<Option<kvgate_engine_sim::SimFleet>> {
    if !cfg.demo {
        return Ok(None);
    }
    let fleet = kvgate_engine_sim::SimFleet::start(
        cfg.demo_engines,
        kvgate_engine_sim::SimConfig::default(),
    )
    .context("starting the simulated engines")?;
    cfg.worker_urls.extend(fleet.urls());
    Ok(Some(fleet))
}

/// Without the `demo` feature there is no simulator to start.
#[cfg(not(feature = "demo"))]
fn demo_fleet(cfg: &mut GatewayConfig) -> anyhow::Result<Option<NoFleet>> {
    if cfg.demo {
        anyhow::bail!("--demo needs a kvgate built with the `demo` feature (on by default)");
    }
    Ok(None)
}

#[cfg(not(feature = "demo"))]
struct NoFleet;

#[cfg(not(feature = "demo"))]
impl NoFleet {
    fn stop(self) {}
}

fn print_demo(gw: &Gateway, cfg: &GatewayConfig) {
    let url = gw.url();
    println!();
    println!(
        "kvgate demo: {} simulated SGLang engines behind {url}",
        cfg.demo_engines
    );
    println!("  workers:  {}", cfg.worker_urls.join(" "));
    println!(
        "  policy:   {}    state: {}",
        cfg.policy.kind,
        cfg.data_dir.display()
    );
    println!();
    println!("Try it:");
    println!(
        "  curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\":\"kvgate-sim-model\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'"
    );
    println!("  curl -s {url}/workers");
    println!();
    println!(
        "OpenAI client settings:  base_url=\"{url}/v1\"  api_key=\"none\"  model=\"kvgate-sim-model\""
    );
    println!("Ctrl-C stops it.");
}
