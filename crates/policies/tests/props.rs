//! Invariants of every policy over arbitrary snapshots: a decision names an eligible
//! worker of the snapshot (or none exactly when none is eligible, or every one is at the
//! waiting cap), and nothing panics on NaN, zeros or huge values.

use std::time::Duration;

use kvgate_policies::{
    CacheIndex, CacheMode, Credit, CreditLedger, DecisionPath, HashRing, LoadMetric, MatchSource,
    PolicyConfig, PolicyKind, PrefixMatches, RankLoad, RequestFacts, RoutingText, SelectInput,
    WorkerId, WorkerLoad, WorkerView, select,
};
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::SmallRng;

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        proptest::num::f64::ANY,
        0.0..1.0f64,
        0.0..100_000.0f64,
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(0.0),
    ]
}

fn count() -> impl Strategy<Value = u64> {
    prop_oneof![0..100u64, any::<u64>(), Just(u64::MAX), Just(0)]
}

fn rank() -> impl Strategy<Value = RankLoad> {
    (
        (count(), count(), count(), count(), count(), count()),
        (float(), float(), float()),
        (count(), count()),
    )
        .prop_map(
            |((run, wait, wtok, used, max, maxrun), (u, g, h), (pt, pus))| RankLoad {
                dp_rank: 0,
                num_running_reqs: run,
                num_waiting_reqs: wait,
                num_waiting_uncached_tokens: wtok,
                num_used_tokens: used,
                max_total_num_tokens: max,
                max_running_requests: maxrun,
                token_usage: u,
                gen_throughput: g,
                cache_hit_rate: h,
                total_prefill_uncached_tokens: pt,
                total_prefill_busy_us: pus,
            },
        )
}

fn worker() -> impl Strategy<Value = WorkerView> {
    (
        0..12u64,
        any::<bool>(),
        count(),
        proptest::option::of(proptest::collection::vec(rank(), 0..3)),
        (count(), count()),
        0..5u64,
    )
        .prop_map(|(n, eligible, in_flight, ranks, (tokens, requests), at)| {
            let mut w = WorkerView::new(WorkerId(n), format!("http://w{n}:8000"));
            w.eligible = eligible;
            w.in_flight = in_flight;
            w.load = ranks.map(|ranks| WorkerLoad {
                ranks,
                sampled_at: Duration::from_secs(at),
                adapters: None,
            });
            w.credit = Credit { tokens, requests };
            w
        })
}

fn request() -> impl Strategy<Value = RequestFacts> {
    let key = prop_oneof![
        Just(RoutingText::Empty),
        ".{0,60}".prop_map(|s: String| RoutingText::Text(s.into())),
        proptest::collection::vec(any::<u32>(), 0..300).prop_map(RoutingText::Tokens),
    ];
    (key, proptest::option::of(".{0,140}")).prop_map(|(key, routing_key)| RequestFacts {
        key,
        routing_key,
        ..RequestFacts::default()
    })
}

fn matches() -> impl Strategy<Value = Option<PrefixMatches>> {
    let source = prop_oneof![
        Just(MatchSource::TextTree),
        Just(MatchSource::TokenTree),
        proptest::option::of(0..400usize).prop_map(|boundary| MatchSource::Hash { boundary }),
    ];
    proptest::option::of(
        (
            prop_oneof![0..400usize, any::<usize>()],
            proptest::collection::vec((0..16u64, prop_oneof![0..400usize, any::<usize>()]), 0..8),
            source,
        )
            .prop_map(|(input_len, per, source)| PrefixMatches {
                input_len,
                per_worker: per.into_iter().map(|(i, n)| (WorkerId(i), n)).collect(),
                source,
                traffic: None,
                session_holder: None,
            }),
    )
}

fn config() -> impl Strategy<Value = PolicyConfig> {
    (
        proptest::sample::select(PolicyKind::ALL.to_vec()),
        any::<bool>(),
        any::<bool>(),
        proptest::sample::select(vec![
            LoadMetric::ExpectedWait,
            LoadMetric::Requests,
            LoadMetric::LeastRequests,
        ]),
        (
            0..4u64,
            1.0..3.0f64,
            proptest::option::of(0.01..1.0f64),
            proptest::option::of(0.01..1.0f64),
        ),
        (
            proptest::option::of(1..5u64),
            0.0..1.0f64,
            proptest::collection::btree_set(1..300usize, 0..4),
        ),
    )
        .prop_map(
            |(kind, cost, hash, metric, (abs, rel, spread, ceiling), (cap, threshold, b))| {
                PolicyConfig {
                    kind,
                    cache_mode: if cost {
                        CacheMode::Cost
                    } else {
                        CacheMode::Threshold
                    },
                    cache_index: if hash {
                        CacheIndex::Hash
                    } else {
                        CacheIndex::Tree
                    },
                    power_of_two_load_metric: metric,
                    balance_abs_threshold: abs,
                    balance_rel_threshold: rel,
                    balance_token_usage_threshold: spread,
                    overload_token_usage_threshold: ceiling,
                    least_load_max_waiting_requests: cap,
                    cache_threshold: threshold,
                    cache_boundaries: b.into_iter().collect(),
                    ..PolicyConfig::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn a_decision_names_an_eligible_worker_of_the_snapshot(
        cfg in config(),
        workers in proptest::collection::vec(worker(), 0..10),
        req in request(),
        m in matches(),
        with_ring in any::<bool>(),
        seq in any::<u64>(),
        seed in any::<u64>(),
    ) {
        prop_assert!(cfg.validate().is_ok());
        let ring = HashRing::from_views(&workers);
        let input = SelectInput {
            matches: m.as_ref(),
            ring: with_ring.then_some(&ring),
            seq,
            now: Duration::from_secs(3),
            ..SelectInput::new(&workers, &req)
        };
        let d = select(&cfg, &input, &mut SmallRng::seed_from_u64(seed));
        let any_eligible = workers.iter().any(|w| w.eligible);
        match d.worker {
            Some(id) => prop_assert!(
                workers.iter().any(|w| w.id == id && w.eligible),
                "{d} is not an eligible worker"
            ),
            None => prop_assert!(
                !any_eligible && d.path == DecisionPath::NoWorker
                    || any_eligible && d.path == DecisionPath::Saturated,
                "no worker with eligible = {any_eligible}: {d}"
            ),
        }
        for c in &d.candidates {
            prop_assert!(workers.iter().any(|w| w.id == c.worker && w.eligible));
            prop_assert!(c.score.is_none_or(|s| !s.is_nan()), "{c:?}");
        }
        if let Some(r) = d.match_rate {
            prop_assert!((0.0..=1.0).contains(&r));
        }
        prop_assert!(d.record_prefix <= m.is_some());
        prop_assert!(d.worker.is_some() || d.credit_tokens == 0);
    }

    #[test]
    fn the_ledger_keeps_only_dispatches_after_the_sample(
        dispatches in proptest::collection::vec((0..10_000u64, 0..100u64), 0..50),
        sample in proptest::option::of(0..100u64),
    ) {
        let w = WorkerId(1);
        let mut l = CreditLedger::new();
        for &(tokens, at) in &dispatches {
            l.record(w, tokens, Duration::from_millis(at));
        }
        l.on_report(w, sample.map(Duration::from_millis));
        let kept: Vec<_> = dispatches
            .iter()
            .filter(|(_, at)| sample.is_some_and(|s| *at > s))
            .collect();
        let c = l.credit(w);
        prop_assert_eq!(c.requests, kept.len() as u64);
        prop_assert_eq!(c.tokens, kept.iter().map(|(t, _)| t).sum::<u64>());
    }
}
