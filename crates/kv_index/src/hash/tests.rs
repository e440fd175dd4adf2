use super::*;
use crate::{decode, encode};

const S: u64 = 1000; // one second, with `now` in milliseconds

fn index(boundaries: &[usize], ttl: u64) -> HashIndex<u64> {
    HashIndex::new(HashConfig::new(boundaries.to_vec(), ttl))
}

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ salt)
        .collect()
}

/// (probe tokens, expected deepest boundary, expected holders).
fn check(idx: &mut HashIndex<u64>, now: u64, cases: &[(&[u32], Option<usize>, &[u64])]) {
    for (i, (toks, boundary, holders)) in cases.iter().enumerate() {
        let p = idx.probe(toks, 0, now);
        assert_eq!(
            (p.boundary, p.holders.as_slice()),
            (*boundary, *holders),
            "case {i}"
        );
    }
}

#[test]
fn boundaries_are_cleaned() {
    let idx = index(&[64, 16, 16, 0], 180 * S);
    assert_eq!(idx.config().boundaries, vec![16, 64]);
}

/// Scenario 46: a recorded holder hits; a miss records at (16, hash); a short request
/// has no applicable boundary and records nothing.
#[test]
fn scenario_46_hit_miss_short() {
    let mut idx = index(&[16], 180 * S);
    let req = tokens(20, 1);
    let (p, _) = idx.probe_and_record(&req, 0, 0, |p| {
        assert_eq!((p.applicable, p.boundary), (1, None), "a miss");
        Some(1)
    });
    assert!(p.holders.is_empty());
    check(
        &mut idx,
        S,
        &[(&req, Some(16), &[1]), (&req[..16], Some(16), &[1])],
    );
    let short = tokens(8, 1);
    let (p, _) = idx.probe_and_record(&short, 0, S, |_| Some(2));
    assert_eq!(p.applicable, 0);
    assert_eq!(idx.key_count(), 1);
    assert_eq!(idx.record(&[], 0, 2, S), 0, "untokenized: nothing recorded");
}

/// Scenario 47: the deepest boundary with a holder wins.
#[test]
fn scenario_47_deepest_first() {
    let mut idx = index(&[16, 32], 180 * S);
    let req = tokens(40, 2);
    idx.record(&req[..20], 0, 2, 0);
    idx.record(&req[..32], 0, 1, S);
    check(
        &mut idx,
        2 * S,
        &[(&req, Some(32), &[1]), (&req[..31], Some(16), &[2, 1])],
    );
}

/// Scenario 48: only boundaries within the request are recorded.
#[test]
fn scenario_48_applicable_only() {
    let mut idx = index(&[16, 32, 64], 180 * S);
    assert_eq!(idx.record(&tokens(40, 3), 0, 1, 0), 2);
    assert_eq!(idx.key_count(), 2);
}

/// Scenario 49: live at ttl, gone after, and pruned when read.
#[test]
fn scenario_49_ttl() {
    let mut idx = index(&[16], 180 * S);
    let req = tokens(16, 4);
    idx.record(&req, 0, 1, 10 * S);
    check(&mut idx, 189 * S, &[(&req, Some(16), &[1])]);
    check(&mut idx, 190 * S, &[(&req, Some(16), &[1])]);
    check(&mut idx, 191 * S, &[(&req, None, &[])]);
    assert_eq!((idx.key_count(), idx.holder_count()), (0, 0));

    let mut idx = index(&[16], S);
    idx.record(&req, 0, 1, 0);
    idx.record(&req, 0, 2, 300);
    check(&mut idx, 1300, &[(&req, Some(16), &[2])]);
}

/// Scenario 50: a fourth holder evicts the stalest.
#[test]
fn scenario_50_holder_cap() {
    let mut idx = index(&[16], 180 * S);
    let req = tokens(16, 5);
    for w in 1..=4 {
        idx.record(&req, 0, w, w * S);
    }
    check(&mut idx, 5 * S, &[(&req, Some(16), &[2, 3, 4])]);
    // A touch refreshes: 2 stays, 3 is now the stalest.
    idx.record(&req, 0, 2, 6 * S);
    idx.record(&req, 0, 7, 7 * S);
    check(&mut idx, 8 * S, &[(&req, Some(16), &[4, 2, 7])]);
}

/// Scenario 51: a spill target is added beside the holder.
#[test]
fn scenario_51_spill_adds_holder() {
    let mut idx = index(&[16], 180 * S);
    let req = tokens(16, 6);
    idx.record(&req, 0, 1, 0);
    let (p, chosen) = idx.probe_and_record(&req, 0, S, |_| Some(2));
    assert_eq!((p.holders, chosen), (vec![1], Some(2)));
    check(&mut idx, 2 * S, &[(&req, Some(16), &[1, 2])]);
}

/// Scenario 52: requests sharing the first 2048 tokens share the key.
#[test]
fn scenario_52_long_boundary() {
    let mut idx = index(&[2048], 180 * S);
    let long = tokens(17_000, 7);
    let mut other = long[..3000].to_vec();
    other[2500] = 1;
    idx.record(&other, 0, 9, 0);
    check(&mut idx, S, &[(&long, Some(2048), &[9])]);
}

/// Scenario 53: the sweep keeps the live key; distinct heads make distinct keys.
#[test]
fn scenario_53_sweep_and_many_keys() {
    let mut idx = index(&[16], 180 * S);
    idx.record(&tokens(16, 8), 0, 1, 0);
    idx.record(&tokens(16, 9), 0, 1, 120 * S);
    let stats = idx.sweep(200 * S);
    assert_eq!(
        stats,
        SweepStats {
            holders: 1,
            keys: 1
        }
    );
    assert_eq!(idx.key_count(), 1);

    let mut idx = index(&[16], 180 * S);
    for i in 0..400 {
        idx.record(&tokens(16, 1000 + i), 0, u64::from(i % 8), u64::from(i));
    }
    idx.sweep(500);
    assert_eq!((idx.key_count(), idx.holder_count()), (400, 400));
}

#[test]
fn namespaces_do_not_share_keys() {
    let mut idx = index(&[16], 180 * S);
    let req = tokens(16, 10);
    idx.record(&req, 0xabc, 1, 0);
    assert_eq!(idx.probe(&req, 0xabc, 1).holders, vec![1]);
    assert!(idx.probe(&req, 0, 1).holders.is_empty());
}

#[test]
fn key_bound_drops_the_stalest_key() {
    let mut idx = HashIndex::new(HashConfig {
        max_keys: Some(3),
        ..HashConfig::new(vec![16], 180 * S)
    });
    let reqs: Vec<Vec<u32>> = (0..5).map(|i| tokens(16, 100 + i)).collect();
    for (i, r) in reqs.iter().take(3).enumerate() {
        idx.record(r, 0, 1, i as u64);
    }
    idx.record(&reqs[0], 0, 2, 10); // refresh key 0: key 1 is the stalest now
    idx.record(&reqs[3], 0, 1, 11);
    assert_eq!(idx.key_count(), 3);
    assert!(idx.probe(&reqs[1], 0, 12).holders.is_empty());
    assert_eq!(idx.probe(&reqs[0], 0, 12).holders, vec![1, 2]);
    assert_eq!(idx.holder_count(), 4);

    let mut none = HashIndex::new(HashConfig {
        max_keys: Some(0),
        ..HashConfig::new(vec![16], 180 * S)
    });
    none.record(&reqs[0], 0, 1, 0);
    assert_eq!(none.key_count(), 0);
}

#[test]
fn remove_tenant_everywhere() {
    let mut idx = index(&[16, 32], 180 * S);
    let req = tokens(32, 11);
    idx.record(&req, 0, 1, 0);
    idx.record(&req[..16], 0, 2, 0);
    assert_eq!(
        idx.remove_tenant(1),
        SweepStats {
            holders: 2,
            keys: 1
        }
    );
    check(&mut idx, 1, &[(&req, Some(16), &[2])]);
}

#[test]
fn snapshot_round_trip_keeps_ages_and_order() {
    let mut idx = HashIndex::new(HashConfig {
        max_keys: Some(10),
        ..HashConfig::new(vec![16, 32], 180 * S)
    });
    let a = tokens(32, 12);
    let b = tokens(32, 13);
    idx.record(&a, 0, 1, 0);
    idx.record(&b, 0, 2, 100 * S);
    let bytes = encode(&idx.snapshot()).unwrap();
    let snap: HashSnapshot<u64> = decode(&bytes).unwrap();

    // Restarted much later: ages are kept, so `a` (age 100 s) expires 80 s after restore.
    let now = 1_000_000 * S;
    let mut back = HashIndex::restore(snap.clone(), idx.config().clone(), now).unwrap();
    assert_eq!(back.snapshot(), idx.snapshot());
    check(
        &mut back,
        now + 79 * S,
        &[(&a, Some(32), &[1]), (&b, Some(32), &[2])],
    );
    check(
        &mut back,
        now + 81 * S,
        &[(&a, None, &[]), (&b, Some(32), &[2])],
    );

    // A smaller key bound keeps the freshest keys; an unknown boundary is dropped.
    let config = HashConfig {
        max_keys: Some(1),
        ..HashConfig::new(vec![32, 48], 180 * S)
    };
    let mut back = HashIndex::restore(snap, config, now).unwrap();
    assert_eq!(back.key_count(), 1);
    check(&mut back, now, &[(&b, Some(32), &[2]), (&a, None, &[])]);

    let bad = HashSnapshot::<u64> {
        version: 0,
        records: vec![],
    };
    assert!(HashIndex::restore(bad, HashConfig::new(vec![16], 1), 0).is_err());
}

#[test]
fn a_snapshot_in_parts_restores_as_the_whole_one() {
    let mut idx = HashIndex::new(HashConfig {
        max_keys: Some(40),
        ..HashConfig::new(vec![16, 32], 180 * S)
    });
    // 30 prompts of two keys each through a 40-key bound: slots are freed and reused.
    for i in 0..30u32 {
        idx.record(&tokens(32, i), 0, u64::from(i % 3), u64::from(i) * S);
    }
    let mut records = Vec::new();
    let mut from = Some(0);
    let mut parts = 0;
    while let Some(f) = from {
        let (part, next) = idx.snapshot_part(f, 7);
        assert!(part.len() <= 7);
        records.extend(part);
        from = next;
        parts += 1;
    }
    assert!(parts >= 6, "{parts} parts");
    assert_eq!(records.len(), idx.key_count());
    let parts = HashSnapshot {
        version: SNAPSHOT_VERSION,
        records,
    };
    let now = 100 * S;
    let a = HashIndex::restore(parts, idx.config().clone(), now).unwrap();
    let b = HashIndex::restore(idx.snapshot(), idx.config().clone(), now).unwrap();
    assert_eq!(a.snapshot(), b.snapshot());
    assert_eq!(a.snapshot(), idx.snapshot());
}

#[test]
fn forget_drops_a_tenant_past_the_boundary_it_held() {
    let mut idx = index(&[16, 32, 64], 180 * S);
    let t = tokens(80, 1);
    idx.record(&t[..16], 0, 1, S);
    idx.record(&t, 0, 2, S);
    idx.record(&t, 0, 1, S);
    // Worker 1 held the 16-token head before: its record at 32 and 64 goes.
    assert_eq!(idx.forget(&t, 0, 1, 16), 2);
    check(
        &mut idx,
        S,
        &[(&t, Some(64), &[2]), (&t[..16], Some(16), &[2, 1])],
    );
    // Nothing held before: every boundary goes, and keys left empty are dropped.
    assert_eq!(idx.forget(&t, 0, 2, 0), 3);
    check(&mut idx, S, &[(&t, Some(16), &[1])]);
    assert_eq!(idx.key_count(), 1);
}
