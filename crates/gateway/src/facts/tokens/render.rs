//! A text request's tokens from the engine itself, for a model with no tokenizer on the
//! gateway's host: vLLM renders a chat (`POST /v1/chat/completions/render`) or a
//! completion's prompts (`POST /v1/completions/render`) exactly as it will for inference,
//! template and special tokens included; a chat's later turns route on an earlier turn's
//! render (see [`tokens`]). The answer is read in the shapes vLLM gives:
//! `{"token_ids": [...]}`, `{"prompt_token_ids": [...]}`, or a list of those (a batch,
//! matched as one sequence, as the local path joins a batch's prompts).

use std::sync::Arc;

use bytes::Bytes;
use kvgate_core::Endpoint;
use kvgate_policies::{RequestFacts, RoutingText};
use serde_json::Value;

use super::TokenSource;
use crate::actors::tokenizers::{RenderError, RenderLater, RenderTarget, Tokenizers, ask};

/// Replaces `facts.key` with the tokens an engine of `targets` renders for `body`; on any
/// failure the text key stays and the reason is said.
///
/// A chat is cached by conversation prefix: each message list a render answered is kept
/// under a hash of its messages (and of the fields that shape the template), so a later
/// turn, whose messages begin with an earlier turn's, is routed at once on that turn's ids
/// (a prefix of its own, which is what a holder can hold) while its whole render is asked
/// off the request path for the turn after. Only a conversation's first request waits on
/// the engine.
pub(super) async fn tokens(
    tokenizers: &Arc<Tokenizers>,
    targets: &Arc<[RenderTarget]>,
    endpoint: Endpoint,
    body: &Bytes,
    facts: &mut RequestFacts,
) -> TokenSource {
    let route = match endpoint {
        Endpoint::Chat => "/v1/chat/completions/render",
        Endpoint::Completions => "/v1/completions/render",
        _ => return TokenSource::text("this route's prompt is matched as text"),
    };
    let keys = match endpoint {
        Endpoint::Chat => conversation_keys(body),
        _ => Vec::new(),
    };
    // The whole prompt's key: the last message list's, else the body's.
    let whole = keys
        .last()
        .copied()
        .unwrap_or_else(|| xxhash_rust::xxh3::xxh3_64_with_seed(body, endpoint as u64));
    // One engine of the model, chosen by the prompt so retries ask the same one.
    let Some(target) = targets.get(whole as usize % targets.len().max(1)) else {
        return TokenSource::text("no engine of the model renders prompts");
    };
    let engine = target.url.to_string();
    if let Some(ids) = tokenizers.rendered(whole) {
        facts.key = RoutingText::Tokens(ids.to_vec());
        return TokenSource::Render {
            engine,
            cached: true,
            prefix_messages: None,
        };
    }
    // The longest earlier turn of this conversation that was rendered.
    let earlier = (keys.iter().enumerate().rev().skip(1))
        .find_map(|(i, k)| tokenizers.rendered(*k).map(|ids| (i + 1, ids)));
    if let Some((messages, ids)) = earlier {
        facts.key = RoutingText::Tokens(ids.to_vec());
        tokenizers.render_later(RenderLater {
            target: target.clone(),
            route,
            body: body.clone(),
            key: whole,
        });
        return TokenSource::Render {
            engine,
            cached: true,
            prefix_messages: Some(messages),
        };
    }
    match ask(target, route, body).await {
        Ok(ids) => {
            let ids: Arc<[u32]> = ids.into();
            tokenizers.keep_rendered(whole, ids.clone());
            facts.key = RoutingText::Tokens(ids.to_vec());
            TokenSource::Render {
                engine,
                cached: false,
                prefix_messages: None,
            }
        }
        Err(e) => {
            if matches!(e, RenderError::NoRoute(_)) {
                tokenizers.render_refused(facts.model.as_deref());
            }
            TokenSource::text(format!("the engine's render failed: {e}"))
        }
    }
}

/// For a chat body, one key per message-list prefix (`keys[k]` for the first `k + 1`
/// messages), each a hash of the fields that shape the template and of those messages;
/// empty when the body has no message list.
fn conversation_keys(body: &[u8]) -> Vec<u64> {
    #[derive(serde::Deserialize)]
    struct Chat {
        #[serde(default)]
        model: Value,
        #[serde(default)]
        messages: Vec<Value>,
        #[serde(default)]
        tools: Value,
        #[serde(default)]
        chat_template_kwargs: Value,
        #[serde(default)]
        add_generation_prompt: Value,
        #[serde(default)]
        continue_final_message: Value,
    }
    let Ok(c) = serde_json::from_slice::<Chat>(body) else {
        return Vec::new();
    };
    // serde_json's maps are sorted: the same value always writes the same bytes.
    let shape = [
        &c.model,
        &c.tools,
        &c.chat_template_kwargs,
        &c.add_generation_prompt,
        &c.continue_final_message,
    ];
    let mut h = xxhash_rust::xxh3::xxh3_64(&serde_json::to_vec(&shape).unwrap_or_default());
    c.messages
        .iter()
        .map(|m| {
            let bytes = serde_json::to_vec(m).unwrap_or_default();
            h = xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, h);
            h
        })
        .collect()
}
