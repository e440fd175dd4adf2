//! §6 scenarios 19, 21–34 (trees; 29 in its hash variant) and 46–54 (hash mode, routing
//! side), in threshold mode with the scenarios' library defaults. The index is not here:
//! each test builds the `PrefixMatches` the index would report. Over 600 lines because it
//! holds one test per scenario of that list, each a few lines.

use super::*;
use crate::testkit::*;
use crate::{CacheIndex, PolicyKind, PrefixMatches, RequestFacts, WorkerView};

/// Threshold mode with the reference library's defaults (threshold 0.5, abs 32, rel 1.1).
fn threshold_cfg() -> PolicyConfig {
    PolicyConfig {
        cache_mode: CacheMode::Threshold,
        cache_threshold: 0.5,
        balance_abs_threshold: 32,
        balance_rel_threshold: 1.1,
        block_size: 4,
        ..PolicyConfig::with_kind(PolicyKind::CacheAware)
    }
}

fn hash_cfg(boundaries: &[usize]) -> PolicyConfig {
    PolicyConfig {
        cache_index: CacheIndex::Hash,
        cache_boundaries: boundaries.to_vec(),
        ..threshold_cfg()
    }
}

fn hash_matches(tokens: usize, boundary: Option<usize>, holders: &[u64]) -> PrefixMatches {
    PrefixMatches {
        input_len: tokens,
        per_worker: holders
            .iter()
            .map(|&i| (id(i), boundary.unwrap_or(0)))
            .collect(),
        source: MatchSource::Hash { boundary },
        traffic: None,
        session_holder: None,
    }
}

fn token_matches(input_len: usize, per_worker: &[(u64, usize)]) -> PrefixMatches {
    PrefixMatches {
        source: MatchSource::TokenTree,
        ..text_matches(input_len, per_worker)
    }
}

/// One decision: the chosen worker, its path, and whether it is recorded.
fn check(
    cfg: &PolicyConfig,
    workers: &[WorkerView],
    req: &RequestFacts,
    matches: Option<&PrefixMatches>,
    expect: (u64, DecisionPath, bool),
) -> Decision {
    for seed in 0..4 {
        let d = pick(cfg, workers, req, matches, seed);
        assert_eq!(
            (d.worker, d.path, d.record_prefix),
            (Some(id(expect.0)), expect.1, expect.2),
            "seed {seed}: {d}"
        );
    }
    pick(cfg, workers, req, matches, 0)
}

#[test]
fn s19_a_repeated_text_stays_with_its_worker() {
    let cfg = threshold_cfg();
    let workers = [w(1), w(2).flight(1)];
    // First sight: a miss; the dark fleet's lowest in-flight wins and is recorded.
    let first = check(
        &cfg,
        &workers,
        &text("hello world"),
        Some(&text_matches(11, &[])),
        (1, DecisionPath::Miss, true),
    );
    assert_eq!(first.match_rate, Some(0.0));
    // Busy the first worker a little: the match still holds it.
    let workers = [w(1).flight(2), w(2).flight(1)];
    check(
        &cfg,
        &workers,
        &text("hello world"),
        Some(&text_matches(11, &[(1, 11)])),
        (1, DecisionPath::Hit, true),
    );
    check(
        &cfg,
        &workers,
        &text("hello"),
        Some(&text_matches(5, &[(1, 5)])),
        (1, DecisionPath::Hit, true),
    );
}

#[test]
fn s21_the_gate_needs_both_margins() {
    let workers = [w(1).flight(10), w(2)];
    let m = text_matches(10, &[(1, 10)]);
    check(
        &threshold_cfg(),
        &workers,
        &text("0123456789"),
        Some(&m),
        (1, DecisionPath::Hit, true),
    );
    let tight = PolicyConfig {
        balance_abs_threshold: 2,
        ..threshold_cfg()
    };
    let d = check(
        &tight,
        &workers,
        &text("0123456789"),
        Some(&m),
        (2, DecisionPath::Spill, true),
    );
    assert!(d.candidates[0].gated && !d.candidates[1].gated, "{d:?}");
}

#[test]
fn s22_a_hot_holder_spills_and_the_target_is_recorded() {
    let m = text_matches(10, &[(1, 10)]);
    check(
        &threshold_cfg(),
        &[w(1).flight(100), w(2)],
        &text("0123456789"),
        Some(&m),
        (2, DecisionPath::Spill, true),
    );
}

#[test]
fn s23_a_deep_queue_elsewhere_does_not_break_affinity() {
    let m = text_matches(10, &[(1, 10)]);
    check(
        &threshold_cfg(),
        &[w(1), w(2).flight(50)],
        &text("0123456789"),
        Some(&m),
        (1, DecisionPath::Hit, true),
    );
}

#[test]
fn s24_hit_among_holders() {
    let m = text_matches(10, &[(1, 10), (2, 10)]);
    let req = text("0123456789");
    check(
        &threshold_cfg(),
        &[w(1).flight(5), w(2), w(3)],
        &req,
        Some(&m),
        (2, DecisionPath::Hit, true),
    );
    let workers = [
        w(1).load(busy(10_000, 0.0, 100.0)),
        w(2).flight(5).load(busy(0, 0.0, 100.0)),
        w(3).load(busy(0, 0.0, 100.0)),
    ];
    check(
        &threshold_cfg(),
        &workers,
        &req,
        Some(&m),
        (2, DecisionPath::Hit, true),
    );
}

#[test]
fn s25_unique_hit_credits_the_prompt() {
    let workers = [w(1).load(busy(10_000, 0.0, 100.0)), w(2).flight(1)];
    // Token path: exactly the token count.
    let d = check(
        &threshold_cfg(),
        &workers,
        &tokens(8),
        Some(&token_matches(8, &[(1, 8)])),
        (1, DecisionPath::Hit, true),
    );
    assert_eq!(d.credit_tokens, 8);
    // Text path: chars / 4 rounded up (the reference credits a flat 1024).
    let d = check(
        &threshold_cfg(),
        &workers,
        &text("hello, world"),
        Some(&text_matches(12, &[(1, 12)])),
        (1, DecisionPath::Hit, true),
    );
    assert_eq!((d.credit_tokens, d.match_rate), (3, Some(1.0)));
}

#[test]
fn s26_miss_goes_by_expected_wait_and_is_recorded() {
    let workers = [
        w(1).load(busy(10_000, 0.0, 100.0)),
        w(2).flight(5).load(busy(0, 0.0, 100.0)),
    ];
    check(
        &threshold_cfg(),
        &workers,
        &text("novel"),
        Some(&text_matches(5, &[])),
        (2, DecisionPath::Miss, true),
    );
}

#[test]
fn s27_spill_by_expected_wait() {
    let workers = [
        w(1).flight(100).load(busy(20_000, 0.0, 100.0)),
        w(2).load(busy(10_000, 0.0, 100.0)),
        w(3).flight(10).load(busy(0, 0.0, 100.0)),
    ];
    let m = text_matches(10, &[(1, 10)]);
    let d = check(
        &threshold_cfg(),
        &workers,
        &text("0123456789"),
        Some(&m),
        (3, DecisionPath::Spill, true),
    );
    // The hot holder was not even scored.
    assert_eq!(d.candidates[0].score, None);
}

fn gate_at_the_mean() -> PolicyConfig {
    PolicyConfig {
        balance_abs_threshold: 0,
        balance_rel_threshold: 1.0,
        ..threshold_cfg()
    }
}

#[test]
fn s28_seed_miss_burst_is_bounded_by_the_gate() {
    let mut workers = vec![
        w(1).load(busy(0, 0.0, 10_000.0)),
        w(2).load(busy(0, 0.0, 100.0)),
    ];
    let m = text_matches(40, &[]);
    let picks = run(
        &gate_at_the_mean(),
        &mut workers,
        &text(&"x".repeat(40)),
        Some(&m),
        8,
        true,
        28,
    );
    assert_eq!(counts(&picks), [(1, 4), (2, 4)].into_iter().collect());
}

#[test]
fn s29_miss_burst_in_hash_mode() {
    let cfg = PolicyConfig {
        cache_index: CacheIndex::Hash,
        cache_boundaries: vec![4],
        ..gate_at_the_mean()
    };
    let fresh = || {
        vec![
            w(1).load(busy(0, 0.0, 10_000.0)),
            w(2).load(busy(0, 0.0, 100.0)),
        ]
    };
    let five = hash_matches(5, None, &[]);
    let picks = run(&cfg, &mut fresh(), &tokens(5), Some(&five), 8, true, 29);
    assert_eq!(counts(&picks), [(1, 4), (2, 4)].into_iter().collect());
    let untokenized = hash_matches(0, None, &[]);
    let picks = run(
        &cfg,
        &mut fresh(),
        &text("hello"),
        Some(&untokenized),
        8,
        true,
        29,
    );
    assert_eq!(counts(&picks), [(1, 4), (2, 4)].into_iter().collect());
}

#[test]
fn s30_seed_idle_residual_through_cache_aware_misses() {
    let mut workers = vec![w(1).load(idle(0.36)), w(2).load(idle(0.0))];
    let m = text_matches(5, &[]);
    let picks = run(
        &threshold_cfg(),
        &mut workers,
        &text("novel"),
        Some(&m),
        8,
        false,
        30,
    );
    assert_eq!(counts(&picks), [(1, 4), (2, 4)].into_iter().collect());
}

fn kv_cfg(spread: Option<f64>, ceiling: Option<f64>) -> PolicyConfig {
    PolicyConfig {
        balance_token_usage_threshold: spread,
        overload_token_usage_threshold: ceiling,
        ..threshold_cfg()
    }
}

#[test]
fn s31_kv_pressure_triggers() {
    let cases: &[(&[f64], &[u64], bool)] = &[
        (&[0.9, 0.9, 0.9], &[0, 0, 0], false),
        (&[0.9, 0.15, 0.15], &[0, 0, 0], true),
        (&[0.97, 0.80], &[0, 0], true),
        (&[0.5, 0.5], &[20, 0], false),
    ];
    let cfg = kv_cfg(Some(0.3), Some(0.95));
    for (usage, flights, expect) in cases {
        let workers: Vec<_> = usage
            .iter()
            .zip(*flights)
            .enumerate()
            .map(|(i, (&u, &f))| w(i as u64 + 1).flight(f).load(busy(0, u, 100.0)))
            .collect();
        let fleet = Fleet::new(&workers, &cfg);
        assert_eq!(kv_pressure(&fleet, &cfg), *expect, "{usage:?} {flights:?}");
    }
    // Off by default, whatever the usage.
    let workers = [
        w(1).load(busy(0, 0.95, 100.0)),
        w(2).load(busy(0, 0.05, 100.0)),
    ];
    let off = threshold_cfg();
    assert!(!kv_pressure(&Fleet::new(&workers, &off), &off));
    // A hit on W1 under pressure goes by load, ungated, and is still recorded.
    let workers = [
        w(1).load(busy(0, 0.9, 100.0)),
        w(2).load(busy(0, 0.1, 100.0)),
    ];
    let m = text_matches(10, &[(1, 10)]);
    check(
        &kv_cfg(Some(0.3), None),
        &workers,
        &text("0123456789"),
        Some(&m),
        (2, DecisionPath::KvPressure, true),
    );
}

#[test]
fn kv_pressure_fallback_is_ungated() {
    // W2 is hot by count but cold by KV: the KV fallback still takes it.
    let workers = [
        w(1).load(busy(0, 0.9, 100.0)),
        w(2).flight(100).load(busy(0, 0.1, 100.0)),
    ];
    let cfg = PolicyConfig {
        balance_abs_threshold: 0,
        balance_rel_threshold: 1.0,
        ..kv_cfg(Some(0.3), None)
    };
    check(
        &cfg,
        &workers,
        &text("x"),
        Some(&text_matches(1, &[])),
        (2, DecisionPath::KvPressure, true),
    );
}

#[test]
fn s32_imbalanced_fleet_keeps_the_cold_worker() {
    let cfg = PolicyConfig {
        balance_abs_threshold: 5,
        balance_rel_threshold: 2.0,
        ..threshold_cfg()
    };
    let workers = [w(1).flight(20), w(2)];
    let req = text("same text");
    check(
        &cfg,
        &workers,
        &req,
        Some(&text_matches(9, &[])),
        (2, DecisionPath::Miss, true),
    );
    for _ in 0..4 {
        check(
            &cfg,
            &workers,
            &req,
            Some(&text_matches(9, &[(2, 9)])),
            (2, DecisionPath::Hit, true),
        );
    }
}

#[test]
fn s34_paths_and_match_rates_for_metrics() {
    let cfg = threshold_cfg();
    let workers = [w(1), w(2).flight(1)];
    let full = pick(
        &cfg,
        &workers,
        &text(&"a".repeat(320)),
        Some(&text_matches(320, &[(1, 320)])),
        0,
    );
    let novel = pick(
        &cfg,
        &workers,
        &text(&"b".repeat(320)),
        Some(&text_matches(320, &[])),
        0,
    );
    let tenth = pick(
        &cfg,
        &workers,
        &text(&"c".repeat(320)),
        Some(&text_matches(320, &[(1, 32)])),
        0,
    );
    let paths: Vec<_> = [&full, &novel, &tenth].iter().map(|d| d.path).collect();
    assert_eq!(
        paths,
        [DecisionPath::Hit, DecisionPath::Miss, DecisionPath::Miss]
    );
    let rates: Vec<f64> = [&full, &novel, &tenth]
        .iter()
        .map(|d| d.match_rate.unwrap())
        .collect();
    // An exact tenth must land in the 0.1 bucket.
    assert_eq!(rates, [1.0, 0.0, 0.1]);
    let le = |b: f64| rates.iter().filter(|&&r| r <= b).count();
    assert_eq!((le(0.0), le(0.1), le(1.0)), (1, 2, 3));
}

#[test]
fn the_threshold_is_strict_and_an_empty_input_misses() {
    let cfg = threshold_cfg();
    let workers = [w(1).flight(1), w(2)];
    check(
        &cfg,
        &workers,
        &text("0123456789"),
        Some(&text_matches(10, &[(1, 5)])),
        (2, DecisionPath::Miss, true),
    );
    check(
        &cfg,
        &workers,
        &text("0123456789"),
        Some(&text_matches(10, &[(1, 6)])),
        (1, DecisionPath::Hit, true),
    );
    check(
        &cfg,
        &workers,
        &text(""),
        Some(&text_matches(0, &[(1, 0)])),
        (2, DecisionPath::Miss, true),
    );
}

#[test]
fn an_ineligible_deepest_holder_leaves_the_shallower_one() {
    let workers = [w(1).down(), w(2).flight(3), w(3)];
    let m = text_matches(10, &[(1, 10), (2, 8)]);
    check(
        &threshold_cfg(),
        &workers,
        &text("0123456789"),
        Some(&m),
        (2, DecisionPath::Hit, true),
    );
}

#[test]
fn without_matches_the_fallback_records_nothing() {
    check(
        &threshold_cfg(),
        &[w(1).flight(1), w(2)],
        &text("x"),
        None,
        (2, DecisionPath::Fallback, false),
    );
    let d = pick(&threshold_cfg(), &[w(1).down()], &text("x"), None, 0);
    assert_eq!((d.worker, d.path), (None, DecisionPath::NoWorker));
}

#[test]
fn s46_hash_hit_miss_and_short_request() {
    let cfg = hash_cfg(&[16]);
    let workers = [w(1).load(busy(10_000, 0.0, 100.0)), w(2).flight(1)];
    check(
        &cfg,
        &workers,
        &tokens(20),
        Some(&hash_matches(20, Some(16), &[1])),
        (1, DecisionPath::Hash, true),
    );
    // Miss: expected wait, and the winner is recorded.
    let fresh = [
        w(1).load(busy(10_000, 0.0, 100.0)),
        w(2).load(busy(0, 0.0, 100.0)),
    ];
    check(
        &cfg,
        &fresh,
        &tokens(20),
        Some(&hash_matches(20, None, &[])),
        (2, DecisionPath::Miss, true),
    );
    // Shorter than every boundary: expected wait, nothing recorded.
    check(
        &cfg,
        &fresh,
        &tokens(8),
        Some(&hash_matches(8, None, &[])),
        (2, DecisionPath::Miss, false),
    );
}

#[test]
fn s47_the_deepest_boundary_wins() {
    // The index reports the holders of the deepest boundary that has any: W1 at 32.
    let cfg = hash_cfg(&[16, 32]);
    check(
        &cfg,
        &[w(1).flight(1), w(2)],
        &tokens(40),
        Some(&hash_matches(40, Some(32), &[1])),
        (1, DecisionPath::Hash, true),
    );
}

#[test]
fn s49_an_expired_holder_is_a_miss() {
    // After the TTL the index reports no live holder; W1 (the former holder) has 3 in flight.
    let cfg = hash_cfg(&[16]);
    check(
        &cfg,
        &[w(1).flight(3), w(2)],
        &tokens(20),
        Some(&hash_matches(20, None, &[])),
        (2, DecisionPath::Miss, true),
    );
}

#[test]
fn s51_hash_spill_and_kv_spread() {
    let cfg = hash_cfg(&[16]);
    let m = hash_matches(20, Some(16), &[1]);
    check(
        &cfg,
        &[w(1).flight(100), w(2)],
        &tokens(20),
        Some(&m),
        (2, DecisionPath::Spill, true),
    );
    let kv = PolicyConfig {
        balance_token_usage_threshold: Some(0.3),
        ..cfg
    };
    let workers = [
        w(1).load(busy(0, 0.9, 100.0)),
        w(2).load(busy(0, 0.1, 100.0)),
    ];
    check(
        &kv,
        &workers,
        &tokens(20),
        Some(&m),
        (2, DecisionPath::KvPressure, true),
    );
}

#[test]
fn s52_long_requests_sharing_a_boundary_head_share_a_worker() {
    let cfg = hash_cfg(&[2048]);
    let workers = [w(1).flight(1), w(2)];
    check(
        &cfg,
        &workers,
        &tokens(3000),
        Some(&hash_matches(3000, None, &[])),
        (2, DecisionPath::Miss, true),
    );
    let workers = [w(1).flight(1), w(2).flight(1)];
    check(
        &cfg,
        &workers,
        &tokens(17_000),
        Some(&hash_matches(17_000, Some(2048), &[2])),
        (2, DecisionPath::Hash, true),
    );
}

#[test]
fn s54_untokenized_text_in_hash_mode_records_nothing() {
    let cfg = hash_cfg(&[16]);
    check(
        &cfg,
        &[w(1).flight(1), w(2)],
        &text(&"t".repeat(100)),
        Some(&hash_matches(0, None, &[])),
        (2, DecisionPath::Miss, false),
    );
}
