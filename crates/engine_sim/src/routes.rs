//! The HTTP surface of one engine, per flavour, and the server that carries it. Over 600
//! lines because every route of every flavour is here, so the flavours' surfaces read side
//! by side.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::dev::Server;
use actix_web::http::StatusCode;
use actix_web::http::header::{CACHE_CONTROL, ContentType};
use actix_web::web::{self, Bytes, Data, ServiceConfig, resource};
use actix_web::{App, HttpResponse, HttpServer, ResponseError};
use futures_util::{Stream, StreamExt, stream};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::{self, Api, Reply, Usage};
use crate::engine::Engine;
use crate::error::ApiError;
use crate::load::{self, SGLANG_VERSION};
use crate::scheduler::{Event, Finish, Job, Ticket};
use crate::{Fault, Flavor};

type Answer = Result<HttpResponse, ApiError>;

/// Largest request body an engine reads (kvgate's own default limit).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Binds one engine's server (one worker thread) on `host:port`; run it on an actix System.
pub(crate) fn bind(
    engine: Arc<Engine>,
    host: &str,
    port: u16,
) -> std::io::Result<(Server, SocketAddr)> {
    let (flavor, metrics_on) = (engine.cfg.flavor, engine.cfg.enable_metrics);
    let data = Data::from(engine);
    let server = HttpServer::new(move || {
        let frozen = Data::clone(&data);
        App::new()
            .app_data(Data::clone(&data))
            // actix's `Bytes` extractor stops at 256 KiB; an engine takes long prompts.
            .app_data(web::PayloadConfig::new(MAX_BODY))
            // A frozen process: connections are accepted, nothing is ever answered.
            .wrap_fn(move |req, srv| {
                // The simulator's own control routes stay up, so a test can thaw it.
                let own = req.path().starts_with("/sim/");
                let freeze = frozen.fault() == Fault::Freeze && !own;
                let refused = !own && req.path() != "/health" && !authorized(&frozen, &req);
                let fut = (!freeze && !refused).then(|| actix_web::dev::Service::call(srv, req));
                async move {
                    match fut {
                        Some(f) => f.await,
                        None if refused => {
                            Err(actix_web::error::ErrorUnauthorized("invalid API key"))
                        }
                        None => std::future::pending().await,
                    }
                }
            })
            .configure(|cfg| routes(cfg, flavor, metrics_on))
            .default_service(web::to(|| async { ApiError::NotFound.error_response() }))
    })
    .workers(1)
    // As uvicorn does for SGLang: a token is sent when it is ready, not when the last one
    // is acknowledged.
    .tcp_nodelay(true)
    .disable_signals()
    .shutdown_timeout(1)
    // Without this a client that goes away is only noticed on the next write, so a pending
    // non-streaming request would keep its slot.
    .h1_allow_half_closed(false)
    .bind((host, port))
    .map_err(|e| std::io::Error::new(e.kind(), format!("binding {host}:{port}: {e}")))?;
    let addr = server
        .addrs()
        .first()
        .copied()
        .ok_or_else(|| std::io::Error::other("bound no address"))?;
    Ok((server.run(), addr))
}

fn routes(cfg: &mut ServiceConfig, flavor: Flavor, metrics_on: bool) {
    // Resources (not bare routes) so a known path with the wrong method answers 405.
    cfg.service(resource("/health").get(health))
        .service(resource("/v1/models").get(models))
        .service(resource("/v1/completions").post(completions))
        .service(resource("/v1/chat/completions").post(chat))
        .service(resource("/sim/stats").get(sim_stats))
        .service(resource("/sim/fault").post(sim_fault))
        .service(resource("/sim/restart").post(sim_restart));
    // SGLang has no `/metrics` route without `--enable-metrics`; vLLM always serves it.
    if metrics_on || flavor == Flavor::Vllm {
        cfg.service(resource("/metrics").get(metrics));
    }
    match flavor {
        Flavor::Sglang | Flavor::SglangLegacy => {
            // Older SGLang has only the `get_` forms, which newer versions keep as aliases.
            let (info, model) = if flavor == Flavor::Sglang {
                (
                    vec!["/server_info", "/get_server_info"],
                    vec!["/model_info", "/get_model_info"],
                )
            } else {
                (vec!["/get_server_info"], vec!["/get_model_info"])
            };
            cfg.service(resource("/health_generate").get(health_generate))
                .service(resource("/ready").get(ready))
                .service(resource(info).get(server_info))
                .service(resource(model).get(model_info))
                .service(resource("/generate").post(generate))
                .service(resource("/flush_cache").get(flush_cache).post(flush_cache))
                .service(resource("/abort_request").post(abort_request));
            if flavor == Flavor::Sglang {
                cfg.service(resource("/v1/loads").get(loads));
            }
        }
        Flavor::Vllm => {
            let version = || async { HttpResponse::Ok().json(json!({"version": "0.11.0"})) };
            cfg.service(resource("/version").get(version))
                .service(resource("/reset_prefix_cache").post(flush_cache));
        }
    }
}

fn health_answer(e: &Engine) -> HttpResponse {
    if e.health_down() {
        HttpResponse::ServiceUnavailable().finish()
    } else {
        HttpResponse::Ok().finish()
    }
}

async fn health(e: Data<Engine>) -> HttpResponse {
    health_answer(&e)
}

async fn ready(e: Data<Engine>) -> HttpResponse {
    health_answer(&e)
}

async fn health_generate(e: Data<Engine>) -> HttpResponse {
    if !e.health_down() {
        e.health_generate().await;
    }
    health_answer(&e)
}

async fn models(e: Data<Engine>) -> HttpResponse {
    let owned_by = if e.cfg.flavor == Flavor::Vllm {
        "vllm"
    } else {
        "sglang"
    };
    HttpResponse::Ok().json(json!({"object": "list", "data": [{
        "id": e.cfg.model,
        "object": "model",
        "created": e.startup_time() as u64,
        "owned_by": owned_by,
        "root": e.cfg.model,
        "max_model_len": e.cfg.context_length,
    }]}))
}

async fn server_info(e: Data<Engine>) -> HttpResponse {
    let c = &e.cfg;
    let internal_states: Vec<Value> = e
        .snapshots()
        .iter()
        .enumerate()
        .map(|(rank, s)| json!({"dp_rank": rank, "last_gen_throughput": s.gen_throughput}))
        .collect();
    HttpResponse::Ok().json(json!({
        "model_path": c.model,
        "tokenizer_path": tokenizer_path(c),
        "served_model_name": c.model,
        "tp_size": 1,
        "dp_size": c.dp_size,
        "page_size": c.page_size,
        "max_running_requests": c.max_running_requests,
        "max_total_num_tokens": c.cache_capacity_tokens,
        "context_length": c.context_length,
        "disaggregation_mode": "null",
        "startup_time": e.startup_time(),
        "internal_states": internal_states,
        "version": SGLANG_VERSION,
        "kv_events": e.kv_events().map(|p| p.descriptor(c)),
    }))
}

/// The configured tokenizer's path, else the model's name (as SGLang reports the model path
/// when no separate tokenizer was given).
fn tokenizer_path(c: &crate::SimConfig) -> Value {
    match &c.tokenizer_path {
        Some(p) => Value::from(p.to_string_lossy().into_owned()),
        None => Value::from(c.model.as_str()),
    }
}

async fn model_info(e: Data<Engine>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "model_path": e.cfg.model,
        "tokenizer_path": tokenizer_path(&e.cfg),
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
    }))
}

#[derive(Deserialize)]
struct LoadsQuery {
    /// Accepted; only the core section is served.
    #[serde(rename = "include")]
    _include: Option<String>,
    dp_rank: Option<usize>,
    format: Option<String>,
}

async fn loads(e: Data<Engine>, q: Result<web::Query<LoadsQuery>, actix_web::Error>) -> Answer {
    hang_if_loads_hang(&e).await;
    let q = q.map_err(|err| ApiError::BadRequest(err.to_string()))?;
    if let Some(r) = q.dp_rank.filter(|r| *r >= e.ranks.len()) {
        return Err(ApiError::BadRequest(format!(
            "dp_rank {r} is out of range (dp_size {})",
            e.ranks.len()
        )));
    }
    let body = load::loads(&e, q.dp_rank);
    Ok(match q.format.as_deref() {
        Some("prometheus") => HttpResponse::Ok()
            .content_type(ContentType::plaintext())
            .body(load::loads_prometheus(&body)),
        _ => HttpResponse::Ok().json(body),
    })
}

/// Whether the request carries the engine's key, when it has one.
fn authorized(e: &Engine, req: &actix_web::dev::ServiceRequest) -> bool {
    let Some(key) = &e.cfg.api_key else {
        return true;
    };
    req.headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t == key)
}

/// Dropped with the connection when the poller gives up.
async fn hang_if_loads_hang(e: &Engine) {
    if e.fault() == Fault::LoadsHang {
        std::future::pending::<()>().await;
    }
}

async fn metrics(e: Data<Engine>) -> HttpResponse {
    hang_if_loads_hang(&e).await;
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(load::metrics(&e))
}

async fn flush_cache(e: Data<Engine>) -> HttpResponse {
    // SGLang's own text; it refuses while requests are in flight.
    const TEXT: &str = "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n";
    let status = if e.flush() {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    };
    HttpResponse::build(status)
        .content_type(ContentType::plaintext())
        .body(TEXT)
}

#[derive(Deserialize)]
struct AbortBody {
    rid: String,
}

async fn abort_request(e: Data<Engine>, body: Bytes) -> Answer {
    let b: AbortBody = api::json_body(&body)?;
    e.abort(&b.rid);
    Ok(HttpResponse::Ok().finish())
}

async fn sim_stats(e: Data<Engine>) -> HttpResponse {
    HttpResponse::Ok().json(e.stats())
}

async fn sim_fault(e: Data<Engine>, body: Bytes) -> Answer {
    let fault: Fault = api::json_body(&body)?;
    if let Fault::ErrorStatus { status, .. } = &fault
        && StatusCode::from_u16(*status).is_err()
    {
        return Err(ApiError::BadRequest(format!(
            "{status} is not an HTTP status"
        )));
    }
    e.set_fault(fault.clone());
    Ok(HttpResponse::Ok().json(fault))
}

async fn sim_restart(e: Data<Engine>) -> HttpResponse {
    e.restart();
    HttpResponse::Ok().json(json!({"startup_time": e.startup_time()}))
}

async fn generate(e: Data<Engine>, body: Bytes) -> Answer {
    infer(e, Api::Generate, body).await
}

async fn completions(e: Data<Engine>, body: Bytes) -> Answer {
    infer(e, Api::Completion, body).await
}

async fn chat(e: Data<Engine>, body: Bytes) -> Answer {
    infer(e, Api::Chat, body).await
}

/// The inference path shared by the three routes: faults, parse, schedule, answer.
async fn infer(e: Data<Engine>, api: Api, body: Bytes) -> Answer {
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
    let pinned = match e.check_rank(req.dp_rank) {
        Ok(pinned) => pinned,
        // SGLang raises inside its generator: a stream answers 200 with the error as its
        // one event, a whole answer is a 400.
        Err(err) if req.stream => return Ok(stream_error(&err)),
        Err(err) => return Err(err),
    };
    let rid = req.rid.unwrap_or_else(|| e.new_rid());
    let model = req.model.unwrap_or_else(|| e.cfg.model.clone());
    let mut prompts = req.prompts;
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
        return Ok(sse(Sse {
            ticket,
            reply,
            queue: VecDeque::new(),
            sent: 0,
            crash_after,
            malformed,
            done: false,
        }));
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

/// A streamed batch: each prompt's chunks as they come, tagged by their choice index, then
/// (with `usage_from`, when the client asked for usage) one usage chunk for the whole
/// batch, and one `[DONE]`. An engine that stops ends the stream without `[DONE]`.
fn sse_batch(usage_from: Option<Reply>, replies: Vec<Reply>, tickets: Vec<Ticket>) -> HttpResponse {
    // Each prompt yields (its chunks, its usage once it finished).
    let per_prompt = replies.into_iter().zip(tickets).map(|(reply, ticket)| {
        Box::pin(stream::unfold(Some((reply, ticket)), |state| async move {
            let (mut reply, mut ticket) = state?;
            let chunks = reply.stream_chunks(ticket.next().await?);
            if reply.finished() {
                let usage = reply.counts();
                Some(((chunks, Some(usage)), None))
            } else {
                Some(((chunks, None), Some((reply, ticket))))
            }
        }))
    });
    let state = BatchStream {
        left: per_prompt.len(),
        merged: stream::select_all(per_prompt),
        usage_from,
        usage: Usage::default(),
    };
    let frames = stream::unfold(state, |mut s| async move {
        if s.left == 0 {
            return None;
        }
        let mut out = String::new();
        while out.is_empty() {
            let (chunks, usage) = s.merged.next().await?;
            for c in chunks {
                out.push_str(&format!("data: {c}\n\n"));
            }
            if let Some(u) = usage {
                s.usage = s.usage.add(u);
                s.left -= 1;
            }
            if s.left == 0 {
                if let Some(head) = &s.usage_from {
                    let chunk = head.usage_chunk(s.usage);
                    out.push_str(&format!("data: {chunk}\n\n"));
                }
                out.push_str("data: [DONE]\n\n");
            }
        }
        Some((Ok::<_, SimulatedCrash>(Bytes::from(out)), s))
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((CACHE_CONTROL, "no-cache"))
        .streaming(frames)
}

struct BatchStream<S> {
    merged: S,
    left: usize,
    usage_from: Option<Reply>,
    usage: Usage,
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

/// A stream whose only event is `err`, then `[DONE]`: how SGLang streams an error raised
/// before the first token.
fn stream_error(err: &ApiError) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((CACHE_CONTROL, "no-cache"))
        .body(format!("data: {}\n\ndata: [DONE]\n\n", err.body()))
}

/// The error that ends a body abruptly: actix closes the connection without the last chunk.
#[derive(Debug, thiserror::Error)]
#[error("simulated engine crash")]
struct SimulatedCrash;

/// `first`, then a crash once it has been written.
fn then_crash(first: Bytes) -> impl Stream<Item = Result<Bytes, SimulatedCrash>> {
    stream::unfold(Some(Some(first)), |state| async move {
        match state? {
            Some(first) => Some((Ok(first), Some(None))),
            None => {
                // Let the dispatcher flush what was sent: an error drops unwritten bytes.
                tokio::task::yield_now().await;
                Some((Err(SimulatedCrash), None))
            }
        }
    })
}

/// A streaming answer in progress. It owns the ticket, so a client that goes away drops it
/// and aborts the request.
struct Sse {
    ticket: Ticket,
    reply: Reply,
    queue: VecDeque<Bytes>,
    sent: usize,
    crash_after: Option<usize>,
    malformed: bool,
    done: bool,
}

fn sse(state: Sse) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((CACHE_CONTROL, "no-cache"))
        .streaming(sse_frames(state))
}

fn sse_frames(state: Sse) -> impl Stream<Item = Result<Bytes, SimulatedCrash>> {
    stream::unfold(state, |mut s| async move {
        loop {
            if let Some(frame) = s.queue.pop_front() {
                if s.crash_after == Some(s.sent) {
                    // Let the dispatcher flush what was sent: an error drops unwritten bytes.
                    tokio::task::yield_now().await;
                    s.queue.clear();
                    s.done = true;
                    s.crash_after = None;
                    return Some((Err(SimulatedCrash), s));
                }
                s.sent += 1;
                return Some((Ok(frame), s));
            }
            if s.done {
                return None;
            }
            // `None`: the engine stopped; end without `[DONE]`.
            let event = s.ticket.next().await?;
            for chunk in s.reply.stream_chunks(event) {
                s.queue.push_back(if s.malformed {
                    Bytes::from_static(b"data: {\"choices\": [{\"delta\": \n\n")
                } else {
                    Bytes::from(format!("data: {chunk}\n\n"))
                });
            }
            if s.reply.finished() {
                s.queue.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                s.done = true;
            }
        }
    })
}
