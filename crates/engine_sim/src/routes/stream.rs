//! Streamed bodies: server-sent events for one prompt or a batch, and the abrupt endings
//! the crash faults inject.

use std::collections::VecDeque;

use actix_web::HttpResponse;
use actix_web::http::header::CACHE_CONTROL;
use actix_web::web::Bytes;
use futures_util::{Stream, StreamExt, stream};

use crate::api::{Reply, Usage};
use crate::error::ApiError;
use crate::scheduler::Ticket;

/// A streamed batch: each prompt's chunks as they come, tagged by their choice index, then
/// (with `usage_from`, when the client asked for usage) one usage chunk for the whole
/// batch, and one `[DONE]`. An engine that stops ends the stream without `[DONE]`.
pub(super) fn sse_batch(
    usage_from: Option<Reply>,
    replies: Vec<Reply>,
    tickets: Vec<Ticket>,
) -> HttpResponse {
    // Each prompt yields (its chunks, its usage once it finished).
    let per_prompt = replies.into_iter().zip(tickets).map(|(reply, ticket)| {
        Box::pin(stream::unfold(Some((reply, ticket)), |state| async move {
            let (mut reply, mut ticket) = state?;
            let chunks = reply.stream_chunks(ticket.next().await?);
            if reply.finished() {
                let usage = reply.counts();
                Some(((chunks, Some(usage)), None))
            } else {
                Some(((chunks, None), Some((reply, ticket))))
            }
        }))
    });
    let state = BatchStream {
        left: per_prompt.len(),
        merged: stream::select_all(per_prompt),
        usage_from,
        usage: Usage::default(),
    };
    let frames = stream::unfold(state, |mut s| async move {
        if s.left == 0 {
            return None;
        }
        let mut out = String::new();
        while out.is_empty() {
            let (chunks, usage) = s.merged.next().await?;
            for c in chunks {
                out.push_str(&format!("data: {c}\n\n"));
            }
            if let Some(u) = usage {
                s.usage = s.usage.add(u);
                s.left -= 1;
            }
            if s.left == 0 {
                if let Some(head) = &s.usage_from {
                    let chunk = head.usage_chunk(s.usage);
                    out.push_str(&format!("data: {chunk}\n\n"));
                }
                out.push_str("data: [DONE]\n\n");
            }
        }
        Some((Ok::<_, SimulatedCrash>(Bytes::from(out)), s))
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((CACHE_CONTROL, "no-cache"))
        .streaming(frames)
}

struct BatchStream<S> {
    merged: S,
    left: usize,
    usage_from: Option<Reply>,
    usage: Usage,
}

/// A stream whose only event is `err`, then `[DONE]`: how SGLang streams an error raised
/// before the first token.
pub(super) fn stream_error(err: &ApiError) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((CACHE_CONTROL, "no-cache"))
        .body(format!("data: {}\n\ndata: [DONE]\n\n", err.body()))
}

/// The error that ends a body abruptly: actix closes the connection without the last chunk.
#[derive(Debug, thiserror::Error)]
#[error("simulated engine crash")]
pub(super) struct SimulatedCrash;

/// `first`, then a crash once it has been written.
pub(super) fn then_crash(first: Bytes) -> impl Stream<Item = Result<Bytes, SimulatedCrash>> {
    stream::unfold(Some(Some(first)), |state| async move {
        match state? {
            Some(first) => Some((Ok(first), Some(None))),
            None => {
                // Let the dispatcher flush what was sent: an error drops unwritten bytes.
                tokio::task::yield_now().await;
                Some((Err(SimulatedCrash), None))
            }
        }
    })
}

/// A streaming answer in progress. It owns the ticket, so a client that goes away drops it
/// and aborts the request.
struct Sse {
    ticket: Ticket,
    reply: Reply,
    queue: VecDeque<Bytes>,
    sent: usize,
    crash_after: Option<usize>,
    malformed: bool,
    done: bool,
}

/// One prompt's answer as it comes; `crash_after` (chunks) and `malformed` are the body
/// faults to inject.
pub(super) fn sse(
    ticket: Ticket,
    reply: Reply,
    crash_after: Option<usize>,
    malformed: bool,
) -> HttpResponse {
    let state = Sse {
        ticket,
        reply,
        queue: VecDeque::new(),
        sent: 0,
        crash_after,
        malformed,
        done: false,
    };
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((CACHE_CONTROL, "no-cache"))
        .streaming(sse_frames(state))
}

fn sse_frames(state: Sse) -> impl Stream<Item = Result<Bytes, SimulatedCrash>> {
    stream::unfold(state, |mut s| async move {
        loop {
            if let Some(frame) = s.queue.pop_front() {
                if s.crash_after == Some(s.sent) {
                    // Let the dispatcher flush what was sent: an error drops unwritten bytes.
                    tokio::task::yield_now().await;
                    s.queue.clear();
                    s.done = true;
                    s.crash_after = None;
                    return Some((Err(SimulatedCrash), s));
                }
                s.sent += 1;
                return Some((Ok(frame), s));
            }
            if s.done {
                return None;
            }
            // `None`: the engine stopped; end without `[DONE]`.
            let event = s.ticket.next().await?;
            for chunk in s.reply.stream_chunks(event) {
                s.queue.push_back(if s.malformed {
                    Bytes::from_static(b"data: {\"choices\": [{\"delta\": \n\n")
                } else {
                    Bytes::from(format!("data: {chunk}\n\n"))
                });
            }
            if s.reply.finished() {
                s.queue.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                s.done = true;
            }
        }
    })
}
