//! The relay of a streamed answer: chunks pass unchanged, held to whole events for an
//! event stream, and a stream that breaks ends with one SSE error event.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use kvgate_core::WorkerUrl;
use tracing::warn;

use super::upstream_error;
use crate::actors::selector::{Booking, Outcome};
use crate::http::answers::IdCatcher;
use crate::http::error::ApiError;
use crate::pipeline::{AnswerNote, Ticket};
use crate::telemetry::RequestSpan;
use crate::upstream::{Body, UpstreamError};

/// The last bytes relayed, to tell a finished LLM stream (`data: [DONE]`) from one the
/// worker abandoned. A body that runs to the connection's end (no length, not chunked)
/// cannot tell a close mid-stream from a finished answer any other way.
#[derive(Default)]
pub(super) struct Tail {
    buf: [u8; 32],
    len: usize,
}

impl Tail {
    pub(super) fn push(&mut self, b: &[u8]) {
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

    pub(super) fn is_done(&self) -> bool {
        let t = self.buf[..self.len].trim_ascii_end();
        t.ends_with(b"data: [DONE]") || t.ends_with(b"data:[DONE]")
    }
}

/// The relay of a streamed answer. Chunks pass unchanged; an upstream that fails or runs
/// past the deadline ends the client's stream with one SSE error event instead of a
/// silent truncation. Dropping the relay (client gone) drops the upstream connection,
/// which aborts the request on the engine, and releases the in-flight slot.
pub(super) struct Relay {
    pub(super) inner: Body,
    pub(super) guard: Option<Booking>,
    pub(super) deadline: Pin<Box<actix_rt::time::Sleep>>,
    pub(super) worker: WorkerUrl,
    pub(super) request_id: String,
    pub(super) timeout: Duration,
    pub(super) done: bool,
    pub(super) tail: Tail,
    /// Only event streams are expected to end with `[DONE]`, and only they are held to
    /// event boundaries.
    pub(super) sse: bool,
    /// Whether a finished stream ends with `[DONE]` on this route; elsewhere a clean end
    /// of the body's framing is the stream's end.
    pub(super) ends_with_done: bool,
    /// Remembers a Responses answer's id with its worker.
    pub(super) catch: Option<IdCatcher>,
    /// The request's span, which ends with the stream.
    pub(super) _span: Option<std::rc::Rc<RequestSpan>>,
    /// The start of an event whose end has not arrived. Relaying events whole means an
    /// error event added after a failure never lands inside an unfinished one.
    pub(super) partial: BytesMut,
    /// Bytes to hand out before reading on (the first chunk, read before the head went).
    pub(super) ready: Option<Bytes>,
    /// The decision log's view of this answer.
    pub(super) note: AnswerNote,
    /// The request's admission slot, held while the stream runs.
    pub(super) _ticket: Option<Ticket>,
}

/// Longest unfinished event held back; anything longer passes as it comes.
const MAX_PARTIAL_EVENT: usize = 256 * 1024;

/// The end of the last complete event in `b` (just past its blank line), looking only at
/// blank lines that end at or after `from`.
pub(super) fn last_event_end(b: &[u8], from: usize) -> Option<usize> {
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
        let event = format!("data: {}\n\n", err.body_for(&self.request_id));
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
        if let Some(c) = self.catch.as_mut() {
            c.feed(&b);
        }
        if let Some(g) = self.guard.as_mut() {
            g.first_byte();
        }
        self.whole_events(b)
    }

    /// The first chunk, read before the relay started.
    pub(super) fn accept(&mut self, b: Bytes) {
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
        if self.sse && self.ends_with_done && !self.tail.is_done() {
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
