//! Replays a plan against a gateway (or its replicas) with streaming requests, as chats or
//! as token prompts, timing each one.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use kvgate_bench::{EngineTokens, Message, Plan};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

/// How requests are released.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Arrival {
    /// At most this many requests in flight; the next goes when one finishes.
    Closed(usize),
    /// Sessions start as a seeded Poisson process at this rate (per second); a session's
    /// later requests follow its previous answer.
    Poisson(f64),
}

/// How a request carries its prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PromptForm {
    /// `/v1/chat/completions` with the messages: the gateway sees text.
    Chat,
    /// `/generate` with `input_ids`: the same chat rendered and encoded by the client with
    /// the engines' tokenizer, so the gateway sees the engines' very tokens.
    Tokens,
}

/// Most requests in flight in Poisson mode, so an overloaded target cannot grow without
/// bound.
const OPEN_LOOP_LIMIT: usize = 1024;

/// One request as the client saw it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Record {
    pub ok: bool,
    /// When it was sent, from the start of the replay.
    pub sent_at: Duration,
    /// The prompt's ids as the engines compute them.
    pub prompt: Vec<u32>,
    /// The answer's ids.
    pub answer_ids: Vec<u32>,
    /// The streamed answer's text.
    pub answer: String,
    pub ttft_ms: Option<f64>,
    pub total_ms: f64,
    pub output_tokens: u64,
    /// The engine's `usage` chunk.
    pub usage: Option<Usage>,
    pub error: Option<String>,
}

/// What the engine said it did, from the stream's `usage` chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub prompt_tokens: u64,
    /// `prompt_tokens_details.cached_tokens`; `None` when the engine does not report it.
    pub cached_tokens: Option<u64>,
}

/// Everything a replay measured.
#[derive(Debug)]
pub(crate) struct Replay {
    pub records: Vec<Record>,
    pub wall: Duration,
    /// The wall-clock cap stopped it.
    pub capped: bool,
}

/// Where and how a replay sends its requests.
pub(crate) struct Wire<'a> {
    /// The gateway's replicas; request `i` of the plan goes to `i % len` (a balancer in
    /// front with no session affinity).
    pub urls: &'a [String],
    pub model: &'a str,
    pub form: PromptForm,
    /// The engines' tokenizer: token prompts, and the ids the ideal is computed on.
    pub tokens: &'a EngineTokens,
}

/// Sends every request of `plan` and waits for all answers, or for `max_wall`.
pub(crate) async fn replay(
    wire: &Wire<'_>,
    plan: &Plan,
    arrival: Arrival,
    seed: u64,
    max_wall: Duration,
    request_timeout: Duration,
) -> Replay {
    let limit = match arrival {
        Arrival::Closed(c) => c.max(1),
        Arrival::Poisson(_) => OPEN_LOOP_LIMIT,
    };
    let client = awc::Client::builder()
        .timeout(request_timeout)
        .connector(awc::Connector::new().limit(limit))
        .finish();
    let path = match wire.form {
        PromptForm::Chat => "/v1/chat/completions",
        PromptForm::Tokens => "/generate",
    };
    let urls: Vec<String> = wire.urls.iter().map(|u| format!("{u}{path}")).collect();
    if urls.is_empty() {
        return Replay {
            records: Vec::new(),
            wall: Duration::ZERO,
            capped: false,
        };
    }
    let permits = Rc::new(Semaphore::new(limit));
    let records = Rc::new(RefCell::new(Vec::with_capacity(plan.len())));
    let starts = start_offsets(plan.sessions.len(), arrival, seed);
    let firsts = first_indices(plan);
    let begun = Instant::now();

    let sessions = plan
        .sessions
        .iter()
        .zip(starts)
        .zip(firsts)
        .map(|((session, start), first)| {
            let (client, urls, permits, records) =
                (&client, &urls, Rc::clone(&permits), Rc::clone(&records));
            async move {
                if let Some(at) = start {
                    actix_rt::time::sleep_until((begun + at).into()).await;
                }
                // The answers so far: a conversation re-sends what the engine said, not the
                // plan's placeholder, so an engine that caches its output can hit it.
                let mut answers: Vec<String> = Vec::new();
                for (k, req) in session.requests.iter().enumerate() {
                    let Ok(_permit) = permits.acquire().await else {
                        return;
                    };
                    let mut messages = req.messages.clone();
                    for (m, a) in messages
                        .iter_mut()
                        .filter(|m| m.role == "assistant")
                        .zip(&answers)
                    {
                        m.content.clone_from(a);
                    }
                    let url = &urls[(first + k) % urls.len()];
                    let rec =
                        one_request(wire, client, url, &messages, plan.max_tokens, begun).await;
                    answers.push(rec.answer.clone());
                    let failed = !rec.ok;
                    records.borrow_mut().push(rec);
                    if failed {
                        // A conversation cannot go on without its answer.
                        return;
                    }
                }
            }
        });
    let all = futures_util::future::join_all(sessions);
    let capped = actix_rt::time::timeout(max_wall, all).await.is_err();
    let wall = begun.elapsed();
    let records = records.take();
    Replay {
        records,
        wall,
        capped,
    }
}

/// One request of a session: its chat encoded in the engines' tokens, sent in the
/// wire's form, and its answer encoded back for the ideal.
async fn one_request(
    wire: &Wire<'_>,
    client: &awc::Client,
    url: &str,
    messages: &[Message],
    max_tokens: usize,
    begun: Instant,
) -> Record {
    let ids = match wire.tokens.chat(messages) {
        Ok(ids) => ids,
        Err(e) => {
            return Record {
                error: Some(format!("encoding the prompt: {e}")),
                ..Record::default()
            };
        }
    };
    let body = match wire.form {
        PromptForm::Chat => json!({
            "model": wire.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        }),
        PromptForm::Tokens => json!({
            "model": wire.model,
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": max_tokens},
            "stream": true,
        }),
    };
    let sent_at = begun.elapsed();
    let mut rec = send(client, url, &body).await;
    rec.sent_at = sent_at;
    rec.prompt = ids;
    if rec.ok && wire.form == PromptForm::Chat {
        match wire.tokens.answer(&rec.answer) {
            Ok(ids) => rec.answer_ids = ids,
            Err(e) => {
                // Not completed: its answer's ids would be missing from the ideal.
                rec.ok = false;
                rec.error = Some(format!("encoding the answer: {e}"));
            }
        }
    }
    rec
}

/// The plan index of each session's first request.
fn first_indices(plan: &Plan) -> Vec<usize> {
    plan.sessions
        .iter()
        .scan(0, |next, s| {
            let first = *next;
            *next += s.requests.len();
            Some(first)
        })
        .collect()
}

/// When each session starts: all at once for a closed loop, Poisson arrivals otherwise.
fn start_offsets(n: usize, arrival: Arrival, seed: u64) -> Vec<Option<Duration>> {
    match arrival {
        Arrival::Closed(_) => vec![None; n],
        Arrival::Poisson(rate) => {
            let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_a11e);
            let mut t = 0.0_f64;
            (0..n)
                .map(|_| {
                    let u: f64 = rng.r#gen::<f64>().max(f64::MIN_POSITIVE);
                    t += -u.ln() / rate;
                    Some(Duration::from_secs_f64(t))
                })
                .collect()
        }
    }
}

/// One streaming request: time to the first chunk carrying `data:`, then to the end.
async fn send(client: &awc::Client, url: &str, body: &Value) -> Record {
    let started = Instant::now();
    let mut rec = Record::default();
    let resp = client
        .post(url)
        .insert_header(("content-type", "application/json"))
        .send_json(body)
        .await;
    let mut resp = match resp {
        Ok(r) => r,
        Err(e) => {
            rec.error = Some(format!("send: {e}"));
            rec.total_ms = ms(started.elapsed());
            return rec;
        }
    };
    let status = resp.status();
    let mut pending: Vec<u8> = Vec::new();
    let mut done = false;
    while let Some(chunk) = resp.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                rec.error = Some(format!("body: {e}"));
                break;
            }
        };
        if rec.ttft_ms.is_none() && chunk.windows(5).any(|w| w == b"data:") {
            rec.ttft_ms = Some(ms(started.elapsed()));
        }
        pending.extend_from_slice(&chunk);
        // Whole lines only; a line can straddle chunks.
        while let Some(eol) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=eol).collect();
            match sse_line(&line) {
                Line::Token(text) => {
                    rec.output_tokens += 1;
                    rec.answer.push_str(&text);
                }
                Line::Usage(u) => rec.usage = Some(u),
                Line::Generated { text, ids, usage } => {
                    // Each `/generate` chunk carries the whole answer so far.
                    rec.output_tokens = ids.len() as u64;
                    rec.answer = text;
                    rec.answer_ids = ids;
                    rec.usage = Some(usage);
                }
                Line::Done => done = true,
                Line::Other => {}
            }
        }
    }
    rec.total_ms = ms(started.elapsed());
    rec.ok = status.is_success() && done && rec.error.is_none();
    if !status.is_success() {
        let text = String::from_utf8_lossy(&pending);
        rec.error = Some(format!(
            "status {status}: {}",
            text.chars().take(200).collect::<String>()
        ));
    } else if !done && rec.error.is_none() {
        rec.error = Some("stream ended without [DONE]".to_owned());
    }
    rec
}

enum Line {
    Token(String),
    Usage(Usage),
    /// A `/generate` chunk: the answer so far and the engine's counts.
    Generated {
        text: String,
        ids: Vec<u32>,
        usage: Usage,
    },
    Done,
    Other,
}

fn sse_line(line: &[u8]) -> Line {
    let Some(data) = line.strip_prefix(b"data:") else {
        return Line::Other;
    };
    let data = data.trim_ascii();
    if data == b"[DONE]" {
        return Line::Done;
    }
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return Line::Other;
    };
    if let Some(meta) = v.get("meta_info").filter(|m| m.is_object()) {
        let ids = v["output_ids"].as_array().map_or_else(Vec::new, |a| {
            a.iter()
                .filter_map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok()))
                .collect()
        });
        return Line::Generated {
            text: v["text"].as_str().unwrap_or_default().to_owned(),
            ids,
            usage: Usage {
                prompt_tokens: meta["prompt_tokens"].as_u64().unwrap_or(0),
                cached_tokens: meta["cached_tokens"].as_u64(),
            },
        };
    }
    if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
        return Line::Usage(Usage {
            prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
            cached_tokens: usage["prompt_tokens_details"]["cached_tokens"].as_u64(),
        });
    }
    match v["choices"][0]["delta"]["content"].as_str() {
        Some(c) if !c.is_empty() => Line::Token(c.to_owned()),
        _ => Line::Other,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generate_chunk_carries_the_answer_so_far_and_the_counts() {
        let line = br#"data: {"text":" as of","output_ids":[419,7],"meta_info":{"prompt_tokens":10,"cached_tokens":4,"finish_reason":null}}"#;
        let Line::Generated { text, ids, usage } = sse_line(line) else {
            panic!("not read as a /generate chunk");
        };
        assert_eq!((text.as_str(), ids), (" as of", vec![419, 7]));
        assert_eq!(
            usage,
            Usage {
                prompt_tokens: 10,
                cached_tokens: Some(4)
            }
        );
        assert!(matches!(sse_line(b"data: [DONE]"), Line::Done));
    }

    #[test]
    fn requests_are_numbered_in_plan_order_across_sessions() {
        let spec = kvgate_bench::WorkloadSpec {
            conversations: 3,
            turns: 2,
            ..kvgate_bench::WorkloadSpec::new(kvgate_bench::WorkloadKind::MultiTurn)
        };
        assert_eq!(first_indices(&Plan::build(&spec)), vec![0, 2, 4]);
    }
}
