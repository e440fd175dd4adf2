//! The routing facts of a long chat body, read by `request_facts` from a body already in
//! the CPU's cache (the gateway reads it just after the socket, where it is not: see
//! docs/benchmarks.md, "Where the bytes go"). ASCII prompts take the vector loop alone;
//! prompts with other characters add a UTF-8 check of each string; source code stops the
//! loop at an escape on every line.
//!
//! `cargo bench -p kvgate-gateway --bench parse`
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvgate_gateway::testing::{Endpoint, request_facts};

/// A chat of a short system prompt and a user message of `kib` KiB built from `unit`.
fn chat(kib: usize, unit: &str) -> Bytes {
    let text: String = unit.repeat(kib * 1024 / unit.len() + 1);
    let mut end = kib * 1024;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Bytes::from(
        serde_json::to_vec(&serde_json::json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "You are a careful assistant."},
                {"role": "user", "content": &text[..end]},
            ],
            "max_tokens": 16,
        }))
        .expect("a JSON body"),
    )
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("request_facts");
    for (name, unit) in [
        ("ascii", "the quick brown fox jumps over the lazy dog "),
        ("accented", "le cœur déçu mais l'âme plutôt naïve "),
        // Source code: an escaped quote and newline every line, so most blocks hold a stop.
        ("code", "    let name = lookup(\"key\", &table)?;\n"),
    ] {
        let body = chat(256, unit);
        g.throughput(Throughput::Bytes(body.len() as u64));
        for prompt in [true, false] {
            let id = format!(
                "256KiB/{name}/{}",
                if prompt { "prompt" } else { "no_prompt" }
            );
            g.bench_function(&id, |b| {
                b.iter(|| request_facts(Endpoint::Chat, black_box(&body), prompt).map(|f| f.stream))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
