//! The Responses and Messages APIs, as vLLM and SGLang serve them to agent clients: the
//! prompt is rendered as a chat and scheduled like one (so the prefix cache serves it the
//! same way), and the answer takes each API's own shape and event names. A Responses
//! answer is stored, and a request naming it as `previous_response_id` continues it here
//! only: any other engine answers 404, as a real one does.

use std::sync::PoisonError;

use actix_web::HttpResponse;
use actix_web::http::header::CACHE_CONTROL;
use actix_web::web::{Bytes, Data};
use futures_util::stream;
use serde_json::{Value, json};

use super::Answer;
use crate::api::{self, Api};
use crate::engine::Engine;
use crate::error::ApiError;
use crate::scheduler::{Event, Job, Ticket};

/// Which of the two APIs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Responses,
    Messages,
}

pub(super) async fn responses(e: Data<Engine>, body: Bytes) -> Answer {
    agent(e, Kind::Responses, body).await
}

pub(super) async fn messages(e: Data<Engine>, body: Bytes) -> Answer {
    agent(e, Kind::Messages, body).await
}

/// A conversation as (role, text) turns.
type Turns = Vec<(String, String)>;

/// The text of a content value: a string, or the `text` of each part.
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// The turns a request asks to be continued, and its own.
fn turns(e: &Engine, kind: Kind, b: &Value) -> Result<Turns, ApiError> {
    let mut out = Vec::new();
    match kind {
        Kind::Responses => {
            if let Some(i) = b["instructions"].as_str() {
                out.push(("system".to_owned(), i.to_owned()));
            }
            if let Some(prev) = b["previous_response_id"].as_str() {
                let held = e.responses.lock().unwrap_or_else(PoisonError::into_inner);
                let before = held
                    .get(prev)
                    .ok_or_else(|| ApiError::UnknownResponse(prev.to_owned()))?;
                out.extend(before.iter().filter(|(r, _)| r != "system").cloned());
            }
            match &b["input"] {
                Value::String(s) => out.push(("user".to_owned(), s.clone())),
                Value::Array(items) => {
                    for it in items {
                        let role = it["role"].as_str().unwrap_or("user").to_owned();
                        out.push((role, text_of(&it["content"])));
                    }
                }
                _ => return Err(ApiError::BadRequest("input is required".into())),
            }
        }
        Kind::Messages => {
            if !b["system"].is_null() {
                out.push(("system".to_owned(), text_of(&b["system"])));
            }
            let msgs = b["messages"].as_array().filter(|m| !m.is_empty());
            let msgs =
                msgs.ok_or_else(|| ApiError::BadRequest("messages: Field required".into()))?;
            for m in msgs {
                let role = m["role"].as_str().unwrap_or("user").to_owned();
                out.push((role, text_of(&m["content"])));
            }
        }
    }
    Ok(out)
}

/// An answer under way: its ids, counts and text.
struct Answering {
    kind: Kind,
    id: String,
    item: String,
    model: String,
    created: u64,
    prompt: usize,
    cached: usize,
    text: String,
    output: usize,
    seq: u64,
}

impl Answering {
    /// The whole answer (a Responses answer with `status`).
    fn body(&self, status: &str) -> Value {
        match self.kind {
            Kind::Responses => json!({
                "id": self.id, "object": "response", "created_at": self.created,
                "model": self.model, "status": status,
                "output": [{"type": "message", "id": self.item, "role": "assistant",
                    "status": status,
                    "content": [{"type": "output_text", "text": self.text, "annotations": []}]}],
                "usage": {"input_tokens": self.prompt,
                    "input_tokens_details": {"cached_tokens": self.cached},
                    "output_tokens": self.output, "total_tokens": self.prompt + self.output},
            }),
            Kind::Messages => json!({
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [{"type": "text", "text": self.text}],
                "stop_reason": "max_tokens", "stop_sequence": null,
                "usage": {"input_tokens": self.prompt, "output_tokens": self.output,
                    "cache_read_input_tokens": self.cached},
            }),
        }
    }

    /// One server-sent event with its name, numbered for Responses.
    fn event(&mut self, name: &str, mut data: Value) -> String {
        data["type"] = json!(name);
        if self.kind == Kind::Responses {
            data["sequence_number"] = json!(self.seq);
            self.seq += 1;
        }
        format!("event: {name}\ndata: {data}\n\n")
    }

    fn opening(&mut self) -> String {
        match self.kind {
            Kind::Responses => {
                let r = self.body("in_progress");
                self.event("response.created", json!({"response": r}))
            }
            Kind::Messages => {
                let mut m = self.body("");
                m["content"] = json!([]);
                m["stop_reason"] = Value::Null;
                let start = self.event("message_start", json!({"message": m}));
                let block = json!({"index": 0, "content_block": {"type": "text", "text": ""}});
                start + &self.event("content_block_start", block)
            }
        }
    }

    fn delta(&mut self, piece: &str) -> String {
        match self.kind {
            Kind::Responses => {
                let d = json!({"item_id": self.item, "output_index": 0, "content_index": 0,
                    "delta": piece});
                self.event("response.output_text.delta", d)
            }
            Kind::Messages => {
                let d = json!({"index": 0, "delta": {"type": "text_delta", "text": piece}});
                self.event("content_block_delta", d)
            }
        }
    }

    fn closing(&mut self) -> String {
        match self.kind {
            Kind::Responses => {
                let r = self.body("completed");
                self.event("response.completed", json!({"response": r}))
            }
            Kind::Messages => {
                let stop = self.event("content_block_stop", json!({"index": 0}));
                let d = json!({"delta": {"stop_reason": "max_tokens", "stop_sequence": null},
                    "usage": {"output_tokens": self.output}});
                let delta = self.event("message_delta", d);
                stop + &delta + &self.event("message_stop", json!({}))
            }
        }
    }

    /// Applies one scheduler event; the text of a new token.
    fn apply(&mut self, ev: Event) -> (Option<&'static str>, bool) {
        match ev {
            Event::Admitted { cached_tokens } => {
                self.cached = cached_tokens;
                (None, false)
            }
            Event::Token { text, finish, .. } => {
                self.text.push_str(text);
                self.output += 1;
                (Some(text), finish.is_some())
            }
            Event::Done(_) => (None, true),
        }
    }
}

async fn agent(e: Data<Engine>, kind: Kind, body: Bytes) -> Answer {
    e.received
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let b: Value = api::json_body(&body)?;
    let history = turns(&e, kind, &b)?;
    let max = b["max_output_tokens"].as_u64().or(b["max_tokens"].as_u64());
    let chat = json!({
        "model": b["model"],
        "messages": history.iter().map(|(r, c)| json!({"role": r, "content": c})).collect::<Vec<_>>(),
        "max_tokens": max,
    });
    let chat = serde_json::to_vec(&chat).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let mut req = api::parse(Api::Chat, &chat, &e.cfg, &e.vocab)?;
    let rid = e.new_rid();
    let prompt = req.prompts.pop().unwrap_or_default();
    let mut a = Answering {
        kind,
        id: match kind {
            Kind::Responses => format!("resp_{rid}"),
            Kind::Messages => format!("msg_{rid}"),
        },
        item: format!("msg_{rid}"),
        model: b["model"]
            .as_str()
            .map_or_else(|| e.cfg.model.clone(), str::to_owned),
        created: kvgate_core::clock::unix_now() as u64,
        prompt: prompt.len(),
        cached: 0,
        text: String::new(),
        output: 0,
        seq: 0,
    };
    let ticket = e.rank(None).submit(Job {
        rid,
        prompt,
        max_new_tokens: req.max_new_tokens,
        probe: false,
    });
    let stored =
        (kind == Kind::Responses && b["store"].as_bool() != Some(false)).then_some(history);
    if b["stream"].as_bool() == Some(true) {
        return Ok(streamed(e, a, ticket, stored));
    }
    let mut ticket = ticket;
    loop {
        let ev = ticket.next().await.ok_or(ApiError::Unavailable)?;
        if a.apply(ev).1 {
            break;
        }
    }
    store(&e, &a, stored);
    Ok(HttpResponse::Ok().json(a.body("completed")))
}

/// Keeps a finished Responses answer for the requests that continue it.
fn store(e: &Engine, a: &Answering, stored: Option<Turns>) {
    if let Some(mut turns) = stored {
        turns.push(("assistant".to_owned(), a.text.clone()));
        (e.responses.lock().unwrap_or_else(PoisonError::into_inner)).insert(a.id.clone(), turns);
    }
}

/// The answer as events: the opening one once the request is admitted (a Messages
/// stream reports its cache reads there), a delta per token, the closing ones.
fn streamed(e: Data<Engine>, a: Answering, ticket: Ticket, stored: Option<Turns>) -> HttpResponse {
    let state = (false, e, a, ticket, stored, false);
    let frames = stream::unfold(
        state,
        |(opened, e, mut a, mut ticket, stored, done)| async move {
            if done {
                return None;
            }
            let mut out = String::new();
            loop {
                // `None`: the engine stopped; the stream ends without its last event.
                let (piece, finished) = a.apply(ticket.next().await?);
                if !opened && (piece.is_some() || finished) {
                    out.push_str(&a.opening());
                }
                if let Some(p) = piece {
                    out.push_str(&a.delta(p));
                }
                if finished {
                    out.push_str(&a.closing());
                    store(&e, &a, stored);
                    return Some((
                        Ok::<_, ApiError>(Bytes::from(out)),
                        (true, e, a, ticket, None, true),
                    ));
                }
                if !out.is_empty() {
                    return Some((Ok(Bytes::from(out)), (true, e, a, ticket, stored, false)));
                }
            }
        },
    );
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((CACHE_CONTROL, "no-cache"))
        .streaming(frames)
}
