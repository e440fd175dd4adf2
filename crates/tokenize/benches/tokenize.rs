//! What tokenizing costs a text request, with the fixture's tokenizer (a 4096-token
//! byte-level BPE with a Llama-3-style chat template, `tests/fixtures/tokenizer`):
//! - a conversation's next turn (16 turns of about 1 KiB each before it), whose earlier
//!   messages are cached, against the same chat with the cache cold;
//! - a 64 KiB string prompt, cold and cached.
//!
//! `cargo bench -p kvgate-tokenize --bench tokenize`

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvgate_tokenize::ModelTokenizer;
use serde_json::json;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer")
}

fn load() -> ModelTokenizer {
    match ModelTokenizer::from_path(&dir()) {
        Ok(t) => t,
        Err(e) => panic!("the fixture tokenizer: {e}"),
    }
}

/// Filler text of about `n` bytes, different for each `seed`.
fn text(seed: usize, n: usize) -> String {
    let words = [
        "the", "cache", "holds", "a", "prefix", "of", "tokens", "computed", "once", "and",
        "reused", "by", "later", "requests", "that", "share", "it",
    ];
    let mut s = String::with_capacity(n + 16);
    let mut i = seed;
    while s.len() < n {
        s.push_str(words[i % words.len()]);
        s.push(if i.is_multiple_of(13) { '.' } else { ' ' });
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    s
}

fn chat_body(turns: usize) -> Vec<u8> {
    let mut messages = vec![json!({"role": "system", "content": text(0, 2048)})];
    for t in 0..turns {
        let role = if t % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": text(t + 1, 1024)}));
    }
    serde_json::to_vec(&json!({"model": "m", "messages": messages})).unwrap_or_default()
}

fn tokenize(c: &mut Criterion) {
    let cached = load();
    let history = chat_body(16);
    let next = chat_body(17);
    let _ = cached.chat_ids(&history);
    let mut g = c.benchmark_group("chat_17_turns");
    g.throughput(Throughput::Bytes(next.len() as u64));
    g.bench_function("next_turn_cached", |b| {
        b.iter(|| black_box(cached.chat_ids(black_box(&next))))
    });
    // A cache too small for any segment: every request encodes everything.
    let cold = ModelTokenizer::with_cache(&dir(), 0).unwrap_or_else(|_| load());
    g.bench_function("cold", |b| {
        b.iter(|| black_box(cold.chat_ids(black_box(&next))))
    });
    g.finish();

    let prompt = text(99, 64 * 1024);
    let mut g = c.benchmark_group("text_64k");
    g.throughput(Throughput::Bytes(prompt.len() as u64));
    g.bench_function("cached", |b| {
        let _ = cached.encode(&prompt, true);
        b.iter(|| black_box(cached.encode(black_box(&prompt), true)))
    });
    g.bench_function("cold", |b| {
        b.iter(|| black_box(cold.encode(black_box(&prompt), true)))
    });
    g.finish();
}

criterion_group!(benches, tokenize);
criterion_main!(benches);
