//! From `/metrics` samples to one [`RankLoad`] per data-parallel rank (SGLang or vLLM).
//!
//! Every value stays per rank, so counts and rates keep their units: nothing is averaged
//! across ranks while something else is summed. Within one rank, repeated samples of the
//! same gauge (one per TP scheduler, say) are replicas, so the largest is kept.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use kvgate_policies::{AdapterLoad, RankLoad};

use crate::counters::{Counter, CounterState};
use crate::error::ParseError;
use crate::prometheus::Sample;

/// The gauges a rank is built from, one slot each.
#[derive(Debug, Clone, Copy)]
enum Gauge {
    Running,
    Waiting,
    WaitingUncachedTokens,
    UsedTokens,
    MaxTotalTokens,
    MaxRunning,
    TokenUsage,
    GenThroughput,
    CacheHitRate,
    PrefillUncachedTotal,
    PrefillBusyUsTotal,
}

const GAUGES: usize = 11;

enum Metric {
    Gauge(Gauge),
    Counter(Counter),
}

/// SGLang names: `sglang:` up to 0.5.3, `sglang_` from 0.5.4 and in
/// `/v1/loads?format=prometheus` (which uses the `/v1/loads` field names).
fn sglang_gauge(name: &str) -> Option<Gauge> {
    let field = name
        .strip_prefix("sglang:")
        .or_else(|| name.strip_prefix("sglang_"))?;
    Some(match field {
        "num_running_reqs" => Gauge::Running,
        "num_queue_reqs" | "num_waiting_reqs" => Gauge::Waiting,
        "num_waiting_uncached_tokens" => Gauge::WaitingUncachedTokens,
        "num_used_tokens" => Gauge::UsedTokens,
        "max_total_num_tokens" => Gauge::MaxTotalTokens,
        "max_running_requests" => Gauge::MaxRunning,
        "token_usage" => Gauge::TokenUsage,
        "gen_throughput" => Gauge::GenThroughput,
        "cache_hit_rate" => Gauge::CacheHitRate,
        "total_prefill_uncached_tokens" => Gauge::PrefillUncachedTotal,
        "total_prefill_busy_us" => Gauge::PrefillBusyUsTotal,
        _ => return None,
    })
}

/// vLLM names; `gpu_*` ones are V0, the rest V1.
fn vllm_metric(name: &str) -> Option<Metric> {
    Some(match name.strip_prefix("vllm:")? {
        "num_requests_running" => Metric::Gauge(Gauge::Running),
        "num_requests_waiting" => Metric::Gauge(Gauge::Waiting),
        "kv_cache_usage_perc" | "gpu_cache_usage_perc" => Metric::Gauge(Gauge::TokenUsage),
        "gpu_prefix_cache_hit_rate" => Metric::Gauge(Gauge::CacheHitRate),
        "generation_tokens_total" => Metric::Counter(Counter::GenerationTokens),
        "prefix_cache_hits_total" => Metric::Counter(Counter::PrefixCacheHits),
        "prefix_cache_queries_total" => Metric::Counter(Counter::PrefixCacheQueries),
        _ => return None,
    })
}

/// Whether a sample named `name` is one [`metrics_to_ranks`] reads: the filter for
/// [`parse_prometheus_where`](crate::parse_prometheus_where), so the rest of a scrape is
/// never stored.
pub(crate) fn is_load_metric(name: &str) -> bool {
    sglang_gauge(name).is_some() || vllm_metric(name).is_some() || name == LORA_INFO
}

/// vLLM's gauge of the LoRA adapters at work: labels `running_lora_adapters` and
/// `waiting_lora_adapters` (comma-separated names) and `max_lora`, value the time it was
/// set. A labelled gauge keeps every label set it was ever given, so only the latest
/// (highest value) is the engine's present state; with data-parallel engines (`engine`
/// label), the latest of each.
const LORA_INFO: &str = "vllm:lora_requests_info";

/// The adapters a vLLM scrape says are running or waiting, and its `max_lora`; `None`
/// when it has no `vllm:lora_requests_info` (LoRA off, or another engine).
pub fn adapters_at_work(samples: &[Sample]) -> Option<AdapterLoad> {
    let mut latest: BTreeMap<&str, &Sample> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name == LORA_INFO) {
        let engine = s.label("engine").unwrap_or("");
        match latest.get(engine) {
            Some(l) if l.value >= s.value => {}
            _ => {
                latest.insert(engine, s);
            }
        }
    }
    if latest.is_empty() {
        return None;
    }
    let mut out = AdapterLoad::default();
    for s in latest.values() {
        for key in ["running_lora_adapters", "waiting_lora_adapters"] {
            let names = s.label(key).unwrap_or("").split(',').map(str::trim);
            for name in names.filter(|n| !n.is_empty()) {
                if !out.active.iter().any(|a| a == name) {
                    out.active.push(name.to_owned());
                }
            }
        }
        let max = s
            .label("max_lora")
            .and_then(|m| m.parse::<u32>().ok())
            .unwrap_or(0);
        out.max_loras = out.max_loras.max(max);
    }
    Some(out)
}

/// Turns one scrape of a worker's `/metrics` into its ranks, sorted by rank.
///
/// `at` is when the scrape was taken and `counters` the worker's previous scrape, from
/// which vLLM's throughput is derived (0 on the first scrape). SGLang bodies leave
/// `counters` untouched.
pub fn metrics_to_ranks(
    samples: &[Sample],
    at: Duration,
    counters: &mut CounterState,
) -> Result<Vec<RankLoad>, ParseError> {
    if samples.iter().any(|s| sglang_gauge(&s.name).is_some()) {
        sglang(samples)
    } else if samples.iter().any(|s| vllm_metric(&s.name).is_some()) {
        vllm(samples, at, counters)
    } else {
        Err(ParseError::NoLoadMetrics)
    }
}

fn sglang(samples: &[Sample]) -> Result<Vec<RankLoad>, ParseError> {
    let mut ranks: BTreeMap<u32, Slots> = BTreeMap::new();
    for s in samples {
        if let Some(g) = sglang_gauge(&s.name) {
            ranks
                .entry(rank_of(s, "dp_rank")?)
                .or_default()
                .put(g, s.value);
        }
    }
    Ok(ranks
        .into_iter()
        .map(|(rank, slots)| slots.rank_load(rank))
        .collect())
}

fn vllm(
    samples: &[Sample],
    at: Duration,
    counters: &mut CounterState,
) -> Result<Vec<RankLoad>, ParseError> {
    let mut ranks: BTreeMap<u32, Slots> = BTreeMap::new();
    let mut totals: HashMap<(u32, Counter), f64> = HashMap::new();
    for s in samples {
        let Some(metric) = vllm_metric(&s.name) else {
            continue;
        };
        let rank = rank_of(s, "engine")?;
        let slots = ranks.entry(rank).or_default();
        match metric {
            Metric::Gauge(g) => slots.put(g, s.value),
            Metric::Counter(c) if s.value.is_finite() => {
                let total = totals.entry((rank, c)).or_insert(s.value);
                *total = total.max(s.value);
            }
            Metric::Counter(_) => {}
        }
    }
    let deltas = counters.advance(at, totals);
    Ok(ranks
        .into_iter()
        .map(|(rank, slots)| {
            let mut load = slots.rank_load(rank);
            load.gen_throughput = deltas
                .rate(rank, Counter::GenerationTokens)
                .map_or(0.0, to_real);
            // V1 has no hit-rate gauge: take the hit ratio of the tokens queried since
            // the previous scrape.
            if slots.get(Gauge::CacheHitRate).is_none() {
                let hits = deltas.grew(rank, Counter::PrefixCacheHits);
                let queries = deltas.grew(rank, Counter::PrefixCacheQueries);
                load.cache_hit_rate = match (hits, queries) {
                    (Some(h), Some(q)) if q > 0.0 => to_real(h / q).min(1.0),
                    _ => 0.0,
                };
            }
            load
        })
        .collect())
}

/// A rank number from `label`; rank 0 when the engine does not label ranks.
fn rank_of(s: &Sample, label: &'static str) -> Result<u32, ParseError> {
    match s.label(label) {
        None => Ok(0),
        Some(v) => v.trim().parse().map_err(|_| ParseError::BadRank {
            label,
            value: v.chars().take(32).collect(),
        }),
    }
}

/// One rank's gauges as read so far.
#[derive(Default)]
struct Slots([Option<f64>; GAUGES]);

impl Slots {
    fn put(&mut self, g: Gauge, v: f64) {
        let slot = &mut self.0[g as usize];
        *slot = Some(slot.map_or(v, |old| old.max(v)));
    }

    fn get(&self, g: Gauge) -> Option<f64> {
        self.0[g as usize]
    }

    fn rank_load(&self, dp_rank: u32) -> RankLoad {
        let count = |g| self.get(g).map_or(0, to_count);
        let real = |g| self.get(g).map_or(0.0, to_real);
        RankLoad {
            dp_rank,
            num_running_reqs: count(Gauge::Running),
            num_waiting_reqs: count(Gauge::Waiting),
            num_waiting_uncached_tokens: count(Gauge::WaitingUncachedTokens),
            num_used_tokens: count(Gauge::UsedTokens),
            max_total_num_tokens: count(Gauge::MaxTotalTokens),
            max_running_requests: count(Gauge::MaxRunning),
            token_usage: real(Gauge::TokenUsage),
            gen_throughput: real(Gauge::GenThroughput),
            cache_hit_rate: real(Gauge::CacheHitRate),
            total_prefill_uncached_tokens: count(Gauge::PrefillUncachedTotal),
            total_prefill_busy_us: count(Gauge::PrefillBusyUsTotal),
        }
    }
}

/// A count from a float: rounded, negatives and NaN to 0, saturating at `u64::MAX`.
pub(crate) fn to_count(v: f64) -> u64 {
    if v.is_nan() || v <= 0.0 {
        0
    } else {
        // `as` saturates, which is what a huge or infinite gauge should become.
        v.round() as u64
    }
}

/// A ratio or rate: non-finite and negative values to 0, so policies never see NaN.
pub(crate) fn to_real(v: f64) -> f64 {
    if v.is_finite() && v > 0.0 { v } else { 0.0 }
}

#[cfg(test)]
mod tests;
