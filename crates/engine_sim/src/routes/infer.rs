//! The inference routes (`/generate` and the OpenAI completions and chat): injected faults,
//! parsing, scheduling one job per prompt, and a whole or streamed answer.

use actix_web::http::StatusCode;
use actix_web::http::header::ContentType;
use actix_web::web::{Bytes, Data};
use actix_web::{HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Answer;
use super::stream::{sse, sse_batch, stream_error, then_crash};
use crate::Fault;
use crate::api::{self, Api, Reply, Usage};
use crate::engine::Engine;
use crate::error::ApiError;
use crate::scheduler::{Event, Finish, Job};

pub(super) async fn generate(e: Data<Engine>, body: Bytes) -> Answer {
    infer(e, Api::Generate, body, None).await
}

pub(super) async fn completions(e: Data<Engine>, req: HttpRequest, body: Bytes) -> Answer {
    let rank = header_rank(&e, &req)?;
    infer(e, Api::Completion, body, rank).await
}

pub(super) async fn chat(e: Data<Engine>, req: HttpRequest, body: Bytes) -> Answer {
    let rank = header_rank(&e, &req)?;
    infer(e, Api::Chat, body, rank).await
}

/// vLLM's `POST /v1/chat/completions/render`: the prompt's token ids as the engine
/// computes them for this chat (`{"token_ids": [...]}`), nothing scheduled.
pub(super) async fn render_chat(e: Data<Engine>, body: Bytes) -> Answer {
    render(e, Api::Chat, body)
}

/// vLLM's `POST /v1/completions/render`: one `{"prompt_token_ids": [...]}` per prompt.
pub(super) async fn render_completion(e: Data<Engine>, body: Bytes) -> Answer {
    render(e, Api::Completion, body)
}

fn render(e: Data<Engine>, api: Api, body: Bytes) -> Answer {
    e.renders.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let req = api::parse(api, &body, &e.cfg, &e.vocab)?;
    let answer = match api {
        Api::Chat => json!({"token_ids": req.prompts.first().cloned().unwrap_or_default()}),
        _ => Value::Array(
            (req.prompts.iter())
                .map(|p| json!({"prompt_token_ids": p}))
                .collect(),
        ),
    };
    Ok(HttpResponse::Ok().json(answer))
}

/// vLLM's `X-data-parallel-rank` request header (a vLLM engine's only way to be told the
/// rank; SGLang reads `routed_dp_rank` in the body).
fn header_rank(e: &Engine, req: &HttpRequest) -> Result<Option<i64>, ApiError> {
    if e.cfg.flavor != crate::Flavor::Vllm {
        return Ok(None);
    }
    let Some(v) = req.headers().get("x-data-parallel-rank") else {
        return Ok(None);
    };
    let bad = || ApiError::BadRequest("X-data-parallel-rank must be an integer".into());
    v.to_str()
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .map(Some)
        .ok_or_else(bad)
}

/// The inference path shared by the three routes: faults, parse, schedule, answer.
/// `header_rank`: a rank named in a header, over the body's.
async fn infer(e: Data<Engine>, api: Api, body: Bytes, header_rank: Option<i64>) -> Answer {
    e.received
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let fault = e.fault();
    match &fault {
        Fault::Latency(delay) => tokio::time::sleep(*delay).await,
        Fault::ErrorStatus { status, body } => {
            let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let json = serde_json::from_str::<serde::de::IgnoredAny>(body).is_ok();
            let kind = if json {
                ContentType::json()
            } else {
                ContentType::plaintext()
            };
            return Ok(HttpResponse::build(status)
                .content_type(kind)
                .body(body.clone()));
        }
        // Dropped with the connection when the client gives up.
        Fault::Hang => std::future::pending::<()>().await,
        _ => {}
    }
    if e.cfg.fixed_response {
        return canned(&e, api, &body);
    }
    let req = api::parse(api, &body, &e.cfg, &e.vocab)?;
    // vLLM reads no rank in the body (an extra field it ignores).
    let body_rank = req.dp_rank.filter(|_| e.cfg.flavor != crate::Flavor::Vllm);
    let pinned = match e.check_rank(header_rank.or(body_rank)) {
        Ok(pinned) => pinned,
        // SGLang raises inside its generator: a stream answers 200 with the error as its
        // one event, a whole answer is a 400.
        Err(err) if req.stream => return Ok(stream_error(&err)),
        Err(err) => return Err(err),
    };
    let rid = req.rid.unwrap_or_else(|| e.new_rid());
    let model = req.model.unwrap_or_else(|| e.cfg.model.clone());
    let mut prompts = req.prompts;
    let scope = e
        .scopes
        .id(req.adapter.as_deref(), req.cache_salt.as_deref())?;
    for p in &mut prompts {
        crate::scopes::enter(p, scope);
    }
    if prompts.len() > 1 {
        let b = Batch {
            api,
            rid,
            model,
            include_usage: req.include_usage,
            max_new_tokens: req.max_new_tokens,
            cache_report: e.cfg.enable_cache_report,
        };
        return b.run(&e, pinned, prompts, req.stream).await;
    }
    let rank = e.rank(pinned);
    let prompt = prompts.pop().unwrap_or_default();
    let mut reply = Reply::new(api, rid.clone(), model, req.include_usage, prompt.len())
        .cache_report(e.cfg.enable_cache_report);
    let job = Job {
        rid,
        prompt,
        max_new_tokens: req.max_new_tokens,
        probe: false,
    };
    let mut ticket = rank.submit(job);
    let crash_after = match fault {
        Fault::CrashMidStream { after_chunks } => Some(after_chunks),
        _ => None,
    };
    let malformed = fault == Fault::MalformedBody;
    if req.stream {
        return Ok(sse(ticket, reply, crash_after, malformed));
    }
    while !reply.finished() {
        let event = ticket.next().await.ok_or(ApiError::Unavailable)?;
        reply.apply(event);
    }
    let body = Bytes::from(reply.body().to_string());
    let half = body.slice(..body.len() / 2);
    Ok(if malformed {
        HttpResponse::Ok()
            .content_type(ContentType::json())
            .body(half)
    } else if crash_after.is_some() {
        HttpResponse::Ok()
            .content_type(ContentType::json())
            .streaming(then_crash(half))
    } else {
        HttpResponse::Ok()
            .content_type(ContentType::json())
            .body(body)
    })
}

/// A batch of prompts in one request: one job per prompt, each sent to a rank as a request
/// of its own would be (SGLang dispatches them one by one), answered as one body whose
/// choices carry the prompts' positions (a `/generate` batch answers a list). Injected
/// body faults apply to single prompts only.
struct Batch {
    api: Api,
    rid: String,
    model: String,
    include_usage: bool,
    max_new_tokens: usize,
    cache_report: bool,
}

impl Batch {
    async fn run(
        self,
        e: &Engine,
        pinned: Option<usize>,
        prompts: Vec<Vec<u32>>,
        stream: bool,
    ) -> Answer {
        let mut replies = Vec::with_capacity(prompts.len());
        let mut tickets = Vec::with_capacity(prompts.len());
        for (i, prompt) in prompts.into_iter().enumerate() {
            let rid = format!("{}-{i}", self.rid);
            // Usage is summed over the batch, so no prompt reports its own.
            replies.push(
                Reply::new(
                    self.api,
                    rid.clone(),
                    self.model.clone(),
                    false,
                    prompt.len(),
                )
                .at_index(i),
            );
            tickets.push(e.rank(pinned).submit(Job {
                rid,
                prompt,
                max_new_tokens: self.max_new_tokens,
                probe: false,
            }));
        }
        if stream {
            let usage_from = self.include_usage.then(|| {
                Reply::new(self.api, self.rid.clone(), self.model.clone(), false, 0)
                    .cache_report(self.cache_report)
            });
            return Ok(sse_batch(usage_from, replies, tickets));
        }
        for (reply, ticket) in replies.iter_mut().zip(&mut tickets) {
            while !reply.finished() {
                reply.apply(ticket.next().await.ok_or(ApiError::Unavailable)?);
            }
        }
        let body = match self.api {
            Api::Generate => Value::Array(replies.iter().map(Reply::body).collect()),
            _ => {
                let mut body = replies[0].body();
                body["id"] = json!(self.rid);
                body["choices"] = replies
                    .iter()
                    .map(|r| r.body()["choices"][0].clone())
                    .collect();
                let usage = replies
                    .iter()
                    .map(Reply::counts)
                    .fold(Usage::default(), Usage::add);
                body["usage"] = usage.json(self.cache_report);
                body
            }
        };
        Ok(HttpResponse::Ok().json(body))
    }
}

/// `fixed_response`: a canned one-token answer, no tokenizing, no scheduling. Body faults
/// (crash, malformed) do not apply.
fn canned(e: &Engine, api: Api, body: &[u8]) -> Answer {
    #[derive(Deserialize)]
    struct Flags {
        stream: Option<bool>,
    }
    let flags: Flags = api::json_body(body)?;
    if let Some(rank) = e.ranks.first() {
        rank.count_canned();
    }
    let mut reply = Reply::new(api, "canned".to_owned(), e.cfg.model.clone(), false, 1);
    let (id, text) = e.vocab.generated(0);
    let token = Event::Token {
        id,
        text,
        finish: Some(Finish::Length),
    };
    if flags.stream.unwrap_or(false) {
        let mut text = String::new();
        for chunk in reply.stream_chunks(token) {
            text.push_str(&format!("data: {chunk}\n\n"));
        }
        text.push_str("data: [DONE]\n\n");
        return Ok(HttpResponse::Ok()
            .content_type("text/event-stream")
            .body(text));
    }
    reply.apply(token);
    Ok(HttpResponse::Ok().json(reply.body()))
}
