//! Match+insert latency on a tree holding 100k prompts over 16 tenants.
//!
//! `cargo bench -p kvgate-kv-index --bench match_insert`

mod common;

use std::hint::black_box;
use std::num::NonZeroUsize;
use std::time::Duration;

use common::{TENANTS, Workload};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use kvgate_kv_index::{HashConfig, HashIndex, KeyUnit, RadixTree, TreeConfig};

const PROMPTS: usize = 100_000;

/// Builds the tree, then caps it at the size it reached so that the measured inserts
/// evict as much as they add (a gateway at its budget).
fn build<E: KeyUnit + common::Unit>(w: &mut Workload<E>, page: usize) -> RadixTree<E, u64> {
    let mut config = TreeConfig::paged(NonZeroUsize::new(page).unwrap_or(NonZeroUsize::MIN));
    let mut tree = RadixTree::new(config.clone());
    for now in 0..PROMPTS as u64 {
        let p = w.prompt();
        let mut pick = None;
        tree.match_and_insert(&p, now, |m| {
            pick = m.per_tenant.first().map(|x| x.0);
            None
        });
        let t = w.choose(pick);
        tree.insert(&p, t, now);
    }
    config.max_units = Some(tree.total_units());
    tree.set_budgets(config.max_units, None);
    eprintln!(
        "tree: {} prompts, {} nodes, {} distinct units, {} tenant units, {} MiB accounted",
        PROMPTS,
        tree.node_count(),
        tree.distinct_units(),
        tree.total_units(),
        tree.size_bytes() >> 20
    );
    tree
}

fn bench_tree<E: KeyUnit + common::Unit>(
    c: &mut Criterion,
    name: &str,
    mut w: Workload<E>,
    page: usize,
) {
    let mut tree = build(&mut w, page);
    let repeats: Vec<Vec<E>> = (0..1024).map(|_| w.prompt()).collect();
    let mut now = PROMPTS as u64;
    for p in &repeats {
        tree.insert(p, now % TENANTS, now);
        now += 1;
    }
    let mut g = c.benchmark_group(name);
    g.sample_size(30)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    // A fresh prompt per call, timed one call at a time: batching inputs would stream
    // megabytes of prompts through the cache between calls, which a gateway never does.
    g.bench_function("match_insert_new_prompt", |b| {
        b.iter_batched(
            || w.prompt(),
            |p| {
                now += 1;
                let (m, t) = tree.match_and_insert(&p, now, |m| {
                    Some(m.per_tenant.first().map_or(now % TENANTS, |x| x.0))
                });
                black_box((m.matched_len, t))
            },
            BatchSize::PerIteration,
        )
    });
    let mut i = 0;
    g.bench_function("match_insert_repeat_prompt", |b| {
        b.iter(|| {
            i = (i + 1) % repeats.len();
            now += 1;
            let (m, t) =
                tree.match_and_insert(&repeats[i], now, |m| m.per_tenant.first().map(|x| x.0));
            black_box((m.matched_len, t))
        })
    });
    g.bench_function("peek_only", |b| {
        b.iter(|| {
            i = (i + 1) % repeats.len();
            black_box(tree.peek_prefix(&repeats[i]).matched_len)
        })
    });
    g.finish();
}

fn text(c: &mut Criterion) {
    // 4 KiB prompts, 64 system prompts of 1–2 KiB.
    bench_tree::<u8>(
        c,
        "text_4KiB",
        Workload::new(1, 64, (1024, 2048), 4096, 48),
        1,
    );
}

fn tokens(c: &mut Criterion) {
    // 1k-token prompts, 64 system prompts of 256–512 tokens, pages of 16.
    bench_tree::<u32>(
        c,
        "tokens_1k_page16",
        Workload::new(2, 64, (256, 512), 1024, 32_000),
        16,
    );
}

fn hash(c: &mut Criterion) {
    let mut w: Workload<u32> = Workload::new(3, 64, (256, 512), 1024, 32_000);
    let mut idx = HashIndex::new(HashConfig::new(vec![64, 256, 512, 1024], 180_000));
    for now in 0..PROMPTS as u64 {
        let p = w.prompt();
        idx.record(&p, 0, now % TENANTS, now);
    }
    let mut now = PROMPTS as u64;
    let mut g = c.benchmark_group("hash_1k_tokens");
    g.sample_size(30)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    g.bench_function("probe_and_record_4_boundaries", |b| {
        // As above: one fresh prompt per timed call.
        b.iter_batched(
            || w.prompt(),
            |p| {
                now += 1;
                black_box(
                    idx.probe_and_record(&p, 0, now, |p| p.holders.first().copied().or(Some(1))),
                )
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, text, tokens, hash);
criterion_main!(benches);
