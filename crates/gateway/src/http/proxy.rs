//! Forwards a request to the chosen worker and relays the answer: buffered when it is a
//! plain JSON body, chunk by chunk (byte for byte) when it streams. One attempt is four
//! named steps: [`send`] (the request out, the answer's head back), [`shed`] (a status
//! another worker may do better with), [`relay_stream`] and [`collect`]. `headers` says
//! which headers cross the gateway; `relay` is the stream relay.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, HttpResponseBuilder};
use bytes::{Bytes, BytesMut};
use kvgate_core::{Secret, WorkerUrl};
use tokio::sync::watch;

use crate::actors::registry::RankVia;
use crate::actors::selector::{Booking, Outcome};
use crate::http::answers::{IdCatcher, ResponseIds};
use crate::http::error::ApiError;
use crate::pipeline::{AnswerNote, Attempt, AttemptFailure, FailureKind, Ticket};
use crate::telemetry::RequestSpan;
use crate::upstream::{Body, Pool, Response, UpstreamError};

mod headers;
mod relay;

pub(crate) use headers::{ROUTING_KEY_NAMES, rank_member};
use headers::{copy_response_headers, request_headers_out};
use relay::{Relay, Tail};

/// What one upstream call needs besides the body and the worker.
pub(crate) struct Upstream<'a> {
    pub pool: &'a Pool,
    /// The path (and query) the request goes to on the worker.
    pub path: &'a str,
    pub request_id: &'a str,
    /// The whole request's timeout (`--request-timeout-secs`), retries included.
    pub timeout: Duration,
    /// When it runs out.
    pub deadline: Instant,
    /// Longest wait for a streamed answer's first byte.
    pub first_token_timeout: Duration,
    /// Longest wait for a plain answer's head (it comes when generation ends).
    pub first_byte_timeout: Duration,
    pub max_response: usize,
    pub stream: bool,
    /// The client's `Authorization` goes to the worker only when the gateway checks no
    /// keys of its own: a gateway key is never handed to an engine.
    pub pass_authorization: bool,
    /// Whether a finished event stream ends with `data: [DONE]` on this route.
    pub ends_with_done: bool,
    /// Where a Responses answer's id is remembered with its worker.
    pub answers: Option<&'a Arc<ResponseIds>>,
    /// The request's span: the engine gets it as the parent of its own.
    pub span: Option<&'a Rc<RequestSpan>>,
}

/// An attempt that failed with nothing sent to the client yet.
#[derive(Debug)]
pub(crate) struct Failure {
    pub error: ApiError,
    /// The worker's own answer (a retryable status such as 503), which the client gets
    /// when no retry is left.
    pub answer: Option<HttpResponse>,
    /// Whether trying another worker can help.
    pub retry: bool,
    pub kind: FailureKind,
}

impl Failure {
    /// The engine certainly did not start the work: retry freely.
    fn not_started(error: ApiError) -> Failure {
        Failure {
            error,
            answer: None,
            retry: true,
            kind: FailureKind::NotStarted,
        }
    }

    /// The engine may have started the work: the pipeline retries it once at most.
    fn maybe_started(error: ApiError) -> Failure {
        Failure {
            kind: FailureKind::MayHaveStarted,
            ..Failure::not_started(error)
        }
    }

    fn last(error: ApiError) -> Failure {
        Failure {
            error,
            answer: None,
            retry: false,
            kind: FailureKind::MayHaveStarted,
        }
    }

    /// What the client gets when this was the last attempt.
    pub(crate) fn into_answer(self) -> Result<HttpResponse, ApiError> {
        match self.answer {
            Some(a) => Ok(a),
            None => Err(self.error),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl AttemptFailure for Failure {
    fn retryable(&self) -> bool {
        self.retry
    }

    fn kind(&self) -> FailureKind {
        self.kind
    }
}

fn upstream_error(worker: &WorkerUrl, source: UpstreamError) -> ApiError {
    ApiError::Upstream {
        worker: worker.to_string(),
        source,
    }
}

/// Statuses that say the worker, not the request, failed: another worker may serve it.
fn retryable_status(s: StatusCode) -> bool {
    matches!(s.as_u16(), 429 | 502 | 503 | 504)
}

/// 429 and 503 say the engine refused the work; a 502 or 504 (a proxy in front of it)
/// may come after the engine started.
fn status_kind(s: StatusCode) -> FailureKind {
    if matches!(s.as_u16(), 429 | 503) {
        FailureKind::NotStarted
    } else {
        FailureKind::MayHaveStarted
    }
}

/// Whether the engine certainly never got the whole request: it cannot have started it.
fn before_request(e: &UpstreamError) -> bool {
    matches!(
        e,
        UpstreamError::Connect(_)
            | UpstreamError::ConnectTimeout(_)
            | UpstreamError::Guard(_)
            | UpstreamError::Write(_)
    )
}

/// How long the body of a retryable error answer may take to arrive: it is kept only to
/// give the client the worker's own words if no retry is left.
const ERROR_BODY_WAIT: Duration = Duration::from_secs(5);

/// Resolves once the worker is taken out (unhealthy or removed).
async fn taken_out(down: &mut watch::Receiver<bool>) {
    loop {
        if *down.borrow_and_update() {
            return;
        }
        if down.changed().await.is_err() {
            return;
        }
    }
}

/// One attempt under way: the worker, its slot and what is known of the answer.
struct Call<'a> {
    up: &'a Upstream<'a>,
    worker: WorkerUrl,
    booking: Booking,
    down: watch::Receiver<bool>,
    deadline: tokio::time::Instant,
    note: AnswerNote,
    number: u32,
}

impl Call<'_> {
    fn timed_out(&self) -> ApiError {
        ApiError::UpstreamTimeout {
            worker: self.worker.to_string(),
            secs: self.up.timeout.as_secs_f64(),
        }
    }

    /// A failure of the worker: counted against its circuit.
    fn failed(&mut self, f: Failure) -> Failure {
        self.booking.set_outcome(Outcome::Failure);
        f
    }
}

/// Sends `body` to the attempt's worker and relays its answer. Upstream error statuses
/// and bodies pass through unchanged, but for 429, 502, 503 and 504: those, like a
/// connection that fails, an answer that breaks off before anything reached the client, a
/// streamed answer whose first byte does not come in time or a worker taken out
/// meanwhile, come back as a [`Failure`] for the pipeline to try elsewhere.
pub(crate) async fn forward(
    up: &Upstream<'_>,
    req: &HttpRequest,
    body: Bytes,
    attempt: Attempt,
    ticket: &Cell<Option<Ticket>>,
) -> Result<HttpResponse, Failure> {
    let Attempt {
        dispatch,
        note,
        number,
        ..
    } = attempt;
    let mut call = Call {
        up,
        worker: dispatch.url,
        booking: dispatch.booking,
        down: dispatch.down,
        deadline: tokio::time::Instant::from_std(up.deadline),
        note,
        number,
    };
    let rank = dispatch.rank.map(|r| (r, dispatch.rank_via));
    let resp = send(&mut call, req, body, dispatch.worker_key.as_ref(), rank).await?;
    let status = resp.status;
    call.note.status(status.as_u16());
    let is_sse = resp
        .header(&header::CONTENT_TYPE)
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    let mut builder = HttpResponse::build(status);
    copy_response_headers(resp.headers, &mut builder);
    if retryable_status(status) {
        return Err(shed(&mut call, status, resp.body, builder).await);
    }
    // A worker's own refusal (4xx) says nothing about its health. A 500 goes to the
    // client as it is (the request may be what failed), but a run of them ejects the
    // engine (`--cb-consecutive-5xx`).
    let outcome = if status.is_success() {
        Outcome::Success
    } else if status.is_server_error() {
        Outcome::ServerError
    } else {
        Outcome::Neutral
    };
    let catch = (up.answers)
        .filter(|_| status.is_success())
        .map(|ids| IdCatcher::new(ids.clone(), call.worker.as_str()));
    if up.stream || is_sse {
        relay_stream(call, resp.body, builder, outcome, is_sse, ticket, catch).await
    } else {
        collect(call, resp.body, builder, outcome, catch).await
    }
}

/// The request out, in one write (the worker's key in place of the client's, the rank
/// added to the body), and the answer's head back.
async fn send(
    call: &mut Call<'_>,
    req: &HttpRequest,
    body: Bytes,
    worker_key: Option<&Secret>,
    rank: Option<(u32, RankVia)>,
) -> Result<Response, Failure> {
    let up = call.up;
    let auth = worker_key.map(|k| format!("Bearer {}", k.expose()));
    // The worker's own key replaces the client's: never both.
    let mut headers = request_headers_out(req.headers(), auth.is_none() && up.pass_authorization);
    if let Some(a) = &auth {
        headers.push(("authorization", a.as_bytes()));
    }
    headers.push(("x-request-id", up.request_id.as_bytes()));
    // The gateway's span is the engine's parent, in place of the client's.
    if let Some(s) = up.span {
        headers.retain(|(n, _)| *n != "traceparent" && *n != "tracestate");
        headers.push(("traceparent", s.traceparent.as_bytes()));
        if !s.tracestate.is_empty() {
            headers.push(("tracestate", s.tracestate.as_bytes()));
        }
    }
    // The rank: vLLM reads it in a header, SGLang in the body.
    let header_rank = rank
        .filter(|(_, via)| *via == RankVia::Header)
        .map(|(r, _)| r.to_string());
    if let Some(r) = &header_rank {
        headers.retain(|(n, _)| *n != "x-data-parallel-rank");
        headers.push(("x-data-parallel-rank", r.as_bytes()));
    }
    let member = rank.and_then(|(r, via)| match via {
        RankVia::Body(field) => rank_member(&body, r, field),
        RankVia::Header => None,
    });
    let insert = member.as_ref().map(|(at, m)| (*at, m.as_slice()));
    // The head of a plain answer comes when generation ends; of a stream, at once. An
    // engine that hangs while its health passes is left after the first-byte limit.
    let first = if up.stream {
        up.first_token_timeout
    } else {
        up.first_byte_timeout
    };
    let head_by = call.deadline.min(tokio::time::Instant::now() + first);
    // Pinned where it is made: moved into the timeout and the select, the exchange's state
    // was copied twice per request.
    let answered = {
        let sent = std::pin::pin!(
            up.pool
                .post_with(&call.worker, up.path, &headers, body, insert)
        );
        tokio::select! {
            // The answer before the cancellation when both are ready (and no RNG per request).
            biased;
            r = tokio::time::timeout_at(head_by, sent) => Some(r),
            () = taken_out(&mut call.down) => None,
        }
    };
    match answered {
        None => Err(Failure::maybe_started(taken_out_error(&call.worker))),
        Some(Err(_)) if head_by < call.deadline => {
            let e = UpstreamError::NoFirstToken(first.as_secs_f64());
            let e = upstream_error(&call.worker, e);
            Err(call.failed(Failure::maybe_started(e)))
        }
        Some(Err(_)) => {
            let e = call.timed_out();
            Err(call.failed(Failure::last(e)))
        }
        Some(Ok(Ok(r))) => Ok(r),
        Some(Ok(Err(e))) => {
            if let UpstreamError::Connect(io) = &e
                && io.kind() == std::io::ErrorKind::ConnectionRefused
            {
                call.booking
                    .refused(format!("{} refused the connection", call.worker));
            } else {
                call.booking.set_outcome(Outcome::Failure);
            }
            let kind = before_request(&e);
            let e = upstream_error(&call.worker, e);
            Err(if kind {
                Failure::not_started(e)
            } else {
                Failure::maybe_started(e)
            })
        }
    }
}

/// A status another worker may do better with: the worker's own words are kept for the
/// client in case no other worker can serve it.
async fn shed(
    call: &mut Call<'_>,
    status: StatusCode,
    body: Body,
    mut builder: HttpResponseBuilder,
) -> Failure {
    // A 429 is the engine shedding load, not failing: it goes elsewhere, but it does not
    // count against the engine's circuit.
    if status != StatusCode::TOO_MANY_REQUESTS {
        call.booking.set_outcome(Outcome::Failure);
    }
    let by = call
        .deadline
        .min(tokio::time::Instant::now() + ERROR_BODY_WAIT);
    let read = tokio::time::timeout_at(by, body.collect(64 * 1024));
    let text = tokio::select! {
        biased;
        r = read => match r {
            Ok(Ok(b)) => b,
            _ => Bytes::new(),
        },
        () = taken_out(&mut call.down) => Bytes::new(),
    };
    Failure {
        error: upstream_error(&call.worker, UpstreamError::Status(status.as_u16())),
        answer: Some(builder.body(text)),
        retry: true,
        kind: status_kind(status),
    }
}

/// A streamed answer: its head goes to the client with its first byte (until then the
/// request can still be tried elsewhere), then [`Relay`] passes the rest.
async fn relay_stream(
    mut call: Call<'_>,
    mut body: Body,
    mut builder: HttpResponseBuilder,
    outcome: Outcome,
    is_sse: bool,
    ticket: &Cell<Option<Ticket>>,
    catch: Option<IdCatcher>,
) -> Result<HttpResponse, Failure> {
    let up = call.up;
    let first_by = call
        .deadline
        .min(tokio::time::Instant::now() + up.first_token_timeout);
    let first = tokio::select! {
        biased;
        r = tokio::time::timeout_at(first_by, body.next()) => r,
        () = taken_out(&mut call.down) => {
            return Err(Failure::maybe_started(taken_out_error(&call.worker)));
        }
    };
    let first = match first {
        Err(_) if first_by < call.deadline => {
            let secs = up.first_token_timeout.as_secs_f64();
            let e = upstream_error(&call.worker, UpstreamError::NoFirstToken(secs));
            return Err(call.failed(Failure::maybe_started(e)));
        }
        Err(_) => {
            let e = call.timed_out();
            return Err(call.failed(Failure::last(e)));
        }
        Ok(Some(Ok(b))) => Some(b),
        Ok(Some(Err(e))) => {
            let e = upstream_error(&call.worker, e);
            return Err(call.failed(Failure::maybe_started(e)));
        }
        // An event stream that ends before its first event is a failed one.
        Ok(None) if is_sse => {
            let e = upstream_error(&call.worker, UpstreamError::StreamUnfinished);
            return Err(call.failed(Failure::maybe_started(e)));
        }
        Ok(None) => None,
    };
    call.booking.set_outcome(outcome);
    builder.insert_header((header::CACHE_CONTROL, HeaderValue::from_static("no-cache")));
    attempts_header(&mut builder, call.number);
    let mut relay = Relay {
        inner: body,
        guard: Some(call.booking),
        deadline: Box::pin(tokio::time::sleep_until(call.deadline)),
        worker: call.worker,
        request_id: up.request_id.to_owned(),
        timeout: up.timeout,
        done: false,
        tail: Tail::default(),
        sse: is_sse,
        ends_with_done: up.ends_with_done,
        catch,
        _span: up.span.cloned(),
        partial: BytesMut::new(),
        ready: None,
        note: call.note,
        _ticket: ticket.take(),
    };
    relay.note.relayed();
    match first {
        Some(b) => relay.accept(b),
        None => relay.done = true,
    }
    Ok(builder.streaming(relay))
}

/// A plain answer, read whole and returned with the worker's status and headers.
async fn collect(
    mut call: Call<'_>,
    body: Body,
    mut builder: HttpResponseBuilder,
    outcome: Outcome,
    catch: Option<IdCatcher>,
) -> Result<HttpResponse, Failure> {
    let read = std::pin::pin!(body.collect(call.up.max_response));
    let body = tokio::select! {
        biased;
        r = tokio::time::timeout_at(call.deadline, read) => match r {
            Err(_) => {
                let e = call.timed_out();
                return Err(call.failed(Failure::last(e)));
            }
            Ok(Err(e @ UpstreamError::BodyTooLarge(_))) => {
                return Err(Failure::last(upstream_error(&call.worker, e)));
            }
            Ok(Err(e)) => {
                let e = upstream_error(&call.worker, e);
                return Err(call.failed(Failure::maybe_started(e)));
            }
            Ok(Ok(b)) => b,
        },
        () = taken_out(&mut call.down) => {
            return Err(Failure::maybe_started(taken_out_error(&call.worker)));
        }
    };
    call.booking.set_outcome(outcome);
    drop(call.booking);
    if let Some(mut c) = catch {
        c.feed(&body);
    }
    call.note.body(&body);
    call.note.relayed();
    attempts_header(&mut builder, call.number);
    Ok(builder.body(body))
}

/// Says on an answer that retries were needed to get it (absent for a first attempt).
fn attempts_header(builder: &mut HttpResponseBuilder, attempt: u32) {
    if attempt > 1 {
        builder.insert_header(("x-kvgate-attempts", attempt.to_string()));
    }
}

fn taken_out_error(worker: &WorkerUrl) -> ApiError {
    upstream_error(worker, UpstreamError::TakenOut)
}

#[cfg(test)]
mod tests;
