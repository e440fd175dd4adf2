//! The proxied inference routes: admission, then a decision and an attempt, and another
//! decision elsewhere when an attempt fails before any byte reached the client.

use std::sync::Arc;
use std::time::Instant;

use actix_web::http::ConnectionType;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use bytes::Bytes;
use kvgate_policies::{RequestFacts, WorkerId};
use tracing::warn;

use crate::actors::index::ForgetPrefix;
use crate::actors::selector::{self, SelectError};
use crate::http::decisions::{Decided, is_text};
use crate::http::error::ApiError;
use crate::http::intake;
use kvgate_core::Endpoint;

use crate::http::parse::request_facts;
use crate::http::proxy::{self, Upstream};
use crate::http::routes::{AppState, RequestId, read_body};
use crate::http::tokens;
use crate::upstream::Pool;

/// The first usable routing key among the headers, in order.
fn routing_key(req: &HttpRequest) -> Option<String> {
    proxy::ROUTING_KEY_NAMES
        .iter()
        .filter_map(|h| req.headers().get(h))
        .find_map(|v| kvgate_policies::valid_routing_key(v.to_str().ok()))
        .map(str::to_owned)
}

/// The routing facts of a body: the prompt as text or tokens (the engine's own, when the
/// model has a tokenizer), the model, the sticky key.
async fn facts_of(
    endpoint: Endpoint,
    req: &HttpRequest,
    body: &Bytes,
    state: &AppState,
) -> Result<RequestFacts, ApiError> {
    let mut facts = request_facts(endpoint, body, state.reads_prompt)?;
    facts.routing_key = routing_key(req);
    tokens::tokenize(&state.tokenizers, endpoint, body, &mut facts).await;
    Ok(facts)
}

/// What the route learns of a request as it is proxied.
struct Seen {
    /// The request's model once a worker serving it was chosen: the label takes only
    /// models the fleet serves.
    served: Option<Arc<str>>,
    /// The body as the intake reads it, until it is read.
    claim: Option<intake::BodyClaim>,
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
    let arrived = Instant::now();
    let metrics = state.metrics.clone();
    // Taken first: a request refused before its body is needed lets the body go.
    let mut seen = Seen {
        served: None,
        claim: intake::claim(&req),
    };
    if let Some(c) = &seen.claim {
        c.hold().await;
    }
    let answer = tracing::Instrument::instrument(
        proxy_request(endpoint, req, payload, state, pool, arrived, &mut seen),
        span,
    )
    .await;
    let Seen { served, claim } = seen;
    let status = match &answer {
        Ok(resp) => resp.status().as_u16(),
        Err(e) => actix_web::ResponseError::status_code(e).as_u16(),
    };
    metrics.request(endpoint, status, served.as_ref());
    // A relayed answer's duration is taken when it ends; an error's now.
    if answer.is_err() {
        metrics
            .route(endpoint)
            .duration
            .observe(arrived.elapsed().as_secs_f64());
    }
    match answer {
        // Refused with its body still coming (the claim was never used): the connection
        // closes after the answer, as actix-http closes one whose body was left unread,
        // rather than reading the rest of the body for nothing.
        Err(e) if claim.is_some() => {
            let mut resp = actix_web::ResponseError::error_response(&e);
            resp.head_mut().set_connection_type(ConnectionType::Close);
            Ok(resp)
        }
        answer => answer,
    }
}

async fn proxy_request(
    endpoint: Endpoint,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    pool: web::Data<Pool>,
    arrived: Instant,
    seen: &mut Seen,
) -> Result<HttpResponse, ApiError> {
    state.keys.client(&req)?;
    let peer = req.peer_addr().map(|a| a.ip());
    let mut ticket = Some(
        state
            .admission
            .admit(state.keys.client_id(&req), peer)
            .await?,
    );
    let read = async {
        match seen.claim.take() {
            Some(c) => c
                .body()
                .await
                .map_err(|e| ApiError::BadRequest(format!("reading the body: {e}"))),
            None => read_body(&req, payload, state.max_payload_size).await,
        }
    };
    let body = actix_rt::time::timeout(state.body_timeout, read)
        .await
        .map_err(|_| ApiError::BodyTimeout(state.body_timeout.as_secs_f64()))??;
    let mut facts = facts_of(endpoint, &req, &body, &state).await?;
    let request_id = req
        .extensions()
        .get::<RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_else(|| Arc::from(""));
    let mut up = Upstream {
        pool: &pool,
        path: endpoint.path(),
        request_id: &request_id,
        timeout: state.request_timeout,
        deadline: Instant::now() + state.request_timeout,
        first_token_timeout: state.first_token_timeout,
        max_response: 256 * 1024 * 1024,
        stream: facts.stream,
        pass_authorization: !state.keys.any(),
        attempt: 1,
    };
    let mut exclude: Vec<WorkerId> = Vec::new();
    let mut last: Option<proxy::Failure> = None;
    let mut attempt = 1;
    let mut restarted = false;
    loop {
        let (text, facts_stream) = (is_text(&facts.key), facts.stream);
        let mut d = match selector::select(&state.selector, facts, exclude.clone(), attempt).await?
        {
            Ok(d) => d,
            // The selector rebuilt its state after a failed decision: ask once more, on
            // the fresh state (a second failure is this request's own answer).
            Err(SelectError::Restarted) if !restarted => {
                restarted = true;
                facts = facts_of(endpoint, &req, &body, &state).await?;
                continue;
            }
            // Every worker left was tried: the client gets the last failure, not a 503.
            Err(e) => {
                return match last {
                    Some(f) => f.into_answer(),
                    None => Err(e.into()),
                };
            }
        };
        let (worker, target, url, recorded) =
            (d.worker, d.target, d.url.clone(), d.recorded.clone());
        state.metrics.dispatched(d.decision.path, attempt);
        seen.served.clone_from(&d.model);
        // The log takes the decision itself; the attempt needs none of it.
        let note = state.decisions.decided(
            &mut d.decision,
            Decided {
                request_id: &request_id,
                model: d.model.take(),
                endpoint,
                attempt,
                worker_url: url.clone(),
                text,
                bytes_per_token: state.bytes_per_token,
                arrived,
                stream: facts_stream,
            },
        );
        up.attempt = attempt;
        let failure = match proxy::forward(&up, &req, body.clone(), d, &mut ticket, note).await {
            Ok(resp) => return Ok(resp),
            Err(f) => f,
        };
        let next = facts_of(endpoint, &req, &body, &state).await?;
        if let Some((model, keep)) = recorded {
            // Nothing of the failed attempt stays in the index.
            state.index.do_send(ForgetPrefix {
                model,
                key: next.key.clone(),
                worker: target,
                keep,
            });
        }
        let out_of_time = Instant::now() >= up.deadline;
        if !failure.retry || attempt >= state.retry.attempts() || out_of_time {
            if failure.retry {
                warn!(request_id = %request_id, worker = %url, attempt, error = %failure.error, "attempt failed; no retry left");
            }
            return failure.into_answer();
        }
        warn!(request_id = %request_id, worker = %url, attempt, error = %failure.error, "attempt failed; trying another worker");
        exclude.push(worker);
        attempt += 1;
        let wait = state.retry.backoff(attempt, &mut rand::thread_rng());
        let left = up.deadline.saturating_duration_since(Instant::now());
        actix_rt::time::sleep(wait.min(left)).await;
        facts = next;
        last = Some(failure);
    }
}
