//! power_of_two: two distinct random eligible workers, the better of the pair.
//!
//! By `power_of_two_load_metric`:
//! - `expected_wait` (default): draw i uniformly, then j uniformly among the others, and
//!   take EW({i, j}). The nominal rate and the no-report rule are scoped to the pair.
//! - `requests`: of the pair, keep those with the fewest in-flight, then EW.
//! - `least_requests`: over all eligible workers (no draw), keep the fewest in-flight,
//!   then EW.
//!
//! One eligible worker is chosen outright. Path `load`; credit the whole prompt.

use rand::{Rng, RngCore};

use crate::config::{LoadMetric, PolicyConfig};
use crate::decision::{Decision, DecisionPath};
use crate::estimate;
use crate::input::SelectInput;
use crate::wait::{Few, Fleet};

pub(crate) fn select(
    cfg: &PolicyConfig,
    input: &SelectInput<'_>,
    rng: &mut dyn RngCore,
) -> Decision {
    let fleet = Fleet::new(input.workers, cfg);
    let e = &fleet.eligible;
    let n = e.len();
    if n == 0 {
        return Decision::none();
    }
    let set = if n == 1 {
        Few::from_slice(&e[..1])
    } else {
        match cfg.power_of_two_load_metric {
            LoadMetric::LeastRequests => fewest_in_flight(&fleet, e),
            metric => {
                let i = rng.gen_range(0..n);
                let j = (i + 1 + rng.gen_range(0..n - 1)) % n;
                let drawn = [e[i], e[j]];
                if metric == LoadMetric::Requests {
                    fewest_in_flight(&fleet, &drawn)
                } else {
                    Few::from_slice(&drawn)
                }
            }
        }
    };
    let credit = estimate::full_credit(input.request, None, cfg);
    fleet
        .pick_by_wait(&set, rng)
        .map_or_else(Decision::none, |p| {
            p.into_decision(&fleet, DecisionPath::Load, credit)
        })
}

fn fewest_in_flight(fleet: &Fleet<'_>, set: &[usize]) -> Few<usize> {
    let min = set.iter().map(|&i| fleet.in_flight(i)).min().unwrap_or(0);
    set.iter()
        .copied()
        .filter(|&i| fleet.in_flight(i) == min)
        .collect()
}

#[cfg(test)]
mod tests;
