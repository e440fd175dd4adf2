//! Multi-turn conversations on a gateway that has just started in front of idle engines:
//! the first turns spread over the fleet, and every later turn goes back to the engine
//! that holds its conversation, while the first turns' answers may still be decoding and
//! before any engine reports a live decode rate.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use kvgate_engine_sim::{SimConfig, engine_of};
use kvgate_tests::{Harness, post_json, sse_events};
use serde_json::{Value, json};

const CONVERSATIONS: usize = 16;
const TURNS: usize = 4;

/// The yardstick's engines: 16 slots, 20k tok/s prefill, 5 ms + 0.2 ms per running request
/// per decode step, a 200k-token pool; idle long enough that their gauges are stale.
fn engine(gauge: f64) -> SimConfig {
    SimConfig {
        max_running_requests: 16,
        prefill_tokens_per_sec: 20_000.0,
        decode_step_base: std::time::Duration::from_millis(5),
        decode_step_per_req: std::time::Duration::from_micros(200),
        cache_capacity_tokens: 200_000,
        initial_gen_throughput: gauge,
        enable_cache_report: true,
        ..SimConfig::default()
    }
}

fn words(seed: usize, n: usize) -> String {
    (0..n)
        .map(|k| format!("w{}", (seed * 7919 + k * 104_729) % 100_000))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One turn's facts: the engine that answered, its answer, and the usage it reported.
struct Turn {
    engine: usize,
    answer: String,
    prompt_tokens: u64,
    cached_tokens: u64,
}

async fn ask(url: String, messages: &[Value]) -> Turn {
    let body = json!({
        "messages": messages,
        "max_tokens": 32,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let r = post_json(&url, &body).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let (events, done) = sse_events(&r.text());
    assert!(done, "{}", r.text());
    let engine = events[0]["id"]
        .as_str()
        .and_then(engine_of)
        .expect("a simulator's response id");
    let answer: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    let usage = &events.last().expect("a usage chunk")["usage"];
    Turn {
        engine,
        answer,
        prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
        cached_tokens: usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    }
}

async fn conversation(url: String, c: usize) -> Vec<Turn> {
    let mut messages =
        vec![json!({"role": "system", "content": format!("Conversation {c}. {}", words(c, 200))})];
    let mut turns = Vec::new();
    for t in 0..TURNS {
        messages.push(json!({"role": "user", "content": words(c * TURNS + t + 1000, 32)}));
        let turn = ask(url.clone(), &messages).await;
        messages.push(json!({"role": "assistant", "content": turn.answer}));
        turns.push(turn);
    }
    turns
}

#[actix_rt::test]
async fn on_a_fresh_gateway_every_conversation_stays_on_its_first_engine() {
    // Engines idle with different stale gauges, as a real fleet's are.
    let gauges = [0.36, 0.0, 0.36, 0.0];
    let h = Harness::start_each(gauges.iter().map(|&g| engine(g)).collect(), |c| {
        c.seed = Some(5);
    });
    // Traffic at once: no waiting for a load report.
    let url = h.url("/v1/chat/completions");
    let all =
        futures_util::future::join_all((0..CONVERSATIONS).map(|c| conversation(url.clone(), c)))
            .await;

    let mut per_engine = [0usize; 4];
    for (c, turns) in all.iter().enumerate() {
        let first = turns[0].engine;
        per_engine[first] += 1;
        let engines: Vec<usize> = turns.iter().map(|t| t.engine).collect();
        assert!(
            engines.iter().all(|&e| e == first),
            "conversation {c} moved: {engines:?}"
        );
        // Each later turn reused the previous prompt at least: it went where it was cached.
        for w in turns.windows(2) {
            assert!(
                w[1].cached_tokens >= w[0].prompt_tokens,
                "conversation {c}: {} cached of {} before",
                w[1].cached_tokens,
                w[0].prompt_tokens
            );
        }
    }
    assert_eq!(per_engine, [4, 4, 4, 4]);
    assert_eq!(h.split(), vec![16, 16, 16, 16]);
}
