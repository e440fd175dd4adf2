//! The simulator's typed configuration: one struct, read from a file, overridden by flags.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Tokenizer;

/// Which engine the simulator impersonates on the wire.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Flavor {
    /// SGLang 0.5.23: `/v1/loads`, `/server_info`, `owned_by: "sglang"`, `sglang_` gauges on `/metrics`.
    #[default]
    Sglang,
    /// Older SGLang: no `/v1/loads` (404 there), load only on `/metrics` as `sglang:` gauges,
    /// and server info only at `/get_server_info` (`/get_model_info`).
    SglangLegacy,
    /// vLLM: OpenAI routes, `owned_by: "vllm"`, `vllm:` metrics, `/version`; no SGLang-native routes.
    Vllm,
}

/// How a data-parallel engine spreads requests that name no `routed_dp_rank` over its ranks
/// (SGLang `--load-balance-method`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum LoadBalanceMethod {
    /// Rank after rank, as SGLang 0.5.23's `auto` resolves to without PD disaggregation.
    #[default]
    RoundRobin,
    /// The rank with the fewest running + waiting requests (ties: the lowest rank).
    ShortestQueue,
}

/// One engine's behaviour. Every field has a default (`#[serde(default)]`); durations are
/// strings with a unit (`"10ms"`, `"500us"`, `"1.5s"`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Served model name (`/v1/models` id, `model_path`). Default `"kvgate-sim-model"`.
    pub model: String,
    /// Wire flavour. Default [`Flavor::Sglang`].
    pub flavor: Flavor,
    /// Running slots per DP rank; more requests wait in a FIFO queue. Default 16.
    pub max_running_requests: usize,
    /// Data-parallel ranks, each its own scheduler, queue and KV pool. Default 1.
    pub dp_size: usize,
    /// Where requests without `routed_dp_rank` go. Default [`LoadBalanceMethod::RoundRobin`].
    pub load_balance_method: LoadBalanceMethod,
    /// Tokens per KV page: the prefix cache's granularity (`/server_info` `page_size`).
    /// Default 1, as SGLang resolves it for most attention backends.
    pub page_size: usize,
    /// KV pool per rank in tokens, SGLang's `max_total_num_tokens`: running requests' KV
    /// (their prompts, their output and the room reserved for the rest of it) and the prefix
    /// cache share it; unlocked cached prefixes are evicted LRU to admit a request, and a
    /// request that still does not fit waits. Default 200 000.
    pub cache_capacity_tokens: usize,
    /// Longest prompt + completion accepted. Default 32 768.
    pub context_length: usize,
    /// Prefill speed over uncached prompt tokens. Default 20 000 tok/s.
    pub prefill_tokens_per_sec: f64,
    /// Fixed cost of one decode step. Default 10 ms.
    #[serde(with = "duration_text")]
    pub decode_step_base: Duration,
    /// Extra cost of one decode step per running request. Default 0.5 ms.
    #[serde(with = "duration_text")]
    pub decode_step_per_req: Duration,
    /// Completion length when the request gives none. Default 16.
    pub default_max_new_tokens: usize,
    /// Decode batches per `gen_throughput` window (SGLang `--decode-log-interval`): the gauge
    /// is set to the tokens decoded in the window over its wall time. Default 40.
    pub decode_log_interval: u32,
    /// A prefill that finds no window closed for this long zeroes `gen_throughput`, as
    /// SGLang 0.5.23 does. Default `"30s"`.
    #[serde(with = "duration_text")]
    pub gen_throughput_staleness: Duration,
    /// `gen_throughput` when the engine first starts, standing for a stale value left by
    /// earlier traffic or health probes (e.g. 0.35, or 800 for a stale busy rate); a restart
    /// starts at 0. Default 0.
    pub initial_gen_throughput: f64,
    /// Report the cumulative `total_prefill_uncached_tokens` / `total_prefill_busy_us` on
    /// `/v1/loads`; off, they read 0 as on SGLang 0.5.23. Default false.
    pub report_prefill_counters: bool,
    /// SGLang `--enable-cache-report` (vLLM `--enable-prompt-tokens-details`): OpenAI answers
    /// carry `usage.prompt_tokens_details.cached_tokens`; off, `prompt_tokens_details` is
    /// null. `/generate` always reports `meta_info.cached_tokens`. Default false.
    pub enable_cache_report: bool,
    /// SGLang `--enable-metrics`: SGLang flavours serve `/metrics` only when set (404
    /// otherwise); vLLM always serves it. Default false.
    pub enable_metrics: bool,
    /// How prompts become tokens. Default [`Tokenizer::WordPieces`].
    pub tokenizer: Tokenizer,
    /// A model's Hugging Face tokenizer (its directory, or its `tokenizer.json` with
    /// `tokenizer_config.json` beside it): prompts are encoded with it and chats rendered
    /// with its chat template, as SGLang does, instead of `tokenizer`; `/server_info` and
    /// `/model_info` report it as `tokenizer_path`. Default none.
    pub tokenizer_path: Option<std::path::PathBuf>,
    /// Canned replies with no tokenizing or scheduling, to measure a gateway's own overhead.
    pub fixed_response: bool,
    /// Seeds the generated tokens. Default 0.
    pub seed: u64,
    /// LoRA adapters of `model` this engine serves: listed in `/v1/models` with `parent`
    /// set to `model`, taken as a request's `model` (vLLM) or `lora_path` (SGLang); each
    /// has its own KV cache. With any, a request naming another model is refused (404).
    /// Default none.
    pub lora_adapters: Vec<String>,
    /// The release `/server_info` reports (SGLang flavours). Before 0.5.10 SGLang reads
    /// a pinned rank only as `data_parallel_rank` (`routed_dp_rank` came after 0.5.9), and
    /// so does the simulator given such a version. Default: 0.5.23.
    pub version: Option<String>,
    /// Adapters on the GPU at once (vLLM `--max-loras`), shown in
    /// `vllm:lora_requests_info`. Default 4.
    pub max_loras: usize,
    /// vLLM flavour: serve the render routes (`/v1/chat/completions/render`,
    /// `/v1/completions/render`), as vLLM does. Default true.
    pub render_routes: bool,
    /// When set, every route but `/health` and the simulator's own wants
    /// `Authorization: Bearer <key>` and answers 401 without it, as SGLang's `--api-key`.
    pub api_key: Option<String>,
    /// Publish prefix-cache changes as SGLang KV events (`--kv-events-config`): the ZMQ PUB
    /// port of rank 0, rank r on this + r. `Some(0)` picks free consecutive ports (read them
    /// from `/server_info` `kv_events`). Default `None`: no events, `kv_events: null`.
    pub kv_events_port: Option<u16>,
    /// The topic frame of every published message. Default `""`, as SGLang's.
    pub kv_events_topic: String,
    /// The vLLM flavour's block hashes as 32 bytes each, not unsigned integers (vLLM with
    /// integer block hashes turned off). Default off.
    pub kv_event_hash_bytes: bool,
    /// The replay ROUTER port of rank 0 (rank r on this + r; 0 picks free ports); needs
    /// `kv_events_port`. Default `None`: no replay.
    pub kv_events_replay_port: Option<u16>,
    /// Batches each rank keeps for replay. Default 10 000 (SGLang's `buffer_steps`).
    pub kv_events_replay_buffer: usize,
    /// Push each rank's load as SGLang `LoadStat` gauges (`--load-publish-endpoint`): the
    /// ZMQ PUB port of rank 0, rank r on this + r; `Some(0)` picks free consecutive ports.
    /// Advertised inside `/server_info` `kv_events` (`load_endpoint_port_base`,
    /// `load_topic`), so it needs `kv_events_port`. Default `None`: no pushed load.
    pub load_publish_port: Option<u16>,
    /// The topic frame of every pushed-load message. Default `"load"`, as SGLang's.
    pub load_topic: String,
    /// A rank pushes its load after every this many scheduler steps (a prefill or a decode
    /// batch). Default 5.
    pub load_publish_every_steps: u32,
    /// A rank pushes its load at least this often, idle or not. Default `"1s"`.
    #[serde(with = "duration_text")]
    pub load_heartbeat: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            model: "kvgate-sim-model".to_owned(),
            flavor: Flavor::Sglang,
            max_running_requests: 16,
            dp_size: 1,
            load_balance_method: LoadBalanceMethod::RoundRobin,
            page_size: 1,
            cache_capacity_tokens: 200_000,
            context_length: 32_768,
            prefill_tokens_per_sec: 20_000.0,
            decode_step_base: Duration::from_millis(10),
            decode_step_per_req: Duration::from_micros(500),
            default_max_new_tokens: 16,
            decode_log_interval: 40,
            gen_throughput_staleness: Duration::from_secs(30),
            initial_gen_throughput: 0.0,
            report_prefill_counters: false,
            enable_cache_report: false,
            enable_metrics: false,
            tokenizer: Tokenizer::WordPieces,
            tokenizer_path: None,
            fixed_response: false,
            seed: 0,
            lora_adapters: Vec::new(),
            version: None,
            max_loras: 4,
            render_routes: true,
            api_key: None,
            kv_events_port: None,
            kv_events_topic: String::new(),
            kv_event_hash_bytes: false,
            kv_events_replay_port: None,
            kv_events_replay_buffer: 10_000,
            load_publish_port: None,
            load_topic: "load".to_owned(),
            load_publish_every_steps: 5,
            load_heartbeat: Duration::from_secs(1),
        }
    }
}

/// A configuration the simulator cannot run.
#[derive(Debug, thiserror::Error)]
#[error("invalid simulator config: {field} {reason}")]
pub(crate) struct ConfigError {
    field: &'static str,
    reason: &'static str,
}

impl SimConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let fail = |field, reason| Err(ConfigError { field, reason });
        if self.max_running_requests == 0 {
            return fail("max_running_requests", "must be at least 1");
        }
        if self.dp_size == 0 {
            return fail("dp_size", "must be at least 1");
        }
        if self.page_size == 0 {
            return fail("page_size", "must be at least 1");
        }
        if self.decode_log_interval == 0 {
            return fail("decode_log_interval", "must be at least 1");
        }
        if !(self.prefill_tokens_per_sec.is_finite() && self.prefill_tokens_per_sec > 0.0) {
            return fail("prefill_tokens_per_sec", "must be a positive number");
        }
        if !(self.initial_gen_throughput.is_finite() && self.initial_gen_throughput >= 0.0) {
            return fail("initial_gen_throughput", "must be a non-negative number");
        }
        self.validate_kv_events()
    }

    fn validate_kv_events(&self) -> Result<(), ConfigError> {
        let fail = |field, reason| Err(ConfigError { field, reason });
        let Some(port) = self.kv_events_port else {
            if self.kv_events_replay_port.is_some() {
                return fail("kv_events_replay_port", "needs kv_events_port");
            }
            if self.load_publish_port.is_some() {
                // `/server_info` advertises the load sockets inside `kv_events`, whose
                // `endpoint_port_base` is required.
                return fail("load_publish_port", "needs kv_events_port");
            }
            return Ok(());
        };
        if self.kv_events_replay_buffer == 0 {
            return fail("kv_events_replay_buffer", "must be at least 1");
        }
        if self.load_publish_every_steps == 0 {
            return fail("load_publish_every_steps", "must be at least 1");
        }
        if self.load_publish_port.is_some() && self.load_heartbeat.is_zero() {
            return fail("load_heartbeat", "must be positive");
        }
        // Rank r takes base + r; free ports (0) are checked when binding.
        let n = self.dp_size;
        let fits = |base: u16| usize::from(base) + n - 1 <= usize::from(u16::MAX);
        let overlap = |a: Option<u16>, b: Option<u16>| match (a, b) {
            (Some(a), Some(b)) if a != 0 && b != 0 => {
                let (a, b) = (usize::from(a), usize::from(b));
                a < b + n && b < a + n
            }
            _ => false,
        };
        if port != 0 && !fits(port) {
            return fail("kv_events_port", "runs past port 65535 for the last rank");
        }
        let (replay, load) = (self.kv_events_replay_port, self.load_publish_port);
        if replay.is_some_and(|p| p != 0 && !fits(p)) {
            return fail(
                "kv_events_replay_port",
                "runs past port 65535 for the last rank",
            );
        }
        if overlap(Some(port), replay) {
            return fail("kv_events_replay_port", "overlaps the kv_events_port ranks");
        }
        if load.is_some_and(|p| p != 0 && !fits(p)) {
            return fail(
                "load_publish_port",
                "runs past port 65535 for the last rank",
            );
        }
        if overlap(Some(port), load) {
            return fail("load_publish_port", "overlaps the kv_events_port ranks");
        }
        if overlap(replay, load) {
            return fail(
                "load_publish_port",
                "overlaps the kv_events_replay_port ranks",
            );
        }
        Ok(())
    }
}

impl From<ConfigError> for std::io::Error {
    fn from(e: ConfigError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
    }
}

/// `Duration` as text with a unit, so a config file reads `decode_step_base = "10ms"`.
mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        let nanos = d.as_nanos();
        let text = if nanos.is_multiple_of(1_000_000) {
            format!("{}ms", nanos / 1_000_000)
        } else if nanos.is_multiple_of(1_000) {
            format!("{}us", nanos / 1_000)
        } else {
            format!("{nanos}ns")
        };
        s.serialize_str(&text)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        parse(&text).ok_or_else(|| {
            D::Error::custom(format!(
                "invalid duration {text:?}: expected a number and a unit (ns, us, ms, s)"
            ))
        })
    }

    fn parse(text: &str) -> Option<Duration> {
        let text = text.trim();
        let split = text.find(|c: char| c.is_ascii_alphabetic())?;
        let (number, unit) = text.split_at(split);
        let value: f64 = number.trim().parse().ok()?;
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            _ => return None,
        };
        Duration::try_from_secs_f64(value * scale).ok()
    }

    #[cfg(test)]
    #[test]
    fn parses_units() {
        assert_eq!(parse("10ms"), Some(Duration::from_millis(10)));
        assert_eq!(parse("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse("250us"), Some(Duration::from_micros(250)));
        assert_eq!(parse("10"), None);
        assert_eq!(parse("-1ms"), None);
        assert_eq!(parse("3 weeks"), None);
    }
}

#[cfg(test)]
#[test]
fn new_fields_read_from_text_and_default_as_documented() {
    let d = SimConfig::default();
    assert_eq!((d.page_size, d.decode_log_interval), (1, 40));
    assert_eq!(d.gen_throughput_staleness, Duration::from_secs(30));
    assert_eq!(
        (d.tokenizer, d.load_balance_method),
        (Tokenizer::WordPieces, LoadBalanceMethod::RoundRobin)
    );
    assert!(!d.enable_cache_report && !d.enable_metrics && !d.report_prefill_counters);
    let cfg: SimConfig = serde_json::from_str(
        r#"{"tokenizer": "four-bytes", "load_balance_method": "shortest-queue",
            "gen_throughput_staleness": "200ms", "initial_gen_throughput": 0.35}"#,
    )
    .unwrap();
    assert_eq!(cfg.tokenizer, Tokenizer::FourBytes);
    assert_eq!(cfg.load_balance_method, LoadBalanceMethod::ShortestQueue);
    assert_eq!(cfg.gen_throughput_staleness, Duration::from_millis(200));
    assert_eq!(cfg.initial_gen_throughput, 0.35);
    let old = serde_json::from_str::<SimConfig>(r#"{"idle_gen_throughput_residual": 0.36}"#);
    assert!(old.is_err(), "the old field is gone");
}

#[cfg(test)]
#[test]
fn pushed_load_defaults_as_sglang_and_reads_durations_with_units() {
    let d = SimConfig::default();
    assert_eq!((d.load_publish_port, d.load_topic.as_str()), (None, "load"));
    assert_eq!(d.load_publish_every_steps, 5);
    assert_eq!(d.load_heartbeat, Duration::from_secs(1));
    let cfg: SimConfig = serde_json::from_str(
        r#"{"kv_events_port": 0, "load_publish_port": 0, "load_heartbeat": "250ms"}"#,
    )
    .unwrap();
    assert_eq!(cfg.load_heartbeat, Duration::from_millis(250));
    assert!(cfg.validate().is_ok());
    let zero = SimConfig {
        load_heartbeat: Duration::ZERO,
        ..cfg
    };
    assert!(zero.validate().is_err());
}

impl SimConfig {
    /// Whether the engine reads `routed_dp_rank` (SGLang after 0.5.9; vLLM reads neither
    /// field but its header).
    pub(crate) fn reads_routed_dp_rank(&self) -> bool {
        let Some(v) = &self.version else {
            return true;
        };
        // An unparsable version (a source build's "main") is taken as current.
        if !v
            .trim_start_matches('v')
            .starts_with(|c: char| c.is_ascii_digit())
        {
            return true;
        }
        let nums: Vec<u32> = v
            .trim_start_matches('v')
            .split('.')
            .map(|p| {
                let d: String = p.chars().take_while(char::is_ascii_digit).collect();
                d.parse().unwrap_or(0)
            })
            .collect();
        let at = |i: usize| nums.get(i).copied().unwrap_or(0);
        (at(0), at(1), at(2)) >= (0, 5, 10)
    }
}
