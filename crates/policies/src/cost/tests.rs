//! The threshold-free cost mode, one scenario per test. Over 600 lines because each
//! scenario builds its fleet and matches in a few lines, and they read best side by side.

use crate::testkit::*;
use crate::{
    CacheMode, CostRule, DecisionNote, DecisionPath, MatchSource, Own, PolicyConfig, PolicyKind,
    PrefixMatches, PrefixTraffic, RankLoad, RateSource, RequestFacts, SelectInput, WorkerLoad,
    WorkerView,
};
use std::time::Duration;

fn cost_cfg() -> PolicyConfig {
    PolicyConfig {
        cache_mode: CacheMode::Cost,
        ..PolicyConfig::with_kind(PolicyKind::CacheAware)
    }
}

/// One busy rank prefilling at `rate` tok/s, with `queued` uncached tokens in `waiting`
/// requests, KV usage 0 and cache hit rate `hit`.
fn prefilling(rate: u64, queued: u64, waiting: u64, hit: f64) -> WorkerLoad {
    report(vec![RankLoad {
        num_running_reqs: 1,
        num_waiting_reqs: waiting,
        num_waiting_uncached_tokens: queued,
        gen_throughput: 1000.0,
        cache_hit_rate: hit,
        total_prefill_uncached_tokens: rate * 10,
        total_prefill_busy_us: 10_000_000,
        ..RankLoad::default()
    }])
}

fn token_matches(input_len: usize, per_worker: &[(u64, usize)]) -> PrefixMatches {
    PrefixMatches {
        source: MatchSource::TokenTree,
        ..text_matches(input_len, per_worker)
    }
}

/// The decision for a token request of `len` tokens with `held` per worker: the chosen
/// worker and path, over several seeds.
fn check(
    cfg: &PolicyConfig,
    workers: &[WorkerView],
    req: &RequestFacts,
    m: Option<&PrefixMatches>,
    expect: (u64, DecisionPath),
) -> crate::Decision {
    for seed in 0..4 {
        let d = pick(cfg, workers, req, m, seed);
        assert_eq!(
            (d.worker, d.path),
            (Some(id(expect.0)), expect.1),
            "seed {seed}: {d:?}"
        );
    }
    pick(cfg, workers, req, m, 0)
}

fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn an_idle_holder_wins_and_is_credited_the_uncached_part() {
    let workers = [
        w(1).load(prefilling(10_000, 0, 0, 0.0)),
        w(2).load(prefilling(10_000, 0, 0, 0.0)),
    ];
    let m = token_matches(2000, &[(1, 1600)]);
    let d = check(
        &cost_cfg(),
        &workers,
        &tokens(2000),
        Some(&m),
        (1, DecisionPath::Hit),
    );
    assert_eq!(
        (d.credit_tokens, d.record_prefix, d.match_rate),
        (400, true, Some(0.8))
    );
    // cost = wait 0 + 1 · 400 / 10k for the holder, 2000 / 10k for the other.
    let c = &d.candidates;
    assert!(
        approx(c[0].score.unwrap(), 0.04) && approx(c[1].score.unwrap(), 0.2),
        "{c:?}"
    );
    assert_eq!(c[0].prefill, c[0].score);
}

#[test]
fn a_backlog_outweighs_affinity_only_past_the_prefill_it_saves() {
    // Holder: one waiting request, so its own prefill counts twice: 0.08 s + Q / 10k.
    // Idle non-holder: 2000 / 10k = 0.2 s. No affinity margin: the plain lowest cost.
    let cfg = PolicyConfig {
        affinity_margin: 0.0,
        ..cost_cfg()
    };
    let m = token_matches(2000, &[(1, 1600)]);
    let with_queue = |q| {
        [
            w(1).load(prefilling(10_000, q, 1, 0.0)),
            w(2).load(prefilling(10_000, 0, 0, 0.0)),
        ]
    };
    check(
        &cfg,
        &with_queue(1000),
        &tokens(2000),
        Some(&m),
        (1, DecisionPath::Hit),
    );
    let d = check(
        &cfg,
        &with_queue(1500),
        &tokens(2000),
        Some(&m),
        (2, DecisionPath::Spill),
    );
    assert_eq!(d.credit_tokens, 2000);
}

#[test]
fn the_affinity_margin_keeps_near_ties_with_the_holder() {
    // Same fleet: the holder costs 0.08 + Q/10k against the idle worker's 0.2 s. With a
    // margin of 0.25 the holder keeps it up to 0.25 s, and loses it beyond.
    let cfg = PolicyConfig {
        affinity_margin: 0.25,
        ..cost_cfg()
    };
    let m = token_matches(2000, &[(1, 1600)]);
    let with_queue = |q| {
        [
            w(1).load(prefilling(10_000, q, 1, 0.0)),
            w(2).load(prefilling(10_000, 0, 0, 0.0)),
        ]
    };
    check(
        &cfg,
        &with_queue(1500),
        &tokens(2000),
        Some(&m),
        (1, DecisionPath::Hit),
    );
    check(
        &cfg,
        &with_queue(1800),
        &tokens(2000),
        Some(&m),
        (2, DecisionPath::Spill),
    );
    // The default margin (0.5) keeps it at 1800 too.
    check(
        &cost_cfg(),
        &with_queue(1800),
        &tokens(2000),
        Some(&m),
        (1, DecisionPath::Hit),
    );
}

#[test]
fn no_cliff_a_partial_match_on_an_idle_worker_beats_a_deep_one_on_a_busy_worker() {
    // W1 holds 90% but has 6000 tokens queued; W2 holds 40% and is idle.
    let workers = [
        w(1).load(prefilling(10_000, 6000, 2, 0.0)),
        w(2).load(prefilling(10_000, 0, 0, 0.0)),
    ];
    let m = token_matches(4000, &[(1, 3600), (2, 1600)]);
    check(
        &cost_cfg(),
        &workers,
        &tokens(4000),
        Some(&m),
        (2, DecisionPath::Hit),
    );
    // The threshold mode sees a hit on W1 (90% > 0.3) and keeps it there.
    let threshold = PolicyConfig {
        cache_mode: CacheMode::Threshold,
        ..cost_cfg()
    };
    check(
        &threshold,
        &workers,
        &tokens(4000),
        Some(&m),
        (1, DecisionPath::Hit),
    );
}

#[test]
fn a_template_every_worker_holds_leaves_the_choice_to_load() {
    let workers = [
        w(1).load(prefilling(10_000, 3000, 1, 0.0)),
        w(2).load(prefilling(10_000, 0, 0, 0.0)),
        w(3).load(prefilling(10_000, 1000, 1, 0.0)),
    ];
    let m = token_matches(2000, &[(1, 200), (2, 200), (3, 200)]);
    check(
        &cost_cfg(),
        &workers,
        &tokens(2000),
        Some(&m),
        (2, DecisionPath::Hit),
    );
}

#[test]
fn measured_prefill_rates_price_a_slow_holder() {
    // Slow holder: 2000 tok/s for the 2000 tokens it lacks = 1 s. Fast non-holder:
    // 4000 tokens at 20k tok/s = 0.2 s.
    let workers = [
        w(1).load(prefilling(2000, 0, 0, 0.0)),
        w(2).load(prefilling(20_000, 0, 0, 0.0)),
    ];
    let m = token_matches(4000, &[(1, 2000)]);
    check(
        &cost_cfg(),
        &workers,
        &tokens(4000),
        Some(&m),
        (2, DecisionPath::Spill),
    );
}

#[test]
fn the_multiplier_counts_queued_dispatched_and_reuse() {
    let workers = [
        w(1).load(prefilling(10_000, 0, 2, 0.5)).credit(0, 3),
        // No report: priced at the candidates' mean prefill rate, m = 1 + dispatched.
        w(2).flight(4).credit(4096, 4),
    ];
    let m = token_matches(1000, &[]);
    let d = pick(&cost_cfg(), &workers, &tokens(1000), Some(&m), 0);
    let c = &d.candidates;
    // W1: 2 waiting requests of unknown size wait 2 · 1024 / 10k; m = 1 + 2 + 3 + 0.5 = 6.5
    // on 1000 / 10k.
    assert!(approx(c[0].prefill.unwrap(), 0.65), "{c:?}");
    assert!(approx(c[0].score.unwrap(), 0.2048 + 0.65), "{c:?}");
    // W2: wait = B (W1's) + 4096 / 10k; m = 1 + 4.
    assert!(approx(c[1].prefill.unwrap(), 0.5), "{c:?}");
    assert!(approx(c[1].score.unwrap(), 0.2048 + 0.4096 + 0.5), "{c:?}");
    assert_eq!(d.path, DecisionPath::Miss);
}

#[test]
fn a_dark_fleet_uses_the_default_prefill_rate() {
    let cfg = PolicyConfig {
        default_prefill_throughput: 1000.0,
        ..cost_cfg()
    };
    let m = token_matches(1000, &[(1, 500)]);
    let d = check(
        &cfg,
        &[w(1).flight(1).credit(1024, 1), w(2)],
        &tokens(1000),
        Some(&m),
        (2, DecisionPath::Spill),
    );
    // W1: 1024 / 1000 + 2 · 500 / 1000; W2: 1000 / 1000.
    assert!(approx(d.candidates[0].score.unwrap(), 1.024 + 1.0), "{d:?}");
    assert!(approx(d.candidates[1].score.unwrap(), 1.0), "{d:?}");
}

#[test]
fn without_reports_requests_past_their_first_token_do_not_price_a_holder_out() {
    // A gateway started just before the traffic: no report yet. The holder's four
    // conversations are decoding (in flight, their credit given back at the first
    // token); the idle worker holds nothing. 300-token prompt, 240 of them held.
    let m = token_matches(300, &[(1, 240)]);
    let fleet = [w(1).flight(4), w(2)];
    let d = check(
        &cost_cfg(),
        &fleet,
        &tokens(300),
        Some(&m),
        (1, DecisionPath::Hit),
    );
    let (holder, idle) = (
        d.candidates[0].score.unwrap(),
        d.candidates[1].score.unwrap(),
    );
    // 60 and 300 uncached tokens at the default 10 000 tok/s, nothing outstanding.
    assert!(approx(holder, 0.006) && approx(idle, 0.03), "{d:?}");
    // Prefill still outstanding on the holder does count: 4 prompts of 3000 tokens.
    let backlog = [w(1).flight(4).credit(12_000, 4), w(2)];
    check(
        &cost_cfg(),
        &backlog,
        &tokens(300),
        Some(&m),
        (2, DecisionPath::Spill),
    );
}

#[test]
fn text_units_are_converted_to_tokens() {
    let workers = [
        w(1).load(prefilling(10_000, 0, 0, 0.0)),
        w(2).load(prefilling(10_000, 0, 0, 0.0)),
    ];
    let req = text(&"a".repeat(4000));
    let d = check(
        &cost_cfg(),
        &workers,
        &req,
        Some(&text_matches(4000, &[(2, 3000)])),
        (2, DecisionPath::Hit),
    );
    // 1000 chars left = 250 tokens.
    assert_eq!(d.credit_tokens, 250);
    assert!(approx(d.candidates[1].score.unwrap(), 0.025));
}

#[test]
fn a_text_prompt_on_the_hash_index_is_priced_in_tokens_and_says_it_was_not_hashed() {
    // The hash index holds nothing for text and reports its length in bytes, as the text
    // tree does: 4000 bytes are 1000 tokens, not 4000.
    let workers = [
        w(1).load(prefilling(10_000, 0, 0, 0.0)),
        w(2).load(prefilling(10_000, 0, 0, 0.0)),
    ];
    let req = text(&"a".repeat(4000));
    let m = PrefixMatches {
        source: MatchSource::Hash { boundary: None },
        ..text_matches(4000, &[])
    };
    let cfg = PolicyConfig {
        cache_index: crate::CacheIndex::Hash,
        ..cost_cfg()
    };
    let d = pick(&cfg, &workers, &req, Some(&m), 0);
    assert_eq!(d.credit_tokens, 1000, "{d:?}");
    let chosen = d.chosen().and_then(|c| c.prefill).unwrap_or_default();
    assert!(approx(chosen, 0.1), "1000 tokens at 10k tok/s: {d:?}");
    // A new prefix also says where the rendezvous ranking put it.
    assert!(
        d.notes.contains(&crate::DecisionNote::TextNotHashed),
        "{d:?}"
    );
    assert!(d.to_string().contains("note=text_not_hashed"), "{d}");
    // A token prompt on the same index carries no such note.
    let d = pick(
        &cfg,
        &workers,
        &tokens(4000),
        Some(&PrefixMatches {
            source: MatchSource::Hash { boundary: None },
            ..token_matches(4000, &[])
        }),
        0,
    );
    assert!(
        !d.notes.contains(&crate::DecisionNote::TextNotHashed),
        "{d:?}"
    );
}

#[test]
fn seed_scenarios_hold_in_cost_mode() {
    let none = RequestFacts::default();
    let novel = token_matches(0, &[]);
    let mut idle_pair = vec![w(1).load(idle(0.36)), w(2).load(idle(0.0))];
    let picks = run(
        &cost_cfg(),
        &mut idle_pair,
        &none,
        Some(&novel),
        8,
        false,
        12,
    );
    assert_eq!(counts(&picks), [(1, 4), (2, 4)].into_iter().collect());
    let mut beside_busy = vec![w(1).load(busy(0, 0.1, 8000.0)), w(2).load(idle(0.36))];
    let picks = run(
        &cost_cfg(),
        &mut beside_busy,
        &none,
        Some(&novel),
        8,
        false,
        13,
    );
    assert_eq!(counts(&picks), [(1, 4), (2, 4)].into_iter().collect());
    let gate_at_mean = PolicyConfig {
        balance_abs_threshold: 0,
        balance_rel_threshold: 1.0,
        ..cost_cfg()
    };
    let mut skewed = vec![
        w(1).load(busy(0, 0.0, 10_000.0)),
        w(2).load(busy(0, 0.0, 100.0)),
    ];
    let m = text_matches(40, &[]);
    let picks = run(
        &gate_at_mean,
        &mut skewed,
        &text(&"x".repeat(40)),
        Some(&m),
        8,
        true,
        28,
    );
    assert_eq!(counts(&picks), [(1, 4), (2, 4)].into_iter().collect());
}

#[test]
fn paths_and_recording() {
    // A 16-token boundary is below the default --min-match-tokens (64): lowered here so
    // that holding it counts, and checked at the default below.
    let cfg = PolicyConfig {
        cache_boundaries: vec![16],
        min_match_tokens: 8,
        ..cost_cfg()
    };
    let workers = [w(1), w(2).flight(1).credit(20, 1)];
    check(
        &cfg,
        &workers,
        &tokens(20),
        None,
        (1, DecisionPath::Fallback),
    );
    assert!(!pick(&cfg, &workers, &tokens(20), None, 0).record_prefix);
    let hash = |boundary: Option<usize>, holders: &[u64]| PrefixMatches {
        input_len: 20,
        per_worker: holders
            .iter()
            .map(|&i| (id(i), boundary.unwrap_or(0)))
            .collect(),
        source: MatchSource::Hash { boundary },
        traffic: None,
        session_holder: None,
    };
    let holder_idle = [w(1).flight(1), w(2)];
    let d = check(
        &cfg,
        &holder_idle,
        &tokens(20),
        Some(&hash(Some(16), &[2])),
        (2, DecisionPath::Hash),
    );
    assert!(d.record_prefix);
    // At the default floor the 16-token holding is priced as none, and labelled so.
    let floor = PolicyConfig {
        min_match_tokens: 64,
        ..cfg.clone()
    };
    let d = pick(
        &floor,
        &holder_idle,
        &tokens(20),
        Some(&hash(Some(16), &[2])),
        0,
    );
    assert_eq!((d.path, d.new_prefix), (DecisionPath::Miss, true), "{d:?}");
    // 8 tokens reach no boundary: nothing to record.
    let short = pick(&cfg, &workers, &tokens(8), Some(&hash(None, &[])), 0);
    assert_eq!(
        (short.path, short.record_prefix),
        (DecisionPath::Miss, false)
    );
}

#[test]
fn the_affinity_margin_never_passes_over_an_idle_worker() {
    // The cheapest worker is idle (nothing running, waiting or in flight): it wins on cost
    // even though a busy holder is within the margin.
    let m = token_matches(2000, &[(1, 1600)]);
    let idle = report(vec![RankLoad {
        total_prefill_uncached_tokens: 100_000,
        total_prefill_busy_us: 10_000_000,
        ..RankLoad::default()
    }]);
    let workers = [w(1).load(prefilling(10_000, 1500, 1, 0.0)), w(2).load(idle)];
    check(
        &cost_cfg(),
        &workers,
        &tokens(2000),
        Some(&m),
        (2, DecisionPath::Spill),
    );
}

/// `m` with the index reporting `through` recent requests (of `total`) that began with
/// the first `len` units.
fn with_traffic(m: PrefixMatches, len: usize, through: f64, total: f64) -> PrefixMatches {
    PrefixMatches {
        traffic: Some(PrefixTraffic {
            total,
            by_prefix: vec![(len, through)],
        }),
        ..m
    }
}

#[test]
fn a_private_prefix_stays_with_its_holder_even_against_an_idle_worker() {
    // The fleet of the test above: a busy holder within the margin, an idle non-holder.
    let idle = report(vec![RankLoad {
        total_prefill_uncached_tokens: 100_000,
        total_prefill_busy_us: 10_000_000,
        ..RankLoad::default()
    }]);
    let fleet = |q| {
        [
            w(1).load(prefilling(10_000, q, 1, 0.0)),
            w(2).load(idle.clone()),
        ]
    };
    let m = token_matches(2000, &[(1, 1600)]);
    // 10 of the last 100 requests shared the held prefix: 10 / (100 + 2 · 2) of the
    // traffic on 2 workers is 0.19 of one worker's share, so the prefix belongs on one.
    let private = with_traffic(m.clone(), 1600, 10.0, 100.0);
    let d = check(
        &cost_cfg(),
        &fleet(1500),
        &tokens(2000),
        Some(&private),
        (1, DecisionPath::Hit),
    );
    assert_eq!(
        (d.rule, d.new_prefix),
        (Some(CostRule::PrivatePrefix), false)
    );
    let worth = d
        .chosen()
        .and_then(|c| c.prefix_traffic)
        .unwrap_or(f64::NAN);
    assert!(approx(worth, 10.0 / 104.0 * 2.0), "{worth}");
    // 90 of 100: the prefix carries more than one worker's share, so it may spread, and
    // the idle worker takes it.
    let popular = with_traffic(m.clone(), 1600, 90.0, 100.0);
    let d = check(
        &cost_cfg(),
        &fleet(1500),
        &tokens(2000),
        Some(&popular),
        (2, DecisionPath::Spill),
    );
    assert_eq!((d.rule, d.new_prefix), (Some(CostRule::Cheapest), true));
    // Beyond the margin even a private prefix moves.
    check(
        &cost_cfg(),
        &fleet(20_000),
        &tokens(2000),
        Some(&private),
        (2, DecisionPath::Spill),
    );
    // Unless the report is old enough for that queue to have been prefilled: 1.9 s at
    // 10 000 tok/s leaves 1 000 of the 20 000 tokens, within the margin again.
    let workers = fleet(20_000);
    let req = tokens(2000);
    let input = SelectInput {
        matches: Some(&private),
        now: Duration::from_millis(1900),
        ..SelectInput::new(&workers, &req)
    };
    let d = crate::select(&cost_cfg(), &input, &mut rng(0));
    assert_eq!(
        (d.worker, d.path),
        (Some(id(1)), DecisionPath::Hit),
        "{d:?}"
    );
    // Or when the engine's two requests were both this gateway's, booked at 1 000
    // unprefilled tokens (followers it knows are hits): priced at those.
    let own = |requests_at_sample| {
        let mut ws = fleet(20_000);
        ws[0].own = Some(Own {
            unprefilled_tokens: 1000,
            requests_at_sample,
        });
        ws
    };
    check(
        &cost_cfg(),
        &own(2),
        &tokens(2000),
        Some(&private),
        (1, DecisionPath::Hit),
    );
    // One of them another gateway's: the report stands.
    check(
        &cost_cfg(),
        &own(1),
        &tokens(2000),
        Some(&private),
        (2, DecisionPath::Spill),
    );
}

#[test]
fn a_new_prefix_starts_where_the_oldest_start_was() {
    // Costs for a 2000-token miss at 10k tok/s: idle 0.2 s; 500 queued tokens and one
    // waiting request, 0.05 + 2 · 0.2 = 0.45 s (within 1 + 3 · 0.5 = 2.5 times the
    // cheapest, 0.5 s); 4000 queued, 0.4 + 2 · 0.2 = 0.8 s (beyond it).
    let fleet = |last: [u64; 3]| {
        [
            WorkerView {
                last_start: last[0],
                ..w(1).load(prefilling(10_000, 0, 0, 0.0))
            },
            WorkerView {
                last_start: last[1],
                ..w(2).load(prefilling(10_000, 500, 1, 0.0))
            },
            WorkerView {
                last_start: last[2],
                ..w(3).load(prefilling(10_000, 4000, 1, 0.0))
            },
        ]
    };
    let miss = with_traffic(token_matches(2000, &[]), 0, 0.0, 50.0);
    let d = check(
        &cost_cfg(),
        &fleet([9, 4, 7]),
        &tokens(2000),
        Some(&miss),
        (2, DecisionPath::Miss),
    );
    assert_eq!((d.rule, d.new_prefix), (Some(CostRule::Spread), true));
    assert_eq!(d.chosen().and_then(|c| c.last_start), Some(4));
    // Nothing started anywhere (or nobody keeps the clock): the cheapest.
    let d = check(
        &cost_cfg(),
        &fleet([0, 0, 0]),
        &tokens(2000),
        Some(&miss),
        (1, DecisionPath::Miss),
    );
    assert_eq!(d.rule, Some(CostRule::Cheapest));
    // The oldest only beyond reach: the oldest within it.
    check(
        &cost_cfg(),
        &fleet([9, 7, 4]),
        &tokens(2000),
        Some(&miss),
        (2, DecisionPath::Miss),
    );
}

#[test]
fn a_holding_under_min_match_tokens_is_no_hit() {
    // 10 shared tokens (a chat template's head) are priced as nothing, and named so.
    let workers = [
        w(1).load(prefilling(10_000, 0, 0, 0.0)),
        w(2).load(prefilling(10_000, 0, 0, 0.0)),
    ];
    let m = token_matches(2000, &[(1, 10)]);
    for seed in 0..8 {
        let d = pick(&cost_cfg(), &workers, &tokens(2000), Some(&m), seed);
        assert_eq!((d.path, d.new_prefix), (DecisionPath::Miss, true), "{d:?}");
    }
}

#[test]
fn the_prefill_rate_says_where_it_came_from() {
    let m = token_matches(1000, &[]);
    // Nobody reports counters (SGLang 0.5.23's zeros): the configured rate, and a note.
    let zeros = report(vec![RankLoad {
        num_running_reqs: 1,
        gen_throughput: 1000.0,
        ..RankLoad::default()
    }]);
    let dark = [w(1).load(zeros.clone()), w(2)];
    let d = pick(&cost_cfg(), &dark, &tokens(1000), Some(&m), 0);
    for c in &d.candidates {
        let r = c.prefill_rate.expect("priced");
        assert_eq!(
            (r.tokens_per_sec, r.source),
            (10_000.0, RateSource::Configured)
        );
    }
    assert!(
        d.notes.contains(&DecisionNote::PrefillRateConfigured),
        "{d:?}"
    );
    assert!(
        d.to_string().contains("note=prefill_rate_configured"),
        "{d}"
    );
    // One reports: its own rate, and the others are priced at it.
    let lit = [w(1).load(prefilling(20_000, 0, 0, 0.0)), w(2).load(zeros)];
    let d = pick(&cost_cfg(), &lit, &tokens(1000), Some(&m), 0);
    let sources: Vec<_> = d
        .candidates
        .iter()
        .map(|c| c.prefill_rate.map(|r| (r.tokens_per_sec, r.source)))
        .collect();
    assert_eq!(
        sources,
        vec![
            Some((20_000.0, RateSource::Reported)),
            Some((20_000.0, RateSource::FleetMean))
        ]
    );
    assert!(
        !d.notes.contains(&DecisionNote::PrefillRateConfigured),
        "{d:?}"
    );
}

/// A token prompt whose first block is `head`'s.
fn headed(head: u32, len: u32) -> RequestFacts {
    RequestFacts {
        key: crate::RoutingText::Tokens(
            (0..len)
                .map(|i| head.wrapping_mul(1_000_003).wrapping_add(i))
                .collect(),
        ),
        ..RequestFacts::default()
    }
}

fn rendezvous_rank(d: &crate::Decision) -> Option<u32> {
    d.notes.iter().find_map(|n| match n {
        DecisionNote::Rendezvous { rank } => Some(*rank),
        _ => None,
    })
}

#[test]
fn a_new_prefix_goes_to_the_same_worker_in_any_order_under_any_ids() {
    let fleet_a: Vec<WorkerView> = (1..=4).map(|i| w(i).load(idle(0.0))).collect();
    // Another replica: the same URLs registered in another order, under other ids.
    let fleet_b: Vec<WorkerView> = fleet_a
        .iter()
        .rev()
        .enumerate()
        .map(|(i, v)| WorkerView {
            id: id(50 + i as u64),
            ..v.clone()
        })
        .collect();
    let url = |ws: &[WorkerView], d: &crate::Decision| {
        let w = d.worker.expect("a worker");
        ws.iter().find(|v| v.id == w).map(|v| v.url.clone())
    };
    let miss = token_matches(600, &[]);
    let mut firsts = std::collections::BTreeMap::new();
    for head in 0..64 {
        let req = headed(head, 600);
        let d = pick(&cost_cfg(), &fleet_a, &req, Some(&miss), 0);
        assert_eq!(d.path, DecisionPath::Miss, "{d:?}");
        assert_eq!(
            rendezvous_rank(&d),
            Some(0),
            "an idle fleet: the first choice"
        );
        for seed in 1..4 {
            let again = pick(&cost_cfg(), &fleet_a, &req, Some(&miss), seed);
            assert_eq!(again.worker, d.worker, "seed {seed}");
            let other = pick(&cost_cfg(), &fleet_b, &req, Some(&miss), seed);
            assert_eq!(url(&fleet_b, &other), url(&fleet_a, &d), "head {head}");
        }
        *firsts.entry(url(&fleet_a, &d)).or_insert(0) += 1;
    }
    // Different heads spread over the fleet.
    assert_eq!(firsts.len(), 4, "{firsts:?}");
}

/// The selector's bookkeeping for one dispatch: `recent` decays and counts a new
/// prefix, `last_start` takes the fleet's next start.
fn book(workers: &mut [WorkerView], at: usize, d: &crate::Decision, starts: &mut u64) {
    let keep = 0.5f64.powf(1.0 / crate::RECENT_HALF_LIFE);
    workers.iter_mut().for_each(|v| v.recent *= keep);
    if d.new_prefix {
        *starts += 1;
        workers[at].recent += 1.0;
        workers[at].last_start = *starts;
    }
}

/// Starts `n` new prefixes with heads from `first` on, returning how many each worker got.
fn start_groups(workers: &mut [WorkerView], first: u32, n: u32, starts: &mut u64) -> [u32; 4] {
    let miss = token_matches(600, &[]);
    let mut got = [0u32; 4];
    for head in first..first + n {
        let d = pick(&cost_cfg(), workers, &headed(head, 600), Some(&miss), 0);
        let at = workers
            .iter()
            .position(|v| Some(v.id) == d.worker)
            .expect("a worker");
        assert!(d.new_prefix, "{d:?}");
        book(workers, at, &d, starts);
        got[at] += 1;
    }
    got
}

#[test]
fn one_replica_keeps_new_prefixes_balanced() {
    let mut workers: Vec<WorkerView> = (1..=4).map(|i| w(i).load(idle(0.0))).collect();
    let mut starts = 0;
    // A fresh gateway: the rendezvous ranking places the first of each worker's starts.
    let miss = token_matches(600, &[]);
    let first = pick(&cost_cfg(), &workers, &headed(0, 600), Some(&miss), 0);
    assert_eq!(rendezvous_rank(&first), Some(0), "{first:?}");
    // Every run of four starts puts one on each worker, whatever the heads.
    for round in 0..50 {
        let got = start_groups(&mut workers, round * 4, 4, &mut starts);
        assert_eq!(got, [1, 1, 1, 1], "round {round}");
    }
}

#[test]
fn new_groups_spread_evenly_whatever_came_before() {
    // What the gateway served before (13 to 17 conversations, one worker busy beyond
    // reach for a while) leaves no debt: 8 new groups land 2 on each. A count of starts
    // made up the gaps first and landed 3:2:2:1.
    for history in 0..24u32 {
        let mut workers: Vec<WorkerView> = (1..=4).map(|i| w(i).load(idle(0.0))).collect();
        let mut starts = 0;
        let busy = (history % 4) as usize;
        let head = 1000 + history * 100;
        let mut before = start_groups(&mut workers, head, 3 + history % 3, &mut starts);
        workers[busy] = workers[busy]
            .clone()
            .load(prefilling(10_000, 200_000, 40, 0.0));
        let during = start_groups(&mut workers, head + 10, 10 + history % 2, &mut starts);
        assert_eq!(during[busy], 0, "busy beyond reach");
        workers[busy] = workers[busy].clone().load(idle(0.0));
        before.iter_mut().zip(during).for_each(|(b, d)| *b += d);
        let got = start_groups(&mut workers, 7000 + history * 100, 8, &mut starts);
        assert_eq!(got, [2, 2, 2, 2], "after {before:?}");
    }
}

#[test]
fn load_still_vetoes_the_first_choice() {
    let idle_fleet: Vec<WorkerView> = (1..=3).map(|i| w(i).load(idle(0.0))).collect();
    let miss = token_matches(2000, &[]);
    let req = headed(7, 2000);
    let first = pick(&cost_cfg(), &idle_fleet, &req, Some(&miss), 0)
        .worker
        .expect("a worker");
    // The first choice with a backlog beyond the placement reach: 40 000 queued tokens,
    // 4 s against 0.2 s for a 2000-token miss elsewhere.
    let loaded: Vec<WorkerView> = idle_fleet
        .iter()
        .map(|v| {
            if v.id == first {
                v.clone().load(prefilling(10_000, 40_000, 8, 0.0))
            } else {
                v.clone().load(prefilling(10_000, 0, 0, 0.0))
            }
        })
        .collect();
    let d = pick(&cost_cfg(), &loaded, &req, Some(&miss), 0);
    assert_ne!(d.worker, Some(first), "{d:?}");
    assert!(rendezvous_rank(&d).is_some_and(|r| r > 0), "{d:?}");
    let first_rank = d
        .candidates
        .iter()
        .find(|c| c.worker == first)
        .and_then(|c| c.placement_rank);
    assert_eq!(first_rank, Some(0), "explain shows the rank it passed over");
    // So does the count gate, on the engine's own counts: another gateway's 100 requests
    // there (over 1.5 and 32 past the mean of 33), none of them this one's.
    let crowded: Vec<WorkerView> = idle_fleet
        .iter()
        .map(|v| {
            if v.id == first {
                v.clone().load(report(vec![RankLoad {
                    num_running_reqs: 100,
                    ..RankLoad::default()
                }]))
            } else {
                v.clone()
            }
        })
        .collect();
    let d = pick(&cost_cfg(), &crowded, &req, Some(&miss), 0);
    assert_ne!(d.worker, Some(first), "{d:?}");
    let c = d.candidates.iter().find(|c| c.worker == first);
    assert!(c.is_some_and(|c| c.gated && c.in_flight == 0), "{d:?}");
}

#[test]
fn a_session_goes_where_it_went_last_unless_load_or_a_deeper_match_says_otherwise() {
    let fleet: Vec<WorkerView> = (1..=4).map(|i| w(i).load(idle(0.0))).collect();
    let req = RequestFacts {
        session: Some("agent-7".into()),
        ..tokens(600)
    };
    // Nobody holds the prompt: its session's worker, though three others are as cheap.
    let mut m = token_matches(600, &[]);
    m.session_holder = Some(id(3));
    let d = check(&cost_cfg(), &fleet, &req, Some(&m), (3, DecisionPath::Miss));
    assert_eq!(d.rule, Some(CostRule::Session), "{d:?}");
    // Between equal matches, the session's worker.
    let mut tie = token_matches(600, &[(2, 512), (3, 512)]);
    tie.session_holder = Some(id(3));
    // (Over four seeds: a tie drawn at random would land on worker 2 too.)
    check(
        &cost_cfg(),
        &fleet,
        &req,
        Some(&tie),
        (3, DecisionPath::Hit),
    );
    // A deeper match elsewhere wins over the session.
    let mut deeper = token_matches(600, &[(2, 576), (3, 128)]);
    deeper.session_holder = Some(id(3));
    check(
        &cost_cfg(),
        &fleet,
        &req,
        Some(&deeper),
        (2, DecisionPath::Hit),
    );
    // A session worker far past the spread's reach is left: load decides.
    let mut busy = fleet.clone();
    busy[2] = w(3).load(prefilling(10_000, 200_000, 40, 0.0));
    check(&cost_cfg(), &busy, &req, Some(&m), (1, DecisionPath::Miss));
}

#[test]
fn a_sessions_first_request_is_placed_by_its_key_alike_on_every_replica() {
    let fleet: Vec<WorkerView> = (1..=4).map(|i| w(i).load(idle(0.0))).collect();
    let reversed: Vec<WorkerView> = fleet.iter().rev().cloned().collect();
    let miss = token_matches(600, &[]);
    let mut places = std::collections::BTreeSet::new();
    for k in 0..16 {
        let session = Some(format!("session-{k}"));
        // Different prompts, one session: one place.
        let a = RequestFacts {
            session: session.clone(),
            ..headed(k, 600)
        };
        let b = RequestFacts {
            session,
            ..headed(k + 1000, 600)
        };
        let da = pick(&cost_cfg(), &fleet, &a, Some(&miss), 0);
        let db = pick(&cost_cfg(), &reversed, &b, Some(&miss), 1);
        assert_eq!(da.worker, db.worker, "session {k}");
        places.insert(da.worker);
    }
    assert!(places.len() >= 3, "16 sessions over {places:?}");
}
