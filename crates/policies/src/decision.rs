//! A decision and the reason for it.

use std::fmt;

use serde::{Deserialize, Serialize};

use kvgate_core::WorkerId;

/// Which branch of a policy made the decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionPath {
    /// A holder of the prefix was chosen.
    Hit,
    /// A holder existed but was too hot; a non-holder was chosen.
    Spill,
    /// Nobody held enough of the prefix; load decided.
    Miss,
    /// Fleet-wide KV pressure: load decided, ungated.
    KvPressure,
    /// A hash ring or hash-mode holder decided.
    Hash,
    /// Load alone (least_load, power_of_two).
    Load,
    /// Position in the rotation (round_robin).
    RoundRobin,
    /// A uniform draw (random).
    Random,
    /// No policy-specific signal; the fallback chose.
    Fallback,
    /// The request continues an answer (`previous_response_id`) whose worker keeps its
    /// state: that worker, whatever the policy.
    Pinned,
    /// No eligible worker.
    NoWorker,
    /// Workers are eligible but every one is at the least_load waiting cap: the request
    /// should wait in admission or be refused with a retry hint.
    Saturated,
}

impl DecisionPath {
    /// The snake_case name used in logs, metrics labels and the explain output.
    pub fn name(self) -> &'static str {
        match self {
            DecisionPath::Hit => "hit",
            DecisionPath::Spill => "spill",
            DecisionPath::Miss => "miss",
            DecisionPath::KvPressure => "kv_pressure",
            DecisionPath::Hash => "hash",
            DecisionPath::Load => "load",
            DecisionPath::RoundRobin => "round_robin",
            DecisionPath::Random => "random",
            DecisionPath::Fallback => "fallback",
            DecisionPath::Pinned => "pinned",
            DecisionPath::NoWorker => "no_worker",
            DecisionPath::Saturated => "saturated",
        }
    }
}

impl fmt::Display for DecisionPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One candidate's scores as the policy compared them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateScore {
    pub worker: WorkerId,
    /// Matched prefix units, when an index was consulted.
    pub matched: Option<usize>,
    /// Expected wait (seconds) or expected time to first token, when computed.
    pub score: Option<f64>,
    pub in_flight: u64,
    /// Removed by the count-pressure gate.
    pub gated: bool,
    /// Cost mode only: the part of `score` that prices the prompt tokens this worker does
    /// not hold (seconds).
    pub prefill: Option<f64>,
    /// Cost mode only: how many engines' worth of the fleet's recent traffic shares the
    /// prefix this worker holds (1.0: one engine's fair share), when the index counts
    /// traffic and the worker holds a useful prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_traffic: Option<f64>,
    /// Cost mode only: new prefixes started on the worker lately
    /// ([`WorkerView::recent`](crate::WorkerView::recent)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent: Option<f64>,
    /// Cost mode only: when the worker last started a new prefix
    /// ([`WorkerView::last_start`](crate::WorkerView::last_start), 0: never); the spread
    /// starts the next one on the lowest within its reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_start: Option<u64>,
    /// Cost mode only, when the request started a new prefix: the worker's place in the
    /// rendezvous ranking of the prompt's head (0: every replica's first choice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_rank: Option<u32>,
    /// Cost mode only: the prefill rate this worker's tokens were priced at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_rate: Option<PrefillRate>,
}

/// A prefill rate and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PrefillRate {
    pub tokens_per_sec: f64,
    pub source: RateSource,
}

/// Where a prefill rate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RateSource {
    /// The worker's own cumulative counters (`total_prefill_uncached_tokens` over
    /// `total_prefill_busy_us`).
    Reported,
    /// The mean of the other candidates' reported rates.
    FleetMean,
    /// `default_prefill_throughput`: no candidate reports the counters (SGLang 0.5.23
    /// leaves them at 0, vLLM has none).
    Configured,
}

impl CandidateScore {
    /// A candidate with nothing computed yet.
    pub fn new(worker: WorkerId, in_flight: u64) -> CandidateScore {
        CandidateScore {
            worker,
            matched: None,
            score: None,
            in_flight,
            gated: false,
            prefill: None,
            prefix_traffic: None,
            recent: None,
            last_start: None,
            placement_rank: None,
            prefill_rate: None,
        }
    }
}

/// Which rule of the cost mode settled the choice (see the `cost` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CostRule {
    /// The lowest cost.
    Cheapest,
    /// A holder within the affinity margin of the lowest cost.
    Affinity,
    /// A holder of a prefix that carries at most one engine's worth of traffic, within
    /// the affinity margin, even though an idle worker was cheaper.
    PrivatePrefix,
    /// Nobody's prefix decided: the worker whose last new prefix is the oldest (in
    /// rotation), within a wider reach of the lowest cost than the affinity margin.
    Spread,
    /// The worker the request's session went to last: nobody's prefix decided (within the
    /// spread's reach of the lowest cost), or it matched as much as the choice did.
    Session,
}

/// Something about a decision that its path and scores do not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "note")]
pub enum DecisionNote {
    /// The hash index (`--cache-index hash`) sees token prompts only: this text prompt was
    /// neither matched nor recorded, so load alone decided.
    TextNotHashed,
    /// The request is tried again (this is its `attempt`th try), with the workers that
    /// failed it left out.
    Retry { attempt: u32 },
    /// Cost mode: no candidate reports its prefill counters, so prefill was priced at the
    /// configured `default_prefill_throughput`, not a measured rate.
    PrefillRateConfigured,
    /// Cost mode: the request started a new prefix, placed by the rendezvous ranking of
    /// its head; `rank` is the chosen worker's place in it (0: the first choice; more when
    /// the balance or load terms ruled better-ranked workers out).
    Rendezvous { rank: u32 },
    /// More than half of the ready workers had open circuits: every ready worker was a
    /// candidate, as if none were open (Envoy's panic threshold), so a fleet-wide burst of
    /// failures does not leave the whole fleet dark until the circuits close.
    Panic,
    /// The request runs under a LoRA adapter: the candidates were the engines of the best
    /// `fit` among those the count gate left (see [`AdapterFit`]).
    Adapter { fit: AdapterFit },
}

/// How well an engine suits a request's LoRA adapter, best first (llm-d's order): the
/// adapter is at work there, or there is room to load it beside those at work, or
/// loading it would evict another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdapterFit {
    Active,
    Room,
    Full,
}

impl DecisionNote {
    /// The snake_case name used in logs and the explain output.
    pub fn name(self) -> &'static str {
        match self {
            DecisionNote::TextNotHashed => "text_not_hashed",
            DecisionNote::Retry { .. } => "retry",
            DecisionNote::PrefillRateConfigured => "prefill_rate_configured",
            DecisionNote::Rendezvous { .. } => "rendezvous",
            DecisionNote::Panic => "panic",
            DecisionNote::Adapter { .. } => "adapter",
        }
    }
}

/// The outcome of one selection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// The chosen worker, `None` when no worker is eligible.
    pub worker: Option<WorkerId>,
    pub path: DecisionPath,
    /// The candidates the policy compared, in the order it saw them.
    pub candidates: Vec<CandidateScore>,
    /// Matched units / input units for the chosen worker, when an index was consulted.
    pub match_rate: Option<f64>,
    /// Token-work to credit to the chosen worker until a load report covers it.
    pub credit_tokens: u64,
    /// Whether the index should record the request's prefix for the chosen worker.
    pub record_prefix: bool,
    /// Cost mode only: the rule that settled the choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<CostRule>,
    /// Cost mode only: the chosen worker held no useful part of the prompt, so the
    /// request starts its prefix there (what [`WorkerView::recent`](crate::WorkerView::recent)
    /// counts and [`WorkerView::last_start`](crate::WorkerView::last_start) dates).
    #[serde(default)]
    pub new_prefix: bool,
    /// What else a reader of the decision should know.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<DecisionNote>,
}

impl Decision {
    /// No eligible worker.
    pub fn none() -> Decision {
        Decision {
            worker: None,
            path: DecisionPath::NoWorker,
            candidates: Vec::new(),
            match_rate: None,
            credit_tokens: 0,
            record_prefix: false,
            rule: None,
            new_prefix: false,
            notes: Vec::new(),
        }
    }

    /// A decision without scores.
    pub fn simple(worker: WorkerId, path: DecisionPath) -> Decision {
        Decision {
            worker: Some(worker),
            path,
            candidates: Vec::new(),
            match_rate: None,
            credit_tokens: 0,
            record_prefix: false,
            rule: None,
            new_prefix: false,
            notes: Vec::new(),
        }
    }

    /// No worker although some are eligible: all are at the waiting cap.
    pub fn saturated(candidates: Vec<CandidateScore>) -> Decision {
        Decision {
            path: DecisionPath::Saturated,
            candidates,
            ..Decision::none()
        }
    }

    /// The chosen candidate's entry in `candidates`, if it was scored.
    pub fn chosen(&self) -> Option<&CandidateScore> {
        let w = self.worker?;
        self.candidates.iter().find(|c| c.worker == w)
    }

    /// The candidates not chosen and not gated, best first: the longest match, then the
    /// lowest score, then the fewest in flight (a gateway's retry order that stays
    /// cache-aware). Policies that score nothing have none.
    pub fn runners_up(&self) -> Vec<WorkerId> {
        let mut rest: Vec<&CandidateScore> = self
            .candidates
            .iter()
            .filter(|c| Some(c.worker) != self.worker && !c.gated)
            .collect();
        rest.sort_by(|a, b| {
            let matched = b.matched.unwrap_or(0).cmp(&a.matched.unwrap_or(0));
            let score = a
                .score
                .unwrap_or(f64::INFINITY)
                .total_cmp(&b.score.unwrap_or(f64::INFINITY));
            matched.then(score).then(a.in_flight.cmp(&b.in_flight))
        });
        rest.into_iter().map(|c| c.worker).collect()
    }
}

/// One line for logs: `worker=… path=… match=… credit=… candidates=n`.
impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.worker {
            Some(w) => write!(f, "worker={w}")?,
            None => f.write_str("worker=none")?,
        }
        write!(f, " path={}", self.path)?;
        if let Some(r) = self.rule {
            write!(f, " rule={r:?}")?;
        }
        if let Some(score) = self.chosen().and_then(|c| c.score) {
            write!(f, " score={score:.6}")?;
        }
        if let Some(m) = self.match_rate {
            write!(f, " match={m:.3}")?;
        }
        write!(
            f,
            " credit={} record={} candidates={}",
            self.credit_tokens,
            self.record_prefix,
            self.candidates.len()
        )?;
        for n in &self.notes {
            match n {
                DecisionNote::Retry { attempt } => write!(f, " note=retry({attempt})")?,
                DecisionNote::Rendezvous { rank } => write!(f, " note=rendezvous({rank})")?,
                other => write!(f, " note={}", other.name())?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runners_up_put_the_longest_match_first_then_the_lowest_score() {
        let id = |n: u64| WorkerId::from_url(&format!("http://w{n}"));
        let cand = |n: u64, matched: usize, score: f64, gated: bool| CandidateScore {
            matched: Some(matched),
            score: Some(score),
            gated,
            ..CandidateScore::new(id(n), 0)
        };
        let d = Decision {
            candidates: vec![
                cand(0, 9, 0.1, false),
                cand(1, 0, 0.2, false),
                cand(2, 4, 0.9, false),
                cand(3, 4, 0.5, false),
                cand(4, 9, 0.0, true),
            ],
            ..Decision::simple(id(0), DecisionPath::Hit)
        };
        assert_eq!(d.runners_up(), vec![id(3), id(2), id(1)]);
        assert!(
            Decision::simple(id(0), DecisionPath::Hash)
                .runners_up()
                .is_empty()
        );
    }
}
