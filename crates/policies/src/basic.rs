//! Policies that read nothing but eligibility: round_robin and random.

use rand::RngCore;

use crate::decision::{Decision, DecisionPath};
use crate::input::SelectInput;

/// The eligible worker at position `seq mod n` among the eligible ones.
pub(crate) fn round_robin(input: &SelectInput<'_>) -> Decision {
    nth_eligible(input, |n| input.seq % n, DecisionPath::RoundRobin)
}

/// A uniform draw among eligible workers.
pub(crate) fn random(input: &SelectInput<'_>, rng: &mut dyn RngCore) -> Decision {
    nth_eligible(input, |n| rng.next_u64() % n, DecisionPath::Random)
}

/// The eligible worker at `pick(n)` of the `n` eligible ones.
fn nth_eligible(
    input: &SelectInput<'_>,
    pick: impl FnOnce(u64) -> u64,
    path: DecisionPath,
) -> Decision {
    let n = input.workers.iter().filter(|w| w.eligible).count();
    if n == 0 {
        return Decision::none();
    }
    let pos = pick(n as u64) as usize;
    input
        .workers
        .iter()
        .filter(|w| w.eligible)
        .nth(pos)
        .map_or_else(Decision::none, |w| Decision::simple(w.id, path))
}
