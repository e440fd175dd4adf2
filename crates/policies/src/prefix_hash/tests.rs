//! §6 scenario 60: prefix_hash.

use super::*;
use crate::testkit::*;
use crate::{PolicyKind, SelectInput, WorkerId};

fn cfg(abs: u64) -> PolicyConfig {
    PolicyConfig {
        prefix_hash_balance_abs_threshold: abs,
        ..PolicyConfig::with_kind(PolicyKind::PrefixHash)
    }
}

/// Whether a worker with `probe` in flight is acceptable among four workers carrying
/// `load` in total (the others share the rest).
fn acceptable(abs: u64, load: u64, probe: u64) -> bool {
    let rest = load - probe;
    let workers = [
        w(1).flight(probe),
        w(2).flight(rest / 3),
        w(3).flight(rest / 3),
        w(4).flight(rest - 2 * (rest / 3)),
    ];
    // Force worker 1 to be the ring target by making it the only worker on the ring.
    let ring = HashRing::new([(WorkerId(1), "http://w1:8000")]);
    let req = tokens(10);
    let input = SelectInput {
        ring: Some(&ring),
        ..SelectInput::new(&workers, &req)
    };
    let d = select(&cfg(abs), &input, &mut rng(0));
    d.worker == Some(id(1)) && d.path == DecisionPath::Hash
}

#[test]
fn s60_overload_test() {
    let cases = [
        (0, 100, 30, true),
        (0, 100, 35, false),
        (10, 40, 13, true),
        (10, 40, 21, false),
        (10, 800, 240, true),
        (10, 800, 260, false),
    ];
    for (abs, load, probe, expect) in cases {
        assert_eq!(
            acceptable(abs, load, probe),
            expect,
            "abs {abs} load {load} probe {probe}"
        );
    }
}

#[test]
fn s60_an_overloaded_deep_target_retries_the_shallower_boundary() {
    let c = PolicyConfig {
        cache_boundaries: vec![8, 16],
        ..cfg(0)
    };
    let req = tokens(20);
    let heads = head_positions(&c, &req);
    assert_eq!(heads.len(), 2);
    let workers = fleet(6);
    let ring = HashRing::from_views(&workers);
    let owner = |pos| ring.owner(pos, |_| true).unwrap();
    // Find a request whose two heads land on different workers.
    let (req, deep, shallow) = (0u32..500)
        .find_map(|s| {
            let req = RequestFacts {
                key: crate::RoutingText::Tokens((s..s + 20).collect()),
                ..RequestFacts::default()
            };
            let h = head_positions(&c, &req);
            let (d, sh) = (owner(h[0]), owner(h[1]));
            (d != sh).then_some((req, d, sh))
        })
        .unwrap();
    let loaded: Vec<_> = workers
        .iter()
        .map(|v| {
            if v.id == deep {
                v.clone().flight(50)
            } else {
                v.clone()
            }
        })
        .collect();
    let input = SelectInput {
        ring: Some(&ring),
        ..SelectInput::new(&loaded, &req)
    };
    let d = select(&c, &input, &mut rng(0));
    assert_eq!((d.worker, d.path), (Some(shallow), DecisionPath::Hash));
    // Unloaded, the deep target wins.
    let input = SelectInput {
        ring: Some(&ring),
        ..SelectInput::new(&workers, &req)
    };
    assert_eq!(select(&c, &input, &mut rng(0)).worker, Some(deep));
}

#[test]
fn heads() {
    let c = PolicyConfig {
        cache_boundaries: vec![4, 8],
        prefix_token_count: 6,
        ..cfg(10)
    };
    // Shorter than the first boundary: the fixed head of min(len, 6) tokens.
    assert_eq!(head_positions(&c, &tokens(3)).len(), 1);
    assert_eq!(head_positions(&c, &tokens(5)).len(), 1);
    assert_eq!(head_positions(&c, &tokens(9)).len(), 2);
    // The same first 8 tokens give the same deepest head.
    let mut long = tokens(100);
    let short = tokens(9);
    assert_eq!(head_positions(&c, &long)[0], head_positions(&c, &short)[0]);
    if let crate::RoutingText::Tokens(t) = &mut long.key {
        t[7] = 999;
    }
    assert_ne!(head_positions(&c, &long)[0], head_positions(&c, &short)[0]);
    assert_eq!(head_positions(&c, &long)[1], head_positions(&c, &short)[1]);
    // Text: the first 6 × 4 chars.
    let a = text(&format!("{}{}", "é".repeat(24), "tail one"));
    let b = text(&format!("{}{}", "é".repeat(24), "tail two"));
    assert_eq!(head_positions(&c, &a), head_positions(&c, &b));
    // A byte budget inside a character is cut back to its start: 21 bytes → 10 × "é" (20).
    let odd = PolicyConfig {
        bytes_per_token: 3.5,
        ..c.clone()
    };
    let a = text(&format!("{}x", "é".repeat(11)));
    let b = text(&format!("{}y", "é".repeat(11)));
    assert_eq!(head_positions(&odd, &a), head_positions(&odd, &b));
    assert_ne!(head_positions(&c, &a), head_positions(&c, &b));
    assert!(head_positions(&c, &RequestFacts::default()).is_empty());
    assert!(head_positions(&c, &text("")).is_empty());
}

#[test]
fn without_a_ring_or_head_the_least_loaded_wins() {
    let workers = [w(1).flight(3), w(2).flight(1), w(3).flight(2)];
    let d = pick(&cfg(10), &workers, &tokens(10), None, 0);
    assert_eq!((d.worker, d.path), (Some(id(2)), DecisionPath::Fallback));
    let ring = HashRing::from_views(&workers);
    let empty = RequestFacts::default();
    let input = SelectInput {
        ring: Some(&ring),
        ..SelectInput::new(&workers, &empty)
    };
    assert_eq!(select(&cfg(10), &input, &mut rng(0)).worker, Some(id(2)));
}
