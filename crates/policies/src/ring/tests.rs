use super::*;

fn ring(n: u64) -> HashRing {
    let urls: Vec<String> = (1..=n).map(|i| format!("http://w{i}:8000")).collect();
    HashRing::new((1..=n).zip(&urls).map(|(i, u)| (WorkerId(i), u.as_str())))
}

/// Owner of each of `keys` keys when every worker is acceptable.
fn owners(r: &HashRing, keys: u64) -> Vec<WorkerId> {
    (0..keys)
        .map(|k| {
            r.owner(HashRing::position(format!("key-{k}").as_bytes()), |_| true)
                .unwrap()
        })
        .collect()
}

#[test]
fn shape() {
    let r = ring(4);
    assert_eq!((r.len(), r.points.len()), (4, 4 * HashRing::VNODES));
    assert!(r.points.windows(2).all(|p| p[0] <= p[1]));
    assert!(HashRing::default().is_empty());
    assert_eq!(HashRing::default().owner(7, |_| true), None);
}

#[test]
fn adding_a_worker_moves_about_one_in_n_keys() {
    let before = owners(&ring(4), 10_000);
    let after = owners(&ring(5), 10_000);
    let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    // Expected 1/5 = 2000; every moved key went to the new worker.
    assert!((1500..2500).contains(&moved), "{moved}");
    assert!(
        before
            .iter()
            .zip(&after)
            .all(|(a, b)| a == b || *b == WorkerId(5))
    );
}

#[test]
fn the_walk_skips_unacceptable_workers() {
    let r = ring(3);
    for k in 0..100u64 {
        let pos = HashRing::position(&k.to_le_bytes());
        let first = r.owner(pos, |_| true).unwrap();
        let next = r.owner(pos, |id| id != first).unwrap();
        assert_ne!(first, next);
    }
    assert_eq!(r.owner(0, |_| false), None);
}

#[test]
fn keys_spread_over_workers() {
    let o = owners(&ring(4), 4000);
    for i in 1..=4 {
        let n = o.iter().filter(|w| **w == WorkerId(i)).count();
        assert!((600..1400).contains(&n), "worker {i}: {n}");
    }
}
