//! The simulator's typed configuration: one struct, read from a file, overridden by flags.

use std::time::Duration;

use serde::{Deserialize, Serialize};

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
    /// Data-parallel ranks, each its own scheduler, queue and cache. Default 1.
    pub dp_size: usize,
    /// Tokens per KV page: the prefix cache's granularity. Default 16.
    pub page_size: usize,
    /// Prefix-cache capacity per rank in tokens (`max_total_num_tokens`); LRU pages beyond it are evicted. Default 200 000.
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
    /// When set (e.g. 0.36), an idle rank's `gen_throughput` shows this residual, as SGLang's
    /// does after its last one-token health generation; unset, it keeps the last busy value.
    pub idle_gen_throughput_residual: Option<f64>,
    /// Canned replies with no tokenizing or scheduling, to measure a gateway's own overhead.
    pub fixed_response: bool,
    /// Seeds the generated token ids. Default 0.
    pub seed: u64,
    /// When set, every route but `/health` and the simulator's own wants
    /// `Authorization: Bearer <key>` and answers 401 without it, as SGLang's `--api-key`.
    pub api_key: Option<String>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            model: "kvgate-sim-model".to_owned(),
            flavor: Flavor::Sglang,
            max_running_requests: 16,
            dp_size: 1,
            page_size: 16,
            cache_capacity_tokens: 200_000,
            context_length: 32_768,
            prefill_tokens_per_sec: 20_000.0,
            decode_step_base: Duration::from_millis(10),
            decode_step_per_req: Duration::from_micros(500),
            default_max_new_tokens: 16,
            idle_gen_throughput_residual: None,
            fixed_response: false,
            seed: 0,
            api_key: None,
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
        if !(self.prefill_tokens_per_sec.is_finite() && self.prefill_tokens_per_sec > 0.0) {
            return fail("prefill_tokens_per_sec", "must be a positive number");
        }
        if self
            .idle_gen_throughput_residual
            .is_some_and(|r| !(r.is_finite() && r >= 0.0))
        {
            return fail(
                "idle_gen_throughput_residual",
                "must be a non-negative number",
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
