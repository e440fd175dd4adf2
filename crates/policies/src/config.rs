//! Policy configuration: one typed struct, validated once at startup.
//!
//! Keys are the reference gateway's flag names with `_` for `-` (`cache_threshold` is
//! `--cache-threshold`), so operators can carry their settings over; where the reference
//! has an alias (`--cache-match-threshold`, `--spill-abs-threshold`,
//! `--spill-rel-threshold`, the `least_load_*` spellings of the scorer knobs) it is accepted
//! too. Internally durations are [`Duration`]s and "off" is `None`; on the wire a duration
//! is a `*_secs` number and, for the two knobs the reference switches off with 0
//! (`eviction_interval_secs`, `least_load_max_waiting_requests`), 0 still means off.
//!
//! kvgate's defaults, and why they differ from the reference's where they do:
//!
//! | key | default | note |
//! |---|---|---|
//! | `kind` | `round_robin` | needs no load reports and no index |
//! | `cache_mode` | `cost` | threshold-free; matched or beat `threshold` on mean TTFT in 10 of 11 simulated workloads (see `cost`) |
//! | `cache_threshold` | 0.3 | the reference CLI's value (its library says 0.5) |
//! | `balance_abs_threshold` | 32 | the reference library's value (its CLI says 64) |
//! | `balance_rel_threshold` | 1.5 | the reference CLI's value (its library says 1.1) |
//! | `balance_token_usage_threshold` | off | |
//! | `overload_token_usage_threshold` | off | |
//! | `eviction_interval_secs` | 60 | |
//! | `max_tree_size` | 16,777,216 | units (text bytes or tokens) per model per tree, summed over tenants |
//! | `block_size` | 16 | |
//! | `cache_index` | `tree` | |
//! | `cache_ttl_secs` | 180 | hash-mode holder lifetime |
//! | `cache_boundaries` | `[]` | ascending token positions |
//! | `least_load_default_throughput` | 2000 tok/s | also used inside cache_aware and power_of_two |
//! | `kv_pressure_weight` (λ) | 0.15 s | one value for every scorer |
//! | `mean_prefill_tokens` (p̄) | 1024 | |
//! | `least_load_max_waiting_requests` | off | |
//! | `default_prefill_throughput` | 10,000 tok/s | cost mode, for a fleet that reports no prefill counters |
//! | `min_match_tokens` | 64 | cost mode: smaller holdings count as none |
//! | `affinity_margin` | 0.5 | cost mode: a holder within this fraction of the cheapest keeps the request |
//! | `bytes_per_token` | 4.0 | converts text lengths (UTF-8 bytes) to token estimates; alias `chars_per_token` |
//! | `power_of_two_load_metric` | `expected_wait` | |
//! | `prefix_token_count` | 256 | |
//! | `prefix_hash_load_factor` | 1.25 | |
//! | `prefix_hash_balance_abs_threshold` | 10 | |
//!
//! Unlike the reference, the scorer knobs (λ, p̄, default throughput) reach every policy
//! that scores expected wait, not least_load alone.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// The routing policies kvgate offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    Random,
    RoundRobin,
    PowerOfTwo,
    LeastLoad,
    CacheAware,
    PrefixHash,
    ConsistentHashing,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 7] = [
        PolicyKind::Random,
        PolicyKind::RoundRobin,
        PolicyKind::PowerOfTwo,
        PolicyKind::LeastLoad,
        PolicyKind::CacheAware,
        PolicyKind::PrefixHash,
        PolicyKind::ConsistentHashing,
    ];

    /// The policy of this name; the error lists every name.
    pub fn from_name(name: &str) -> Result<PolicyKind, String> {
        PolicyKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = PolicyKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown policy {name:?}; one of: {}", names.join(", "))
            })
    }

    /// The name used on the command line and in config files.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Random => "random",
            PolicyKind::RoundRobin => "round_robin",
            PolicyKind::PowerOfTwo => "power_of_two",
            PolicyKind::LeastLoad => "least_load",
            PolicyKind::CacheAware => "cache_aware",
            PolicyKind::PrefixHash => "prefix_hash",
            PolicyKind::ConsistentHashing => "consistent_hashing",
        }
    }

    /// Whether the selector must consult the prefix index before calling the policy.
    pub fn needs_prefix_matches(self) -> bool {
        matches!(self, PolicyKind::CacheAware)
    }

    /// Whether the policy reads the prompt (its text or tokens, or their length). The others
    /// route on the fleet and the routing key alone, so the gateway need not build the
    /// routing text for them.
    pub fn reads_prompt(self) -> bool {
        matches!(
            self,
            PolicyKind::CacheAware
                | PolicyKind::PrefixHash
                | PolicyKind::LeastLoad
                | PolicyKind::PowerOfTwo
        )
    }

    /// Whether the policies read load reports (so the poller must run).
    pub fn needs_loads(self) -> bool {
        matches!(
            self,
            PolicyKind::CacheAware | PolicyKind::LeastLoad | PolicyKind::PowerOfTwo
        )
    }

    /// Whether the selector must pass a [`HashRing`](crate::HashRing) in the input.
    pub fn needs_ring(self) -> bool {
        matches!(self, PolicyKind::ConsistentHashing | PolicyKind::PrefixHash)
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| ConfigError::UnknownPolicy(s.to_owned()))
    }
}

/// How cache_aware trades prefix affinity against load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    /// The reference's pipeline: a hit above `cache_threshold` goes to a holder unless the
    /// count gate says it is too hot; otherwise expected wait decides.
    Threshold,
    /// Threshold-free: the worker with the lowest expected time to first token (its
    /// prefill backlog plus the prefill of what it does not hold).
    Cost,
}

/// Which prefix index cache_aware reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheIndex {
    /// A radix tree over text or tokens (pages of `block_size`).
    Tree,
    /// Holders per (boundary, hash of the head), for token requests at `cache_boundaries`.
    Hash,
}

/// What power_of_two compares within its pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadMetric {
    /// Expected wait of the two drawn workers.
    ExpectedWait,
    /// Fewest in-flight of the two drawn workers, then expected wait.
    Requests,
    /// Fewest in-flight over all eligible workers (no draw), then expected wait.
    LeastRequests,
}

/// By name, so a wrong one is answered with the list rather than a type's name.
impl<'de> Deserialize<'de> for PolicyKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        PolicyKind::from_name(&name).map_err(serde::de::Error::custom)
    }
}

/// Knobs of every policy. Names follow the reference gateway's flags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    pub kind: PolicyKind,

    /// cache_aware: threshold (reference-compatible) or cost (threshold-free).
    pub cache_mode: CacheMode,
    /// Threshold mode: a hit needs matched/input strictly above this (tree index only).
    #[serde(alias = "cache_match_threshold")]
    pub cache_threshold: f64,
    /// Count gate: a worker is too hot when its in-flight exceeds the mean by this many...
    #[serde(alias = "spill_abs_threshold")]
    pub balance_abs_threshold: u64,
    /// ...and is above this multiple of the mean (both must hold). At least 1.0.
    #[serde(alias = "spill_rel_threshold")]
    pub balance_rel_threshold: f64,
    /// KV pressure: when the KV-usage spread (hottest − coldest) exceeds this, load alone
    /// decides, ungated. `None`: off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balance_token_usage_threshold: Option<f64>,
    /// KV pressure: when the hottest worker's KV usage exceeds this, load alone decides,
    /// ungated. `None`: off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overload_token_usage_threshold: Option<f64>,
    /// Prefix-index eviction period (the index actor's timer). `None`: never.
    #[serde(rename = "eviction_interval_secs", with = "kvgate_core::secs::or_off")]
    pub eviction_interval: Option<Duration>,
    /// Prefix-tree budget per model, in units (text bytes or tokens) summed over tenants.
    pub max_tree_size: usize,
    /// Token-tree page size, in tokens.
    pub block_size: usize,
    /// Which index cache_aware consults.
    pub cache_index: CacheIndex,
    /// Hash mode: how long a recorded holder stays live.
    #[serde(rename = "cache_ttl_secs", with = "kvgate_core::secs")]
    pub cache_ttl: Duration,
    /// Hash mode and prefix_hash: strictly ascending token positions to hash the head at.
    pub cache_boundaries: Vec<usize>,

    /// Expected wait: the rate (tok/s) of a candidate set where nobody has a live rate.
    pub least_load_default_throughput: f64,
    /// Expected wait: λ, seconds per unit of the KV-pressure term k/(1−k).
    #[serde(alias = "least_load_kv_pressure_weight")]
    pub kv_pressure_weight: f64,
    /// Expected wait: p̄, tokens assumed per queued request when only counts are known,
    /// and the credit of a request whose length is unknown.
    #[serde(alias = "least_load_mean_prefill_tokens")]
    pub mean_prefill_tokens: u64,
    /// least_load: drop workers whose waiting requests (reported + dispatched since) reach
    /// this. `None`: off.
    #[serde(with = "count_or_off", skip_serializing_if = "Option::is_none")]
    pub least_load_max_waiting_requests: Option<u64>,
    /// Cost mode: prefill rate (tok/s) of a candidate set where nobody reports prefill
    /// counters.
    pub default_prefill_throughput: f64,
    /// UTF-8 bytes per token, to price text requests in tokens.
    #[serde(alias = "chars_per_token")]
    pub bytes_per_token: f64,
    /// Cost mode: a worker holding fewer tokens of the prompt than this is priced as holding
    /// none. Savings that small are noise, and without the floor a short shared head (a
    /// chat template, a common greeting) pulls every unrelated request onto the worker
    /// that saw it first.
    pub min_match_tokens: usize,
    /// Cost mode: a holder of the prompt keeps it while its cost is within this fraction of
    /// the cheapest worker's (0 = the plain lowest cost).
    pub affinity_margin: f64,

    /// power_of_two: what the pair is compared on.
    pub power_of_two_load_metric: LoadMetric,

    /// prefix_hash: tokens of the head to hash (`bytes_per_token` × as many bytes for text).
    pub prefix_token_count: usize,
    /// prefix_hash: a ring target is overloaded above this multiple of the mean...
    pub prefix_hash_load_factor: f64,
    /// ...and above the mean plus this.
    pub prefix_hash_balance_abs_threshold: u64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            kind: PolicyKind::RoundRobin,
            cache_mode: CacheMode::Cost,
            cache_threshold: 0.3,
            balance_abs_threshold: 32,
            balance_rel_threshold: 1.5,
            balance_token_usage_threshold: None,
            overload_token_usage_threshold: None,
            eviction_interval: Some(Duration::from_secs(60)),
            max_tree_size: 1 << 24,
            block_size: 16,
            cache_index: CacheIndex::Tree,
            cache_ttl: Duration::from_secs(180),
            cache_boundaries: Vec::new(),
            least_load_default_throughput: 2000.0,
            kv_pressure_weight: 0.15,
            mean_prefill_tokens: 1024,
            least_load_max_waiting_requests: None,
            default_prefill_throughput: 10_000.0,
            min_match_tokens: 64,
            affinity_margin: 0.5,
            bytes_per_token: 4.0,
            power_of_two_load_metric: LoadMetric::ExpectedWait,
            prefix_token_count: 256,
            prefix_hash_load_factor: 1.25,
            prefix_hash_balance_abs_threshold: 10,
        }
    }
}

impl PolicyConfig {
    /// The default configuration with another policy.
    pub fn with_kind(kind: PolicyKind) -> PolicyConfig {
        PolicyConfig {
            kind,
            ..PolicyConfig::default()
        }
    }

    /// Checks every knob once; the error names the offending key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &'static str, reason: &str| {
            Err(ConfigError::Invalid {
                key,
                reason: reason.to_owned(),
            })
        };
        if !(0.0..=1.0).contains(&self.cache_threshold) {
            return bad("cache_threshold", "must be between 0 and 1");
        }
        if !(self.balance_rel_threshold >= 1.0 && self.balance_rel_threshold.is_finite()) {
            return bad("balance_rel_threshold", "must be a finite number >= 1.0");
        }
        for (key, v) in [
            (
                "balance_token_usage_threshold",
                self.balance_token_usage_threshold,
            ),
            (
                "overload_token_usage_threshold",
                self.overload_token_usage_threshold,
            ),
        ] {
            if let Some(v) = v
                && !(v > 0.0 && v <= 1.0)
            {
                return bad(key, "must be in (0, 1]; leave unset to disable");
            }
        }
        if self.max_tree_size == 0 {
            return bad("max_tree_size", "must be at least 1");
        }
        if self.block_size == 0 {
            return bad("block_size", "must be at least 1");
        }
        if self.cache_ttl < Duration::from_secs(1) {
            return bad("cache_ttl_secs", "must be at least 1 second");
        }
        if self.cache_boundaries.first() == Some(&0) {
            return bad("cache_boundaries", "positions must be at least 1");
        }
        if self.cache_boundaries.windows(2).any(|w| w[0] >= w[1]) {
            return bad("cache_boundaries", "must be strictly ascending");
        }
        for (key, v) in [
            (
                "least_load_default_throughput",
                self.least_load_default_throughput,
            ),
            (
                "default_prefill_throughput",
                self.default_prefill_throughput,
            ),
            ("bytes_per_token", self.bytes_per_token),
        ] {
            if !(v > 0.0 && v.is_finite()) {
                return bad(key, "must be a finite number > 0");
            }
        }
        if !(self.affinity_margin >= 0.0 && self.affinity_margin.is_finite()) {
            return bad("affinity_margin", "must be a finite number >= 0");
        }
        if !(self.kv_pressure_weight >= 0.0 && self.kv_pressure_weight.is_finite()) {
            return bad("kv_pressure_weight", "must be a finite number >= 0");
        }
        if self.mean_prefill_tokens == 0 {
            return bad("mean_prefill_tokens", "must be at least 1");
        }
        if self.prefix_token_count == 0 {
            return bad("prefix_token_count", "must be at least 1");
        }
        if !(self.prefix_hash_load_factor >= 1.0 && self.prefix_hash_load_factor.is_finite()) {
            return bad("prefix_hash_load_factor", "must be a finite number >= 1.0");
        }
        Ok(())
    }

    /// The configured boundaries a request of `token_count` tokens reaches, ascending.
    /// Hash mode probes and records exactly these; an empty slice means the request gets
    /// no hash affinity (untokenized, or shorter than the first boundary).
    pub fn applicable_boundaries(&self, token_count: usize) -> &[usize] {
        let n = self.cache_boundaries.partition_point(|&b| b <= token_count);
        &self.cache_boundaries[..n]
    }
}

/// `Option<u64>` where 0 (the reference's spelling) means `None`.
mod count_or_off {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(v.unwrap_or(0))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        let v = u64::deserialize(d)?;
        Ok((v != 0).then_some(v))
    }
}

#[cfg(test)]
mod tests;
