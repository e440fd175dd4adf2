//! A text request's tokens, when its model has a tokenizer: the chat rendered with the
//! model's chat template, or the prompt encoded with the special tokens the tokenizer adds,
//! so the selector matches it on the blocks workers report in their KV events. Long bodies
//! are tokenized on actix's blocking pool, not on the HTTP thread; the tokenizer caches by
//! segment, so a conversation's later turns encode only what is new.

use std::borrow::Cow;
use std::sync::Arc;

use actix_web::web;
use bytes::Bytes;
use kvgate_policies::{PromptText, RequestFacts, RoutingText};
use serde::Serialize;

use crate::actors::tokenizers::{Slot, Tokenizers};

mod render;
use kvgate_core::Endpoint;

/// Bodies up to this size are tokenized where they were read.
const INLINE_MAX: usize = 16 * 1024;

/// Where a request's routing key came from: explain and the decision log show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub(crate) enum TokenSource {
    /// The request carried token ids (`input_ids`, a token-array prompt).
    Request,
    /// Encoded with the model's tokenizer, loaded from `tokenizer`.
    Tokenizer { tokenizer: String },
    /// Rendered by the engine at `engine` (vLLM's render routes), or by an earlier call
    /// (`cached`): for the same prompt, or, for a chat, for its first `prefix_messages`
    /// messages, on which it is routed while its whole render runs off the request path.
    Render {
        engine: String,
        cached: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        prefix_messages: Option<usize>,
    },
    /// Matched as text on the approximate index, for this reason.
    Text { reason: Cow<'static, str> },
    /// The policy does not read the prompt.
    None,
}

impl TokenSource {
    fn text(reason: impl Into<Cow<'static, str>>) -> TokenSource {
        TokenSource::Text {
            reason: reason.into(),
        }
    }
}

/// Replaces a text key with the engine's tokens when the model has a tokenizer, or, with
/// none here, when its engines render prompts (vLLM); a failure leaves the text key (the
/// engine gives the request its own answer). On the HTTP threads: the render client is
/// theirs.
pub(crate) async fn tokenize(
    tokenizers: &Arc<Tokenizers>,
    endpoint: Endpoint,
    body: &Bytes,
    facts: &mut RequestFacts,
) -> TokenSource {
    if matches!(facts.key, RoutingText::Text(_))
        && let Some(Slot::Render(targets)) = tokenizers.lookup(facts.model.as_deref())
    {
        return render::tokens(tokenizers, &targets, endpoint, body, facts).await;
    }
    tokenize_here(tokenizers, endpoint, body, facts).await
}

/// [`tokenize`] with the gateway's own tokenizers only (the endpoint picker, whose tasks
/// may move between threads).
pub(crate) async fn tokenize_here(
    tokenizers: &Tokenizers,
    endpoint: Endpoint,
    body: &Bytes,
    facts: &mut RequestFacts,
) -> TokenSource {
    match &facts.key {
        RoutingText::Tokens(_) => return TokenSource::Request,
        RoutingText::Empty => return TokenSource::None,
        RoutingText::Text(_) => {}
    }
    let tok = match tokenizers.lookup(facts.model.as_deref()) {
        Some(Slot::Render(_)) => {
            return TokenSource::text(
                "no tokenizer here (give --tokenizer-path): the engine renders prompts, which the picker does not ask",
            );
        }
        None => return TokenSource::text("no worker serving this model publishes KV events"),
        Some(Slot::Loading(_)) => return TokenSource::text("the model's tokenizer is loading"),
        Some(Slot::Failed(e)) => return TokenSource::text(format!("tokenizer not loaded: {e}")),
        Some(Slot::Missing(reason)) => return TokenSource::text(reason.to_string()),
        Some(Slot::Ready(t)) => t,
    };
    // The Responses and Messages prompts are rendered by the engine's own templates
    // from fields the gateway does not model: they are matched as text.
    if !matches!(
        endpoint,
        Endpoint::Chat | Endpoint::Completions | Endpoint::Generate
    ) {
        return TokenSource::text("this route's prompt is matched as text");
    }
    if endpoint == Endpoint::Chat && !tok.has_chat_template() {
        return TokenSource::text("the model's tokenizer has no chat template");
    }
    let text = match std::mem::take(&mut facts.key) {
        RoutingText::Text(t) => t,
        other => {
            facts.key = other;
            return TokenSource::None;
        }
    };
    let run = {
        let (tok, body) = (tok.clone(), body.clone());
        move |text: PromptText| {
            let ids = match endpoint {
                Endpoint::Chat => tok.chat_ids(&body),
                _ => tok.encode(&text.to_cow(), true),
            };
            (ids, text)
        }
    };
    let (ids, text) = if body.len() <= INLINE_MAX {
        run(text)
    } else {
        match web::block(move || run(text)).await {
            Ok(done) => done,
            // The pool is gone (shutting down); the text went with the closure.
            Err(_) => return TokenSource::text("no thread to tokenize on"),
        }
    };
    match ids {
        Ok(ids) => {
            facts.key = RoutingText::Tokens(ids);
            TokenSource::Tokenizer {
                tokenizer: tok.path().display().to_string(),
            }
        }
        Err(e) => {
            facts.key = RoutingText::Text(text);
            TokenSource::text(format!("tokenization failed: {e}"))
        }
    }
}
