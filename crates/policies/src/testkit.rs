//! Builders shared by the unit tests.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::snapshot::{
    Credit, PrefixMatches, RankLoad, RequestFacts, RoutingText, WorkerLoad, WorkerView,
};
use crate::{CreditLedger, Decision, PolicyConfig, select};
use crate::{SelectInput, WorkerId};

/// Worker `i`: id `i`, url `http://w{i}`.
pub(crate) fn w(i: u64) -> WorkerView {
    WorkerView::new(WorkerId(i), format!("http://w{i}:8000"))
}

/// Workers 1..=n.
pub(crate) fn fleet(n: u64) -> Vec<WorkerView> {
    (1..=n).map(w).collect()
}

pub(crate) fn id(i: u64) -> WorkerId {
    WorkerId(i)
}

pub(crate) fn rng(seed: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed)
}

/// Builder-style setters for tests.
pub(crate) trait With {
    fn flight(self, n: u64) -> Self;
    fn load(self, l: WorkerLoad) -> Self;
    fn credit(self, tokens: u64, requests: u64) -> Self;
    fn down(self) -> Self;
}

impl With for WorkerView {
    fn flight(mut self, n: u64) -> Self {
        self.in_flight = n;
        self
    }
    fn load(mut self, l: WorkerLoad) -> Self {
        self.load = Some(l);
        self
    }
    fn credit(mut self, tokens: u64, requests: u64) -> Self {
        self.credit = Credit { tokens, requests };
        self
    }
    fn down(mut self) -> Self {
        self.eligible = false;
        self
    }
}

/// One rank.
pub(crate) fn rank(running: u64, queued_tokens: u64, usage: f64, g: f64) -> RankLoad {
    RankLoad {
        num_running_reqs: running,
        num_waiting_uncached_tokens: queued_tokens,
        token_usage: usage,
        gen_throughput: g,
        ..RankLoad::default()
    }
}

pub(crate) fn report(ranks: Vec<RankLoad>) -> WorkerLoad {
    WorkerLoad {
        ranks,
        sampled_at: Duration::ZERO,
        adapters: None,
    }
}

/// "Busy report (q, u, g)": one rank, running 1, q waiting tokens, usage u, throughput g.
pub(crate) fn busy(q: u64, u: f64, g: f64) -> WorkerLoad {
    report(vec![rank(1, q, u, g)])
}

/// An idle rank whose stale gauge reads `g`.
pub(crate) fn idle(g: f64) -> WorkerLoad {
    report(vec![rank(0, 0, 0.0, g)])
}

/// A report whose queue is only a waiting-request count.
pub(crate) fn waiting(reqs: u64) -> WorkerLoad {
    report(vec![RankLoad {
        num_waiting_reqs: reqs,
        ..RankLoad::default()
    }])
}

pub(crate) fn text(s: &str) -> RequestFacts {
    RequestFacts {
        key: RoutingText::Text(s.into()),
        ..RequestFacts::default()
    }
}

pub(crate) fn tokens(n: u32) -> RequestFacts {
    RequestFacts {
        key: RoutingText::Tokens((0..n).collect()),
        ..RequestFacts::default()
    }
}

/// Matches of a text-tree index.
pub(crate) fn text_matches(input_len: usize, per_worker: &[(u64, usize)]) -> PrefixMatches {
    PrefixMatches {
        input_len,
        per_worker: per_worker.iter().map(|&(i, n)| (WorkerId(i), n)).collect(),
        ..PrefixMatches::default()
    }
}

/// One decision.
pub(crate) fn pick(
    cfg: &PolicyConfig,
    workers: &[WorkerView],
    req: &RequestFacts,
    matches: Option<&PrefixMatches>,
    seed: u64,
) -> Decision {
    let input = SelectInput {
        matches,
        ..SelectInput::new(workers, req)
    };
    select(cfg, &input, &mut rng(seed))
}

/// `n` consecutive decisions like the selector makes them: each chosen worker is credited
/// through a ledger (no report arrives in between) and, if `bump`, gets one more in flight.
pub(crate) fn run(
    cfg: &PolicyConfig,
    workers: &mut [WorkerView],
    req: &RequestFacts,
    matches: Option<&PrefixMatches>,
    n: usize,
    bump: bool,
    seed: u64,
) -> Vec<WorkerId> {
    let mut rng = rng(seed);
    let mut ledger = CreditLedger::new();
    let mut out = Vec::new();
    let base: Vec<Credit> = workers.iter().map(|w| w.credit).collect();
    for k in 0..n {
        for (w, b) in workers.iter_mut().zip(&base) {
            let c = ledger.credit(w.id);
            w.credit = Credit {
                tokens: b.tokens + c.tokens,
                requests: b.requests + c.requests,
            };
        }
        let input = SelectInput {
            matches,
            seq: k as u64,
            ..SelectInput::new(workers, req)
        };
        let d = select(cfg, &input, &mut rng);
        ledger.apply(&d, Duration::from_millis(k as u64));
        if let Some(chosen) = d.worker {
            out.push(chosen);
            if bump && let Some(v) = workers.iter_mut().find(|v| v.id == chosen) {
                v.in_flight += 1;
            }
        }
    }
    out
}

/// How many times each worker (by id number) was picked.
pub(crate) fn counts(picks: &[WorkerId]) -> BTreeMap<u64, usize> {
    let mut m = BTreeMap::new();
    for p in picks {
        *m.entry(p.0).or_insert(0) += 1;
    }
    m
}
