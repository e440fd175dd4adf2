//! What a policy sees: the request's routing facts and a view of each candidate worker.

use std::sync::Arc;
use std::time::Duration;

use kvgate_core::WorkerId;
use serde::{Deserialize, Serialize};

use crate::text::PromptText;

/// The part of a request that routing looks at. Built by the gateway from the body,
/// never the body itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestFacts {
    /// The `model` field, if the request named one.
    pub model: Option<String>,
    /// What the prefix index keys on.
    pub key: RoutingText,
    /// A sticky routing key from a header (`x-kvgate-routing-key`, `x-smg-routing-key`).
    pub routing_key: Option<String>,
    /// `stream: true` in the body.
    pub stream: bool,
    /// The URL of the worker that keeps the state this request continues (the worker
    /// that answered its `previous_response_id`). An eligible worker of that URL is
    /// chosen whatever the policy; otherwise the policy decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
    /// The session the request says it belongs to (OpenAI's `prompt_cache_key`, a session
    /// header): in cost mode a prompt nobody's prefix decides goes where its session went
    /// last (within the load reach of a new prefix), or, for a session's first request,
    /// where the session's rendezvous ranking puts it; between equal matches the session's
    /// worker wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The LoRA adapter the request runs under: its `model` where that names an adapter
    /// of the fleet, or SGLang's `lora_path`. An adapter's KV cache is not its base
    /// model's: prefixes are matched and recorded under the adapter alone, and cache_aware
    /// prefers engines where it is active ([`AdapterLoad`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    /// vLLM's `cache_salt`: requests with different salts (or one salted, one not) never
    /// share a prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
}

impl RequestFacts {
    /// Whether the request's KV cache is kept apart from its base model's (an adapter or
    /// a salt): the gateway then keys its prefix index by [`RequestFacts::index_key`].
    pub fn scoped(&self) -> bool {
        self.adapter.is_some() || self.cache_salt.is_some()
    }

    /// The key a prefix index matches and records this request under: its routing text,
    /// led by a marker of its adapter and salt when it has either, so prefixes of two
    /// scopes never share a unit while they share one index (and its memory budget) per
    /// model. The marker is a hash: a salt is a tenant's secret.
    pub fn index_key(&self) -> std::borrow::Cow<'_, RoutingText> {
        use std::borrow::Cow;
        if !self.scoped() {
            return Cow::Borrowed(&self.key);
        }
        let mut b = Vec::new();
        for part in [self.adapter.as_deref(), self.cache_salt.as_deref()] {
            let part = part.unwrap_or("").as_bytes();
            b.extend_from_slice(&(part.len() as u64).to_le_bytes());
            b.extend_from_slice(part);
        }
        let h = xxhash_rust::xxh3::xxh3_64(&b);
        Cow::Owned(match &self.key {
            RoutingText::Empty => RoutingText::Empty,
            RoutingText::Text(t) => {
                let mut s = format!("\u{1}scope:{h:016x}\u{1}");
                s.push_str(&t.to_cow());
                RoutingText::Text(s.into())
            }
            RoutingText::Tokens(t) => {
                // Ids no vocabulary reaches.
                let mut v = vec![u32::MAX, (h >> 32) as u32 | 1 << 31, h as u32 | 1 << 31];
                v.extend_from_slice(t);
                RoutingText::Tokens(v)
            }
        })
    }
}

/// The prompt as routing sees it: text (chat rendered with roles) or token ids.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RoutingText {
    #[default]
    Empty,
    Text(PromptText),
    Tokens(Vec<u32>),
}

impl RoutingText {
    /// Token count if known exactly (token requests only).
    pub fn token_count(&self) -> Option<usize> {
        match self {
            RoutingText::Tokens(t) => Some(t.len()),
            _ => None,
        }
    }
}

/// Load of one data-parallel rank, as the engine last reported it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankLoad {
    pub dp_rank: u32,
    pub num_running_reqs: u64,
    pub num_waiting_reqs: u64,
    pub num_waiting_uncached_tokens: u64,
    pub num_used_tokens: u64,
    pub max_total_num_tokens: u64,
    pub max_running_requests: u64,
    /// KV usage, 0..1.
    pub token_usage: f64,
    /// Tokens/s over the last decode interval; stale on an idle rank.
    pub gen_throughput: f64,
    pub cache_hit_rate: f64,
    /// Cumulative counters (SGLang); 0 when the engine does not report them.
    pub total_prefill_uncached_tokens: u64,
    pub total_prefill_busy_us: u64,
}

/// One load report for a worker: every rank, and when it was sampled.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerLoad {
    pub ranks: Vec<RankLoad>,
    /// When the gateway took the sample, on the selector's monotonic clock.
    pub sampled_at: Duration,
    /// The engine's LoRA adapters at work, where it reports them (vLLM's
    /// `vllm:lora_requests_info`); `None` when it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapters: Option<AdapterLoad>,
}

/// The LoRA adapters an engine is running or has requests waiting for, and how many it
/// holds on the GPU at once (vLLM `--max-loras`; 0 when unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterLoad {
    pub active: Vec<String>,
    pub max_loras: u32,
}

/// Work the gateway dispatched to a worker after its load sample was taken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credit {
    pub tokens: u64,
    pub requests: u64,
}

/// What this gateway itself has on a worker, beyond the engine's report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Own {
    /// Uncached tokens, as booked, of this gateway's requests there that have not reached
    /// their first token.
    pub unprefilled_tokens: u64,
    /// This gateway's requests there at the load sample, as near as it can tell: those in
    /// flight when the report arrived, less those it sent after the sample.
    pub requests_at_sample: u64,
}

/// A worker as the policy sees it for one decision.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerView {
    pub id: WorkerId,
    pub url: Arc<str>,
    /// Settled by the registry (health with hysteresis, not draining); policies only read it.
    pub eligible: bool,
    /// Requests this gateway has in flight on the worker.
    pub in_flight: u64,
    /// The latest fresh load report, or `None` when unknown or stale.
    pub load: Option<WorkerLoad>,
    /// Work dispatched since `load.sampled_at`.
    pub credit: Credit,
    /// New prefixes started on this worker lately: dispatches that went to it holding no
    /// useful part of their prompt ([`Decision::new_prefix`](crate::Decision::new_prefix)),
    /// decayed by the caller (the gateway halves the count every [`RECENT_HALF_LIFE`]
    /// dispatches to the fleet). Shown in explain; no rule reads it.
    pub recent: f64,
    /// When this worker last started a new prefix, as the caller's running count of new
    /// prefixes started anywhere in the fleet (0: never). The cost mode starts a prefix
    /// nobody holds on the worker whose last start is the oldest, among those within its
    /// reach: a fixed rotation, so any run of new prefixes spreads evenly whatever came
    /// before it. Left at 0 everywhere, the rendezvous ranking places them.
    pub last_start: u64,
    /// What this gateway has there, when the caller keeps it. When the engine reported no
    /// more requests than this gateway had there, the cost mode prices its queue at no more than
    /// this gateway's own unprefilled bookings: the engine counts a group's followers as
    /// uncached until the group's first prefill is cached, the gateway booked them as
    /// hits. `None`: the report alone.
    pub own: Option<Own>,
}

/// Half-life of [`WorkerView::recent`], in dispatches to the whole fleet, as the gateway
/// keeps it.
pub const RECENT_HALF_LIFE: f64 = 256.0;

impl WorkerView {
    /// A healthy worker with nothing known about its load.
    pub fn new(id: WorkerId, url: impl Into<Arc<str>>) -> WorkerView {
        WorkerView {
            id,
            url: url.into(),
            eligible: true,
            in_flight: 0,
            load: None,
            credit: Credit::default(),
            recent: 0.0,
            last_start: 0,
            own: None,
        }
    }
}

/// How much of the request each tenant (worker) already holds, from the prefix index.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PrefixMatches {
    /// Units (text bytes or tokens) of the request, after any namespace marker.
    pub input_len: usize,
    /// Matched units per worker; workers holding nothing are absent.
    pub per_worker: Vec<(WorkerId, usize)>,
    /// Which index answered, and so what the units are.
    pub source: MatchSource,
    /// How much recent traffic shared each matched prefix (tree indexes that count it).
    #[serde(default)]
    pub traffic: Option<PrefixTraffic>,
    /// The target the request's session (`RequestFacts::session`) was last sent to, as the
    /// gateway remembers it.
    #[serde(default)]
    pub session_holder: Option<WorkerId>,
}

/// Recent requests through the prefixes of one request, as the tree index counts them
/// (decayed counts of routing lookups).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PrefixTraffic {
    /// All recent requests: the denominator of a share.
    pub total: f64,
    /// (units from the start, recent requests whose prompt began with those units),
    /// shallowest first, one entry per index node on the matched path.
    pub by_prefix: Vec<(usize, f64)>,
}

impl PrefixTraffic {
    /// Recent requests that began with the first `units` units of this one: the first
    /// entry reaching `units`, the total for 0, and 0 past the matched path.
    pub fn at(&self, units: usize) -> f64 {
        if units == 0 {
            return self.total;
        }
        self.by_prefix
            .iter()
            .find(|(end, _)| *end >= units)
            .map_or(0.0, |(_, c)| *c)
    }
}

/// The index that produced a [`PrefixMatches`], which fixes its units and how a policy
/// reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchSource {
    /// Radix tree over the request's text; units are UTF-8 bytes.
    #[default]
    TextTree,
    /// Radix tree over token ids in whole pages; units are tokens.
    TokenTree,
    /// Hash mode: `per_worker` lists the live holders at `boundary`, the deepest applicable
    /// boundary that has any (each with `boundary` matched tokens). `None`: no applicable
    /// boundary had a live holder.
    Hash { boundary: Option<usize> },
}

impl MatchSource {
    /// Whether the units are text bytes (converted to tokens for pricing).
    pub fn is_text(self) -> bool {
        matches!(self, MatchSource::TextTree)
    }
}

impl PrefixMatches {
    /// The matched length for `w`, 0 if it holds nothing.
    pub fn matched(&self, w: WorkerId) -> usize {
        self.per_worker
            .iter()
            .find(|(id, _)| *id == w)
            .map_or(0, |(_, n)| *n)
    }
}
