//! least_load: the expected-wait winner over every eligible worker.
//!
//! 1. E = the eligible workers; none → no worker.
//! 2. With `least_load_max_waiting_requests = cap`, drop every worker whose report shows
//!    `Σ_r num_waiting_reqs + requests dispatched since the sample ≥ cap`. Workers without
//!    a report are never dropped. If every worker is dropped the decision names none,
//!    with path `saturated`: the request should wait in admission rather than pile onto a
//!    full queue. The cap applies even to a single worker.
//! 3. EW(E) (see the `wait` module), path `load`.
//!
//! The credit (the whole prompt) makes consecutive picks inside one poll interval
//! water-fill: two equal workers alternate.

use rand::RngCore;

use crate::config::PolicyConfig;
use crate::decision::{CandidateScore, Decision, DecisionPath};
use crate::estimate;
use crate::input::SelectInput;
use crate::wait::{Few, Fleet};

pub(crate) fn select(
    cfg: &PolicyConfig,
    input: &SelectInput<'_>,
    rng: &mut dyn RngCore,
) -> Decision {
    let fleet = Fleet::new(input.workers, cfg);
    if fleet.eligible.is_empty() {
        return Decision::none();
    }
    let set: Few<usize> = match cfg.least_load_max_waiting_requests {
        None => fleet.eligible.clone(),
        Some(cap) => {
            let open: Few<usize> = fleet
                .eligible
                .iter()
                .copied()
                .filter(|&i| {
                    fleet.load(i).is_none_or(|l| {
                        let dispatched = fleet.workers[i].credit.requests as f64;
                        l.waiting_reqs + dispatched < cap as f64
                    })
                })
                .collect();
            if open.is_empty() {
                let capped = fleet
                    .eligible
                    .iter()
                    .map(|&i| CandidateScore::new(fleet.workers[i].id, fleet.in_flight(i)))
                    .collect();
                return Decision::saturated(capped);
            }
            open
        }
    };
    let credit = estimate::full_credit(input.request, None, cfg);
    fleet
        .pick_by_wait(&set, rng)
        .map_or_else(Decision::none, |p| {
            p.into_decision(&fleet, DecisionPath::Load, credit)
        })
}

#[cfg(test)]
mod tests;
