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

use kvgate_poller::WorkerUrl;

use crate::actors::selector::Booking;
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

/// What one upstream call needs besides the body.
pub struct Upstream<'a> {
    pub pool: &'a Pool,
    pub worker: &'a WorkerUrl,
    pub path: &'static str,
    pub request_id: &'a str,
    pub timeout: Duration,
    pub max_response: usize,
    pub stream: bool,
}

fn upstream_error(worker: &WorkerUrl, source: UpstreamError) -> ApiError {
    ApiError::Upstream {
        worker: worker.to_string(),
        source,
    }
}

/// Sends `body` to the worker and relays its answer. Upstream error statuses and bodies
/// pass through unchanged.
pub async fn forward(
    up: Upstream<'_>,
    req: &HttpRequest,
    body: Bytes,
    guard: Booking,
) -> Result<HttpResponse, ApiError> {
    let started = Instant::now();
    let timed_out = || ApiError::UpstreamTimeout {
        worker: up.worker.to_string(),
        secs: up.timeout.as_secs_f64(),
    };
    let mut headers: Vec<(&str, &[u8])> = Vec::with_capacity(FORWARDED.len() + 1);
    for name in &FORWARDED {
        for v in req.headers().get_all(name) {
            headers.push((name.as_str(), v.as_bytes()));
        }
    }
    headers.push(("x-request-id", up.request_id.as_bytes()));
    let sent = up.pool.post(up.worker, up.path, &headers, body);
    let resp = match actix_rt::time::timeout(up.timeout, sent).await {
        Err(_) => return Err(timed_out()),
        Ok(r) => r.map_err(|e| upstream_error(up.worker, e))?,
    };
    let is_sse = resp
        .header(&header::CONTENT_TYPE)
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    let mut builder = HttpResponse::build(resp.status);
    copy_response_headers(resp.headers, &mut builder);
    if up.stream || is_sse {
        let deadline = up.timeout.saturating_sub(started.elapsed());
        builder.insert_header((header::CACHE_CONTROL, HeaderValue::from_static("no-cache")));
        return Ok(builder.streaming(Relay {
            inner: resp.body,
            guard: Some(guard),
            deadline: Box::pin(actix_rt::time::sleep(deadline)),
            worker: up.worker.clone(),
            request_id: up.request_id.to_owned(),
            timeout: up.timeout,
            done: false,
            tail: Tail::default(),
            sse: is_sse,
            partial: BytesMut::new(),
        }));
    }
    let remaining = up.timeout.saturating_sub(started.elapsed());
    let read = resp.body.collect(up.max_response);
    let body = match actix_rt::time::timeout(remaining, read).await {
        Err(_) => return Err(timed_out()),
        Ok(Err(e)) => return Err(upstream_error(up.worker, e)),
        Ok(Ok(b)) => b,
    };
    drop(guard);
    Ok(builder.body(body))
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
        self.guard = None;
        // An unfinished event is dropped: the client could not parse it anyway.
        self.partial.clear();
        let event = format!("data: {}\n\n", err.body());
        Poll::Ready(Some(Ok(Bytes::from(event))))
    }
}

impl Stream for Relay {
    type Item = Result<Bytes, actix_web::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        loop {
            match Pin::new(&mut self.inner).poll_next(cx) {
                Poll::Ready(Some(Ok(b))) => {
                    self.tail.push(&b);
                    if let Some(g) = self.guard.as_mut() {
                        g.first_byte();
                    }
                    if let Some(whole) = self.whole_events(b) {
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

    use super::{HttpResponse, Tail, copy_response_headers, last_event_end};

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
