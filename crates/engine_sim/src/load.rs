//! What an engine reports about its load: the `/v1/loads` body and the Prometheus text of
//! `/metrics` (SGLang `sglang_`/`sglang:` gauges or vLLM `vllm:` series) and
//! `/v1/loads?format=prometheus`, and the pushed `LoadStat` gauge ([`load_stat`]), built from
//! the same figures.

use std::fmt::Write;
use std::time::{Duration, SystemTime};

use kvgate_core::clock::unix_now;
use kvgate_kv_events::LoadStat;
use serde::Serialize;

use crate::scheduler::Snapshot;
use crate::scopes::Scopes;
use crate::{Flavor, SimConfig};

/// `GET /v1/loads`, field for field as SGLang 0.5.23 writes it.
#[derive(Serialize, Debug)]
pub(crate) struct LoadsBody {
    timestamp: String,
    version: String,
    accelerator: Option<String>,
    num_accelerators: u32,
    loads: Vec<RankLoad>,
}

#[derive(Serialize, Debug)]
struct RankLoad {
    timestamp: f64,
    dp_rank: usize,
    num_running_reqs: usize,
    num_waiting_reqs: usize,
    num_waiting_uncached_tokens: usize,
    num_used_tokens: usize,
    num_total_tokens: usize,
    num_active_tokens: usize,
    num_prealloc_ready_tokens: usize,
    max_total_num_tokens: usize,
    max_running_requests: usize,
    token_usage: f64,
    gen_throughput: f64,
    cache_hit_rate: f64,
    utilization: f64,
    total_prefill_uncached_tokens: u64,
    total_prefill_busy_us: u64,
    decode_moments: Option<Vec<f64>>,
}

pub(crate) const SGLANG_VERSION: &str = "0.5.23";

/// The body for all ranks, or only `dp_rank`.
pub(crate) fn loads(cfg: &SimConfig, snapshots: &[Snapshot], dp_rank: Option<usize>) -> LoadsBody {
    let now = unix_now();
    let loads = snapshots
        .iter()
        .enumerate()
        .filter(|(rank, _)| dp_rank.is_none_or(|r| r == *rank))
        .map(|(rank, s)| rank_load(cfg, rank, s, now))
        .collect();
    LoadsBody {
        timestamp: iso8601(SystemTime::UNIX_EPOCH + Duration::from_secs_f64(now)),
        version: cfg
            .version
            .clone()
            .unwrap_or_else(|| SGLANG_VERSION.to_owned()),
        accelerator: None,
        num_accelerators: 0,
        loads,
    }
}

fn rank_load(cfg: &SimConfig, dp_rank: usize, s: &Snapshot, now: f64) -> RankLoad {
    let usage = token_usage(cfg, s);
    let counter = |v: u64| if cfg.report_prefill_counters { v } else { 0 };
    RankLoad {
        timestamp: now,
        dp_rank,
        num_running_reqs: s.running,
        num_waiting_reqs: s.waiting,
        num_waiting_uncached_tokens: s.waiting_uncached_tokens,
        num_used_tokens: s.used_tokens,
        num_total_tokens: s.used_tokens,
        num_active_tokens: 0,
        num_prealloc_ready_tokens: 0,
        max_total_num_tokens: cfg.cache_capacity_tokens,
        max_running_requests: cfg.max_running_requests,
        token_usage: usage,
        gen_throughput: s.gen_throughput,
        cache_hit_rate: cache_hit_rate(s),
        utilization: usage,
        // SGLang 0.5.23 reports 0 here even on a busy rank (see the fixture).
        total_prefill_uncached_tokens: counter(s.total_prefill_uncached_tokens),
        total_prefill_busy_us: counter(s.total_prefill_busy_us),
        decode_moments: None,
    }
}

/// Rank `dp_rank`'s pushed load: the figures `/v1/loads` reports for the same snapshot.
pub(crate) fn load_stat(cfg: &SimConfig, dp_rank: usize, s: &Snapshot) -> LoadStat {
    let l = rank_load(cfg, dp_rank, s, 0.0);
    let n = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
    LoadStat {
        num_running_reqs: n(l.num_running_reqs),
        num_waiting_reqs: n(l.num_waiting_reqs),
        num_tokens: n(l.num_used_tokens),
        max_total_num_tokens: n(l.max_total_num_tokens),
        attn_dp_rank: u32::try_from(l.dp_rank).unwrap_or(u32::MAX),
        num_waiting_uncached_tokens: Some(n(l.num_waiting_uncached_tokens)),
        num_total_tokens: Some(n(l.num_total_tokens)),
        max_running_requests: Some(n(l.max_running_requests)),
        total_prefill_uncached_tokens: Some(l.total_prefill_uncached_tokens),
        total_prefill_busy_us: Some(l.total_prefill_busy_us),
    }
}

fn token_usage(cfg: &SimConfig, s: &Snapshot) -> f64 {
    if cfg.cache_capacity_tokens == 0 {
        return 0.0;
    }
    (s.used_tokens as f64 / cfg.cache_capacity_tokens as f64).min(1.0)
}

fn cache_hit_rate(s: &Snapshot) -> f64 {
    let c = s.counters;
    if c.prompt_tokens == 0 {
        0.0
    } else {
        c.cached_tokens as f64 / c.prompt_tokens as f64
    }
}

/// `/v1/loads?format=prometheus`: every numeric field as `sglang_<field>{dp_rank="N"}`.
pub(crate) fn loads_prometheus(body: &LoadsBody) -> String {
    let mut out = String::new();
    for load in &body.loads {
        let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(load) else {
            continue;
        };
        for (field, value) in fields {
            if field != "dp_rank"
                && let Some(v) = value.as_f64()
            {
                let _ = writeln!(out, "sglang_{field}{{dp_rank=\"{}\"}} {v}", load.dp_rank);
            }
        }
    }
    out
}

/// A series name and how to read it off a rank; a `_total` name is a counter.
type Series = (&'static str, fn(&SimConfig, &Snapshot) -> f64);

#[rustfmt::skip]
const SGLANG_SERIES: &[Series] = &[
    ("num_running_reqs", |_, s| s.running as f64),
    ("num_queue_reqs", |_, s| s.waiting as f64),
    ("num_used_tokens", |_, s| s.used_tokens as f64),
    ("token_usage", token_usage),
    ("gen_throughput", |_, s| s.gen_throughput),
    ("cache_hit_rate", |_, s| cache_hit_rate(s)),
    ("utilization", token_usage),
    ("prompt_tokens_total", |_, s| s.counters.prompt_tokens as f64),
    ("generation_tokens_total", |_, s| s.counters.generated_tokens as f64),
    ("cached_tokens_total", |_, s| s.counters.cached_tokens as f64),
];

#[rustfmt::skip]
const VLLM_SERIES: &[Series] = &[
    ("num_requests_running", |_, s| s.running as f64),
    ("num_requests_waiting", |_, s| s.waiting as f64),
    ("kv_cache_usage_perc", token_usage),
    ("prompt_tokens_total", |_, s| s.counters.prompt_tokens as f64),
    ("generation_tokens_total", |_, s| s.counters.generated_tokens as f64),
    // vLLM counts prefix-cache queries and hits in tokens.
    ("prefix_cache_queries_total", |_, s| s.counters.prompt_tokens as f64),
    ("prefix_cache_hits_total", |_, s| s.counters.cached_tokens as f64),
];

/// `GET /metrics` in the flavour's names, one series per rank.
pub(crate) fn metrics(cfg: &SimConfig, snapshots: &[Snapshot], scopes: &Scopes) -> String {
    let (prefix, rank_label, table) = match cfg.flavor {
        Flavor::Sglang => ("sglang_", "dp_rank", SGLANG_SERIES),
        Flavor::SglangLegacy => ("sglang:", "dp_rank", SGLANG_SERIES),
        Flavor::Vllm => ("vllm:", "engine", VLLM_SERIES),
    };
    let model = &cfg.model;
    let mut out = String::new();
    for (name, value) in table {
        // prometheus_client names a counter family without its `_total` suffix.
        let (family, kind) = match name.strip_suffix("_total") {
            Some(family) => (family, "counter"),
            None => (*name, "gauge"),
        };
        let _ = writeln!(out, "# TYPE {prefix}{family} {kind}");
        for (rank, s) in snapshots.iter().enumerate() {
            let v = value(cfg, s);
            let labels = format!("model_name=\"{model}\",{rank_label}=\"{rank}\"");
            let _ = writeln!(out, "{prefix}{name}{{{labels}}} {v}");
        }
    }
    if cfg.flavor == Flavor::Vllm && !cfg.lora_adapters.is_empty() {
        lora_info(&mut out, cfg, snapshots, scopes);
    }
    out
}

/// vLLM's `vllm:lora_requests_info`: the adapters of running and of waiting requests, and
/// `max_lora`, valued at the time it was set (one series, the present; vLLM's own gauge
/// also keeps the label sets it had before, which a reader must skip by their older time).
fn lora_info(out: &mut String, cfg: &SimConfig, snapshots: &[Snapshot], scopes: &Scopes) {
    let names = |pick: fn(&Snapshot) -> &[u32]| {
        let mut v: Vec<String> = snapshots
            .iter()
            .flat_map(|s| pick(s).iter().copied())
            .filter_map(|id| scopes.get(id).and_then(|(a, _)| a))
            .collect();
        v.sort();
        v.dedup();
        v.join(",")
    };
    let running = names(|s| &s.scopes_running);
    let waiting = names(|s| &s.scopes_waiting);
    let now = kvgate_core::clock::unix_now();
    let _ = writeln!(out, "# TYPE vllm:lora_requests_info gauge");
    let _ = writeln!(
        out,
        "vllm:lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{running}\",waiting_lora_adapters=\"{waiting}\"}} {now}",
        cfg.max_loras
    );
}

/// `2026-12-02T16:00:00.000000+00:00`, as Python's `datetime.isoformat()` writes UTC.
fn iso8601(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days to civil date (proleptic Gregorian), after Howard Hinnant's algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}+00:00",
        rem / 3_600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_micros()
    )
}

#[cfg(test)]
#[test]
fn iso8601_matches_python() {
    use std::time::Duration;
    let t = SystemTime::UNIX_EPOCH + Duration::from_micros(1_796_227_200_000_001);
    assert_eq!(iso8601(t), "2026-12-02T16:00:00.000001+00:00");
    assert_eq!(
        iso8601(SystemTime::UNIX_EPOCH),
        "1970-01-01T00:00:00.000000+00:00"
    );
    let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
    assert_eq!(iso8601(leap), "2000-02-29T00:00:00.000000+00:00");
}
