//! HTTP handlers: inference routes (proxied), the gateway's own routes and the worker
//! admin API (REST and the sglang-router legacy forms).

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use actix_web::http::StatusCode;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use kvgate_policies::WorkerView;
use kvgate_poller::WorkerUrl;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::actors::index::{ClearWorker, GetIndexStats, IndexActor};
use crate::actors::registry::{
    AddWorker, ListWorkers, RegistryActor, RemoveWorker, WorkerRecord, WorkerSource,
};
use crate::actors::selector::{self, Dispatch, GetViews, SelectorActor};
use crate::http::error::ApiError;
use crate::http::parse::{Endpoint, request_facts};
use crate::http::proxy::{self, Upstream};
use crate::upstream::{Pool, UpstreamError};

/// Shared by every HTTP worker thread.
#[derive(Debug, Clone)]
pub struct AppState {
    pub selector: Addr<SelectorActor>,
    pub registry: Addr<RegistryActor>,
    pub index: Addr<IndexActor>,
    pub max_payload_size: usize,
    pub request_timeout: Duration,
}

/// The request id of this request, set by the middleware in `server.rs`.
#[derive(Debug, Clone)]
pub struct RequestId(pub Arc<str>);

/// Reads the body up to the limit; a declared length over it is refused before reading.
async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<Bytes, ApiError> {
    if let Some(len) = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > limit as u64
    {
        return Err(ApiError::PayloadTooLarge { size: len, limit });
    }
    let mut buf = BytesMut::new();
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

/// The first usable routing key among the headers, in order.
fn routing_key(req: &HttpRequest) -> Option<String> {
    proxy::ROUTING_KEY_NAMES
        .iter()
        .filter_map(|h| req.headers().get(h))
        .find_map(|v| kvgate_policies::valid_routing_key(v.to_str().ok()))
        .map(str::to_owned)
}

/// Any inference route: `endpoint` says which body shape to read and where to forward.
pub async fn inference(
    endpoint: Endpoint,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    pool: web::Data<Pool>,
) -> Result<HttpResponse, ApiError> {
    // A debug span: at the default info level it costs nothing on the hot path; the
    // request id is also in every warning the proxy logs.
    let id = req.extensions().get::<RequestId>().map(|r| r.0.clone());
    let span = tracing::debug_span!(
        "request",
        id = id.as_deref().unwrap_or(""),
        route = endpoint.path()
    );
    tracing::Instrument::instrument(proxy_request(endpoint, req, payload, state, pool), span).await
}

async fn proxy_request(
    endpoint: Endpoint,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    pool: web::Data<Pool>,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(&req, payload, state.max_payload_size).await?;
    let mut facts = request_facts(endpoint, &body)?;
    facts.routing_key = routing_key(&req);
    let stream = facts.stream;
    let Dispatch { url, booking, .. } =
        selector::select(&state.selector, facts, Vec::new()).await??;
    let request_id = req
        .extensions()
        .get::<RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_else(|| Arc::from(""));
    let up = Upstream {
        pool: &pool,
        worker: &url,
        path: endpoint.path(),
        request_id: &request_id,
        timeout: state.request_timeout,
        max_response: 256 * 1024 * 1024,
        stream,
    };
    proxy::forward(up, &req, body, booking).await
}

pub async fn health() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

pub async fn readiness(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let fleet = state.registry.send(ListWorkers).await?;
    let healthy = fleet.iter().filter(|w| w.healthy()).count();
    let body = |status: &str| json!({"status": status, "healthy_workers": healthy, "total_workers": fleet.len()});
    if healthy > 0 {
        Ok(HttpResponse::Ok().json(body("ready")))
    } else {
        let mut b = body("not ready");
        b["reason"] = json!("no healthy worker");
        Ok(HttpResponse::ServiceUnavailable().json(b))
    }
}

pub async fn models(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let fleet = state.registry.send(ListWorkers).await?;
    let mut seen = std::collections::BTreeMap::<&str, &WorkerRecord>::new();
    for w in fleet.iter() {
        for m in &w.models {
            seen.entry(m.as_str()).or_insert(w);
        }
    }
    let data: Vec<Value> = seen
        .iter()
        .map(|(id, w)| {
            json!({"id": id, "object": "model", "created": w.added_at as u64, "owned_by": w.runtime})
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({"object": "list", "data": data})))
}

fn worker_json(rec: &WorkerRecord, view: Option<&WorkerView>) -> Value {
    let mut v = serde_json::to_value(rec).unwrap_or_else(|_| json!({}));
    v["id"] = json!(rec.id.to_string());
    v["healthy"] = json!(rec.healthy());
    v["in_flight"] = json!(view.map_or(0, |v| v.in_flight));
    v
}

async fn worker_list(state: &AppState) -> Result<Vec<Value>, ApiError> {
    let fleet = state.registry.send(ListWorkers).await?;
    let views = state.selector.send(GetViews).await?;
    Ok(fleet
        .iter()
        .map(|rec| worker_json(rec, views.iter().find(|v| v.id == rec.id)))
        .collect())
}

pub async fn list_workers(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let workers = worker_list(&state).await?;
    Ok(HttpResponse::Ok().json(json!({"total": workers.len(), "workers": workers})))
}

/// Percent-decodes a path segment (worker URLs arrive encoded).
fn percent_decode(s: &str) -> String {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(h * 16 + l);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub async fn get_worker(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddBody {
    url: String,
}

async fn add(state: &AppState, url: String) -> Result<WorkerRecord, ApiError> {
    Ok(state
        .registry
        .send(AddWorker {
            url,
            source: WorkerSource::Api,
        })
        .await??)
}

/// Largest body `POST /workers` reads; a worker URL needs far less.
const ADMIN_BODY_LIMIT: usize = 1024 * 1024;

pub async fn post_worker(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    // Read like an inference body, so a size or transfer error is a JSON error too.
    let body = read_body(&req, payload, ADMIN_BODY_LIMIT).await?;
    let b: AddBody = serde_json::from_slice(&body).map_err(|e| {
        if e.is_data() {
            ApiError::BadRequest(format!("expected {{\"url\": \"http://host:port\"}}: {e}"))
        } else {
            ApiError::InvalidJson(e.to_string())
        }
    })?;
    let rec = add(&state, b.url).await?;
    Ok(HttpResponse::build(StatusCode::CREATED)
        .insert_header(("location", format!("/workers/{}", rec.id)))
        .json(worker_json(&rec, None)))
}

pub async fn delete_worker(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let key = percent_decode(req.match_info().get("key").unwrap_or(""));
    let rec = state.registry.send(RemoveWorker { key }).await??;
    Ok(HttpResponse::Ok().json(json!({"status": "removed", "worker": worker_json(&rec, None)})))
}

#[derive(Deserialize)]
pub struct UrlQuery {
    url: Option<String>,
}

fn query_url(q: UrlQuery) -> Result<String, ApiError> {
    q.url
        .filter(|u| !u.is_empty())
        .ok_or_else(|| ApiError::BadRequest("the 'url' query parameter is required".into()))
}

pub async fn legacy_add(
    q: web::Query<UrlQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let rec = add(&state, query_url(q.into_inner())?).await?;
    Ok(HttpResponse::Ok().json(json!({
        "status": "success",
        "message": format!("Successfully added worker: {}", rec.url),
        "worker": worker_json(&rec, None),
    })))
}

pub async fn legacy_remove(
    q: web::Query<UrlQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let key = query_url(q.into_inner())?;
    let rec = state.registry.send(RemoveWorker { key }).await??;
    Ok(HttpResponse::Ok().json(json!({
        "status": "success",
        "message": format!("Successfully removed worker: {}", rec.url),
    })))
}

pub async fn legacy_list(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
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

async fn flush_one(pool: &Pool, url: &WorkerUrl) -> Result<(), FlushError> {
    let call = async {
        let resp = pool.post(url, "/flush_cache", &[], Bytes::new()).await?;
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
pub async fn flush_cache(
    state: web::Data<AppState>,
    pool: web::Data<Pool>,
) -> Result<HttpResponse, ApiError> {
    let fleet = state.registry.send(ListWorkers).await?;
    let pool: &Pool = &pool;
    let calls = fleet
        .iter()
        .filter(|w| w.healthy())
        .map(|w| async move { (w, flush_one(pool, &w.url).await) });
    let results = futures_util::future::join_all(calls).await;
    let mut flushed = 0;
    let mut failed = Vec::new();
    for (w, outcome) in results {
        match outcome {
            Ok(()) => {
                flushed += 1;
                state.index.do_send(ClearWorker(w.id));
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
pub async fn index_stats(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (stats, persist) = state.index.send(GetIndexStats).await?;
    let models: Vec<Value> = stats
        .iter()
        .map(|m| {
            json!({
                "model": m.model,
                "text_units": m.text_units,
                "token_units": m.token_units,
                "hash_keys": m.hash_keys,
                "per_worker": m.per_worker.iter().map(|(w, n)| json!({"worker": w.to_string(), "units": n})).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({"models": models, "persistence": persist})))
}

pub async fn not_found(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::RouteNotFound(format!(
        "{} {}",
        req.method(),
        req.path()
    )))
}

pub async fn method_not_allowed(req: HttpRequest) -> Result<HttpResponse, ApiError> {
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
