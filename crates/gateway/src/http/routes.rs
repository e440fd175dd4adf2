//! HTTP handlers: the gateway's own routes and the worker admin API (REST and the
//! sglang-router legacy forms). The proxied inference routes are in `inference`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use bytes::Bytes;

use kvgate_core::WorkerUrl;
use kvgate_policies::WorkerId;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::actors::events::{GetEventStates, WorkerEvents};
use crate::actors::index::{ClearWorker, GetIndexStats, Ping as IndexPing};
use crate::actors::registry::{
    AddWorker, DrainWorker, ListWorkers, RemoveWorker, WorkerRecord, WorkerSource, WorkerStatus,
};
use crate::actors::selector::{CircuitState, GetWorkerStates, Ping, WorkerState, worker_state};
use crate::actors::tokenizers::Slot;
use crate::http::error::ApiError;
use crate::http::state::{AppState, read_body};
use crate::upstream::{Pool, UpstreamError};
use kvgate_core::Secret;

pub(crate) async fn health() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// Alive unless an actor panicked too often to be restarted: then only a new
/// process routes again, and a 503 tells the orchestrator so.
pub(crate) async fn liveness(state: web::Data<AppState>) -> HttpResponse {
    let given_up = state.supervision.given_up();
    let restarts = state.supervision.restarts();
    if given_up.is_empty() {
        return HttpResponse::Ok().json(json!({"status": "ok", "actor_restarts": restarts}));
    }
    HttpResponse::ServiceUnavailable().json(json!({
        "status": "failed",
        "reason": "an actor could not be restarted",
        "actors": given_up,
        "actor_restarts": restarts,
    }))
}

/// Ready when it serves: not shutting down, its routing actors answer, and some worker
/// is ready.
pub(crate) async fn readiness(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if state.lifecycle.shutting_down.load(Ordering::Acquire) {
        return Ok(HttpResponse::ServiceUnavailable()
            .json(json!({"status": "not ready", "reason": "shutting down"})));
    }
    let fleet = state.registry.send(ListWorkers).await?;
    let healthy = fleet.iter().filter(|w| w.healthy()).count();
    let body = |status: &str| json!({"status": status, "healthy_workers": healthy, "total_workers": fleet.len()});
    let ping = Duration::from_secs(2);
    let (selector, index) = (
        actix_rt::time::timeout(ping, state.selector.send(Ping)).await,
        actix_rt::time::timeout(ping, state.index.send(IndexPing)).await,
    );
    let routable = match (selector, index) {
        (Ok(Ok(routable)), Ok(Ok(()))) => Some(routable),
        _ => None,
    };
    let given_up = state.supervision.given_up();
    let reason = if given_up.iter().any(|a| matches!(*a, "selector" | "index")) {
        Some("a routing actor could not be restarted")
    } else if !given_up.is_empty() {
        Some("an actor could not be restarted")
    } else {
        match routable {
            None => Some("the routing actors do not answer"),
            Some(_) if healthy == 0 => Some("no healthy worker"),
            Some(false) => Some("no worker can be routed to"),
            Some(true) => None,
        }
    };
    match reason {
        None => Ok(HttpResponse::Ok().json(body("ready"))),
        Some(r) => {
            let mut b = body("not ready");
            b["reason"] = json!(r);
            Ok(HttpResponse::ServiceUnavailable().json(b))
        }
    }
}

pub(crate) async fn models(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.keys.client(&req)?;
    let fleet = state.registry.send(ListWorkers).await?;
    let mut seen = std::collections::BTreeMap::<&str, &WorkerRecord>::new();
    for w in fleet.iter() {
        for m in &w.models {
            seen.entry(m.as_str()).or_insert(w);
        }
    }
    let data: Vec<Value> = seen.iter().map(|(id, w)| model_card(id, w)).collect();
    Ok(HttpResponse::Ok().json(json!({"object": "list", "data": data})))
}

/// One model as OpenAI lists it; an adapter with its base model (`parent`), as vLLM does.
fn model_card(id: &str, w: &WorkerRecord) -> Value {
    let mut card =
        json!({"id": id, "object": "model", "created": w.added_at as u64, "owned_by": w.runtime});
    if let Some(base) = w.adapters.get(id) {
        card["parent"] = json!(base);
    }
    card
}

/// Why a worker gets no traffic, if it gets none.
fn not_routed_because(rec: &WorkerRecord, state: Option<&WorkerState>) -> Option<String> {
    match rec.status {
        WorkerStatus::Ready => match state.map(|s| s.circuit) {
            Some(CircuitState::Open) => Some("circuit open after repeated failures".into()),
            _ => None,
        },
        WorkerStatus::Draining => Some("draining: removal pending".into()),
        WorkerStatus::Pending | WorkerStatus::Unhealthy => rec
            .last_error
            .clone()
            .or_else(|| Some("not detected yet".into())),
    }
}

fn worker_json(
    rec: &WorkerRecord,
    states: &[WorkerState],
    events: Option<&WorkerEvents>,
    tokenizers: &HashMap<String, Slot>,
) -> Value {
    let whole = worker_state(states, rec.id);
    let state = whole.as_ref();
    let mut v = serde_json::to_value(rec).unwrap_or_else(|_| json!({}));
    v["id"] = json!(rec.id.to_string());
    v["healthy"] = json!(rec.healthy());
    v["in_flight"] = json!(state.map_or(0, |s| s.view.in_flight));
    v["circuit"] = json!(state.map_or(CircuitState::Closed, |s| s.circuit));
    v["recent_failures"] = json!(state.map_or(0, |s| s.recent_failures));
    v["reason"] = json!(not_routed_because(rec, state));
    // Whether the engine's own KV events feed the chain index, and how far.
    v["events"] = match (events, &rec.kv_events) {
        (Some(e), _) => json!(e),
        (None, Some(_)) => json!({"state": "connecting"}),
        (None, None) => json!({"state": "off", "reason": "no kv_events in /server_info"}),
    };
    // Whether text requests to it are matched on its events: its model's tokenizer.
    v["tokenizer"] = match rec.models.iter().find_map(|m| tokenizers.get(m)) {
        _ if rec.kv_events.is_none() => {
            json!({"state": "unused", "reason": "no KV events to match"})
        }
        None => json!({"state": "pending"}),
        Some(Slot::Loading(p)) => json!({"state": "loading", "path": p}),
        Some(Slot::Ready(t)) => json!({"state": "ready", "path": t.path(),
            "chat_template": t.has_chat_template()}),
        Some(Slot::Failed(e)) => json!({"state": "failed", "reason": e}),
        Some(Slot::Missing(r)) => json!({"state": "missing", "reason": r.to_string()}),
        Some(Slot::Render(_)) => json!({"state": "render",
            "reason": "no tokenizer here: the engine renders text prompts (vLLM's render routes)"}),
    };
    // What the poller last saw, summed over ranks; null without a fresh report.
    v["load"] = state
        .and_then(|s| s.view.load.as_ref())
        .map_or(Value::Null, crate::http::state::load_json);
    // Routed rank by rank: each rank's own count and circuit.
    v["routed_ranks"] = match rec.routed_ranks() {
        None => Value::Null,
        Some(_) => states
            .iter()
            .filter(|s| s.worker == rec.id)
            .map(|s| json!({"rank": s.rank, "in_flight": s.view.in_flight, "circuit": s.circuit}))
            .collect(),
    };
    v
}

async fn worker_list(state: &AppState) -> Result<Vec<Value>, ApiError> {
    let fleet = state.registry.send(ListWorkers).await?;
    let views = state.selector.send(GetWorkerStates).await?;
    let events = state.events.send(GetEventStates).await?;
    let tokenizers = state.tokenizers.all();
    Ok(fleet
        .iter()
        .map(|rec| worker_json(rec, &views, events.get(&rec.id), &tokenizers))
        .collect())
}

pub(crate) async fn list_workers(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.keys.admin(&req)?;
    let workers = worker_list(&state).await?;
    Ok(HttpResponse::Ok().json(json!({"total": workers.len(), "workers": workers})))
}

/// Percent-decodes a path segment (worker URLs arrive encoded).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

pub(crate) async fn get_worker(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.keys.admin(&req)?;
    let key = percent_decode(req.match_info().get("key").unwrap_or(""));
    let workers = worker_list(&state).await?;
    let norm = WorkerUrl::parse(&key).ok();
    workers
        .into_iter()
        .find(|w| {
            w["id"].as_str() == Some(key.as_str())
                || norm
                    .as_ref()
                    .is_some_and(|n| w["url"].as_str() == Some(n.as_str()))
        })
        .map(|w| HttpResponse::Ok().json(w))
        .ok_or(ApiError::WorkerNotFound(key))
}

/// `POST /workers`: kvgate's body, which is also the reference gateway's (`url`,
/// `api_key`, `worker_type`, and fields kvgate takes but does not use: `model_id`,
/// `priority`, `cost`, `labels`, any other), so a migrating script's body is accepted.
#[derive(Deserialize)]
struct AddBody {
    url: String,
    /// The key this worker expects, if not `--worker-api-key`.
    #[serde(default)]
    api_key: Option<Secret>,
    /// `regular` (or absent): the only kind kvgate serves.
    #[serde(default)]
    worker_type: Option<String>,
    /// The engine's own `--kv-events-config` (the JSON object, or its text), for an engine
    /// that does not advertise its KV events (vLLM): two engines on one host with their
    /// own event ports, say.
    #[serde(default)]
    kv_events_config: Option<Value>,
    /// Everything else, shown back in the answer as `ignored_fields`.
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
}

async fn add(
    state: &AppState,
    url: String,
    api_key: Option<Secret>,
    kv_events_config: Option<String>,
) -> Result<WorkerRecord, ApiError> {
    let parsed = WorkerUrl::parse(&url).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    if api_key.as_ref().is_some_and(|k| !k.is_usable()) {
        return Err(ApiError::BadRequest(
            "api_key must be non-empty visible ASCII".into(),
        ));
    }
    if let Err(why) = state.allow.check(parsed.host(), parsed.port()).await {
        return Err(ApiError::WorkerNotAllowed {
            url: parsed.to_string(),
            why: why.to_string(),
        });
    }
    state.guard.watch(parsed.host());
    Ok(state
        .registry
        .send(AddWorker {
            url,
            source: WorkerSource::Api,
            api_key,
            kv_events_config,
        })
        .await??)
}

/// Drains a worker (no new requests; those in flight finish, for at most the grace
/// period), then removes it.
async fn drain_and_remove(state: &AppState, key: String) -> Result<WorkerRecord, ApiError> {
    let rec = state
        .registry
        .send(DrainWorker { key: key.clone() })
        .await??;
    let until = Instant::now() + state.grace;
    loop {
        let states = state.selector.send(GetWorkerStates).await?;
        let busy = worker_state(&states, rec.id).is_some_and(|s| s.view.in_flight > 0);
        if !busy || Instant::now() >= until {
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(state.registry.send(RemoveWorker { key }).await??)
}

/// Largest body `POST /workers` reads; a worker URL needs far less.
const ADMIN_BODY_LIMIT: usize = 1024 * 1024;

pub(crate) async fn post_worker(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.keys.admin(&req)?;
    // Read like an inference body, so a size or transfer error is a JSON error too.
    let body = read_body(&req, payload, ADMIN_BODY_LIMIT).await?;
    let b: AddBody = serde_json::from_slice(&body).map_err(|e| {
        if e.is_data() {
            ApiError::BadRequest(format!("expected {{\"url\": \"http://host:port\"}}: {e}"))
        } else {
            ApiError::InvalidJson(e.to_string())
        }
    })?;
    if let Some(t) = b.worker_type.as_deref().filter(|t| *t != "regular") {
        return Err(ApiError::BadRequest(format!(
            "worker_type {t:?} is not served: kvgate routes regular workers only (no prefill/decode disaggregation); use \"regular\" or leave it out"
        )));
    }
    if !b.rest.is_empty() {
        let names: Vec<&str> = b.rest.keys().map(String::as_str).collect();
        tracing::info!(worker = %b.url, fields = ?names, "worker body fields kvgate does not use");
    }
    let events = match b.kv_events_config {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(o @ Value::Object(_)) => Some(o.to_string()),
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "kv_events_config must be the engine's --kv-events-config JSON (an object or its text), not {other}"
            )));
        }
    };
    let rec = add(&state, b.url, b.api_key, events).await?;
    let mut shown = worker_json(&rec, &[], None, &state.tokenizers.all());
    shown["ignored_fields"] = Value::Object(b.rest);
    Ok(HttpResponse::build(StatusCode::CREATED)
        .insert_header(("location", format!("/workers/{}", rec.id)))
        .json(shown))
}

pub(crate) async fn delete_worker(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.keys.admin(&req)?;
    let key = percent_decode(req.match_info().get("key").unwrap_or(""));
    let rec = drain_and_remove(&state, key).await?;
    let mut body = json!({"status": "removed", "worker": worker_json(&rec, &[], None, &state.tokenizers.all())});
    // Its pod may still be Ready: the caller learns here that discovery will not bring it
    // straight back, and what will.
    if let Some(pod) = &rec.kubernetes {
        body["excluded_until"] = json!("pod_change");
        body["message"] = json!(format!(
            "pod {}/{} stays out while it is as it was; it comes back when the pod changes (unready and ready again, or a new IP or uid) or the gateway restarts",
            pod.namespace, pod.pod
        ));
    }
    Ok(HttpResponse::Ok().json(body))
}

#[derive(Deserialize)]
pub(crate) struct UrlQuery {
    url: Option<String>,
}

fn query_url(q: UrlQuery) -> Result<String, ApiError> {
    q.url
        .filter(|u| !u.is_empty())
        .ok_or_else(|| ApiError::BadRequest("the 'url' query parameter is required".into()))
}

pub(crate) async fn legacy_add(
    req: HttpRequest,
    q: web::Query<UrlQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.keys.admin(&req)?;
    let rec = add(&state, query_url(q.into_inner())?, None, None).await?;
    Ok(HttpResponse::Ok().json(json!({
        "status": "success",
        "message": format!("Successfully added worker: {}", rec.url),
        "worker": worker_json(&rec, &[], None, &state.tokenizers.all()),
    })))
}

pub(crate) async fn legacy_remove(
    req: HttpRequest,
    q: web::Query<UrlQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.keys.admin(&req)?;
    let key = query_url(q.into_inner())?;
    let rec = drain_and_remove(&state, key).await?;
    Ok(HttpResponse::Ok().json(json!({
        "status": "success",
        "message": format!("Successfully removed worker: {}", rec.url),
    })))
}

pub(crate) async fn legacy_list(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.keys.admin(&req)?;
    let fleet = state.registry.send(ListWorkers).await?;
    let urls: Vec<&str> = fleet.iter().map(|w| w.url.as_str()).collect();
    Ok(HttpResponse::Ok().json(json!({"urls": urls})))
}

/// Why one worker's `/flush_cache` failed.
#[derive(Debug, thiserror::Error)]
enum FlushError {
    #[error("no answer within {0} s")]
    Timeout(u64),
    #[error("status {status}: {body}")]
    Status { status: u16, body: String },
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

/// How long one worker's `/flush_cache` may take.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(30);

async fn flush_one(pool: &Pool, url: &WorkerUrl, key: Option<&Secret>) -> Result<(), FlushError> {
    let auth = key.map(|k| format!("Bearer {}", k.expose()));
    let headers: Vec<(&str, &[u8])> = auth
        .iter()
        .map(|a| ("authorization", a.as_bytes()))
        .collect();
    let call = async {
        let resp = pool
            .post(url, "/flush_cache", &headers, Bytes::new())
            .await?;
        let status = resp.status;
        let body = resp.body.collect(4096).await.unwrap_or_default();
        Ok::<_, UpstreamError>((status, body))
    };
    match actix_rt::time::timeout(FLUSH_TIMEOUT, call).await {
        Err(_) => Err(FlushError::Timeout(FLUSH_TIMEOUT.as_secs())),
        Ok(Ok((status, _))) if status.is_success() => Ok(()),
        Ok(Ok((status, body))) => Err(FlushError::Status {
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body).into_owned(),
        }),
        Ok(Err(e)) => Err(e.into()),
    }
}

/// Fans `/flush_cache` out to every ready worker; the index forgets what a flushed worker
/// held, since its cache is now empty.
pub(crate) async fn flush_cache(
    req: HttpRequest,
    state: web::Data<AppState>,
    pool: web::Data<Pool>,
) -> Result<HttpResponse, ApiError> {
    state.keys.admin(&req)?;
    let fleet = state.registry.send(ListWorkers).await?;
    let pool: &Pool = &pool;
    let calls = fleet
        .iter()
        .filter(|w| w.healthy())
        .map(|w| async move { (w, flush_one(pool, &w.url, w.api_key.as_ref()).await) });
    let results = futures_util::future::join_all(calls).await;
    let mut flushed = 0;
    let mut failed = Vec::new();
    for (w, outcome) in results {
        match outcome {
            Ok(()) => {
                flushed += 1;
                for (target, _) in w.targets() {
                    state.index.do_send(ClearWorker(target));
                }
            }
            Err(e) => failed.push(json!({"worker": w.url, "error": e.to_string()})),
        }
    }
    let total = fleet.len();
    let status = if failed.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::PARTIAL_CONTENT
    };
    Ok(HttpResponse::build(status).json(json!({
        "status": if failed.is_empty() { "success" } else { "partial_success" },
        "workers_flushed": flushed,
        "total_workers": total,
        "failed": failed,
    })))
}

/// What the prefix index holds, per model and worker.
pub(crate) async fn index_stats(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.keys.admin(&req)?;
    let (stats, persist) = state.index.send(GetIndexStats).await?;
    let fleet = state.registry.send(ListWorkers).await?;
    // Tenants are routing targets: a worker, or one rank of a worker routed by rank.
    let targets: HashMap<WorkerId, (String, Option<u32>)> = (fleet.iter())
        .flat_map(|r| {
            let url = r.url.to_string();
            r.targets()
                .into_iter()
                .map(move |(t, rank)| (t, (url.clone(), rank)))
        })
        .collect();
    let models: Vec<Value> = stats
        .iter()
        .map(|m| {
            let per: Vec<Value> = (m.per_worker.iter())
                .map(|(w, n)| {
                    let (url, rank) = targets.get(w).cloned().unzip();
                    json!({"worker": w.to_string(), "units": n, "url": url, "rank": rank.flatten()})
                })
                .collect();
            json!({
                "model": m.model,
                "text_units": m.text_units,
                "token_units": m.token_units,
                "hash_keys": m.hash_keys,
                "per_worker": per,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({"models": models, "persistence": persist})))
}

/// The inference routes kvgate serves, for the 404 of any other `/v1/` path.
const SERVED_ROUTES: &str = "POST /v1/chat/completions, POST /v1/completions, POST /generate, POST /v1/responses, POST /v1/messages, POST /v1/embeddings, POST /v1/rerank, POST /rerank, POST /v1/score, POST /v1/classify, POST /v1/tokenize, POST /v1/detokenize, POST /v1/audio/transcriptions, GET /v1/models, GET /v1/models/{id}";

pub(crate) async fn not_found(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let what = format!("{} {}", req.method(), req.path());
    Err(ApiError::RouteNotFound(if req.path().starts_with("/v1/") {
        format!("{what}; kvgate serves {SERVED_ROUTES}")
    } else {
        what
    }))
}

/// `GET /v1/models/{id}`: one model of the union, as OpenAI answers it.
pub(crate) async fn model(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.keys.client(&req)?;
    let id = percent_decode(req.match_info().get("id").unwrap_or(""));
    let fleet = state.registry.send(ListWorkers).await?;
    let w = (fleet.iter())
        .find(|w| w.models.contains(&id))
        .ok_or_else(|| ApiError::ModelNotFound(id.clone()))?;
    Ok(HttpResponse::Ok().json(model_card(&id, w)))
}

pub(crate) async fn method_not_allowed(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed {
        method: req.method().to_string(),
        path: req.path().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::percent_decode;

    #[test]
    fn decodes_urls() {
        assert_eq!(percent_decode("http%3A%2F%2Fa%3A8000"), "http://a:8000");
        assert_eq!(percent_decode("abc"), "abc");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
