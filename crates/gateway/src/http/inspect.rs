//! Inspection routes: `POST /admin/explain` (a dry-run decision for a request body),
//! `GET /admin/decisions` (the decision log), `GET /metrics`, `GET /admin/state` and
//! `GET /dashboard` (the fleet page).

use std::collections::HashMap;
use std::sync::Arc;

use actix_web::{HttpRequest, HttpResponse, web};
use kvgate_policies::{CandidateScore, RoutingText, WorkerId, WorkerView};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::actors::events::{EventState, GetEventStates, WorkerEvents};
use crate::actors::index::{GetIndexStats, IndexStats};
use crate::actors::registry::ListWorkers;
use crate::actors::selector::{
    CircuitState, Explain, Explained, GetViews, GetWorkerStates, WorkerState, worker_state,
};
use crate::http::error::ApiError;
use crate::http::history::{self, percentile};
use crate::http::inference;
use kvgate_core::Endpoint;

use crate::http::state::{AppState, load_json, read_body};
use crate::metrics::{Fleet, FleetWorker};

/// The inference route a name stands for: a path (`/v1/chat/completions`, with or without
/// the leading slash) or a short name (`chat`, `completions`, `generate`, `responses`,
/// `messages`).
fn endpoint_named(name: &str) -> Option<Endpoint> {
    let name = name.trim_start_matches('/');
    match name {
        "chat" | "chat/completions" => Some(Endpoint::Chat),
        "completions" => Some(Endpoint::Completions),
        "responses" => Some(Endpoint::Responses),
        "messages" => Some(Endpoint::Messages),
        _ => (Endpoint::ALL.into_iter())
            .find(|e| *e != Endpoint::Other && e.path().trim_start_matches('/') == name),
    }
}

fn unknown_route(name: &str) -> ApiError {
    ApiError::BadRequest(format!(
        "unknown route '{name}': expected an inference route's path (/v1/chat/completions, /v1/completions, /generate, /v1/responses, /v1/messages, ...) or chat, completions, generate, responses, messages"
    ))
}

/// `POST /admin/explain[/{route}]`: the decision the gateway would make for this body now,
/// with nothing dispatched, credited or recorded.
pub(crate) async fn explain(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.keys.admin(&req)?;
    let body = read_body(&req, payload, state.max_payload_size).await?;
    let suffix = req.match_info().get("route").filter(|r| !r.is_empty());
    let field = match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(m)) => m.get("route").cloned(),
        Ok(_) => {
            return Err(ApiError::BadRequest(
                "the body must be a JSON object, as sent to an inference route".into(),
            ));
        }
        Err(e) => return Err(ApiError::BadRequest(format!("invalid JSON body: {e}"))),
    };
    let endpoint = match (suffix, field) {
        (Some(s), _) => endpoint_named(s).ok_or_else(|| unknown_route(s))?,
        (None, Some(Value::String(s))) => endpoint_named(&s).ok_or_else(|| unknown_route(&s))?,
        (None, Some(other)) => {
            return Err(ApiError::BadRequest(format!(
                "'route' must be a string, not {other}"
            )));
        }
        (None, None) => {
            return Err(ApiError::BadRequest(
                "say which route the body is for: a 'route' field or a path suffix, as in /admin/explain/v1/chat/completions".into(),
            ));
        }
    };
    let (facts, source) = inference::facts_of(endpoint, &req, &body, &state).await?;
    let mut prompt = match &facts.key {
        RoutingText::Text(t) => json!({"kind": "text", "bytes": t.len(),
            "estimated_tokens": (t.len() as f64 / state.pipeline.bytes_per_token().max(f64::MIN_POSITIVE)).ceil() as u64}),
        RoutingText::Tokens(t) => json!({"kind": "tokens", "tokens": t.len()}),
        RoutingText::Empty => json!({"kind": "none"}),
    };
    // Where the tokens came from, or why the text is matched as text.
    prompt["tokens_from"] = json!(source);
    let model = facts.model.clone();
    let explained = state
        .selector
        .send(Explain {
            facts: Arc::new(facts),
        })
        .await??;
    let targets = state.selector.send(GetWorkerStates).await?;
    let events = state.events.send(GetEventStates).await?;
    let mut out = decision_json(&explained, &targets, &events);
    if let Value::Object(m) = &mut out {
        m.insert("route".into(), json!(endpoint.path()));
        m.insert("model".into(), json!(model));
        m.insert("prompt".into(), prompt);
        m.insert("dispatched".into(), json!(false));
    }
    Ok(HttpResponse::Ok().json(out))
}

/// A decision with every candidate's scores, load figures and URL, and which index
/// matched each candidate.
fn decision_json(
    e: &Explained,
    targets: &[WorkerState],
    events: &HashMap<WorkerId, WorkerEvents>,
) -> Value {
    let d = &e.decision;
    let by_id: HashMap<_, _> = targets.iter().map(|t| (t.view.id, t)).collect();
    let url = |id| by_id.get(&id).map(|t| t.view.url.to_string());
    let candidates: Vec<Value> = d
        .candidates
        .iter()
        .map(|c| {
            let target = by_id.get(&c.worker).copied();
            let mut j = candidate_json(c, target.map(|t| &t.view), d.worker == Some(c.worker));
            // A rank routed on its own: which one, and the worker it is a rank of.
            if let Some(t) = target.filter(|t| t.rank.is_some()) {
                j["rank"] = json!(t.rank);
                j["worker_id"] = json!(t.worker.to_string());
                j["target_id"] = json!(c.worker.to_string());
            }
            // Which index matched it, as the selector used them: the engine's own KV
            // events, or the approximate index.
            let worker = target.map_or(c.worker, |t| t.worker);
            let state = events.get(&worker).map_or(EventState::Off, |e| e.state);
            j["events"] = json!(state);
            j["matched_by"] = json!(if e.from_events.contains(&c.worker) {
                "kv_events"
            } else {
                "index"
            });
            j
        })
        .collect();
    let chosen = d.worker.and_then(|w| by_id.get(&w).copied());
    json!({
        "worker": d.worker.and_then(url),
        "worker_id": chosen.map_or(d.worker, |t| Some(t.worker)).map(|w| w.to_string()),
        "rank": chosen.and_then(|t| t.rank),
        "path": d.path.name(),
        "rule": d.rule,
        "notes": d.notes.iter().map(|n| n.name()).collect::<Vec<_>>(),
        "match_rate": d.match_rate,
        "credit_tokens": d.credit_tokens,
        "record_prefix": d.record_prefix,
        "new_prefix": d.new_prefix,
        "reason": d.to_string(),
        "candidates": candidates,
    })
}

fn candidate_json(c: &CandidateScore, view: Option<&WorkerView>, chosen: bool) -> Value {
    // In cost mode the score is the expected wait plus the priced prefill.
    let expected_wait = match (c.score, c.prefill) {
        (Some(s), Some(p)) => Some(s - p),
        (s, None) => s,
        (None, Some(_)) => None,
    };
    let load = view.and_then(|v| v.load.as_ref()).map(load_json);
    json!({
        "worker": view.map(|v| v.url.to_string()),
        "worker_id": c.worker.to_string(),
        "chosen": chosen,
        "eligible": view.is_some_and(|v| v.eligible),
        "matched": c.matched,
        "score": c.score,
        "expected_wait": expected_wait,
        "prefill": c.prefill,
        "in_flight": c.in_flight,
        "gated": c.gated,
        "prefix_traffic": c.prefix_traffic,
        "recent": c.recent,
        "last_start": c.last_start,
        "placement_rank": c.placement_rank,
        "prefill_rate": c.prefill_rate,
        "credit_tokens": view.map(|v| v.credit.tokens),
        "load": load,
    })
}

#[derive(Debug, Deserialize)]
pub(crate) struct DecisionsQuery {
    limit: Option<usize>,
    since: Option<u64>,
}

/// Most decisions one call returns.
const MAX_DECISIONS: usize = 1024;

/// `GET /admin/decisions?limit=N&since=SEQ`: the newest N decisions, or the first N after
/// SEQ (for following), oldest first, with each candidate's URL.
pub(crate) async fn decisions(
    req: HttpRequest,
    query: web::Query<DecisionsQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.keys.admin(&req)?;
    let limit = query.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_DECISIONS {
        return Err(ApiError::BadRequest(format!(
            "limit must be between 1 and {MAX_DECISIONS}"
        )));
    }
    let mut records = state.pipeline.decisions().read(limit, query.since);
    let views = state.selector.send(GetViews).await?;
    let urls: HashMap<_, _> = views.iter().map(|v| (v.id, v.url.to_string())).collect();
    for r in &mut records {
        for c in &mut r.candidates {
            c.worker = urls.get(&c.worker_id).cloned();
        }
    }
    let last = records.last().map(|r| r.seq).or(query.since);
    Ok(HttpResponse::Ok().json(json!({"decisions": records, "last_seq": last})))
}

/// `GET /metrics` on the gateway port (behind the admin key when admin keys are set).
pub(crate) async fn metrics(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.keys.admin(&req)?;
    scrape(&state).await
}

/// `GET /metrics` on `--prometheus-port`: no key (bind it where only Prometheus reaches).
pub(crate) async fn open_metrics(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    scrape(&state).await
}

async fn scrape(state: &AppState) -> Result<HttpResponse, ApiError> {
    let records = state.registry.send(ListWorkers).await?;
    let states = state.selector.send(GetWorkerStates).await?;
    let (stats, persist) = state.index.send(GetIndexStats).await?;
    let events = state.events.send(GetEventStates).await?;
    // Index tenants are routing targets: each rank of a worker routed by rank counts for it.
    let urls: HashMap<_, _> = (records.iter())
        .flat_map(|r| r.targets().into_iter().map(|(t, _)| (t, r.url.to_string())))
        .collect();
    let fleet = Fleet {
        workers: records
            .iter()
            .map(|r| {
                let whole = worker_state(&states, r.id);
                let s = whole.as_ref();
                let e = events.get(&r.id);
                FleetWorker {
                    events_state: match e.map(|e| e.state) {
                        None | Some(EventState::Off) => 0,
                        Some(EventState::Connecting) => 1,
                        Some(EventState::Live) => 2,
                        Some(EventState::Stalled) => 3,
                        Some(EventState::Refused) => 4,
                    },
                    event_blocks: e.map_or(0, |e| e.blocks),
                    url: r.url.to_string(),
                    healthy: r.healthy(),
                    in_flight: s.map_or(0, |s| s.view.in_flight),
                    circuit: match s.map(|s| s.circuit) {
                        Some(CircuitState::Open) => 2,
                        Some(CircuitState::HalfOpen) => 1,
                        _ => 0,
                    },
                    ranks: s
                        .and_then(|s| s.view.load.as_ref())
                        .map(|l| l.ranks.clone())
                        .unwrap_or_default(),
                }
            })
            .collect(),
        index: index_series(&stats, &urls),
        snapshots_written: persist.snapshots_written,
        snapshot_failures: persist.write_failures,
        snapshot_pending: persist.pending,
    };
    let body = state
        .metrics
        .encode(&fleet)
        .map_err(|e| ApiError::Internal(format!("encoding the metrics: {e}")))?;
    Ok(HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(body))
}

/// Answers the TTFT percentiles are taken over.
const TTFT_WINDOW: usize = 200;
/// How far back the fleet page's decisions per path go (the log's last 1024 at most).
const RECENT_WINDOW_MS: u64 = 5 * 60 * 1000;

/// `GET /admin/state`: the fleet and the gateway's counters in one document, for the
/// fleet page (`/dashboard`) and scripts.
pub(crate) async fn fleet_state(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.keys.admin(&req)?;
    let records = state.registry.send(ListWorkers).await?;
    let states = state.selector.send(GetWorkerStates).await?;
    let (stats, _) = state.index.send(GetIndexStats).await?;
    let worker_of: HashMap<WorkerId, WorkerId> = (records.iter())
        .flat_map(|r| r.targets().into_iter().map(|(t, _)| (t, r.id)))
        .collect();
    let mut units: HashMap<_, usize> = HashMap::new();
    for m in &stats {
        for (w, n) in &m.per_worker {
            *units
                .entry(worker_of.get(w).copied().unwrap_or(*w))
                .or_default() += n;
        }
    }
    let total_units: usize = units.values().sum();
    let workers: Vec<Value> = records
        .iter()
        .map(|r| {
            let whole = worker_state(&states, r.id);
            let s = whole.as_ref();
            let held = units.get(&r.id).copied().unwrap_or(0);
            json!({
                "url": r.url.as_str(),
                "id": r.id.to_string(),
                "models": r.models,
                "status": r.status,
                "healthy": r.healthy(),
                "circuit": s.map(|s| s.circuit),
                "in_flight": s.map_or(0, |s| s.view.in_flight),
                "load": s.and_then(|s| s.view.load.as_ref()).map(load_json),
                "index_units": held,
                "index_share": if total_units > 0 { held as f64 / total_units as f64 } else { 0.0 },
            })
        })
        .collect();
    let m = &state.metrics;
    let now_ms = (kvgate_core::clock::unix_now() * 1000.0) as u64;
    let recent: serde_json::Map<String, Value> = state
        .pipeline
        .decisions()
        .paths_within(std::time::Duration::from_millis(RECENT_WINDOW_MS))
        .into_iter()
        .map(|(p, n)| (p.to_owned(), json!(n)))
        .collect();
    let mut ttfts = state.pipeline.decisions().recent_ttfts(TTFT_WINDOW);
    let paths: serde_json::Map<String, Value> = m
        .decision_counts()
        .into_iter()
        .map(|(p, n)| (p.to_owned(), json!(n)))
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "time_unix_ms": now_ms,
        "workers": workers,
        "requests_total": m.requests_total(),
        "decisions_by_path": paths,
        "recent_decisions": {"window_secs": RECENT_WINDOW_MS / 1000, "by_path": recent},
        "cached_tokens": {
            "predicted": m.predicted_cached.get(),
            "reported": m.reported_cached.get(),
        },
        "ttft_ms": {
            "window": ttfts.len(),
            "p50": percentile(&mut ttfts, 50.0),
            "p99": percentile(&mut ttfts, 99.0),
        },
    })))
}

/// The index's holdings per model, worker URL and unit (`bytes`, `tokens`), for
/// `kvgate_index_units`.
fn index_series(
    stats: &[IndexStats],
    urls: &HashMap<WorkerId, String>,
) -> Vec<(String, String, &'static str, usize)> {
    let mut out = Vec::new();
    for m in stats {
        for (w, text, tokens) in &m.per_worker_split {
            let url = urls.get(w).cloned().unwrap_or_else(|| w.to_string());
            for (unit, n) in [("bytes", *text), ("tokens", *tokens)] {
                if n > 0 {
                    out.push((m.model.clone(), url.clone(), unit, n));
                }
            }
        }
    }
    out
}

/// `GET /dashboard`: the fleet page, one self-contained file (no CDN, nothing fetched but
/// `/admin/state`).
pub(crate) async fn dashboard() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header(("cache-control", "no-cache"))
        .body(DASHBOARD)
}

const DASHBOARD: &str = include_str!("dashboard.html");

/// `GET /admin/history`: the fleet page's chart, kept by the gateway (the last 15 minutes
/// at 5-second steps, oldest first).
pub(crate) async fn history(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.keys.admin(&req)?;
    Ok(HttpResponse::Ok().json(json!({
        "step_secs": history::STEP.as_secs(),
        "samples": state.history.read(),
    })))
}
