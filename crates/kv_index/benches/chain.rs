//! The KV chain index: applying stored blocks as engines publish them, and matching a
//! 256-block request against 16 workers holding 1M blocks.
//!
//! 64 shared heads of 128 blocks (a system prompt or a document), each stored by 4 of the 16
//! workers; then every worker stores its own conversations, each one head plus 128 unique
//! blocks, until the fleet holds 1M blocks. Blocks of 16 tokens, events of 16 blocks each
//! (a chunk of a request, naming the previous chunk's last block as parent), SGLang-like
//! engine hashes (the same for the same content on every engine). RSS growth while
//! building is printed, for memory per block.
//!
//! `cargo bench -p kvgate-kv-index --bench chain`

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::rss_bytes;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use kvgate_kv_index::{ChainConfig, ChainIndex, ChainStore, chain_keys};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const BS: usize = 16;
const WORKERS: u64 = 16;
const HEADS: usize = 64;
const HEAD_BLOCKS: usize = 128;
const TAIL_BLOCKS: usize = 128;
const TOTAL: usize = 1_000_000;
const EVENT_BLOCKS: usize = 16;

/// One stored event: worker, engine hashes, parent, tokens.
struct Event {
    worker: u64,
    hashes: Vec<u64>,
    parent: Option<u64>,
    tokens: Vec<u32>,
}

struct Fleet {
    events: Vec<Event>,
    /// Requests of 256 blocks: a head and one worker's conversation, with that worker.
    requests: Vec<(Vec<u32>, u64)>,
}

fn random_blocks(rng: &mut SmallRng, n: usize) -> Vec<u32> {
    (0..n * BS).map(|_| rng.gen_range(0..128_000)).collect()
}

/// A sequence's blocks as events of `EVENT_BLOCKS`, hashes `base + position`, each event
/// naming the previous one's last block as parent.
fn events_of(worker: u64, tokens: &[u32], base: u64, parent: Option<u64>, out: &mut Vec<Event>) {
    for (i, chunk) in tokens.chunks(EVENT_BLOCKS * BS).enumerate() {
        let first = base + (i * EVENT_BLOCKS) as u64;
        out.push(Event {
            worker,
            hashes: (first..first + (chunk.len() / BS) as u64).collect(),
            parent: if i == 0 { parent } else { Some(first - 1) },
            tokens: chunk.to_vec(),
        });
    }
}

fn fleet() -> Fleet {
    let mut rng = SmallRng::seed_from_u64(16);
    let heads: Vec<Vec<u32>> = (0..HEADS)
        .map(|_| random_blocks(&mut rng, HEAD_BLOCKS))
        .collect();
    let head_hash = |h: usize| (h as u64) << 32;
    let mut events = Vec::new();
    let mut held = 0;
    for (h, head) in heads.iter().enumerate() {
        for k in 0..4 {
            let w = (h as u64 + k * 4) % WORKERS;
            events_of(w, head, head_hash(h), None, &mut events);
            held += HEAD_BLOCKS;
        }
    }
    let mut requests = Vec::new();
    let mut conv = 0u64;
    while held < TOTAL {
        let w = conv % WORKERS;
        // A head this worker holds.
        let h = (0..HEADS)
            .filter(|h| (0..4).any(|k| (*h as u64 + k * 4) % WORKERS == w))
            .nth(rng.gen_range(0..16))
            .unwrap_or(0);
        let tail = random_blocks(&mut rng, TAIL_BLOCKS);
        let parent = head_hash(h) + HEAD_BLOCKS as u64 - 1;
        events_of(
            w,
            &tail,
            (1 << 48) + (conv << 16),
            Some(parent),
            &mut events,
        );
        held += TAIL_BLOCKS;
        if requests.len() < 1024 {
            let mut req = heads[h].clone();
            req.extend_from_slice(&tail);
            requests.push((req, w));
        }
        conv += 1;
    }
    Fleet { events, requests }
}

fn apply(ix: &mut ChainIndex<u64>, events: &[Event]) -> usize {
    let mut applied = 0;
    for e in events {
        let s = ChainStore {
            block_hashes: &e.hashes,
            parent: e.parent,
            token_ids: &e.tokens,
            block_size: BS,
            namespace: 0,
            tier: 0,
        };
        applied += ix.apply_stored(e.worker, 0, &s).applied;
    }
    applied
}

fn chain(c: &mut Criterion) {
    let f = fleet();
    let blocks: usize = f.events.iter().map(|e| e.hashes.len()).sum();
    let rss0 = rss_bytes();
    let started = Instant::now();
    let mut ix = ChainIndex::new(ChainConfig::default());
    let applied = apply(&mut ix, &f.events);
    let took = started.elapsed();
    let rss = rss_bytes().saturating_sub(rss0);
    let stats = ix.stats();
    assert_eq!(applied, blocks);
    assert_eq!(stats.unknown_parents, 0);
    eprintln!(
        "index: {} events, {} blocks held by {WORKERS} workers, {} nodes; built in {:.2} s \
         ({:.2} M blocks/s); RSS growth {} MiB, {:.0} B per block held",
        f.events.len(),
        stats.blocks,
        stats.nodes,
        took.as_secs_f64(),
        blocks as f64 / took.as_secs_f64() / 1e6,
        rss >> 20,
        rss as f64 / stats.blocks as f64
    );
    for (req, w) in f.requests.iter().take(4) {
        let m = ix.match_tokens(req, BS, 0);
        assert_eq!(m.matched_by(*w, 0), 256);
        assert_eq!(m.per_rank.len(), 4, "the head's other holders");
    }

    let mut g = c.benchmark_group("chain_16_workers_1m_blocks");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    // A different request each call, so the index's nodes on its path are not in cache
    // from the last call; its tokens are, as they are for a gateway that just parsed it.
    let mut i = 0;
    let mut next = |skip: usize| {
        i = (i + 1) % f.requests.len();
        f.requests[i].0[skip..].to_vec()
    };
    g.bench_function("match_256_blocks", |b| {
        b.iter_batched(
            || next(0),
            |req| black_box(ix.match_tokens(&req, BS, 0).per_rank.len()),
            BatchSize::PerIteration,
        )
    });
    // The hashing alone, for how much of a match is the walk.
    g.bench_function("chain_keys_256_blocks", |b| {
        b.iter_batched(
            || next(0),
            |req| black_box(chain_keys(&req, BS, 0).len()),
            BatchSize::PerIteration,
        )
    });
    // No worker holds the first block.
    g.bench_function("match_255_blocks_miss", |b| {
        b.iter_batched(
            || next(BS),
            |req| black_box(ix.match_tokens(&req, BS, 0).per_rank.len()),
            BatchSize::PerIteration,
        )
    });
    g.finish();

    let mut g = c.benchmark_group("chain_apply");
    g.throughput(Throughput::Elements(blocks as u64))
        .sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .warm_up_time(Duration::from_secs(1));
    g.bench_function("apply_1m_stored_blocks", |b| {
        b.iter_batched(
            || ChainIndex::new(ChainConfig::default()),
            |mut ix| {
                black_box(apply(&mut ix, &f.events));
                ix
            },
            BatchSize::PerIteration,
        )
    });
    // At a cap of half the blocks: every store past it evicts as much as it adds.
    g.bench_function("apply_1m_stored_blocks_capped_500k", |b| {
        b.iter_batched(
            || {
                ChainIndex::new(ChainConfig {
                    max_blocks: Some(TOTAL / 2),
                })
            },
            |mut ix| {
                black_box(apply(&mut ix, &f.events));
                ix
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, chain);
criterion_main!(benches);
