//! Routing policies for kvgate, as pure functions of a snapshot.
//!
//! A policy reads a [`SelectInput`] (the request's routing facts, a [`WorkerView`] per
//! candidate, the prefix index's per-worker [`PrefixMatches`], the fleet's [`HashRing`],
//! the dispatch sequence number and the time) and returns a [`Decision`]: the chosen
//! worker, the branch that chose it ([`DecisionPath`]), the scores it compared
//! ([`CandidateScore`]), the chosen worker's match rate, the work to credit to it and
//! whether the index should record the request for it. This crate never reads a clock,
//! spawns a task, takes a lock or does I/O, and does not know the prefix index's data
//! structures: [`PrefixMatches`] is the boundary. Randomness comes in as an argument so
//! tests pin a seed. A text prompt is a [`PromptText`]: runs that can borrow the long
//! strings of the request body instead of copying them.
//!
//! ```
//! use kvgate_policies::{select, PolicyConfig, RequestFacts, SelectInput, WorkerId, WorkerView};
//! use rand::SeedableRng;
//!
//! let workers = vec![
//!     WorkerView::new(WorkerId(1), "http://a:8000"),
//!     WorkerView::new(WorkerId(2), "http://b:8000"),
//! ];
//! let request = RequestFacts::default();
//! let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
//! let input = SelectInput { seq: 1, ..SelectInput::new(&workers, &request) };
//! let decision = select(&PolicyConfig::default(), &input, &mut rng);
//! assert_eq!(decision.worker, Some(WorkerId(2)));
//! ```
//!
//! # Policies
//!
//! | kind | chooses | reads |
//! |---|---|---|
//! | `random` | a uniform draw among eligible workers | eligibility |
//! | `round_robin` | the eligible worker at `seq mod n` | eligibility, `seq` |
//! | `least_load` | the least expected wait over all eligible workers, with an optional waiting cap | loads, credit, in-flight |
//! | `power_of_two` | the better of two random eligible workers | loads, credit, in-flight |
//! | `cache_aware` | prefix affinity traded against load: `cost` mode (default) or `threshold` mode | matches, loads, credit, in-flight |
//! | `prefix_hash` | the ring owner of the request's head, unless it is overloaded | ring, in-flight |
//! | `consistent_hashing` | the ring owner of the routing key | ring, routing key |
//!
//! The expected wait shared by the load-aware policies is in the `wait` module's docs,
//! the gate and KV-pressure trigger in `gate`, cache_aware's pipeline in `cache_aware`,
//! the threshold-free cost mode (and why it is the default) in `cost`, the hash policies
//! in `ring`, `consistent_hashing` and `prefix_hash`, and the credit bookkeeping in
//! [`CreditLedger`].
//!
//! # What the selector does around a decision
//!
//! - Filters the fleet to the request's model before calling [`select`], and for
//!   cache_aware asks that model's index (one per served model) for the matches.
//! - Passes each worker's latest **fresh** [`WorkerLoad`] (or `None`) and its
//!   [`CreditLedger::credit`]; after the decision, credits
//!   [`Decision::credit_tokens`] to the chosen worker ([`CreditLedger::apply`]) and, if
//!   [`Decision::record_prefix`], records the request in the index for that worker only.
//!   A dry run ("explain") is a call to [`select`] whose decision is not applied.
//! - Builds the [`HashRing`] when the set of workers changes, not per request.
//! - Treats `worker: None` as no eligible worker (path `no_worker`), or, with path
//!   `saturated`, as every worker at the least_load waiting cap.

mod adapter;
mod affinity;
mod basic;
mod cache_aware;
mod config;
mod consistent_hashing;
mod cost;
mod decision;
mod error;
mod estimate;
mod gate;
mod input;
mod least_load;
mod ledger;
mod placement;
mod power_of_two;
mod prefix_hash;
mod ring;
mod snapshot;
mod text;
mod wait;

#[cfg(test)]
mod testkit;

use rand::RngCore;

pub use config::{CacheIndex, CacheMode, LoadMetric, PolicyConfig, PolicyKind};
pub use consistent_hashing::{MAX_ROUTING_KEY_BYTES, ROUTING_KEY_HEADERS, valid_routing_key};
pub use decision::{
    AdapterFit, CandidateScore, CostRule, Decision, DecisionNote, DecisionPath, PrefillRate,
    RateSource,
};
pub use error::ConfigError;
pub use input::SelectInput;
/// A worker's identity (from `kvgate-core`): the views and decisions name workers by it.
pub use kvgate_core::WorkerId;
pub use ledger::CreditLedger;
pub use ring::HashRing;
pub use snapshot::{
    AdapterLoad, Credit, MatchSource, Own, PrefixMatches, PrefixTraffic, RECENT_HALF_LIFE,
    RankLoad, RequestFacts, RoutingText, WorkerLoad, WorkerView,
};
pub use text::PromptText;

/// Picks a worker for one request under the configured policy; a request pinned to the
/// worker that keeps its state ([`RequestFacts::pinned`]) goes there while it is eligible.
pub fn select(cfg: &PolicyConfig, input: &SelectInput<'_>, rng: &mut dyn RngCore) -> Decision {
    if let Some(pinned) = input.request.pinned.as_deref()
        && let Some(w) = input
            .workers
            .iter()
            .find(|w| w.eligible && &*w.url == pinned)
    {
        return Decision::simple(w.id, DecisionPath::Pinned);
    }
    match cfg.kind {
        PolicyKind::RoundRobin => basic::round_robin(input),
        PolicyKind::Random => basic::random(input, rng),
        PolicyKind::LeastLoad => least_load::select(cfg, input, rng),
        PolicyKind::PowerOfTwo => power_of_two::select(cfg, input, rng),
        PolicyKind::CacheAware => cache_aware::select(cfg, input, rng),
        PolicyKind::PrefixHash => prefix_hash::select(cfg, input, rng),
        PolicyKind::ConsistentHashing => consistent_hashing::select(input, rng),
    }
}
