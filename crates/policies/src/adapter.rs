//! LoRA adapter fit: a request that runs under an adapter goes to the engines where the
//! adapter suits best, among those the count gate leaves.
//!
//! ```text
//! fit(w) = active   the adapter is running or waiting on w (its weights are on the GPU),
//!                   or w holds the prompt's prefix under the adapter (its blocks are there)
//!        = room     w runs fewer adapters than it holds at once, or does not say
//!        = full     loading it would evict an adapter at work
//! ```
//!
//! llm-d's order (active, then loaded, then loadable), with what engines report: vLLM's
//! `vllm:lora_requests_info` names the adapters running and waiting and `max_lora`, not
//! which idle ones still sit on the GPU, so "loaded" is read as "room to load without
//! evicting". Only the best fit among the ungated candidates stays a candidate, so a busy
//! engine with the adapter active loses to an idle one where it would load, as it would
//! lose any request (the gate, not the fit, bounds the load). Which engines may serve the
//! adapter at all is the gateway's (the engines that list it in `/v1/models`).

use crate::decision::AdapterFit;
use crate::gate::Gate;
use crate::snapshot::WorkerView;
use crate::wait::{Few, Fleet};

/// How `w` suits `adapter` (`holds`: it holds the prompt's prefix under the adapter).
pub(crate) fn fit(w: &WorkerView, adapter: &str, holds: bool) -> AdapterFit {
    if holds {
        return AdapterFit::Active;
    }
    let Some(a) = w.load.as_ref().and_then(|l| l.adapters.as_ref()) else {
        return AdapterFit::Room;
    };
    if a.active.iter().any(|x| x == adapter) {
        AdapterFit::Active
    } else if a.max_loras == 0 || a.active.len() < a.max_loras as usize {
        AdapterFit::Room
    } else {
        AdapterFit::Full
    }
}

/// Leaves in `fleet.eligible` only the best-fitting of the workers the gate leaves (all of
/// them when it leaves none); returns that fit. `None` for a request with no adapter.
pub(crate) fn narrow(
    fleet: &mut Fleet<'_>,
    gate: &Gate,
    adapter: Option<&str>,
    holds: &dyn Fn(usize) -> bool,
) -> Option<AdapterFit> {
    let adapter = adapter?;
    let open = gate.ungated(fleet, &fleet.eligible);
    let of = |i: usize| fit(&fleet.workers[i], adapter, holds(i));
    let best = open.iter().map(|&i| of(i)).min()?;
    let kept: Few<usize> = open.iter().copied().filter(|&i| of(i) == best).collect();
    fleet.eligible = kept;
    Some(best)
}

#[cfg(test)]
mod tests;
