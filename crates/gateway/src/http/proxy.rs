//! Forwards a request to the chosen worker and relays the answer: buffered when it is a
//! plain JSON body, chunk by chunk (byte for byte) when it streams.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, HttpResponseBuilder};
use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use tracing::warn;

use kvgate_core::WorkerUrl;

use actix_web::http::StatusCode;
use tokio::sync::watch;

use crate::actors::selector::Booking;
use crate::actors::selector::{Dispatch, Outcome};
use crate::http::admission::Ticket;
use crate::http::decisions::AnswerNote;
use crate::http::error::ApiError;
use crate::upstream::{Body, Pool, UpstreamError};

/// The policies' routing-key headers, as typed names (see `FORWARDED`).
pub(crate) static ROUTING_KEY_NAMES: [HeaderName; 2] = [
    HeaderName::from_static(kvgate_policies::ROUTING_KEY_HEADERS[0]),
    HeaderName::from_static(kvgate_policies::ROUTING_KEY_HEADERS[1]),
];
// A header added to the policies' list must be added above too.
const _: () = assert!(kvgate_policies::ROUTING_KEY_HEADERS.len() == ROUTING_KEY_NAMES.len());

/// Request headers passed to workers; everything else stays at the gateway. Typed names:
/// a lookup by `&str` parses the name first, nine times per request.
static FORWARDED: [HeaderName; 9] = [
    header::CONTENT_TYPE,
    header::ACCEPT,
    header::AUTHORIZATION,
    HeaderName::from_static("x-correlation-id"),
    HeaderName::from_static("traceparent"),
    HeaderName::from_static("tracestate"),
    HeaderName::from_static(kvgate_policies::ROUTING_KEY_HEADERS[0]),
    HeaderName::from_static(kvgate_policies::ROUTING_KEY_HEADERS[1]),
    header::USER_AGENT,
];

/// Response headers the gateway does not relay: the hop-by-hop ones (RFC 9110 §7.6.1),
/// and the framing and identity headers the gateway's own server writes for its answer.
fn set_by_this_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "trailers"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
            | "date"
            | "server"
    )
}

/// Copies the worker's response headers, less those set by this hop and those the
/// worker's `Connection` header names as hop-by-hop for its connection.
fn copy_response_headers(from: Vec<(HeaderName, HeaderValue)>, to: &mut HttpResponseBuilder) {
    // Header names are lowercase; the tokens are made so to compare.
    let named: Vec<String> = from
        .iter()
        .filter(|(n, _)| n == header::CONNECTION)
        .flat_map(|(_, v)| v.as_bytes().split(|b| *b == b','))
        .map(|t| String::from_utf8_lossy(t.trim_ascii()).to_ascii_lowercase())
        .collect();
    for (name, value) in from {
        let listed = named.iter().any(|t| t == name.as_str());
        if !set_by_this_hop(&name) && !listed {
            to.append_header((name, value));
        }
    }
}

/// What one upstream call needs besides the body and the worker.
pub struct Upstream<'a> {
    pub pool: &'a Pool,
    pub path: &'static str,
    pub request_id: &'a str,
    /// The whole request's timeout (`--request-timeout-secs`), retries included.
    pub timeout: Duration,
    /// When it runs out.
    pub deadline: Instant,
    /// Longest wait for a streamed answer's first byte.
    pub first_token_timeout: Duration,
    pub max_response: usize,
    pub stream: bool,
    /// The client's `Authorization` goes to the worker only when the gateway checks no
    /// keys of its own: a gateway key is never handed to an engine.
    pub pass_authorization: bool,
    /// Which attempt this is (1: the first); later ones say so in `x-kvgate-attempts`.
    pub attempt: u32,
}

/// An attempt that failed with nothing sent to the client yet.
#[derive(Debug)]
pub struct Failure {
    pub error: ApiError,
    /// The worker's own answer (a retryable status such as 503), which the client gets
    /// when no retry is left.
    pub answer: Option<HttpResponse>,
    /// Whether trying another worker can help.
    pub retry: bool,
}

impl Failure {
    fn retry(error: ApiError) -> Failure {
        Failure {
            error,
            answer: None,
            retry: true,
        }
    }

    /// What the client gets when this was the last attempt.
    pub fn into_answer(self) -> Result<HttpResponse, ApiError> {
        match self.answer {
            Some(a) => Ok(a),
            None => Err(self.error),
        }
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

/// Sends `body` to the worker and relays its answer. Upstream error statuses and bodies
/// pass through unchanged, but for 429, 502, 503 and 504: those, like a connection that
/// fails, an answer that breaks off before anything reached the client, a streamed answer
/// whose first byte does not come in time or a worker taken out meanwhile, come back as a
/// [`Failure`] for the caller to try elsewhere.
pub async fn forward(
    up: &Upstream<'_>,
    req: &HttpRequest,
    body: Bytes,
    dispatch: Dispatch,
    ticket: &mut Option<Ticket>,
    mut note: AnswerNote,
) -> Result<HttpResponse, Failure> {
    let Dispatch {
        url: worker,
        mut booking,
        mut down,
        worker_key,
        rank,
        ..
    } = dispatch;
    let timed_out = || ApiError::UpstreamTimeout {
        worker: worker.to_string(),
        secs: up.timeout.as_secs_f64(),
    };
    let auth = worker_key
        .as_ref()
        .map(|k| format!("Bearer {}", k.expose()));
    let mut headers: Vec<(&str, &[u8])> = Vec::with_capacity(FORWARDED.len() + 1);
    for name in &FORWARDED {
        // The worker's own key replaces the client's: never both.
        if (auth.is_some() || !up.pass_authorization) && *name == header::AUTHORIZATION {
            continue;
        }
        for v in req.headers().get_all(name) {
            headers.push((name.as_str(), v.as_bytes()));
        }
    }
    if let Some(a) = &auth {
        headers.push(("authorization", a.as_bytes()));
    }
    headers.push(("x-request-id", up.request_id.as_bytes()));
    let deadline = tokio::time::Instant::from_std(up.deadline);
    let member = rank.and_then(|r| rank_member(&body, r));
    let insert = member.as_ref().map(|(at, m)| (*at, m.as_slice()));
    // Pinned where it is made: moved into the timeout and the select, the exchange's state
    // was copied twice per request.
    let resp = {
        let sent = std::pin::pin!(up.pool.post_with(&worker, up.path, &headers, body, insert));
        tokio::select! {
            // The answer before the cancellation when both are ready (and no RNG per request).
            biased;
            r = tokio::time::timeout_at(deadline, sent) => match r {
                Err(_) => {
                    booking.set_outcome(Outcome::Failure);
                    return Err(Failure { retry: false, ..Failure::retry(timed_out()) });
                }
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    if let UpstreamError::Connect(io) = &e
                        && io.kind() == std::io::ErrorKind::ConnectionRefused
                    {
                        booking.refused(format!("{worker} refused the connection"));
                    } else {
                        booking.set_outcome(Outcome::Failure);
                    }
                    return Err(Failure::retry(upstream_error(&worker, e)));
                }
            },
            () = taken_out(&mut down) => return Err(Failure::retry(taken_out_error(&worker))),
        }
    };
    let status = resp.status;
    note.status(status.as_u16());
    let is_sse = resp
        .header(&header::CONTENT_TYPE)
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    let mut builder = HttpResponse::build(status);
    copy_response_headers(resp.headers, &mut builder);
    if retryable_status(status) {
        // A 429 is the engine shedding load, not failing: it goes elsewhere, but it does
        // not count against the engine's circuit.
        if status != StatusCode::TOO_MANY_REQUESTS {
            booking.set_outcome(Outcome::Failure);
        }
        // Kept for the client in case no other worker can serve it.
        let by = deadline.min(tokio::time::Instant::now() + ERROR_BODY_WAIT);
        let read = tokio::time::timeout_at(by, resp.body.collect(64 * 1024));
        let text = tokio::select! {
            biased;
            r = read => match r {
                Ok(Ok(b)) => b,
                _ => Bytes::new(),
            },
            () = taken_out(&mut down) => Bytes::new(),
        };
        let error = ApiError::Upstream {
            worker: worker.to_string(),
            source: UpstreamError::Status(status.as_u16()),
        };
        return Err(Failure {
            error,
            answer: Some(builder.body(text)),
            retry: true,
        });
    }
    // A worker's own refusal (4xx) says nothing about its health; a 500 neither.
    let outcome = if status.is_success() {
        Outcome::Success
    } else {
        Outcome::Neutral
    };
    let mut body = resp.body;
    if up.stream || is_sse {
        // The head goes to the client with the first byte: until then the request can
        // still be tried elsewhere.
        let first_by = deadline.min(tokio::time::Instant::now() + up.first_token_timeout);
        let first = tokio::select! {
            biased;
            r = tokio::time::timeout_at(first_by, body.next()) => r,
            () = taken_out(&mut down) => return Err(Failure::retry(taken_out_error(&worker))),
        };
        let first = match first {
            Err(_) if first_by < deadline => {
                booking.set_outcome(Outcome::Failure);
                return Err(Failure::retry(ApiError::Upstream {
                    worker: worker.to_string(),
                    source: UpstreamError::NoFirstToken(up.first_token_timeout.as_secs_f64()),
                }));
            }
            Err(_) => {
                booking.set_outcome(Outcome::Failure);
                return Err(Failure {
                    retry: false,
                    ..Failure::retry(timed_out())
                });
            }
            Ok(Some(Ok(b))) => Some(b),
            Ok(Some(Err(e))) => {
                booking.set_outcome(Outcome::Failure);
                return Err(Failure::retry(upstream_error(&worker, e)));
            }
            // An event stream that ends before its first event is a failed one.
            Ok(None) if is_sse => {
                booking.set_outcome(Outcome::Failure);
                return Err(Failure::retry(upstream_error(
                    &worker,
                    UpstreamError::StreamUnfinished,
                )));
            }
            Ok(None) => None,
        };
        booking.set_outcome(outcome);
        builder.insert_header((header::CACHE_CONTROL, HeaderValue::from_static("no-cache")));
        attempts_header(&mut builder, up.attempt);
        let mut relay = Relay {
            inner: body,
            guard: Some(booking),
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
            worker,
            request_id: up.request_id.to_owned(),
            timeout: up.timeout,
            done: false,
            tail: Tail::default(),
            sse: is_sse,
            partial: BytesMut::new(),
            ready: None,
            note,
            _ticket: ticket.take(),
        };
        relay.note.relayed();
        match first {
            Some(b) => relay.accept(b),
            None => relay.done = true,
        }
        return Ok(builder.streaming(relay));
    }
    let read = std::pin::pin!(body.collect(up.max_response));
    let body = tokio::select! {
        biased;
        r = tokio::time::timeout_at(deadline, read) => match r {
            Err(_) => {
                booking.set_outcome(Outcome::Failure);
                return Err(Failure { retry: false, ..Failure::retry(timed_out()) });
            }
            Ok(Err(e @ UpstreamError::BodyTooLarge(_))) => {
                return Err(Failure { retry: false, ..Failure::retry(upstream_error(&worker, e)) });
            }
            Ok(Err(e)) => {
                booking.set_outcome(Outcome::Failure);
                return Err(Failure::retry(upstream_error(&worker, e)));
            }
            Ok(Ok(b)) => b,
        },
        () = taken_out(&mut down) => return Err(Failure::retry(taken_out_error(&worker))),
    };
    booking.set_outcome(outcome);
    drop(booking);
    note.body(&body);
    note.relayed();
    attempts_header(&mut builder, up.attempt);
    Ok(builder.body(body))
}

/// Where and what to add to a JSON object body so the engine serves it on data-parallel
/// rank `rank` (SGLang's `routed_dp_rank`): right after the opening brace. `None` when the
/// body names a rank already (`routed_dp_rank`, or the older `data_parallel_rank`): the
/// client's own choice stands. A quote inside a JSON string is escaped, so only a member
/// name matches.
pub(crate) fn rank_member(body: &[u8], rank: u32) -> Option<(usize, Vec<u8>)> {
    let named = |key: &[u8]| memchr::memmem::find(body, key).is_some();
    if named(b"\"routed_dp_rank\"") || named(b"\"data_parallel_rank\"") {
        return None;
    }
    let open = body.iter().position(|b| !b.is_ascii_whitespace())?;
    if body[open] != b'{' {
        return None;
    }
    let empty = body[open + 1..]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'}');
    let member = format!("\"routed_dp_rank\":{rank}{}", if empty { "" } else { "," });
    Some((open + 1, member.into_bytes()))
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

/// The last bytes relayed, to tell a finished LLM stream (`data: [DONE]`) from one the
/// worker abandoned. A body that runs to the connection's end (no length, not chunked)
/// cannot tell a close mid-stream from a finished answer any other way.
#[derive(Default)]
struct Tail {
    buf: [u8; 32],
    len: usize,
}

impl Tail {
    fn push(&mut self, b: &[u8]) {
        let keep = self.buf.len();
        if b.len() >= keep {
            self.buf.copy_from_slice(&b[b.len() - keep..]);
            self.len = keep;
        } else {
            let total = (self.len + b.len()).min(keep);
            let old = total - b.len();
            self.buf.copy_within(self.len - old..self.len, 0);
            self.buf[old..total].copy_from_slice(b);
            self.len = total;
        }
    }

    fn is_done(&self) -> bool {
        let t = self.buf[..self.len].trim_ascii_end();
        t.ends_with(b"data: [DONE]") || t.ends_with(b"data:[DONE]")
    }
}

/// The relay of a streamed answer. Chunks pass unchanged; an upstream that fails or runs
/// past the deadline ends the client's stream with one SSE error event instead of a
/// silent truncation. Dropping the relay (client gone) drops the upstream connection,
/// which aborts the request on the engine, and releases the in-flight slot.
struct Relay {
    inner: Body,
    guard: Option<Booking>,
    deadline: Pin<Box<actix_rt::time::Sleep>>,
    worker: WorkerUrl,
    request_id: String,
    timeout: Duration,
    done: bool,
    tail: Tail,
    /// Only event streams are expected to end with `[DONE]`, and only they are held to
    /// event boundaries.
    sse: bool,
    /// The start of an event whose end has not arrived. Relaying events whole means an
    /// error event added after a failure never lands inside an unfinished one.
    partial: BytesMut,
    /// Bytes to hand out before reading on (the first chunk, read before the head went).
    ready: Option<Bytes>,
    /// The decision log's view of this answer.
    note: AnswerNote,
    /// The request's admission slot, held while the stream runs.
    _ticket: Option<Ticket>,
}

/// Longest unfinished event held back; anything longer passes as it comes.
const MAX_PARTIAL_EVENT: usize = 256 * 1024;

/// The end of the last complete event in `b` (just past its blank line), looking only at
/// blank lines that end at or after `from`.
fn last_event_end(b: &[u8], from: usize) -> Option<usize> {
    let mut i = b.len();
    while i > from {
        let before = &b[..i];
        // `\n\r\n` covers `\r\n\r\n`; a trailing `\r\n\r` is no end until its `\n` comes.
        if before.ends_with(b"\n\n") || before.ends_with(b"\n\r\n") || before.ends_with(b"\r\r") {
            return Some(i);
        }
        i -= 1;
    }
    None
}

impl Relay {
    fn fail(&mut self, err: ApiError) -> Poll<Option<Result<Bytes, actix_web::Error>>> {
        warn!(worker = %self.worker, request_id = %self.request_id, error = %err, "upstream stream failed");
        self.done = true;
        self.note.failed();
        // A stream that breaks counts against its worker, first byte or not.
        if let Some(g) = self.guard.as_mut() {
            g.set_outcome(Outcome::Failure);
        }
        self.guard = None;
        // An unfinished event is dropped: the client could not parse it anyway.
        self.partial.clear();
        let event = format!("data: {}\n\n", err.body());
        Poll::Ready(Some(Ok(Bytes::from(event))))
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // Dropped before its end: the client went away mid-answer.
        if !self.done {
            self.note.abandoned();
        }
    }
}

impl Stream for Relay {
    type Item = Result<Bytes, actix_web::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(b) = self.ready.take() {
            return Poll::Ready(Some(Ok(b)));
        }
        if self.done {
            return Poll::Ready(None);
        }
        loop {
            match Pin::new(&mut self.inner).poll_next(cx) {
                Poll::Ready(Some(Ok(b))) => {
                    if let Some(whole) = self.take(b) {
                        return Poll::Ready(Some(Ok(whole)));
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    let err = upstream_error(&self.worker, e);
                    return self.fail(err);
                }
                Poll::Ready(None) => return self.end(),
                Poll::Pending => break,
            }
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            let worker = self.worker.to_string();
            let secs = self.timeout.as_secs_f64();
            return self.fail(ApiError::UpstreamTimeout { worker, secs });
        }
        Poll::Pending
    }
}

impl Relay {
    /// A chunk of the answer, with what goes out of it now.
    fn take(&mut self, b: Bytes) -> Option<Bytes> {
        self.tail.push(&b);
        self.note.chunk(&b);
        if let Some(g) = self.guard.as_mut() {
            g.first_byte();
        }
        self.whole_events(b)
    }

    /// The first chunk, read before the relay started.
    fn accept(&mut self, b: Bytes) {
        self.ready = self.take(b);
    }

    /// What of `b` (after any held part) can go to the client now: up to the last event
    /// end, or all of it when this is no event stream.
    fn whole_events(&mut self, b: Bytes) -> Option<Bytes> {
        if !self.sse {
            return Some(b);
        }
        if self.partial.is_empty() {
            return match last_event_end(&b, 0) {
                Some(n) if n == b.len() => Some(b),
                Some(n) => {
                    self.partial.extend_from_slice(&b[n..]);
                    Some(b.slice(..n))
                }
                None if b.len() > MAX_PARTIAL_EVENT => Some(b),
                None => {
                    self.partial.extend_from_slice(&b);
                    None
                }
            };
        }
        let from = self.partial.len().saturating_sub(3);
        self.partial.extend_from_slice(&b);
        match last_event_end(&self.partial, from) {
            Some(n) => Some(self.partial.split_to(n).freeze()),
            None if self.partial.len() > MAX_PARTIAL_EVENT => Some(self.partial.split().freeze()),
            None => None,
        }
    }

    /// The upstream body ended cleanly.
    fn end(&mut self) -> Poll<Option<Result<Bytes, actix_web::Error>>> {
        if self.sse && !self.tail.is_done() {
            let err = upstream_error(&self.worker, UpstreamError::StreamUnfinished);
            return self.fail(err);
        }
        self.done = true;
        self.guard = None;
        // A finished stream whose last event lacks its blank line still gets all of it.
        if self.partial.is_empty() {
            Poll::Ready(None)
        } else {
            Poll::Ready(Some(Ok(self.partial.split().freeze())))
        }
    }
}

#[cfg(test)]
mod tests {
    use actix_web::http::StatusCode;
    use actix_web::http::header::{HeaderName, HeaderValue};

    use super::{HttpResponse, Tail, copy_response_headers, last_event_end, rank_member};

    #[test]
    fn headers_the_worker_names_in_connection_are_not_relayed() {
        let h = |n: &str, v: &str| {
            (
                HeaderName::from_bytes(n.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            )
        };
        let from = vec![
            h("content-type", "application/json"),
            h("connection", "keep-alive, X-Hop"),
            h("connection", " x-other "),
            h("x-hop", "1"),
            h("x-other", "2"),
            h("x-kept", "3"),
            h("keep-alive", "timeout=5"),
            h("transfer-encoding", "chunked"),
            h("server", "uvicorn"),
        ];
        let mut b = HttpResponse::build(StatusCode::OK);
        copy_response_headers(from, &mut b);
        let resp = b.finish();
        let mut names: Vec<&str> = resp.headers().keys().map(|n| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-type", "x-kept"]);
    }

    #[test]
    fn event_ends_are_found_for_every_line_ending() {
        assert_eq!(last_event_end(b"data: 1\n\ndata: 2", 0), Some(9));
        assert_eq!(last_event_end(b"data: 1\n\ndata: 2\n\n", 0), Some(18));
        assert_eq!(last_event_end(b"data: 1\r\n\r\nda", 0), Some(11));
        assert_eq!(last_event_end(b"data: 1\r\rda", 0), Some(9));
        assert_eq!(last_event_end(b"data: 1\n", 0), None);
        assert_eq!(last_event_end(b"data: 1\r\n\r", 0), None);
        assert_eq!(last_event_end(b"", 0), None);
        // Only ends after `from` count: the caller has already looked before it.
        assert_eq!(last_event_end(b"a\n\nbcdef", 4), None);
        assert_eq!(last_event_end(b"a\n\nb\n\n", 4), Some(6));
    }

    #[test]
    fn the_rank_goes_first_in_the_object_unless_the_client_named_one() {
        let with = |body: &str, rank| {
            rank_member(body.as_bytes(), rank).map(|(at, m)| {
                let mut out = body.as_bytes()[..at].to_vec();
                out.extend(m);
                out.extend(&body.as_bytes()[at..]);
                String::from_utf8(out).expect("utf-8")
            })
        };
        assert_eq!(
            with(r#"{"text":"hi"}"#, 1).as_deref(),
            Some(r#"{"routed_dp_rank":1,"text":"hi"}"#)
        );
        assert_eq!(
            with(" \n{ }", 3).as_deref(),
            Some(" \n{\"routed_dp_rank\":3 }")
        );
        assert_eq!(with(r#"{"routed_dp_rank": 0, "text":"x"}"#, 1), None);
        assert_eq!(with(r#"{"data_parallel_rank": 0}"#, 1), None);
        // Only a member name counts: inside a string the quotes are escaped.
        assert_eq!(
            with(r#"{"text":"say \"routed_dp_rank\""}"#, 2).as_deref(),
            Some(r#"{"routed_dp_rank":2,"text":"say \"routed_dp_rank\""}"#)
        );
        assert_eq!(with("[1]", 1), None);
    }

    #[test]
    fn tail_sees_done_across_chunks() {
        let mut t = Tail::default();
        t.push(b"data: {\"x\":1}\n\ndata: [DO");
        assert!(!t.is_done());
        t.push(b"NE]\n\n");
        assert!(t.is_done());
        t.push(b"data: {}\n\n");
        assert!(!t.is_done());
        let mut t = Tail::default();
        t.push(&[b'x'; 100]);
        t.push(b"data: [DONE]\r\n\r\n");
        assert!(t.is_done());
    }
}
