//! Bodies of the three inference routes, and the JSON shapes of their answers
//! (SGLang-native `/generate`, OpenAI completions and chat, whole or as stream chunks).

use std::time::Instant;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::scheduler::{Event, Finish};
use crate::vocab::Vocab;
use crate::{SimConfig, tokenizer};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    Generate,
    Completion,
    Chat,
}

/// What every inference request comes down to.
#[derive(Debug)]
pub(crate) struct Request {
    /// One prompt, or several for a batch (`/v1/completions` and `/generate` take a list).
    pub(crate) prompts: Vec<Vec<u32>>,
    pub(crate) max_new_tokens: usize,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) rid: Option<String>,
    /// `routed_dp_rank` as sent (signed, so a negative one is refused with SGLang's words).
    pub(crate) dp_rank: Option<i64>,
    pub(crate) model: Option<String>,
    /// The LoRA adapter it runs under (its `model`, or `lora_path`), and its cache salt.
    pub(crate) adapter: Option<String>,
    pub(crate) cache_salt: Option<String>,
}

/// Fields every route accepts.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Common {
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    rid: Option<String>,
    routed_dp_rank: Option<i64>,
    /// Deprecated alias of `routed_dp_rank`.
    data_parallel_rank: Option<i64>,
    model: Option<String>,
    /// SGLang's adapter field.
    lora_path: Option<String>,
    /// vLLM's cache salt.
    cache_salt: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
struct GenerateBody {
    text: Option<Prompt>,
    input_ids: Option<Prompt>,
    #[serde(default)]
    sampling_params: SamplingParams,
    #[serde(flatten)]
    common: Common,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SamplingParams {
    max_new_tokens: Option<usize>,
}

#[derive(Deserialize)]
struct CompletionBody {
    prompt: Option<Prompt>,
    max_tokens: Option<usize>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Deserialize)]
struct ChatBody {
    messages: Option<Vec<Message>>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: Option<Content>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

/// A content part; only text parts carry tokens here.
#[derive(Deserialize)]
struct Part {
    text: Option<String>,
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::BadRequest(message.into())
}

pub(crate) fn json_body<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| bad(format!("invalid request body: {e}")))
}

/// Parses and checks an inference body, tokenizing its prompt.
pub(crate) fn parse(
    api: Api,
    body: &[u8],
    cfg: &SimConfig,
    vocab: &Vocab,
) -> Result<Request, ApiError> {
    let (prompts, max_new, common) = match api {
        Api::Generate => {
            let b: GenerateBody = json_body(body)?;
            let prompts = match (b.text, b.input_ids) {
                (Some(p), None) | (None, Some(p)) => batch(vocab, p)?,
                _ => return Err(bad("Either text or input_ids should be provided.")),
            };
            (prompts, b.sampling_params.max_new_tokens, b.common)
        }
        Api::Completion => {
            let b: CompletionBody = json_body(body)?;
            let prompts = batch(vocab, b.prompt.ok_or_else(|| bad("prompt is required"))?)?;
            (prompts, b.max_tokens, b.common)
        }
        Api::Chat => {
            let b: ChatBody = json_body(body)?;
            let messages = b.messages.filter(|m| !m.is_empty());
            let messages = messages.ok_or_else(|| bad("messages must be a non-empty list"))?;
            let texts: Vec<(String, String)> = messages
                .into_iter()
                .map(|m| (m.role, content_text(m.content)))
                .collect();
            let ids = match vocab.chat(body) {
                // The template's own refusals are the client's error, as in SGLang.
                Some(ids) => ids?,
                None => {
                    let text =
                        tokenizer::render_chat(texts.iter().map(|(r, c)| (r.as_str(), c.as_str())));
                    vocab.encode(&text)?
                }
            };
            let max_new = b.max_completion_tokens.or(b.max_tokens);
            (vec![ids], max_new, b.common)
        }
    };
    let stream = common.stream.unwrap_or(false);
    if prompts.is_empty() {
        return Err(bad("The prompt list is empty."));
    }
    if prompts.len() > 1 && stream && api == Api::Generate {
        return Err(bad(
            "streaming a batch from /generate is not simulated; use /v1/completions",
        ));
    }
    let max_new_tokens = max_new.unwrap_or(cfg.default_max_new_tokens);
    for prompt in &prompts {
        check_prompt(prompt, max_new_tokens, cfg)?;
    }
    let dp_rank = if cfg.reads_routed_dp_rank() {
        common.routed_dp_rank.or(common.data_parallel_rank)
    } else {
        common.data_parallel_rank
    };
    // vLLM names an adapter by `model` alone; `lora_path` is SGLang's.
    let lora_path = common
        .lora_path
        .filter(|_| cfg.flavor != crate::Flavor::Vllm);
    let adapter = adapter_of(cfg, common.model.as_deref(), lora_path)?;
    Ok(Request {
        adapter,
        cache_salt: common.cache_salt.filter(|s| !s.is_empty()),
        prompts,
        max_new_tokens,
        stream,
        include_usage: common
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        rid: common.rid,
        dp_rank,
        model: common.model,
    })
}

/// The adapter a request runs under: its `model` where that is one of the engine's
/// adapters, else its `lora_path`, which must be one. An engine with adapters refuses a
/// model it does not serve, as vLLM does.
fn adapter_of(
    cfg: &SimConfig,
    model: Option<&str>,
    lora_path: Option<String>,
) -> Result<Option<String>, ApiError> {
    let known = |m: &str| cfg.lora_adapters.iter().any(|a| a == m);
    if let Some(m) = model
        && known(m)
    {
        return Ok(Some(m.to_owned()));
    }
    if !cfg.lora_adapters.is_empty()
        && let Some(m) = model
        && m != cfg.model
    {
        return Err(ApiError::UnknownModel(m.to_owned()));
    }
    match lora_path.filter(|p| !p.is_empty()) {
        Some(p) if known(&p) => Ok(Some(p)),
        Some(p) => Err(bad(format!("LoRA adapter {p} is not loaded"))),
        None => Ok(None),
    }
}

fn check_prompt(prompt: &[u32], max_new_tokens: usize, cfg: &SimConfig) -> Result<(), ApiError> {
    if prompt.is_empty() {
        return Err(bad("The prompt is empty."));
    }
    if prompt.len() + max_new_tokens > cfg.context_length {
        return Err(bad(format!(
            "Requested token count exceeds the model's maximum context length of {} tokens. \
             You requested a total of {} tokens: {} tokens from the input messages and {} \
             tokens for the completion.",
            cfg.context_length,
            prompt.len() + max_new_tokens,
            prompt.len(),
            max_new_tokens
        )));
    }
    // SGLang clamps to its KV pool too; a request that could never be admitted is refused
    // here, in the same words, rather than left waiting forever.
    if prompt.len() + max_new_tokens > cfg.cache_capacity_tokens {
        return Err(bad(format!(
            "Requested token count exceeds the KV cache capacity (max_total_num_tokens) of {} \
             tokens. You requested a total of {} tokens: {} tokens from the input messages and \
             {} tokens for the completion.",
            cfg.cache_capacity_tokens,
            prompt.len() + max_new_tokens,
            prompt.len(),
            max_new_tokens
        )));
    }
    Ok(())
}

/// The prompts of a body: one, or each element of a list.
fn batch(vocab: &Vocab, prompt: Prompt) -> Result<Vec<Vec<u32>>, ApiError> {
    Ok(match prompt {
        Prompt::Text(t) => vec![vocab.encode(&t)?],
        Prompt::Ids(ids) => vec![ids],
        Prompt::Texts(v) => v
            .iter()
            .map(|t| vocab.encode(t))
            .collect::<Result<_, _>>()?,
        Prompt::IdLists(v) => v,
    })
}

fn content_text(content: Option<Content>) -> String {
    match content {
        None => String::new(),
        Some(Content::Text(t)) => t,
        Some(Content::Parts(parts)) => parts
            .into_iter()
            .filter_map(|p| p.text)
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// The answer being built for one request, fed by scheduler events.
#[derive(Debug)]
pub(crate) struct Reply {
    api: Api,
    rid: String,
    model: String,
    created: u64,
    include_usage: bool,
    /// `enable_cache_report`: OpenAI usage carries `prompt_tokens_details`.
    cache_report: bool,
    started: Instant,
    prompt_tokens: usize,
    cached_tokens: usize,
    text: String,
    output_ids: Vec<u32>,
    finish: Option<Finish>,
    /// The choice index: the prompt's position in a batch.
    index: usize,
}

impl Reply {
    pub(crate) fn new(
        api: Api,
        rid: String,
        model: String,
        include_usage: bool,
        prompt_tokens: usize,
    ) -> Self {
        Self {
            api,
            rid,
            model,
            created: kvgate_core::clock::unix_now() as u64,
            include_usage,
            cache_report: false,
            started: Instant::now(),
            prompt_tokens,
            cached_tokens: 0,
            text: String::new(),
            output_ids: Vec::new(),
            finish: None,
            index: 0,
        }
    }

    /// With `prompt_tokens_details` in its usage (`enable_cache_report`).
    pub(crate) fn cache_report(mut self, on: bool) -> Self {
        self.cache_report = on;
        self
    }

    /// The reply to the `index`-th prompt of a batch.
    pub(crate) fn at_index(mut self, index: usize) -> Self {
        self.index = index;
        self
    }

    pub(crate) fn finished(&self) -> bool {
        self.finish.is_some()
    }

    /// Records an event; returns the text of a new token.
    pub(crate) fn apply(&mut self, event: Event) -> Option<&'static str> {
        match event {
            Event::Admitted { cached_tokens } => {
                self.cached_tokens = cached_tokens;
                None
            }
            Event::Token { id, text, finish } => {
                self.text.push_str(text);
                self.output_ids.push(id);
                self.finish = finish;
                Some(text)
            }
            Event::Done(finish) => {
                self.finish = Some(finish);
                None
            }
        }
    }

    /// Records an event; returns the stream chunks it produces.
    pub(crate) fn stream_chunks(&mut self, event: Event) -> Vec<Value> {
        let first = self.output_ids.is_empty();
        let piece = self.apply(event);
        let mut chunks = Vec::new();
        match self.api {
            Api::Generate => {
                if piece.is_some() || self.finished() {
                    chunks.push(self.body());
                }
                return chunks;
            }
            Api::Chat if first && piece.is_some() => {
                chunks.push(self.chunk(json!({"role": "assistant", "content": ""}), None));
            }
            _ => {}
        }
        if let Some(piece) = piece {
            chunks.push(match self.api {
                Api::Chat => self.chunk(json!({ "content": piece }), None),
                _ => self.chunk(json!(piece), None),
            });
        }
        if let Some(finish) = self.finish {
            let last = match self.api {
                Api::Chat => json!({}),
                _ => json!(""),
            };
            chunks.push(self.chunk(last, Some(finish)));
            if self.include_usage {
                chunks.push(self.usage_chunk(self.counts()));
            }
        }
        chunks
    }

    /// The whole answer (also the cumulative `/generate` stream chunk).
    pub(crate) fn body(&self) -> Value {
        match self.api {
            Api::Generate => json!({
                "text": self.text,
                "output_ids": self.output_ids,
                "meta_info": {
                    "id": self.rid,
                    "finish_reason": self.finish.map(|f| match f {
                        Finish::Length => json!({"type": "length", "length": self.output_ids.len()}),
                        Finish::Abort => json!({"type": "abort", "message": "Abort request"}),
                    }),
                    "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": self.output_ids.len(),
                    "cached_tokens": self.cached_tokens,
                    "e2e_latency": self.started.elapsed().as_secs_f64(),
                },
            }),
            Api::Completion => json!({
                "id": self.rid,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [{
                    "index": self.index,
                    "text": self.text,
                    "logprobs": null,
                    "finish_reason": self.finish.map(openai_finish),
                    "matched_stop": null,
                }],
                "usage": self.usage(),
            }),
            Api::Chat => json!({
                "id": self.rid,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": self.text, "tool_calls": null},
                    "logprobs": null,
                    "finish_reason": self.finish.map(openai_finish),
                    "matched_stop": null,
                }],
                "usage": self.usage(),
            }),
        }
    }

    /// One OpenAI stream chunk; `delta` is the chat delta or the completion text.
    fn chunk(&self, delta: Value, finish: Option<Finish>) -> Value {
        let (object, key) = match self.api {
            Api::Chat => ("chat.completion.chunk", "delta"),
            _ => ("text_completion", "text"),
        };
        json!({
            "id": self.rid,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": self.index,
                key: delta,
                "logprobs": null,
                "finish_reason": finish.map(openai_finish),
            }],
        })
    }

    /// The closing stream chunk that carries only `usage`.
    pub(crate) fn usage_chunk(&self, usage: Usage) -> Value {
        let mut chunk = self.chunk(Value::Null, None);
        chunk["choices"] = json!([]);
        chunk["usage"] = usage.json(self.cache_report);
        chunk
    }

    fn usage(&self) -> Value {
        self.counts().json(self.cache_report)
    }

    pub(crate) fn counts(&self) -> Usage {
        Usage {
            prompt: self.prompt_tokens,
            completion: self.output_ids.len(),
            cached: self.cached_tokens,
        }
    }
}

/// Token counts of one reply, or summed over a batch.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Usage {
    pub(crate) prompt: usize,
    pub(crate) completion: usize,
    pub(crate) cached: usize,
}

impl Usage {
    pub(crate) fn add(self, o: Usage) -> Usage {
        Usage {
            prompt: self.prompt + o.prompt,
            completion: self.completion + o.completion,
            cached: self.cached + o.cached,
        }
    }

    /// The OpenAI `usage` object. As in SGLang's usage processor, `prompt_tokens_details`
    /// is `{"cached_tokens": n}` only with the cache report on and a hit (`n > 0`), else null.
    pub(crate) fn json(self, cache_report: bool) -> Value {
        let details =
            (cache_report && self.cached > 0).then(|| json!({"cached_tokens": self.cached}));
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": details,
        })
    }
}

fn openai_finish(finish: Finish) -> &'static str {
    match finish {
        Finish::Length => "length",
        Finish::Abort => "abort",
    }
}
