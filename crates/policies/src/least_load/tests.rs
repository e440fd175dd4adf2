//! §6 scenarios 14 and 15: the waiting cap, and a forgotten fleet.

use crate::testkit::*;
use crate::{DecisionPath, PolicyConfig, PolicyKind, RequestFacts};

fn capped(cap: u64) -> PolicyConfig {
    PolicyConfig {
        least_load_max_waiting_requests: Some(cap),
        ..PolicyConfig::with_kind(PolicyKind::LeastLoad)
    }
}

/// The pick for `workers` under `cfg`: `Some(worker)` or `None` (saturated).
fn check(cfg: &PolicyConfig, workers: &[crate::WorkerView], expect: Option<u64>) {
    let d = pick(cfg, workers, &RequestFacts::default(), None, 0);
    assert_eq!(d.worker, expect.map(id), "{d}");
    if expect.is_none() && workers.iter().any(|w| w.eligible) {
        assert_eq!(d.path, DecisionPath::Saturated);
    }
}

#[test]
fn s14_waiting_cap() {
    // W1 at 64 waiting is dropped although W2 scores worse.
    let w2_worse = busy(100_000, 0.5, 10.0);
    check(
        &capped(48),
        &[w(1).load(waiting(64)), w(2).load(w2_worse)],
        Some(2),
    );
    check(
        &capped(48),
        &[w(1).load(waiting(48)), w(2).load(waiting(48))],
        None,
    );
    check(&capped(48), &[w(1).load(waiting(64))], None);
    // Cap 2 with W1 at 1 waiting: the first pick → W1; one dispatch later it is capped.
    let pair = [w(1).load(waiting(1)), w(2).load(waiting(1)).credit(0, 5)];
    check(&capped(2), &pair, Some(1));
    let after = [pair[0].clone().credit(1024, 1), pair[1].clone()];
    check(&capped(2), &after, None);
    let with_w3 = [after[0].clone(), w(3).load(waiting(0))];
    check(&capped(2), &with_w3, Some(3));
    // Workers without a report are never capped.
    check(&capped(1), &[w(1).flight(100)], Some(1));
    // No cap: the worse-scoring worker is never preferred.
    let off = PolicyConfig::with_kind(PolicyKind::LeastLoad);
    check(
        &off,
        &[w(1).load(waiting(64)), w(2).load(busy(100_000, 0.5, 10.0))],
        Some(1),
    );
    check(&off, &[w(1).load(waiting(64))], Some(1));
}

#[test]
fn s15_after_a_reset_the_dark_fleet_rule_applies() {
    // Reports and credit forgotten: the lowest in-flight wins.
    let off = PolicyConfig::with_kind(PolicyKind::LeastLoad);
    check(
        &off,
        &[w(1).flight(3), w(2).flight(1), w(3).flight(2)],
        Some(2),
    );
}

#[test]
fn no_eligible_worker() {
    let off = PolicyConfig::with_kind(PolicyKind::LeastLoad);
    let d = pick(&off, &[w(1).down()], &RequestFacts::default(), None, 0);
    assert_eq!((d.worker, d.path), (None, DecisionPath::NoWorker));
}
