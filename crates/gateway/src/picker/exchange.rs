//! One ext_proc stream, one HTTP request through Envoy, in `FULL_DUPLEX_STREAMED` mode:
//! the request headers (admission), the body chunks (kept, unanswered), at the body's end
//! the pick (the answer to the headers, then the body back in chunks), then the response
//! headers (status, the served endpoint) and body (passed back chunk by chunk, read for
//! the cached tokens it reports). The booking and the admission ticket live here and go
//! when the response ends or the stream does, whichever comes first.
//!
//! The answers are a stream that reads the next message when it has nothing to send, so
//! the stream's state needs no lock and no task of its own.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use futures_util::Stream;
use kvgate_core::Endpoint;
use kvgate_policies::RequestFacts;
use tonic::{Status, Streaming};

use super::Picker;
use super::choose::{self, Pick};
use super::envoy::{self, header};
use crate::facts::{FactsError, request_facts, tokens};
use crate::metrics::Door;
use crate::pipeline::{Job, Outcome, Refusal, Ticket};

/// What the request headers said.
#[derive(Debug)]
struct Head {
    /// `None` for a path that is no inference route: picked on the model-less facts.
    endpoint: Option<Endpoint>,
    request_id: Arc<str>,
    routing_key: Option<String>,
    /// The first session header the request carried.
    session: Option<String>,
    /// The gateway's subset hint, when it gave one.
    subset: Option<Vec<String>>,
    arrived: Instant,
}

/// One stream's state.
pub(super) struct Exchange {
    picker: Arc<Picker>,
    inbound: Streaming<ProcessingRequest>,
    out: VecDeque<ProcessingResponse>,
    /// Envoy closed its side.
    done: bool,
    head: Option<Head>,
    body: Vec<u8>,
    ticket: Option<Ticket>,
    job: Option<Job>,
    pick: Option<Pick>,
    /// An immediate response was sent: Envoy answers the client, the rest is ignored.
    refused: bool,
    /// The response's first body chunk went by.
    first_byte: bool,
    /// Envoy reported the response's headers.
    responded: bool,
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange")
            .field("picked", &self.pick.as_ref().map(|p| &p.destinations))
            .field("refused", &self.refused)
            .finish()
    }
}

/// The worker's answer for its circuit: a success, a failure Envoy may retry elsewhere
/// (429, 502, 503, 504, as the HTTP door counts them), or neither (its own refusal).
fn outcome(status: u16) -> Outcome {
    match status {
        200..=299 => Outcome::Success,
        429 | 502..=504 => Outcome::Failure,
        _ => Outcome::Neutral,
    }
}

fn bad_request(e: &FactsError) -> Refusal {
    let (code, message) = match e {
        FactsError::BadRequest(m) => ("invalid_request", m.clone()),
        FactsError::InvalidJson(m) => (
            "json_parse_error",
            format!("request body is not valid JSON: {m}"),
        ),
    };
    Refusal {
        status: 400,
        kind: "invalid_request_error",
        code,
        message,
        retry_after: None,
    }
}

fn too_large(limit: usize) -> Refusal {
    Refusal {
        status: 413,
        kind: "invalid_request_error",
        code: "payload_too_large",
        message: format!("request body exceeds the limit of {limit} bytes"),
        retry_after: None,
    }
}

impl Exchange {
    pub(super) fn new(picker: Arc<Picker>, inbound: Streaming<ProcessingRequest>) -> Exchange {
        Exchange {
            picker,
            inbound,
            out: VecDeque::new(),
            done: false,
            head: None,
            body: Vec::new(),
            ticket: None,
            job: None,
            pick: None,
            refused: false,
            first_byte: false,
            responded: false,
        }
    }

    /// The answers, in order, as Envoy's messages call for them.
    pub(super) fn answers(self) -> impl Stream<Item = Result<ProcessingResponse, Status>> + Send {
        futures_util::stream::unfold(self, |mut ex| async move {
            loop {
                if let Some(m) = ex.out.pop_front() {
                    return Some((Ok(m), ex));
                }
                if ex.done {
                    return None;
                }
                match ex.inbound.message().await {
                    Ok(Some(m)) => ex.on(m).await,
                    // Envoy ended the stream (or it broke): the request is over.
                    Ok(None) | Err(_) => {
                        ex.finish();
                        ex.done = true;
                    }
                }
            }
        })
    }

    async fn on(&mut self, m: ProcessingRequest) {
        if self.refused {
            return;
        }
        let md = m.metadata_context.as_ref();
        match m.request {
            Some(Message::RequestHeaders(h)) => self.request_headers(&h, md).await,
            Some(Message::RequestBody(b)) => self.request_body(b).await,
            Some(Message::RequestTrailers(_)) => {
                if self.pick.is_none() {
                    self.end_of_request(false).await;
                }
                if !self.refused {
                    self.out.push_back(envoy::continue_trailers(false));
                }
            }
            Some(Message::ResponseHeaders(h)) => self.response_headers(&h, md).await,
            Some(Message::ResponseBody(b)) => self.response_body(&b),
            Some(Message::ResponseTrailers(_)) => {
                self.out.push_back(envoy::continue_trailers(true));
                self.finish();
            }
            None => {}
        }
    }

    fn refuse(&mut self, r: &Refusal) {
        let id = self.head.as_ref().map_or("", |h| &h.request_id);
        let body = r.body(id);
        self.out
            .push_back(envoy::refuse(r.status, &body, r.code, r.retry_after));
        self.refused = true;
        self.body = Vec::new();
        self.finish();
    }

    async fn request_headers(&mut self, h: &HttpHeaders, md: Option<&Metadata>) {
        let hs = h.headers.as_ref();
        let path = header(hs, ":path").unwrap_or("");
        let path = path.split(['?', '#']).next().unwrap_or("");
        let request_id: Arc<str> = Arc::from(header(hs, "x-request-id").unwrap_or(""));
        let routing_key = kvgate_policies::ROUTING_KEY_HEADERS
            .iter()
            .find_map(|n| kvgate_policies::valid_routing_key(header(hs, n)))
            .map(str::to_owned);
        let session = (self.picker.session_headers.iter())
            .find_map(|n| kvgate_policies::valid_routing_key(header(hs, n)))
            .map(str::to_owned);
        self.head = Some(Head {
            endpoint: Endpoint::from_path(path),
            request_id,
            routing_key,
            session,
            subset: envoy::subset_hint(md),
            arrived: Instant::now(),
        });
        // The client as Envoy saw it, for the per-client rate.
        let peer: Option<IpAddr> = header(hs, "x-forwarded-for")
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.trim().parse().ok());
        // The rate now; a slot once the body is in (a slow upload through the gateway
        // holds none), as at the HTTP door.
        if let Err(e) = self.picker.pipeline.admission.rate(None, peer) {
            return self.refuse(&Refusal::admission(&e));
        }
        if h.end_of_stream {
            self.end_of_request(false).await;
        }
    }

    async fn request_body(&mut self, b: HttpBody) {
        if self.body.len() + b.body.len() > self.picker.max_body {
            return self.refuse(&too_large(self.picker.max_body));
        }
        if self.body.is_empty() {
            self.body = b.body;
        } else {
            self.body.extend_from_slice(&b.body);
        }
        if b.end_of_stream {
            self.end_of_request(true).await;
        }
    }

    /// The request's facts, read once from the whole body.
    async fn facts(&self, head: &Head, body: &Bytes) -> Result<RequestFacts, FactsError> {
        let mut facts = match head.endpoint {
            Some(e) if !body.is_empty() => {
                let mut f = request_facts(e, body, self.picker.reads_prompt)?;
                tokens::tokenize_here(&self.picker.tokenizers, e, body, &mut f).await;
                f
            }
            _ => RequestFacts::default(),
        };
        facts.routing_key.clone_from(&head.routing_key);
        // As at the HTTP door: the body's key (read with the facts), a session header,
        // the routing key.
        if facts.session.is_none() {
            facts.session = head.session.clone().or_else(|| head.routing_key.clone());
        }
        Ok(facts)
    }

    /// The whole request is in: the pick answers the request headers, then the body goes
    /// back (`ended`: its last chunk ended the request, no trailers follow).
    async fn end_of_request(&mut self, ended: bool) {
        let Some(head) = self.head.take() else {
            // Body without headers: not a request this protocol sends.
            self.done = true;
            return;
        };
        match self.picker.pipeline.admission.slot().await {
            Ok(t) => self.ticket = Some(t),
            Err(e) => {
                self.head = Some(head);
                return self.refuse(&Refusal::admission(&e));
            }
        }
        let body = Bytes::from(std::mem::take(&mut self.body));
        let facts = match self.facts(&head, &body).await {
            Ok(f) => f,
            Err(e) => {
                self.head = Some(head);
                return self.refuse(&bad_request(&e));
            }
        };
        let job = Job {
            facts: Arc::new(facts),
            endpoint: head.endpoint.unwrap_or(Endpoint::Chat),
            request_id: head.request_id.clone(),
            arrived: head.arrived,
            door: Door::ExtProc,
        };
        let picked = choose::pick(&self.picker.pipeline, &job, head.subset.as_deref()).await;
        self.head = Some(head);
        match picked {
            Ok(p) => {
                self.out.push_back(envoy::pick(&p.destinations));
                if ended || !body.is_empty() {
                    self.out.extend(envoy::body_chunks(&body, ended, false));
                }
                self.pick = Some(p);
                self.job = Some(job);
            }
            Err(r) => self.refuse(&r),
        }
    }

    async fn response_headers(&mut self, h: &HttpHeaders, md: Option<&Metadata>) {
        let hs = h.headers.as_ref();
        self.responded = true;
        if let (Some(served), Some(job)) = (envoy::served(md, hs), &self.job)
            && let Some(p) = self.pick.take()
        {
            self.pick = if served == p.endpoint {
                Some(p)
            } else {
                choose::moved(&self.picker.pipeline, job, p, &served).await
            };
        }
        let status = header(hs, ":status").and_then(|s| s.parse::<u16>().ok());
        if let (Some(p), Some(s)) = (&mut self.pick, status) {
            p.attempt.note.status(s);
            p.attempt.note.relayed();
            p.attempt.dispatch.booking.set_outcome(outcome(s));
        }
        self.out.push_back(envoy::continue_headers(true));
        if h.end_of_stream {
            self.finish();
        }
    }

    fn response_body(&mut self, b: &HttpBody) {
        if let Some(p) = &mut self.pick {
            if !std::mem::replace(&mut self.first_byte, true) {
                p.attempt.dispatch.booking.first_byte();
            }
            p.attempt.note.chunk(&b.body);
        }
        self.out
            .extend(envoy::body_chunks(&b.body, b.end_of_stream, true));
        if b.end_of_stream {
            self.finish();
        }
    }

    /// The request is over: its booking (and the decision log's note) and its admission
    /// slot go back.
    fn finish(&mut self) {
        if let Some(mut p) = self.pick.take()
            && !self.responded
        {
            // Envoy never reported a response: the client or the gateway gave up.
            p.attempt.note.abandoned();
        }
        self.job = None;
        self.ticket = None;
    }
}
