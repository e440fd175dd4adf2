//! §6 scenarios 1–13 and 33 (expected wait), through least_load and the scorer itself.

use super::*;
use crate::testkit::*;
use crate::{PolicyConfig, PolicyKind, SelectInput, select};

fn least_load() -> PolicyConfig {
    PolicyConfig::with_kind(PolicyKind::LeastLoad)
}

/// The scores of every worker as one candidate set.
fn scores(workers: &[WorkerView]) -> Vec<f64> {
    let cfg = least_load();
    let fleet = Fleet::new(workers, &cfg);
    fleet.expected_waits(&fleet.eligible).to_vec()
}

/// With no credit applied, the winner is always worker `expect` (over several seeds).
fn check(workers: Vec<WorkerView>, req: &crate::RequestFacts, expect: u64) {
    for seed in 0..5 {
        let d = pick(&least_load(), &workers, req, None, seed);
        assert_eq!(d.worker, Some(id(expect)), "seed {seed}: {d}");
    }
}

fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn s01_dark_fleet_spreads_uniformly() {
    let workers = fleet(128);
    let mut r = rng(1);
    let cfg = least_load();
    let req = crate::RequestFacts::default();
    let mut picks = Vec::new();
    for _ in 0..1000 {
        let d = select(&cfg, &SelectInput::new(&workers, &req), &mut r);
        picks.push(d.worker.unwrap());
    }
    let c = counts(&picks);
    assert_eq!(c.len(), 128, "every worker picked at least once");
    let mean = 1000.0 / 128.0;
    assert!(c.values().all(|&n| (n as f64) <= 3.0 * mean), "{c:?}");
}

#[test]
fn s02_lowest_in_flight_wins_in_a_dark_fleet() {
    let workers: Vec<_> = (1..=128)
        .map(|i| w(i).flight(if i == 77 { 0 } else { 1 }))
        .collect();
    let mut picks = Vec::new();
    let mut r = rng(2);
    let req = crate::RequestFacts::default();
    for _ in 0..1000 {
        picks.push(
            select(&least_load(), &SelectInput::new(&workers, &req), &mut r)
                .worker
                .unwrap(),
        );
    }
    assert_eq!(counts(&picks), [(77, 1000)].into_iter().collect());
}

#[test]
fn s03_sub_epsilon_differences_are_ties() {
    let workers: Vec<_> = (1..=4)
        .map(|i| w(i).load(busy(0, i as f64 * 1e-9, 100.0)))
        .collect();
    let mut r = rng(3);
    let req = crate::RequestFacts::default();
    let picks: Vec<_> = (0..400)
        .map(|_| {
            select(&least_load(), &SelectInput::new(&workers, &req), &mut r)
                .worker
                .unwrap()
        })
        .collect();
    let c = counts(&picks);
    assert!(c.len() == 4 && c.values().all(|&n| n >= 50), "{c:?}");
}

#[test]
fn s04_queue_comparisons() {
    let none = crate::RequestFacts::default();
    // 8000 vs 1000 queued at 100 tok/s: 80 s vs 10 s.
    check(
        vec![
            w(1).load(busy(8000, 0.0, 100.0)),
            w(2).load(busy(1000, 0.0, 100.0)),
        ],
        &none,
        2,
    );
    // 5000 queued at 50 vs at 500 tok/s.
    check(
        vec![
            w(1).load(busy(5000, 0.0, 50.0)),
            w(2).load(busy(5000, 0.0, 500.0)),
        ],
        &none,
        2,
    );
    // No live rate anywhere: both at the 2000 tok/s default, 5 s vs 0.5 s.
    let zero = vec![
        w(1).load(busy(10_000, 0.0, 0.0)),
        w(2).load(busy(1000, 0.0, 0.0)),
    ];
    let s = scores(&zero);
    assert!(approx(s[0], 5.0) && approx(s[1], 0.5), "{s:?}");
    check(zero, &none, 2);
    // Queue known only as request counts: 64 vs 6, twenty picks in a row with credit.
    let mut counted = vec![w(1).load(waiting(64)), w(2).load(waiting(6))];
    let picks = run(&least_load(), &mut counted, &none, None, 20, false, 4);
    assert_eq!(counts(&picks), [(2, 20)].into_iter().collect());
    // Reported tokens beat the count estimate: 500 tokens (200 requests) vs 8000 tokens.
    let mut r1 = rank(1, 500, 0.0, 100.0);
    r1.num_waiting_reqs = 200;
    check(
        vec![
            w(1).load(report(vec![r1])),
            w(2).load(busy(8000, 0.0, 100.0)),
        ],
        &none,
        1,
    );
}

#[test]
fn s05_kv_pressure_term() {
    let cfg = PolicyConfig {
        kv_pressure_weight: 2.0,
        ..least_load()
    };
    let none = crate::RequestFacts::default();
    let d = pick(
        &cfg,
        &[
            w(1).load(busy(0, 0.9, 100.0)),
            w(2).load(busy(0, 0.1, 100.0)),
        ],
        &none,
        None,
        0,
    );
    assert_eq!(d.worker, Some(id(2)));
    let d = pick(
        &cfg,
        &[
            w(1).load(busy(0, 0.98, 100.0)),
            w(2).load(busy(0, 0.0, 100.0)),
        ],
        &none,
        None,
        0,
    );
    assert_eq!(d.worker, Some(id(2)));
    // 0.98 → 2 · 0.98 / 0.02 = 98 s.
    assert!(approx(d.candidates[0].score.unwrap(), 98.0), "{d:?}");
}

#[test]
fn s06_credit_water_fills_two_equal_workers() {
    let mut workers = vec![
        w(1).load(busy(0, 0.0, 100.0)),
        w(2).load(busy(0, 0.0, 100.0)),
    ];
    let picks = run(&least_load(), &mut workers, &tokens(100), None, 2, false, 6);
    assert_ne!(picks[0], picks[1]);
}

#[test]
fn s07_known_token_count_is_credited_exactly() {
    let workers = vec![
        w(1).load(busy(0, 0.2, 100.0)),
        w(2).load(busy(2048, 0.2, 100.0)),
    ];
    let d = pick(&least_load(), &workers, &tokens(2100), None, 0);
    assert_eq!((d.worker, d.credit_tokens), (Some(id(1)), 2100));
    let credited = vec![workers[0].clone().credit(2100, 1), workers[1].clone()];
    let d = pick(
        &least_load(),
        &credited,
        &crate::RequestFacts::default(),
        None,
        0,
    );
    assert_eq!((d.worker, d.credit_tokens), (Some(id(2)), 1024));
}

#[test]
fn s09_unreported_worker_is_priced_from_the_best_reporter() {
    let workers = vec![w(1).load(waiting(1)), w(2).load(waiting(3)), w(3)];
    let mut picked = Vec::new();
    for trial in 0..150 {
        let d = pick(
            &least_load(),
            &workers,
            &crate::RequestFacts::default(),
            None,
            trial,
        );
        picked.push(d.worker.unwrap());
    }
    let c = counts(&picked);
    assert_eq!(c.get(&2), None, "{c:?}");
    assert!(c[&1] > 0 && c[&3] > 0 && c[&3] < 120, "{c:?}");
}

#[test]
fn s10_nominal_is_scoped_to_the_candidates() {
    // C reports 100k tok/s but is not a candidate (ineligible here).
    let workers = vec![
        w(1).flight(2),
        w(2).load(busy(1000, 0.2, 100.0)),
        w(3).load(busy(0, 0.0, 100_000.0)).down(),
    ];
    let s = scores(&workers);
    // B = 1000/100 + 0.15·0.2/0.8; A = B + 2·1024/100 (the reference quotes the 20.48 s part).
    let b = 10.0 + 0.15 * 0.2 / 0.8;
    assert!(approx(s[1], b) && approx(s[0], b + 20.48), "{s:?}");
    check(workers, &crate::RequestFacts::default(), 2);
}

#[test]
fn s11_idle_ranks_are_not_live() {
    assert_eq!(live_rate(&[rank(0, 0, 0.0, 0.36)]), 0.0);
    // Reference: 800. kvgate counts the idle rank at the busy rank's rate.
    assert_eq!(
        live_rate(&[rank(0, 0, 0.0, 0.36), rank(4, 0, 0.0, 800.0)]),
        1600.0
    );
}

#[test]
fn partly_idle_multi_rank_worker_is_not_slower_than_a_busy_peer() {
    // W1: one rank busy at 800, one idle. W2: both busy at 800. Same queue.
    let w1 = report(vec![rank(2, 4000, 0.0, 800.0), rank(0, 0, 0.0, 0.36)]);
    let w2 = report(vec![rank(2, 2000, 0.0, 800.0), rank(2, 2000, 0.0, 800.0)]);
    let s = scores(&[w(1).load(w1), w(2).load(w2)]);
    assert!(approx(s[0], s[1]), "{s:?}");
}

#[test]
fn an_idle_worker_is_priced_per_rank_in_a_fleet_of_mixed_sizes() {
    // W1: two ranks busy at 100 tok/s each (200 in all), 300 tokens queued: 1.5 s.
    // W2: one idle rank, 200 tokens queued: one rank's rate, 100, gives 2 s. Priced at W1's
    // whole-worker rate it read as 1 s and won.
    let w1 = report(vec![rank(1, 150, 0.0, 100.0), rank(1, 150, 0.0, 100.0)]);
    let w2 = report(vec![rank(0, 200, 0.0, 0.36)]);
    let s = scores(&[w(1).load(w1.clone()), w(2).load(w2.clone())]);
    assert!(approx(s[0], 1.5) && approx(s[1], 2.0), "{s:?}");
    check(vec![w(1).load(w1), w(2).load(w2)], &tokens(10), 1);
    // And an idle two-rank worker beside a busy one-rank peer counts both its ranks.
    let busy1 = report(vec![rank(1, 100, 0.0, 100.0)]);
    let idle2 = report(vec![rank(0, 100, 0.0, 0.0), rank(0, 100, 0.0, 0.0)]);
    let s = scores(&[w(1).load(busy1), w(2).load(idle2)]);
    assert!(approx(s[0], 1.0) && approx(s[1], 1.0), "{s:?}");
}

#[test]
fn s12_seed_idle_residual_burst_splits_evenly() {
    let mut workers = vec![w(1).load(idle(0.36)), w(2).load(idle(0.0))];
    let picks = run(
        &least_load(),
        &mut workers,
        &crate::RequestFacts::default(),
        None,
        8,
        false,
        12,
    );
    assert_eq!(counts(&picks), [(1, 4), (2, 4)].into_iter().collect());
}

#[test]
fn s13_seed_idle_beside_busy_splits_evenly() {
    let mut workers = vec![w(1).load(busy(0, 0.1, 8000.0)), w(2).load(idle(0.36))];
    let picks = run(
        &least_load(),
        &mut workers,
        &crate::RequestFacts::default(),
        None,
        8,
        false,
        13,
    );
    assert_eq!(counts(&picks), [(1, 4), (2, 4)].into_iter().collect());
}

#[test]
fn s33_a_worker_without_a_fresh_report_is_scored_as_unreported() {
    // W1's old idle report is stale, so the selector passes none; it has 5 in flight.
    let workers = vec![w(1).flight(5), w(2).load(busy(1000, 0.0, 100.0))];
    let s = scores(&workers);
    assert!(approx(s[1], 10.0) && approx(s[0], 10.0 + 51.2), "{s:?}");
    check(workers, &crate::RequestFacts::default(), 2);
}

#[test]
fn argmin_handles_non_finite_scores() {
    let mut r = rng(0);
    assert_eq!(argmin_uniform(&[], &mut r), None);
    assert_eq!(
        argmin_uniform(&[f64::NAN, 2.0, f64::INFINITY], &mut r),
        Some(1)
    );
    assert!(argmin_uniform(&[f64::NAN, f64::NAN], &mut r).is_some());
}

#[test]
fn prefill_rate_comes_from_the_cumulative_counters() {
    let mut r = rank(1, 0, 0.0, 100.0);
    r.total_prefill_uncached_tokens = 50_000;
    r.total_prefill_busy_us = 2_000_000;
    let l = Load::read(&report(vec![r, rank(0, 0, 0.0, 0.0)]), 1024.0).unwrap();
    assert!(approx(l.prefill_rate, 25_000.0) && l.ranks == 2.0, "{l:?}");
    assert_eq!(Load::read(&report(vec![]), 1024.0), None);
}

/// The rate the seed replaced, as the reference computes it: a worker's summed
/// `gen_throughput` if above 0, else the default; every rank's gauge counts, idle or not.
fn seed_formula_scores(workers: &[WorkerView]) -> Vec<f64> {
    let p = Params::from_config(&least_load());
    workers
        .iter()
        .map(|w| {
            let ranks = &w.load.as_ref().map_or(&[][..], |l| &l.ranks[..]);
            let g: f64 = ranks.iter().map(|r| r.gen_throughput).sum();
            let rate = if g > 0.0 { g } else { p.default_rate };
            let queued: f64 = ranks
                .iter()
                .map(|r| r.num_waiting_uncached_tokens as f64)
                .sum();
            (queued + w.credit.tokens as f64) / rate
        })
        .collect()
}

/// `n` decisions by `score`, each winner credited `tokens` as the selector's ledger does
/// (no report arrives in between); picks per worker id.
fn replay_burst(
    score: fn(&[WorkerView]) -> Vec<f64>,
    mut workers: Vec<WorkerView>,
    n: usize,
    tokens: u64,
) -> Vec<usize> {
    let mut rng = rng(15);
    let mut picks = vec![0; workers.len()];
    for _ in 0..n {
        let at = argmin_uniform(&score(&workers), &mut rng).expect("a winner");
        picks[at] += 1;
        workers[at].credit.tokens += tokens;
        workers[at].credit.requests += 1;
        workers[at].in_flight += 1;
    }
    picks
}

#[test]
fn the_seed_burst_on_asymmetric_stale_gauges_splits_evenly_where_the_replaced_formula_piles_up() {
    // The end-to-end test's fleet: idle engines, one left at 0.35 tok/s, one at 0.
    let fleet = || vec![w(1).load(idle(0.35)), w(2).load(idle(0.0))];
    assert_eq!(replay_burst(scores, fleet(), 32, 12), vec![16, 16]);
    // The 0.35 tok/s engine looks 5700 times slower than the default: it gets one request.
    assert_eq!(
        replay_burst(seed_formula_scores, fleet(), 32, 12),
        vec![1, 31]
    );
    // The same scorer through the policy, with the ledger the selector uses.
    let mut workers = fleet();
    let picks = run(&least_load(), &mut workers, &tokens(12), None, 32, true, 15);
    assert_eq!(counts(&picks), [(1, 16), (2, 16)].into_iter().collect());
}
