//! The proxied inference routes, the HTTP front door of the dispatch pipeline: the client
//! key, admission, the body and its facts (read once), then the pipeline's attempts, each
//! proxied to its worker (`proxy`).

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use actix_web::http::ConnectionType;
use actix_web::http::header;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use bytes::Bytes;
use kvgate_core::{BodyShape, Endpoint};
use kvgate_policies::RequestFacts;

use crate::facts::tokens::{self, TokenSource};
use crate::facts::{multipart_fields, read_request};
use crate::http::error::ApiError;
use crate::http::intake;
use crate::http::proxy::{self, Upstream};
use crate::http::state::{AppState, RequestId, read_body};
use crate::metrics::Door;
use crate::pipeline::{Job, RunError};
use crate::telemetry::RequestSpan;
use crate::upstream::Pool;

/// The first usable routing key among the headers, in order.
fn routing_key(req: &HttpRequest) -> Option<String> {
    proxy::ROUTING_KEY_NAMES
        .iter()
        .filter_map(|h| req.headers().get(h))
        .find_map(|v| kvgate_policies::valid_routing_key(v.to_str().ok()))
        .map(str::to_owned)
}

/// The request's session when its body named none (`prompt_cache_key`, read with its
/// facts): the first of the session headers it carries, else its routing key.
fn header_session(
    req: &HttpRequest,
    headers: &[actix_web::http::header::HeaderName],
    routing_key: Option<&String>,
) -> Option<String> {
    (headers.iter())
        .filter_map(|h| req.headers().get(h))
        .find_map(|v| kvgate_policies::valid_routing_key(v.to_str().ok()))
        .map(str::to_owned)
        .or_else(|| routing_key.cloned())
}

/// The routing facts of a body: the prompt as text or tokens (the engine's own, when the
/// model has a tokenizer), the model, the sticky key, and the worker that keeps the
/// answer it continues; and where its tokens came from. `POST /admin/explain` reads a body
/// through this too, so it explains what a dispatch would decide.
pub(crate) async fn facts_of(
    endpoint: Endpoint,
    req: &HttpRequest,
    body: &Bytes,
    state: &AppState,
) -> Result<(RequestFacts, TokenSource), ApiError> {
    let read = read_request(endpoint, body, state.reads_prompt)?;
    let mut facts = read.facts;
    if endpoint.shape() == BodyShape::Multipart {
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        (facts.model, facts.stream) = multipart_fields(body, ct)?;
    }
    facts.routing_key = routing_key(req);
    if facts.session.is_none() {
        facts.session = header_session(req, &state.session_headers, facts.routing_key.as_ref());
    }
    facts.pinned = read
        .continues
        .and_then(|id| state.answers.worker_of(&id))
        .map(|w| w.to_string());
    let source = tokens::tokenize(&state.tokenizers, endpoint, body, &mut facts).await;
    Ok((facts, source))
}

/// What the route learns of a request as it is proxied.
struct Seen {
    /// The request's model once a worker serving it was chosen: the label takes only
    /// models the fleet serves.
    served: Option<Arc<str>>,
    /// The body as the intake reads it, until it is read.
    claim: Option<intake::BodyClaim>,
    /// The request's span, with `--otlp-endpoint`; a streamed answer keeps it to its end.
    span: Option<Rc<RequestSpan>>,
}

/// Any inference route: `endpoint` says which body shape to read and where to forward.
pub(crate) async fn inference(
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
    let trace = (state.telemetry)
        .request_span(req.headers(), endpoint.path(), id.as_deref().unwrap_or(""))
        .map(Rc::new);
    let mut seen = Seen {
        served: None,
        claim: intake::claim(&req),
        span: trace,
    };
    if let Some(c) = &seen.claim {
        c.hold().await;
    }
    let answer = tracing::Instrument::instrument(
        proxy_request(endpoint, req, payload, state, pool, arrived, &mut seen),
        span,
    )
    .await;
    let Seen {
        served,
        claim,
        span: trace,
    } = seen;
    let status = match &answer {
        Ok(resp) => resp.status().as_u16(),
        Err(e) => actix_web::ResponseError::status_code(e).as_u16(),
    };
    if let Some(s) = trace {
        s.status(status);
    }
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

/// Any path no route serves: under `/v1/`, with `--passthrough-unknown-routes`, a `POST`
/// is forwarded to a worker chosen by load; otherwise a 404 that lists the routes served.
pub(crate) async fn passthrough(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    pool: web::Data<Pool>,
) -> Result<HttpResponse, ApiError> {
    if state.passthrough
        && req.method() == actix_web::http::Method::POST
        && req.path().starts_with("/v1/")
    {
        return inference(Endpoint::Other, req, payload, state, pool).await;
    }
    crate::http::routes::not_found(req).await
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
    // In picker mode the gateway in front proxies; this port keeps its admin routes.
    if !state.serves_inference {
        return Err(ApiError::RouteNotFound(endpoint.path().to_owned()));
    }
    state.keys.client(&req)?;
    let peer = state.proxies.client_ip(&req);
    let span = seen.span.clone();
    let admission = &state.pipeline.admission;
    admission.rate(state.keys.client_id(&req), peer)?;
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
    // A slot only once the body is here: a slow upload must not hold one. Handed to the
    // answer that relays a stream, so the slot is held until it ends.
    let ticket = Cell::new(Some(admission.slot().await?));
    let job = Job {
        facts: Arc::new(facts_of(endpoint, &req, &body, &state).await?.0),
        endpoint,
        request_id: req
            .extensions()
            .get::<RequestId>()
            .map_or_else(|| Arc::from(""), |r| r.0.clone()),
        arrived,
        door: Door::Http,
    };
    // A passthrough goes where it was sent; a query string goes with any route.
    let path = match (endpoint, req.uri().path_and_query()) {
        (Endpoint::Other, Some(pq)) => pq.as_str(),
        (_, Some(pq)) if pq.query().is_some() => pq.as_str(),
        _ => endpoint.path(),
    };
    let up = Upstream {
        pool: &pool,
        path,
        request_id: &job.request_id,
        timeout: state.request_timeout,
        deadline: Instant::now() + state.request_timeout,
        first_token_timeout: state.first_token_timeout,
        first_byte_timeout: state.first_byte_timeout,
        max_response: 256 * 1024 * 1024,
        stream: job.facts.stream,
        pass_authorization: !state.keys.any(),
        ends_with_done: endpoint.ends_with_done(),
        answers: (endpoint == Endpoint::Responses).then_some(&state.answers),
        span: span.as_ref(),
    };
    let served = &mut seen.served;
    let sent = state.pipeline.run(&job, up.deadline, |a| {
        served.clone_from(&a.dispatch.model);
        if let Some(s) = up.span {
            s.worker(a.dispatch.url.as_str(), a.number);
        }
        proxy::forward(&up, &req, body.clone(), a, &ticket)
    });
    match sent.await {
        Ok(resp) => Ok(resp),
        Err(RunError::Dispatch(e)) => Err(e.into()),
        Err(RunError::Failed(f)) => f.into_answer(),
    }
}
