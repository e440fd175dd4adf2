//! `kvgate-sim`: runs a simulated engine fleet until Ctrl-C (or SIGTERM).
//!
//! Settings come from `--config` (TOML or JSON, the fields of `SimConfig`), then flags
//! override them; both go through `SimConfig`'s own deserializer, so a bad value fails the
//! same way from either.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Parser;
use kvgate_engine_sim::{SimConfig, SimFleet};
use serde_json::{Map, Value};

/// Simulated SGLang/vLLM engines for kvgate.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// How many engines to start.
    #[arg(long, default_value_t = 1)]
    engines: usize,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// First port; engines take consecutive ports. 0 lets the OS pick each.
    #[arg(long, default_value_t = 8000)]
    base_port: u16,
    /// A TOML (`.toml`) or JSON file with `SimConfig` fields.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    model: Option<String>,
    /// sglang | sglang-legacy | vllm
    #[arg(long)]
    flavor: Option<String>,
    #[arg(long)]
    max_running_requests: Option<usize>,
    #[arg(long)]
    dp_size: Option<usize>,
    /// Ranks for requests without `routed_dp_rank`: round-robin (default) | shortest-queue
    #[arg(long)]
    load_balance_method: Option<String>,
    #[arg(long)]
    page_size: Option<usize>,
    #[arg(long)]
    cache_capacity_tokens: Option<usize>,
    #[arg(long)]
    prefill_tokens_per_sec: Option<f64>,
    /// With a unit, e.g. `10ms`.
    #[arg(long)]
    decode_step_base: Option<String>,
    /// With a unit, e.g. `500us`.
    #[arg(long)]
    decode_step_per_req: Option<String>,
    #[arg(long)]
    default_max_new_tokens: Option<usize>,
    /// Decode batches per `gen_throughput` window (default 40).
    #[arg(long)]
    decode_log_interval: Option<u32>,
    /// A prefill zeroes `gen_throughput` when no window closed for this long, with a unit
    /// (default `30s`).
    #[arg(long)]
    gen_throughput_staleness: Option<String>,
    /// `gen_throughput` at first start: a stale value from earlier probes or traffic
    /// (e.g. 0.36; default 0).
    #[arg(long)]
    initial_gen_throughput: Option<f64>,
    /// Report the cumulative prefill counters on `/v1/loads` (0 otherwise, as SGLang 0.5.23).
    #[arg(long)]
    report_prefill_counters: bool,
    /// `usage.prompt_tokens_details.cached_tokens` on OpenAI answers (SGLang
    /// `--enable-cache-report`).
    #[arg(long)]
    enable_cache_report: bool,
    /// Serve `/metrics` on SGLang flavours (SGLang `--enable-metrics`; vLLM always does).
    #[arg(long)]
    enable_metrics: bool,
    /// word-pieces (default) | four-bytes
    #[arg(long)]
    tokenizer: Option<String>,
    /// A model's Hugging Face tokenizer (directory or tokenizer.json): prompts encoded and
    /// chats rendered with it, as SGLang does; overrides --tokenizer.
    #[arg(long)]
    tokenizer_path: Option<String>,
    /// Canned replies, no scheduling: for measuring a gateway's own overhead.
    #[arg(long)]
    fixed_response: bool,
    #[arg(long)]
    seed: Option<u64>,
    /// LoRA adapters of the model, comma-separated: listed in `/v1/models` with their
    /// parent, each with its own KV cache (default none).
    #[arg(long, value_delimiter = ',')]
    lora_adapters: Vec<String>,
    /// Adapters on the GPU at once, as `vllm:lora_requests_info` shows it (default 4).
    #[arg(long)]
    max_loras: Option<usize>,
    /// Publish KV events over ZMQ: rank 0's PUB port, rank r on +r (0 picks free ports,
    /// shown in `/server_info` `kv_events`). Off by default.
    #[arg(long)]
    kv_events_port: Option<u16>,
    /// The topic of published KV events (default empty, as SGLang).
    #[arg(long)]
    kv_events_topic: Option<String>,
    /// Rank 0's replay ROUTER port, rank r on +r (0 picks free ports); needs `--kv-events-port`.
    #[arg(long)]
    kv_events_replay_port: Option<u16>,
    /// Batches each rank keeps for replay (default 10000).
    #[arg(long)]
    kv_events_replay_buffer: Option<usize>,
    /// Push SGLang `LoadStat` gauges over ZMQ (SGLang `--load-publish-endpoint`): rank 0's PUB
    /// port, rank r on +r (0 picks free ports, shown in `/server_info` `kv_events`); needs
    /// `--kv-events-port`. Off by default.
    #[arg(long)]
    load_publish_port: Option<u16>,
    /// The topic of pushed-load messages (default `load`, as SGLang).
    #[arg(long)]
    load_topic: Option<String>,
    /// Scheduler steps between pushed loads (default 5).
    #[arg(long)]
    load_publish_every_steps: Option<u32>,
    /// Longest gap between pushed loads, idle or not, with a unit (default `1s`).
    #[arg(long)]
    load_heartbeat: Option<String>,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let cfg = config(&args)?;
    let fleet = SimFleet::start_on(&args.host, args.base_port, args.engines, cfg.clone())
        .context("starting the fleet")?;
    eprintln!(
        "kvgate-sim: {} {:?} engine(s), dp_size {}, model {}",
        fleet.len(),
        cfg.flavor,
        cfg.dp_size,
        cfg.model
    );
    for url in fleet.urls() {
        println!("{url}");
    }
    wait_for_shutdown()?;
    eprintln!("kvgate-sim: stopping");
    fleet.stop();
    Ok(())
}

fn config(args: &Args) -> anyhow::Result<SimConfig> {
    let mut value = match &args.config {
        Some(path) => read_file(path)?,
        None => Value::Object(Map::new()),
    };
    let Some(fields) = value.as_object_mut() else {
        bail!("the config file must hold a table of SimConfig fields");
    };
    let mut set = |key: &str, v: Option<Value>| {
        if let Some(v) = v {
            fields.insert(key.to_owned(), v);
        }
    };
    set("model", args.model.clone().map(Value::from));
    if !args.lora_adapters.is_empty() {
        set(
            "lora_adapters",
            Some(Value::from(args.lora_adapters.clone())),
        );
    }
    set("max_loras", args.max_loras.map(Value::from));
    set("flavor", args.flavor.clone().map(Value::from));
    set(
        "max_running_requests",
        args.max_running_requests.map(Value::from),
    );
    set("dp_size", args.dp_size.map(Value::from));
    set(
        "load_balance_method",
        args.load_balance_method.clone().map(Value::from),
    );
    set("page_size", args.page_size.map(Value::from));
    set(
        "cache_capacity_tokens",
        args.cache_capacity_tokens.map(Value::from),
    );
    set(
        "prefill_tokens_per_sec",
        args.prefill_tokens_per_sec.map(Value::from),
    );
    set(
        "decode_step_base",
        args.decode_step_base.clone().map(Value::from),
    );
    set(
        "decode_step_per_req",
        args.decode_step_per_req.clone().map(Value::from),
    );
    set(
        "default_max_new_tokens",
        args.default_max_new_tokens.map(Value::from),
    );
    set(
        "decode_log_interval",
        args.decode_log_interval.map(Value::from),
    );
    set(
        "gen_throughput_staleness",
        args.gen_throughput_staleness.clone().map(Value::from),
    );
    set(
        "initial_gen_throughput",
        args.initial_gen_throughput.map(Value::from),
    );
    set("tokenizer", args.tokenizer.clone().map(Value::from));
    set(
        "tokenizer_path",
        args.tokenizer_path.clone().map(Value::from),
    );
    set("seed", args.seed.map(Value::from));
    set("kv_events_port", args.kv_events_port.map(Value::from));
    set(
        "kv_events_topic",
        args.kv_events_topic.clone().map(Value::from),
    );
    set(
        "kv_events_replay_port",
        args.kv_events_replay_port.map(Value::from),
    );
    set(
        "kv_events_replay_buffer",
        args.kv_events_replay_buffer.map(Value::from),
    );
    set("load_publish_port", args.load_publish_port.map(Value::from));
    set("load_topic", args.load_topic.clone().map(Value::from));
    set(
        "load_publish_every_steps",
        args.load_publish_every_steps.map(Value::from),
    );
    set(
        "load_heartbeat",
        args.load_heartbeat.clone().map(Value::from),
    );
    for (key, on) in [
        ("report_prefill_counters", args.report_prefill_counters),
        ("enable_cache_report", args.enable_cache_report),
        ("enable_metrics", args.enable_metrics),
        ("fixed_response", args.fixed_response),
    ] {
        if on {
            set(key, Some(Value::Bool(true)));
        }
    }
    serde_json::from_value(value).context("invalid simulator settings")
}

fn read_file(path: &Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value = if path.extension().is_some_and(|e| e == "toml") {
        toml::from_str(&text).with_context(|| format!("parsing {} as TOML", path.display()))?
    } else {
        serde_json::from_str(&text)
            .with_context(|| format!("parsing {} as JSON", path.display()))?
    };
    Ok(value)
}

fn wait_for_shutdown() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                r = tokio::signal::ctrl_c() => r,
                _ = term.recv() => Ok(()),
            }
        }
        #[cfg(not(unix))]
        tokio::signal::ctrl_c().await
    })?;
    Ok(())
}
