//! Policies that read nothing but eligibility: round_robin and random.

use rand::RngCore;

use crate::decision::{Decision, DecisionPath};
use crate::snapshot::SelectInput;

/// The eligible worker at position `seq mod n` among the eligible ones.
pub fn round_robin(input: &SelectInput<'_>) -> Decision {
    let n = input.workers.iter().filter(|w| w.eligible).count();
    if n == 0 {
        return Decision::none();
    }
    let pos = (input.seq % n as u64) as usize;
    input
        .workers
        .iter()
        .filter(|w| w.eligible)
        .nth(pos)
        .map_or_else(Decision::none, |w| {
            Decision::simple(w.id, DecisionPath::RoundRobin)
        })
}

/// A uniform draw among eligible workers.
pub fn random(input: &SelectInput<'_>, rng: &mut dyn RngCore) -> Decision {
    let n = input.workers.iter().filter(|w| w.eligible).count();
    if n == 0 {
        return Decision::none();
    }
    let pos = (rng.next_u64() % n as u64) as usize;
    input
        .workers
        .iter()
        .filter(|w| w.eligible)
        .nth(pos)
        .map_or_else(Decision::none, |w| {
            Decision::simple(w.id, DecisionPath::Random)
        })
}
