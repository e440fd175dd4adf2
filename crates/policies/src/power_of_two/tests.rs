//! §6 scenarios 16–18: power_of_two.

use crate::testkit::*;
use crate::{LoadMetric, PolicyConfig, PolicyKind, RequestFacts, WorkerView};

fn p2(metric: LoadMetric) -> PolicyConfig {
    PolicyConfig {
        power_of_two_load_metric: metric,
        ..PolicyConfig::with_kind(PolicyKind::PowerOfTwo)
    }
}

/// Per-worker win counts over `n` seeded picks (no credit, no in-flight change).
fn check(
    metric: LoadMetric,
    workers: &[WorkerView],
    n: u64,
) -> std::collections::BTreeMap<u64, usize> {
    let mut r = rng(n);
    let req = RequestFacts::default();
    let picks: Vec<_> = (0..n)
        .map(|_| {
            crate::select(&p2(metric), &crate::SelectInput::new(workers, &req), &mut r)
                .worker
                .unwrap()
        })
        .collect();
    counts(&picks)
}

#[test]
fn s16_the_pair_never_picks_the_worst() {
    let c = check(
        LoadMetric::ExpectedWait,
        &[w(1).flight(10), w(2).flight(5), w(3).flight(0)],
        300,
    );
    assert_eq!(c.get(&1), None, "{c:?}");
    assert!(c[&3] > c[&2], "{c:?}");
}

#[test]
fn s17_requests_metric_vs_expected_wait() {
    let workers = [
        w(1).flight(5).load(busy(0, 0.0, 100.0)),
        w(2).flight(2).load(busy(50_000, 0.0, 100.0)),
    ];
    assert_eq!(
        check(LoadMetric::Requests, &workers, 50),
        [(2, 50)].into_iter().collect()
    );
    assert_eq!(
        check(LoadMetric::ExpectedWait, &workers, 50),
        [(1, 50)].into_iter().collect()
    );
}

#[test]
fn s18_least_requests_scans_everyone() {
    let workers = [
        w(1).flight(4),
        w(2).flight(5),
        w(3).flight(1),
        w(4).flight(3),
    ];
    assert_eq!(
        check(LoadMetric::LeastRequests, &workers, 100),
        [(3, 100)].into_iter().collect()
    );
}

#[test]
fn one_eligible_worker_is_chosen_outright() {
    let c = check(LoadMetric::ExpectedWait, &[w(1).down(), w(2).flight(9)], 10);
    assert_eq!(c, [(2, 10)].into_iter().collect());
}
