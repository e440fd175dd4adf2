//! Cost of one `select` call with 16 workers, per policy.
//!
//! Run with `cargo bench -p kvgate-policies --bench select`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use kvgate_policies::{
    CacheMode, HashRing, MatchSource, PolicyConfig, PolicyKind, PrefixMatches, RankLoad,
    RequestFacts, RoutingText, SelectInput, WorkerId, WorkerLoad, WorkerView, select,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;

/// 16 workers with two-rank reports and some credit and in-flight each.
fn fleet() -> Vec<WorkerView> {
    (0..16u64)
        .map(|i| {
            let url = format!("http://10.0.0.{i}:30000");
            let rank = |r: u32| RankLoad {
                dp_rank: r,
                num_running_reqs: 8 + i,
                num_waiting_reqs: i % 4,
                num_waiting_uncached_tokens: 512 * (i % 4),
                token_usage: 0.1 + 0.04 * i as f64,
                gen_throughput: 1500.0 + 50.0 * i as f64,
                max_running_requests: 64,
                total_prefill_uncached_tokens: 1_000_000 + i * 1000,
                total_prefill_busy_us: 80_000_000,
                ..RankLoad::default()
            };
            let mut w = WorkerView::new(WorkerId::from_url(&url), url);
            w.in_flight = 10 + i;
            w.credit.tokens = 256 * i;
            w.credit.requests = i / 2;
            w.load = Some(WorkerLoad {
                ranks: vec![rank(0), rank(1)],
                sampled_at: Duration::from_secs(1),
                adapters: None,
            });
            w
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let workers = fleet();
    let ring = HashRing::from_views(&workers);
    let request = RequestFacts {
        key: RoutingText::Tokens((0..2048).collect()),
        ..RequestFacts::default()
    };
    // Four holders at different depths, as a token tree would report them.
    let matches = PrefixMatches {
        input_len: 2048,
        per_worker: [(3, 1536), (7, 1536), (11, 512), (12, 64)]
            .iter()
            .map(|&(i, n)| (workers[i].id, n))
            .collect(),
        source: MatchSource::TokenTree,
        traffic: None,
        session_holder: None,
    };
    let input = SelectInput {
        matches: Some(&matches),
        ring: Some(&ring),
        now: Duration::from_secs(2),
        ..SelectInput::new(&workers, &request)
    };
    let cache_aware = PolicyConfig::with_kind(PolicyKind::CacheAware);
    let cases = [
        (
            "cache_aware_cost_16",
            PolicyConfig {
                cache_mode: CacheMode::Cost,
                ..cache_aware.clone()
            },
        ),
        (
            "cache_aware_threshold_16",
            PolicyConfig {
                cache_mode: CacheMode::Threshold,
                ..cache_aware
            },
        ),
        (
            "least_load_16",
            PolicyConfig::with_kind(PolicyKind::LeastLoad),
        ),
        (
            "power_of_two_16",
            PolicyConfig::with_kind(PolicyKind::PowerOfTwo),
        ),
        (
            "prefix_hash_16",
            PolicyConfig::with_kind(PolicyKind::PrefixHash),
        ),
        (
            "round_robin_16",
            PolicyConfig::with_kind(PolicyKind::RoundRobin),
        ),
    ];
    let mut rng = SmallRng::seed_from_u64(1);
    for (name, cfg) in &cases {
        c.bench_function(name, |b| {
            b.iter(|| select(black_box(cfg), black_box(&input), &mut rng))
        });
    }
    c.bench_function("hash_ring_build_16", |b| {
        b.iter(|| HashRing::from_views(black_box(&workers)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
