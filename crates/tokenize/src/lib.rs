//! The token ids an engine will compute for a request, from the model's own files: the
//! Hugging Face `tokenizer.json` and, for chat, the chat template of
//! `tokenizer_config.json` (or `chat_template.jinja` beside it). kvgate uses them to match
//! text requests against the blocks engines report in their KV events.
//!
//! Chats are rendered as transformers' `apply_chat_template(…, tokenize=True)` renders them
//! (no special tokens added beyond the template's), with the request's
//! `add_generation_prompt` (default true) and `continue_final_message`, as vLLM passes
//! them; plain text is encoded as `tokenizer.encode(text)` (with them), as SGLang and vLLM
//! do.
//!
//! Encoding is cached by segment: text is cut where the added tokens (`<|eot_id|>`, …)
//! stand, as the tokenizer itself cuts it, so each message of a conversation is encoded
//! once and later turns encode only what is new. Where the tokenizer's pre-tokenizer looks
//! at a piece's place in the whole text (a Metaspace that prepends only at the start), or a
//! load-time check disagrees, whole texts are cached instead.
//!
//! ```no_run
//! # fn main() -> Result<(), kvgate_tokenize::TokenizeError> {
//! let tok = kvgate_tokenize::ModelTokenizer::from_path("/models/llama-3".as_ref())?;
//! let ids = tok.chat_ids(br#"{"messages": [{"role": "user", "content": "Hi"}]}"#)?;
//! let text_ids = tok.encode("Once upon a time", true)?;
//! # let _ = (ids, text_ids); Ok(()) }
//! ```

mod cache;
mod template;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use serde::Deserialize;
use thiserror::Error;
use tokenizers::Tokenizer;

pub use cache::CacheStats;
use cache::SegmentCache;
use template::ChatTemplate;

/// Tokens the segment cache holds by default (4 bytes each).
pub const DEFAULT_CACHE_TOKENS: usize = 4 * 1024 * 1024;

#[derive(Debug, Error)]
pub enum TokenizeError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Load { path: PathBuf, message: String },
    #[error("chat template: {0}")]
    Template(String),
    #[error("the tokenizer has no chat template")]
    NoTemplate,
    #[error("chat template rendering failed: {0}")]
    Render(String),
    #[error("request body: {0}")]
    Body(String),
    #[error("encoding failed: {0}")]
    Encode(String),
}

/// A model's tokenizer with its chat template and segment cache. Cheap to share behind an
/// `Arc`; every method takes `&self`.
pub struct ModelTokenizer {
    inner: Tokenizer,
    template: Option<ChatTemplate>,
    /// Finds added tokens as the tokenizer does (leftmost longest); `None` when text must
    /// be encoded whole.
    splitter: Option<(AhoCorasick, Vec<u32>)>,
    /// What `add_special_tokens` puts before and after a text, when it only wraps it.
    affix: Option<(Vec<u32>, Vec<u32>)>,
    cache: SegmentCache,
    path: PathBuf,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("path", &self.path)
            .field("chat_template", &self.template.is_some())
            .field("segmented", &self.splitter.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize, Default)]
struct TokenizerConfig {
    #[serde(default)]
    chat_template: Option<TemplateField>,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

/// A string, or a list of named templates (`default` is the one used for chats).
#[derive(Deserialize)]
#[serde(untagged)]
enum TemplateField {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

/// The parts of a chat completion body the template reads.
#[derive(Deserialize)]
struct ChatParts {
    messages: minijinja::Value,
    #[serde(default)]
    tools: Option<minijinja::Value>,
    #[serde(default)]
    chat_template_kwargs: Option<minijinja::Value>,
    /// vLLM's request fields: the template ends with the assistant's opening (the default),
    /// or leaves the final message open for the model to continue.
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
}

fn read(path: &Path) -> Result<Option<String>, TokenizeError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TokenizeError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

impl ModelTokenizer {
    /// Loads a model directory (with `tokenizer.json`, and `tokenizer_config.json` and
    /// `chat_template.jinja` when present) or a `tokenizer.json` file (with the config
    /// beside it).
    pub fn from_path(path: &Path) -> Result<ModelTokenizer, TokenizeError> {
        Self::with_cache(path, DEFAULT_CACHE_TOKENS)
    }

    /// As [`from_path`](Self::from_path), with a segment cache of `cache_tokens` tokens.
    pub fn with_cache(path: &Path, cache_tokens: usize) -> Result<ModelTokenizer, TokenizeError> {
        let (dir, file) = if path.is_dir() {
            (path.to_owned(), path.join("tokenizer.json"))
        } else {
            let dir = path.parent().map(Path::to_owned).unwrap_or_default();
            (dir, path.to_owned())
        };
        let inner = Tokenizer::from_file(&file).map_err(|e| TokenizeError::Load {
            path: file.clone(),
            message: e.to_string(),
        })?;
        let config_path = dir.join("tokenizer_config.json");
        let config: TokenizerConfig = match read(&config_path)? {
            Some(s) => serde_json::from_str(&s).map_err(|e| TokenizeError::Load {
                path: config_path.clone(),
                message: e.to_string(),
            })?,
            None => TokenizerConfig::default(),
        };
        let source = match config.chat_template {
            Some(TemplateField::One(s)) => Some(s),
            Some(TemplateField::Named(list)) => list
                .into_iter()
                .find(|t| t.name == "default")
                .map(|t| t.template),
            None => read(&dir.join("chat_template.jinja"))?,
        };
        let tokens = ["bos_token", "eos_token", "unk_token", "pad_token"]
            .iter()
            .filter_map(|name| {
                let v = config.rest.get(*name)?;
                // A string, or an AddedToken map with its `content`.
                let s = v.as_str().or_else(|| v.get("content")?.as_str())?;
                Some(((*name).to_owned(), s.to_owned()))
            })
            .collect();
        let template = source.map(|s| ChatTemplate::new(s, tokens)).transpose()?;
        let mut tok = ModelTokenizer {
            splitter: splitter(&inner),
            affix: None,
            inner,
            template,
            cache: SegmentCache::new(cache_tokens),
            path: path.to_owned(),
        };
        tok.affix = tok.find_affix();
        if tok.splitter.is_some() && !tok.segments_agree() {
            tok.splitter = None;
        }
        Ok(tok)
    }

    /// Where it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// Whether text is cached by segment (otherwise whole texts are).
    pub fn segmented(&self) -> bool {
        self.splitter.is_some()
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// The template's text for a chat completion body (`messages`, `tools`,
    /// `chat_template_kwargs`), as vLLM renders it: `add_generation_prompt` (default true)
    /// ends it with the assistant's opening; `continue_final_message` leaves the final
    /// message open, the text cut right after its content (transformers' rule).
    pub fn render_chat(&self, body: &[u8]) -> Result<String, TokenizeError> {
        let t = self.template.as_ref().ok_or(TokenizeError::NoTemplate)?;
        let parts: ChatParts =
            serde_json::from_slice(body).map_err(|e| TokenizeError::Body(e.to_string()))?;
        // vLLM lays the request's `chat_template_kwargs` over its own fields.
        let kw = |name: &str| -> Option<bool> {
            let v = parts.chat_template_kwargs.as_ref()?.get_attr(name).ok()?;
            (v.kind() == minijinja::value::ValueKind::Bool).then(|| v.is_true())
        };
        let open = kw("continue_final_message")
            .or(parts.continue_final_message)
            .unwrap_or(false);
        let generation = kw("add_generation_prompt")
            .or(parts.add_generation_prompt)
            .unwrap_or(true);
        let last = open.then(|| final_text(&parts.messages)).flatten();
        let text = t.render(
            parts.messages,
            parts.tools,
            parts.chat_template_kwargs,
            generation,
        )?;
        Ok(match last {
            Some(content) => match text.rfind(content.trim()) {
                Some(at) => text[..at + content.trim().len()].to_owned(),
                None => text,
            },
            None => text,
        })
    }

    /// The token ids of a chat completion body, as the engine computes them.
    pub fn chat_ids(&self, body: &[u8]) -> Result<Vec<u32>, TokenizeError> {
        let text = self.render_chat(body)?;
        self.encode(&text, false)
    }

    /// The token ids of `text`; `add_special_tokens` adds what the tokenizer's
    /// post-processor adds (a BOS, say), as `tokenizer.encode(text)` does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        let (before, after) = match (&self.affix, add_special_tokens) {
            (Some((b, a)), true) => (b.as_slice(), a.as_slice()),
            (None, true) => return self.cached(text, true).map(|ids| ids.to_vec()),
            (_, false) => (&[][..], &[][..]),
        };
        let mut out = Vec::with_capacity(before.len() + text.len() / 3 + after.len());
        out.extend_from_slice(before);
        match &self.splitter {
            Some((ac, ids)) => {
                let mut at = 0;
                for m in ac.find_iter(text) {
                    if m.start() > at {
                        out.extend_from_slice(&self.cached(&text[at..m.start()], false)?);
                    }
                    out.push(ids[m.pattern().as_usize()]);
                    at = m.end();
                }
                if at < text.len() {
                    out.extend_from_slice(&self.cached(&text[at..], false)?);
                }
            }
            None => out.extend_from_slice(&self.cached(text, false)?),
        }
        out.extend_from_slice(after);
        Ok(out)
    }

    fn cached(&self, text: &str, special: bool) -> Result<Arc<[u32]>, TokenizeError> {
        let k = cache::key(u8::from(special), text);
        if let Some(ids) = self.cache.get(&k) {
            return Ok(ids);
        }
        let ids: Arc<[u32]> = self.raw(text, special)?.into();
        self.cache.insert(k, ids.clone());
        Ok(ids)
    }

    fn raw(&self, text: &str, special: bool) -> Result<Vec<u32>, TokenizeError> {
        self.inner
            .encode_fast(text, special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizeError::Encode(e.to_string()))
    }

    /// The post-processor's additions, when they only wrap the text (found by encoding a
    /// probe both ways).
    fn find_affix(&self) -> Option<(Vec<u32>, Vec<u32>)> {
        let with = self.raw("a b", true).ok()?;
        let bare = self.raw("a b", false).ok()?;
        if bare.is_empty() {
            return None;
        }
        let at = with
            .windows(bare.len())
            .position(|w| w == bare.as_slice())?;
        Some((with[..at].to_vec(), with[at + bare.len()..].to_vec()))
    }

    /// Whether encoding by segment gives what encoding whole texts gives, on probes that
    /// put added tokens at a text's start, middle and end, and between spaces.
    fn segments_agree(&self) -> bool {
        if self.splitter.is_none() {
            return true;
        }
        let specials: Vec<String> = self
            .inner
            .get_added_tokens_decoder()
            .into_values()
            .map(|t| t.content)
            .take(2)
            .collect();
        let (Some(first), Some(last)) = (specials.first(), specials.last()) else {
            return true;
        };
        let probes = [
            format!("{first}Hello world {last}  after\n"),
            format!(" lead {first} mid{last}tail end"),
            format!("x{first}{last} y"),
        ];
        probes
            .iter()
            .all(|p| match (self.raw(p, false), self.encode(p, false)) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            })
    }
}

/// The splitter over the tokenizer's added tokens, when cutting text at them before
/// encoding is exactly what the tokenizer does: no token that strips or matches whole
/// words only or is matched after normalization, and no pre-tokenizer that treats the
/// text's first piece differently.
fn splitter(t: &Tokenizer) -> Option<(AhoCorasick, Vec<u32>)> {
    let pre = serde_json::to_string(&t.get_pre_tokenizer()).ok()?;
    if pre.contains("Metaspace") && pre.contains("\"first\"") {
        return None;
    }
    let mut added: Vec<(u32, String)> = Vec::new();
    for (id, tok) in t.get_added_tokens_decoder() {
        if tok.normalized || tok.lstrip || tok.rstrip || tok.single_word {
            return None;
        }
        added.push((id, tok.content));
    }
    if added.is_empty() {
        return None;
    }
    added.sort();
    let ac = AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(added.iter().map(|(_, c)| c.as_str()))
        .ok()?;
    Some((ac, added.into_iter().map(|(id, _)| id).collect()))
}

/// The text of the final message, when it is a string.
fn final_text(messages: &minijinja::Value) -> Option<String> {
    let n = messages.len()?;
    let last = messages
        .get_item(&minijinja::Value::from(n.checked_sub(1)?))
        .ok()?;
    let content = last.get_attr("content").ok()?;
    content.as_str().map(str::to_owned)
}
