//! A request's routing facts, read once per client request whatever front door it came
//! through: model, stream flag, and the prompt as text or token ids (`request_facts`),
//! then its model's own tokens where it has a tokenizer (`tokens`). The body itself is
//! forwarded unchanged.

use std::borrow::Cow;

use bytes::Bytes;
use kvgate_core::{BodyShape, Endpoint};
use kvgate_policies::{PromptText, RequestFacts, RoutingText};
use serde::Deserialize;

/// Bodies read by [`request_facts`] in this process (test builds): a request is read once
/// whatever happens to its dispatch.
#[cfg(feature = "fault-injection")]
static PARSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many bodies [`request_facts`] has read in this process (test builds).
#[cfg(feature = "fault-injection")]
pub fn parsed() -> u64 {
    PARSED.load(std::sync::atomic::Ordering::Relaxed)
}

/// A body routing cannot read; the front door answers it with a 400.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FactsError {
    #[error("{0}")]
    BadRequest(String),
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
}

mod fast;
mod plain;
mod routes;
pub(crate) mod tokens;

pub(crate) use routes::multipart_fields;
use routes::{MessagesBody, PlainBody, ResponsesBody};

#[derive(Deserialize)]
struct ChatBody<'a> {
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    /// OpenAI's `prompt_cache_key`: the session the request belongs to.
    #[serde(default, borrow)]
    prompt_cache_key: Option<Cow<'a, str>>,
    /// SGLang's adapter field (see [`Scope`]).
    #[serde(default, borrow)]
    lora_path: Option<Loose<'a>>,
    /// vLLM's salt (see [`Scope`]).
    #[serde(default, borrow)]
    cache_salt: Option<Loose<'a>>,
    #[serde(borrow)]
    messages: Vec<Message<'a>>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(default, borrow)]
    content: Option<Content<'a>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    Parts(#[serde(borrow)] Vec<Part<'a>>),
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct CompletionBody<'a> {
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    /// OpenAI's `prompt_cache_key`: the session the request belongs to.
    #[serde(default, borrow)]
    prompt_cache_key: Option<Cow<'a, str>>,
    /// SGLang's adapter field (see [`Scope`]).
    #[serde(default, borrow)]
    lora_path: Option<Loose<'a>>,
    /// vLLM's salt (see [`Scope`]).
    #[serde(default, borrow)]
    cache_salt: Option<Loose<'a>>,
    #[serde(borrow)]
    prompt: Prompt<'a>,
}

#[derive(Deserialize)]
struct GenerateBody<'a> {
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    /// OpenAI's `prompt_cache_key`: the session the request belongs to.
    #[serde(default, borrow)]
    prompt_cache_key: Option<Cow<'a, str>>,
    /// SGLang's adapter field (see [`Scope`]).
    #[serde(default, borrow)]
    lora_path: Option<Loose<'a>>,
    /// vLLM's salt (see [`Scope`]).
    #[serde(default, borrow)]
    cache_salt: Option<Loose<'a>>,
    #[serde(default, borrow)]
    text: Option<Prompt<'a>>,
    #[serde(default)]
    input_ids: Option<Prompt<'a>>,
}

/// What keeps a request's KV cache apart from its base model's: SGLang's `lora_path`
/// (an adapter's name) and vLLM's `cache_salt`. A value of another shape (SGLang takes a
/// list of paths for a batch) is the engine's to judge: routing reads none.
#[derive(Default)]
struct Scope<'a> {
    lora_path: Option<Loose<'a>>,
    cache_salt: Option<Loose<'a>>,
}

/// A string, or anything else (read as nothing).
#[derive(Deserialize)]
#[serde(untagged)]
enum Loose<'a> {
    Str(#[serde(borrow)] Cow<'a, str>),
    Other(serde::de::IgnoredAny),
}

impl<'a> Loose<'a> {
    fn text(self) -> Option<Cow<'a, str>> {
        match self {
            Loose::Str(s) if !s.is_empty() => Some(s),
            _ => None,
        }
    }
}

impl<'a> Scope<'a> {
    fn strings(self) -> (Option<String>, Option<String>) {
        let own = |l: Option<Loose<'a>>| l.and_then(Loose::text).map(Cow::into_owned);
        (own(self.lora_path), own(self.cache_salt))
    }
}

/// A prompt in any of the OpenAI/SGLang shapes.
#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    Texts(#[serde(borrow)] Vec<Cow<'a, str>>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

impl Prompt<'_> {
    /// The prompt as routing text, its long strings borrowed from `body`.
    fn into_routing(self, keep: bool, body: &Bytes) -> RoutingText {
        if !keep {
            return RoutingText::Empty;
        }
        match self {
            Prompt::Text(t) => {
                let mut text = PromptText::over(body.clone());
                text.push_body_str(&t);
                RoutingText::Text(text.seal())
            }
            // A batch goes to one worker; its prompts are recorded as one sequence.
            Prompt::Texts(ts) => {
                let mut text = PromptText::over(body.clone());
                for (i, t) in ts.iter().enumerate() {
                    if i > 0 {
                        text.push_str("\n");
                    }
                    text.push_body_str(t);
                }
                RoutingText::Text(text.seal())
            }
            Prompt::Tokens(t) => RoutingText::Tokens(t),
            Prompt::TokenLists(ls) => RoutingText::Tokens(ls.concat()),
        }
    }
}

fn json_error(e: serde_json::Error) -> FactsError {
    if e.is_data() {
        FactsError::BadRequest(format!("invalid request body: {e}"))
    } else {
        FactsError::InvalidJson(e.to_string())
    }
}

/// Deepest nesting accepted; deeper documents are refused before parsing, so neither the
/// gateway nor the engine behind it ever walks them.
pub(crate) const MAX_JSON_DEPTH: usize = 128;

/// Bytes that change the depth outside strings, or start one.
const STRUCTURAL: [bool; 256] = {
    let mut t = [false; 256];
    t[b'"' as usize] = true;
    t[b'[' as usize] = true;
    t[b'{' as usize] = true;
    t[b']' as usize] = true;
    t[b'}' as usize] = true;
    t
};

/// A scan for nesting depth outside strings (the JSON itself is validated by serde).
/// Strings, where a prompt's bytes are, are skipped with `memchr`, not byte by byte.
fn too_deep(body: &[u8]) -> bool {
    let (mut depth, mut i) = (0usize, 0usize);
    while i < body.len() {
        let b = body[i];
        i += 1;
        if !STRUCTURAL[b as usize] {
            continue;
        }
        match b {
            b'"' => loop {
                match memchr::memchr2(b'"', b'\\', &body[i..]) {
                    None => return false,
                    Some(k) if body[i + k] == b'"' => {
                        i += k + 1;
                        break;
                    }
                    // An escape: whatever follows the backslash is not the string's end.
                    Some(k) => i += k + 2,
                }
                if i >= body.len() {
                    return false;
                }
            },
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return true;
                }
            }
            _ => depth = depth.saturating_sub(1),
        }
    }
    false
}

/// Extracts the routing facts of a request body for `endpoint`. Without `prompt` the body
/// is checked as fully but the prompt is left out (`RoutingText::Empty`): the policy
/// does not read it. The routing text borrows its long strings from `bytes` (see
/// [`PromptText`]), so a long prompt is not copied.
pub fn request_facts(
    endpoint: Endpoint,
    bytes: &Bytes,
    prompt: bool,
) -> Result<RequestFacts, FactsError> {
    read_request(endpoint, bytes, prompt).map(|r| r.facts)
}

/// What a request body tells the gateway: its routing facts, and the answer it continues
/// (a Responses request's `previous_response_id`).
pub(crate) struct ReadRequest {
    pub facts: RequestFacts,
    pub continues: Option<String>,
}

/// [`request_facts`], and the answer the request continues.
pub(crate) fn read_request(
    endpoint: Endpoint,
    bytes: &Bytes,
    prompt: bool,
) -> Result<ReadRequest, FactsError> {
    #[cfg(feature = "fault-injection")]
    PARSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    match endpoint.shape() {
        // Form fields are read with the body's content type (`multipart_fields`).
        BodyShape::Multipart => return Ok(nothing()),
        // A passthrough body is read only when it is a JSON object.
        BodyShape::Any if bytes.trim_ascii_start().first() != Some(&b'{') => {
            return Ok(nothing());
        }
        _ => {}
    }
    // The fast path checks UTF-8 as it reads (see `fast`); what it leaves goes to serde,
    // with the checks and error messages it needs first.
    let parsed = match fast::scan(bytes, endpoint, prompt) {
        Some(b) => b,
        None => serde_checked(endpoint, bytes)?,
    };
    facts_of(parsed, prompt, bytes)
}

/// Facts of a body routing does not read: no model, no prompt.
fn nothing() -> ReadRequest {
    ReadRequest {
        facts: RequestFacts::default(),
        continues: None,
    }
}

/// `body` read by serde, after the checks serde would not make or would report vaguely.
fn serde_checked(endpoint: Endpoint, body: &[u8]) -> Result<Body<'_>, FactsError> {
    // serde_json skips unread strings without checking them: check the whole body once,
    // then parse it as a `str`, which serde does not check again.
    // The SIMD check is several times std's on a long prompt; std's says where it failed.
    let body = match simdutf8::basic::from_utf8(body).or_else(|_| std::str::from_utf8(body)) {
        Ok(b) => b,
        Err(e) => {
            return Err(FactsError::InvalidJson(format!(
                "the body is not UTF-8: {e}"
            )));
        }
    };
    // Reject non-objects early: untagged enums would otherwise give vague messages.
    let first = body.bytes().find(|b| !b.is_ascii_whitespace());
    if first != Some(b'{') {
        return Err(if first.is_none() {
            FactsError::InvalidJson("empty body".into())
        } else if too_deep(body.as_bytes()) {
            too_deep_error()
        } else {
            // Let serde report invalid JSON as such; valid JSON that is not an object is a 400.
            match serde_json::from_str::<serde::de::IgnoredAny>(body) {
                Err(e) => json_error(e),
                Ok(_) => FactsError::BadRequest("request body must be a JSON object".into()),
            }
        });
    }
    // The fast path reads at most 32 levels, so only what it leaves to serde can be too
    // deep: the depth scan, a pass over the whole body, runs only then.
    if too_deep(body.as_bytes()) {
        return Err(too_deep_error());
    }
    serde_body(endpoint, body)
}

fn too_deep_error() -> FactsError {
    FactsError::InvalidJson(format!("nesting deeper than {MAX_JSON_DEPTH} levels"))
}

/// A body of one of the shapes, read by the fast path (the first three) or by serde.
enum Body<'a> {
    Chat(ChatBody<'a>),
    Completion(CompletionBody<'a>),
    Generate(GenerateBody<'a>),
    Responses(ResponsesBody<'a>),
    Messages(MessagesBody<'a>),
    Plain(PlainBody<'a>),
}

/// The body as serde reads it: the reference for the fast path, and the answer (with
/// serde's error messages) wherever the fast path is unsure.
fn serde_body(endpoint: Endpoint, body: &str) -> Result<Body<'_>, FactsError> {
    Ok(match endpoint.shape() {
        BodyShape::Chat => Body::Chat(serde_json::from_str(body).map_err(json_error)?),
        BodyShape::Completion => Body::Completion(serde_json::from_str(body).map_err(json_error)?),
        BodyShape::Generate => Body::Generate(serde_json::from_str(body).map_err(json_error)?),
        BodyShape::Responses => Body::Responses(serde_json::from_str(body).map_err(json_error)?),
        BodyShape::Messages => Body::Messages(serde_json::from_str(body).map_err(json_error)?),
        BodyShape::Json | BodyShape::Any | BodyShape::Multipart => {
            Body::Plain(serde_json::from_str(body).map_err(json_error)?)
        }
    })
}

fn facts_of(body: Body<'_>, prompt: bool, bytes: &Bytes) -> Result<ReadRequest, FactsError> {
    let mut continues = None;
    let cache_key = match &body {
        Body::Chat(b) => b.prompt_cache_key.as_deref(),
        Body::Completion(b) => b.prompt_cache_key.as_deref(),
        Body::Generate(b) => b.prompt_cache_key.as_deref(),
        Body::Responses(b) => b.prompt_cache_key.as_deref(),
        Body::Messages(b) => b.prompt_cache_key.as_deref(),
        Body::Plain(b) => b.prompt_cache_key.as_deref(),
    };
    // A key that is no usable routing key (empty, too long) names no session.
    let session = kvgate_policies::valid_routing_key(cache_key).map(str::to_owned);
    let mut scope = Scope::default();
    let (model, stream, key) = match body {
        Body::Responses(b) => {
            let key = b.routing(prompt, bytes);
            continues = b.previous_response_id.map(Cow::into_owned);
            (b.model, b.stream, key)
        }
        Body::Messages(b) => {
            let key = b.routing(prompt, bytes);
            (b.model, b.stream, key)
        }
        Body::Plain(b) => (b.model, b.stream, RoutingText::Empty),
        Body::Chat(b) => {
            scope = Scope {
                lora_path: b.lora_path,
                cache_salt: b.cache_salt,
            };
            let key = if prompt {
                RoutingText::Text(render_chat(&b.messages, bytes))
            } else {
                RoutingText::Empty
            };
            (b.model, b.stream, key)
        }
        Body::Completion(b) => {
            scope = Scope {
                lora_path: b.lora_path,
                cache_salt: b.cache_salt,
            };
            (b.model, b.stream, b.prompt.into_routing(prompt, bytes))
        }
        Body::Generate(b) => {
            scope = Scope {
                lora_path: b.lora_path,
                cache_salt: b.cache_salt,
            };
            let key = match (b.text, b.input_ids) {
                (Some(t), _) => t.into_routing(prompt, bytes),
                (None, Some(ids @ (Prompt::Tokens(_) | Prompt::TokenLists(_)))) => {
                    ids.into_routing(prompt, bytes)
                }
                (None, Some(_)) => {
                    return Err(FactsError::BadRequest(
                        "input_ids must be an array of token ids".into(),
                    ));
                }
                (None, None) => {
                    return Err(FactsError::BadRequest(
                        "one of 'text' or 'input_ids' is required".into(),
                    ));
                }
            };
            (b.model, b.stream, key)
        }
    };
    let (adapter, cache_salt) = scope.strings();
    Ok(ReadRequest {
        facts: RequestFacts {
            model: model.map(Cow::into_owned),
            key,
            routing_key: None,
            stream: stream.unwrap_or(false),
            pinned: None,
            session,
            adapter,
            cache_salt,
        },
        continues,
    })
}

/// Chat as routing text: each message's role and content, in order, so conversations that
/// differ only in roles do not look identical.
fn render_chat(messages: &[Message<'_>], body: &Bytes) -> PromptText {
    let mut out = PromptText::over(body.clone());
    for m in messages {
        out.push_str("<|");
        out.push_str(&m.role);
        out.push_str("|>\n");
        match &m.content {
            Some(Content::Text(t)) => out.push_body_str(t),
            Some(Content::Parts(parts)) => {
                for t in parts.iter().filter_map(|p| p.text.as_deref()) {
                    out.push_body_str(t);
                }
            }
            None => {}
        }
        out.push_str("\n");
    }
    out.seal()
}

#[cfg(test)]
mod tests;
