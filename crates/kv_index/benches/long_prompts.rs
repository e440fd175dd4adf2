//! The tree alone at long prompts: observe (match and count) then insert of a 256 KiB
//! prompt, as the gateway does per request, into a text tree of 10k such prompts
//! (64 shared heads of 128–192 KiB, each prompt one head and a unique tail up to 256 KiB).
//!
//! `cargo bench -p kvgate-kv-index --bench long_prompts`

mod common;

use std::hint::black_box;
use std::time::Duration;

use common::{TENANTS, Workload};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use kvgate_kv_index::{RadixTree, TreeConfig};

const PROMPTS: usize = 10_000;
const LEN: usize = 256 * 1024;

fn long_prompts(c: &mut Criterion) {
    let mut w: Workload<u8> = Workload::new(11, 64, (128 * 1024, 192 * 1024), LEN, 48);
    let mut tree: RadixTree<u8, u64> = RadixTree::new(TreeConfig::default());
    for now in 0..PROMPTS as u64 {
        let p = w.prompt();
        let m = tree.observe(&p);
        let t = w.choose(m.per_tenant.first().map(|x| x.0));
        tree.insert(&p, t, now);
    }
    eprintln!(
        "tree: {PROMPTS} prompts of {} KiB, {} nodes, {} MiB accounted",
        LEN / 1024,
        tree.node_count(),
        tree.size_bytes() >> 20
    );
    let repeats: Vec<Vec<u8>> = (0..64).map(|_| w.prompt()).collect();
    let mut now = PROMPTS as u64;
    for p in &repeats {
        tree.insert(p, now % TENANTS, now);
        now += 1;
    }
    let mut g = c.benchmark_group("text_256k_10k_prompts");
    g.throughput(Throughput::Bytes(LEN as u64))
        .sample_size(30)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(1));
    // A head the tree holds and a tail it does not: the common case of a long prompt.
    g.bench_function("observe_insert_new_prompt", |b| {
        b.iter_batched(
            || w.prompt(),
            |p| {
                now += 1;
                let m = tree.observe(&p);
                let t = m.per_tenant.first().map_or(now % TENANTS, |x| x.0);
                tree.insert(&p, t, now);
                black_box(m.matched_len)
            },
            BatchSize::PerIteration,
        )
    });
    let mut i = 0;
    // The whole prompt held already: a repeat, or the next turn's shared part.
    g.bench_function("observe_insert_repeat_prompt", |b| {
        b.iter(|| {
            i = (i + 1) % repeats.len();
            now += 1;
            let p = &repeats[i];
            let m = tree.observe(p);
            let t = m.per_tenant.first().map_or(now % TENANTS, |x| x.0);
            tree.insert(p, t, now);
            black_box(m.matched_len)
        })
    });
    g.finish();
}

criterion_group!(benches, long_prompts);
criterion_main!(benches);
