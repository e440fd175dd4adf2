//! What every HTTP handler shares: the gateway's state, the request id, reading a body
//! within its limit, and the JSON view of a worker's load (`/workers`, `/admin/state`).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::actors::supervise::Supervision;
use actix::Addr;
use actix_web::{HttpRequest, web};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use kvgate_policies::WorkerLoad;
use serde_json::{Value, json};

use crate::actors::events::EventsActor;
use crate::actors::index::IndexActor;
use crate::actors::registry::RegistryActor;
use crate::actors::selector::SelectorActor;
use crate::actors::tokenizers::Tokenizers;
use crate::http::answers::ResponseIds;
use crate::http::auth::{AllowList, Keys};
use crate::http::error::ApiError;
use crate::http::forwarded::TrustedProxies;
use crate::http::history::History;
use crate::metrics::Metrics;
use crate::pipeline::Pipeline;
use crate::telemetry::Telemetry;
use crate::upstream::ConnectGuard;

/// Shared by every HTTP worker thread.
#[derive(Debug, Clone)]
pub(crate) struct AppState {
    /// Admission, decisions, retries and the decision log, shared with any other front
    /// door.
    pub pipeline: Pipeline,
    /// The inference routes are served (not in picker mode, unless asked).
    pub serves_inference: bool,
    /// `--passthrough-unknown-routes`: other `/v1/` paths are forwarded.
    pub passthrough: bool,
    /// Which worker keeps which Responses answer.
    pub answers: Arc<ResponseIds>,
    /// The fleet page's chart, sampled every 5 s.
    pub history: Arc<History>,
    /// Request spans, with `--otlp-endpoint`.
    pub telemetry: Arc<Telemetry>,
    pub selector: Addr<SelectorActor>,
    pub registry: Addr<RegistryActor>,
    pub index: Addr<IndexActor>,
    pub max_payload_size: usize,
    pub request_timeout: Duration,
    pub first_token_timeout: Duration,
    /// `--first-byte-timeout-secs`: a plain answer's head.
    pub first_byte_timeout: Duration,
    pub body_timeout: Duration,
    pub keys: Keys,
    pub allow: AllowList,
    /// API-added workers' host names, vetted again at each upstream connection.
    pub guard: ConnectGuard,
    /// Whose forwarding headers name the client of the per-address rate limit.
    pub proxies: TrustedProxies,
    /// Longest drain of a worker removed through the API, and of the gateway at SIGTERM.
    pub grace: Duration,
    pub lifecycle: Arc<Lifecycle>,
    /// The actors' supervisors: one given up on fails `/liveness`.
    pub supervision: Arc<Supervision>,
    /// `--request-id-headers`, parsed.
    pub request_id_headers: Arc<[actix_web::http::header::HeaderName]>,
    /// `--session-headers`, parsed.
    pub session_headers: Arc<[actix_web::http::header::HeaderName]>,
    /// Whether the policy reads the prompt; without it the routing text is not built.
    pub reads_prompt: bool,
    pub metrics: Arc<Metrics>,
    /// The KV-event subscriptions and the chain index.
    pub events: Addr<EventsActor>,
    /// The models' tokenizers, for text requests to workers with KV events.
    pub tokenizers: Arc<Tokenizers>,
}

/// Whether the gateway is on its way out (SIGTERM): readiness says so at once.
#[derive(Debug, Default)]
pub(crate) struct Lifecycle {
    pub shutting_down: AtomicBool,
}

/// The request id of this request, set by the middleware in `http/app.rs`.
#[derive(Debug, Clone)]
pub(crate) struct RequestId(pub Arc<str>);

/// Reads the body up to the limit; a declared length over it is refused before reading.
pub(crate) async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(len) = declared
        && len > limit as u64
    {
        return Err(ApiError::PayloadTooLarge { size: len, limit });
    }
    // The declared length sizes the buffer once: no regrowth, no copies, no slack.
    let mut buf = BytesMut::with_capacity(declared.map_or(0, |n| n as usize));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::BadRequest(format!("reading the body: {e}")))?;
        if buf.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge {
                size: (buf.len() + chunk.len()) as u64,
                limit,
            });
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// Refuses a body not declared `application/json` (parameters such as `charset` aside): a
/// browser page can send a form or `text/plain` to another site without asking first, but
/// not JSON.
pub(crate) fn require_json(req: &HttpRequest) -> Result<(), ApiError> {
    let declared = req.headers().get(actix_web::http::header::CONTENT_TYPE);
    let json = declared.is_some_and(|v| {
        let essence = v
            .as_bytes()
            .split(|b| *b == b';')
            .next()
            .unwrap_or_default();
        essence
            .trim_ascii()
            .eq_ignore_ascii_case(b"application/json")
    });
    if json {
        return Ok(());
    }
    Err(ApiError::UnsupportedMediaType(declared.map_or_else(
        || "none".into(),
        |v| format!("'{}'", String::from_utf8_lossy(v.as_bytes())),
    )))
}

/// A load report summed over ranks (KV usage averaged).
pub(crate) fn load_json(l: &WorkerLoad) -> Value {
    let n = l.ranks.len().max(1) as f64;
    json!({
        "ranks": l.ranks.len(),
        "running": l.ranks.iter().map(|r| r.num_running_reqs).sum::<u64>(),
        "waiting": l.ranks.iter().map(|r| r.num_waiting_reqs).sum::<u64>(),
        "waiting_uncached_tokens": l.ranks.iter().map(|r| r.num_waiting_uncached_tokens).sum::<u64>(),
        "kv_usage": l.ranks.iter().map(|r| r.token_usage).sum::<f64>() / n,
        "gen_throughput": l.ranks.iter().map(|r| r.gen_throughput).sum::<f64>(),
        "sampled_at_secs": l.sampled_at.as_secs_f64(),
    })
}
