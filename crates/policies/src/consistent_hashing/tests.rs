//! §6 scenario 61 (routing key parts; the target-worker header is not part of kvgate).

use crate::testkit::*;
use crate::{
    DecisionPath, HashRing, PolicyConfig, PolicyKind, RequestFacts, SelectInput, WorkerView,
    select, valid_routing_key,
};

fn keyed(key: &str) -> RequestFacts {
    RequestFacts {
        routing_key: Some(key.to_owned()),
        ..RequestFacts::default()
    }
}

/// The decision for `req` with a ring over `workers` (or none).
fn check(
    workers: &[WorkerView],
    req: &RequestFacts,
    with_ring: bool,
    seed: u64,
) -> crate::Decision {
    let ring = HashRing::from_views(workers);
    let input = SelectInput {
        ring: with_ring.then_some(&ring),
        ..SelectInput::new(workers, req)
    };
    select(
        &PolicyConfig::with_kind(PolicyKind::ConsistentHashing),
        &input,
        &mut rng(seed),
    )
}

#[test]
fn s61_the_same_key_always_picks_the_same_worker() {
    let workers = fleet(5);
    for k in 0..50 {
        let req = keyed(&format!("user-{k}"));
        let first = check(&workers, &req, true, 0);
        assert_eq!(first.path, DecisionPath::Hash);
        for seed in 1..5 {
            assert_eq!(check(&workers, &req, true, seed).worker, first.worker);
        }
        // Without a ring the key still sticks.
        let a = check(&workers, &req, false, 1).worker;
        assert_eq!(check(&workers, &req, false, 2).worker, a);
    }
}

#[test]
fn s61_adding_a_worker_moves_about_one_in_n_keys() {
    let (four, five) = (fleet(4), fleet(5));
    let moved = (0..2000)
        .filter(|k| {
            let req = keyed(&format!("session-{k}"));
            check(&four, &req, true, 0).worker != check(&five, &req, true, 0).worker
        })
        .count();
    assert!((250..550).contains(&moved), "{moved} of 2000");
}

#[test]
fn an_unhealthy_owner_is_skipped() {
    let workers = fleet(3);
    let req = keyed("k");
    let owner = check(&workers, &req, true, 0).worker.unwrap();
    let degraded: Vec<_> = workers
        .iter()
        .map(|v| {
            if v.id == owner {
                v.clone().down()
            } else {
                v.clone()
            }
        })
        .collect();
    let d = check(&degraded, &req, true, 0);
    assert!(d.worker.is_some() && d.worker != Some(owner));
    let all_down: Vec<_> = workers.iter().map(|v| v.clone().down()).collect();
    assert_eq!(check(&all_down, &req, true, 0).path, DecisionPath::NoWorker);
}

#[test]
fn s61_an_overlong_or_empty_key_is_ignored() {
    let long = "k".repeat(129);
    assert_eq!(valid_routing_key(Some(&long)), None);
    assert_eq!(valid_routing_key(Some("")), None);
    assert_eq!(valid_routing_key(Some(&long[..128])), Some(&long[..128]));
    let workers = fleet(4);
    assert_eq!(
        check(&workers, &keyed(&long), true, 0).path,
        DecisionPath::Fallback
    );
    let picks: Vec<_> = (0..40)
        .map(|s| {
            check(&workers, &RequestFacts::default(), true, s)
                .worker
                .unwrap()
        })
        .collect();
    assert!(counts(&picks).len() > 1, "no key: a random worker");
}
