//! consistent_hashing: the ring owner of the request's routing key.
//!
//! The gateway reads the key from the `x-kvgate-routing-key` header (also accepting the
//! reference's `x-smg-routing-key`, see [`ROUTING_KEY_HEADERS`]) into
//! `RequestFacts::routing_key`. A usable key is non-empty and at most
//! [`MAX_ROUTING_KEY_BYTES`] bytes; others are ignored.
//!
//! - Key and ring: the first eligible worker clockwise from the key's position, path `hash`.
//! - Key but no ring (or no eligible worker on it): `xxh3(key) mod n` over the eligible
//!   workers in id order, path `hash`, so the key still sticks while the fleet is stable.
//! - No usable key: a uniform draw among eligible workers, path `fallback`.

use rand::{Rng, RngCore};

use crate::decision::{Decision, DecisionPath};
use crate::ring::HashRing;
use kvgate_core::WorkerId;

use crate::input::SelectInput;

/// Headers a routing key is read from, in order of preference.
pub const ROUTING_KEY_HEADERS: [&str; 2] = ["x-kvgate-routing-key", "x-smg-routing-key"];

/// Longest routing key honoured, in bytes.
pub const MAX_ROUTING_KEY_BYTES: usize = 128;

/// The key if it is usable for routing: non-empty and at most 128 bytes.
pub fn valid_routing_key(key: Option<&str>) -> Option<&str> {
    key.filter(|k| !k.is_empty() && k.len() <= MAX_ROUTING_KEY_BYTES)
}

pub(crate) fn select(input: &SelectInput<'_>, rng: &mut dyn RngCore) -> Decision {
    let mut eligible: Vec<WorkerId> = input
        .workers
        .iter()
        .filter(|w| w.eligible)
        .map(|w| w.id)
        .collect();
    if eligible.is_empty() {
        return Decision::none();
    }
    eligible.sort_unstable();
    let Some(key) = valid_routing_key(input.request.routing_key.as_deref()) else {
        let w = eligible[rng.gen_range(0..eligible.len())];
        return Decision::simple(w, DecisionPath::Fallback);
    };
    let pos = HashRing::position(key.as_bytes());
    let owner = input
        .ring
        .and_then(|r| r.owner(pos, |id| eligible.binary_search(&id).is_ok()))
        .unwrap_or_else(|| eligible[(pos % eligible.len() as u64) as usize]);
    Decision::simple(owner, DecisionPath::Hash)
}

#[cfg(test)]
mod tests;
