//! What one prefix-affinity decision reads, computed once: the fleet, the gate and each
//! worker's matched units. cache_aware's threshold mode and its cost mode both decide
//! from it.

use rand::RngCore;

use crate::config::PolicyConfig;
use crate::decision::{CandidateScore, Decision, DecisionPath};
use crate::estimate;
use crate::gate::Gate;
use crate::input::SelectInput;
use crate::snapshot::{MatchSource, PrefixMatches, RoutingText};
use crate::wait::{Few, Fleet, Pick};

/// Everything one cache_aware decision reads, computed once.
#[derive(Debug)]
pub(crate) struct Ctx<'a> {
    pub cfg: &'a PolicyConfig,
    pub input: &'a SelectInput<'a>,
    pub fleet: Fleet<'a>,
    pub gate: Gate,
    /// Matched units per worker index (0 for non-holders and ineligible workers).
    pub matched: Few<usize>,
}

impl<'a> Ctx<'a> {
    pub(crate) fn matches(&self) -> Option<&'a PrefixMatches> {
        self.input.matches
    }

    /// Whether the request reaches a configured hash boundary.
    pub(crate) fn hash_applicable(&self) -> bool {
        let tokens = match &self.input.request.key {
            RoutingText::Tokens(t) => t.len(),
            _ => 0,
        };
        !self.cfg.applicable_boundaries(tokens).is_empty()
    }

    /// Whether the index should record the chosen worker for this request.
    pub(crate) fn recordable(&self) -> bool {
        match self.matches().map(|m| m.source) {
            None => false,
            Some(MatchSource::Hash { .. }) => self.hash_applicable(),
            Some(MatchSource::TextTree | MatchSource::TokenTree) => true,
        }
    }

    /// The eligible workers holding any part of the prompt.
    pub(crate) fn holders(&self) -> Few<usize> {
        self.fleet
            .eligible
            .iter()
            .copied()
            .filter(|&i| self.matched[i] > 0)
            .collect()
    }

    pub(crate) fn ungated_eligible(&self) -> Few<usize> {
        self.gate.ungated(&self.fleet, &self.fleet.eligible)
    }

    /// Matched units / input units for worker index `i`.
    pub(crate) fn match_rate(&self, i: usize) -> Option<f64> {
        let m = self.matches()?;
        Some(if m.input_len == 0 {
            0.0
        } else {
            (self.matched[i] as f64 / m.input_len as f64).min(1.0)
        })
    }

    /// One entry per eligible worker, with its match and gate verdict.
    pub(crate) fn candidates(&self) -> Vec<CandidateScore> {
        let has_matches = self.matches().is_some();
        self.fleet
            .eligible
            .iter()
            .map(|&i| {
                let w = &self.fleet.workers[i];
                CandidateScore {
                    matched: has_matches.then_some(self.matched[i]),
                    gated: self.gate.gated(self.fleet.requests(i)),
                    ..CandidateScore::new(w.id, w.in_flight)
                }
            })
            .collect()
    }

    /// Each worker index's place in [`candidates`](Self::candidates) (which follow
    /// `fleet.eligible`), `usize::MAX` for a worker that is not one: scores and notes are
    /// put in place by index, not searched for by id, so a decision stays linear in the
    /// fleet's size.
    pub(crate) fn candidate_slots(&self) -> Vec<usize> {
        let mut slot = vec![usize::MAX; self.fleet.workers.len()];
        for (at, &i) in self.fleet.eligible.iter().enumerate() {
            slot[i] = at;
        }
        slot
    }

    /// EW(set) with the whole prompt as credit.
    pub(crate) fn by_wait(
        &self,
        set: &[usize],
        path: DecisionPath,
        record: bool,
        rng: &mut dyn RngCore,
    ) -> Decision {
        let Some(pick) = self.fleet.pick_by_wait(set, rng) else {
            return Decision::none();
        };
        let credit = estimate::full_credit(self.input.request, self.matches(), self.cfg);
        self.decide(&pick, path, credit, record)
    }

    /// The decision for `pick`, with every eligible worker listed.
    pub(crate) fn decide(
        &self,
        pick: &Pick,
        path: DecisionPath,
        credit_tokens: u64,
        record_prefix: bool,
    ) -> Decision {
        let mut candidates = self.candidates();
        let slot = self.candidate_slots();
        for (i, score) in &pick.scored {
            if let Some(c) = slot.get(*i).and_then(|&at| candidates.get_mut(at)) {
                c.score = Some(*score);
            }
        }
        Decision {
            worker: Some(self.fleet.workers[pick.worker].id),
            path,
            candidates,
            match_rate: self.match_rate(pick.worker),
            credit_tokens,
            record_prefix,
            rule: None,
            new_prefix: false,
            notes: Vec::new(),
        }
    }
}
