//! A text request's tokens from the engine itself, for a model with no tokenizer on the
//! gateway's host: vLLM renders a chat (`POST /v1/chat/completions/render`) or a
//! completion's prompts (`POST /v1/completions/render`) exactly as it will for inference,
//! template and special tokens included. The answer is read in the shapes vLLM gives:
//! `{"token_ids": [...]}`, `{"prompt_token_ids": [...]}`, or a list of those (a batch,
//! matched as one sequence, as the local path joins a batch's prompts).

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kvgate_core::Endpoint;
use kvgate_policies::{RequestFacts, RoutingText};
use serde_json::Value;

use super::TokenSource;
use crate::actors::tokenizers::{RenderTarget, Tokenizers};

/// A render is a tokenization on the engine's CPU: past this the request goes as text.
const RENDER_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest render answer read (a token id is at most 11 bytes of JSON).
const ANSWER_LIMIT: usize = 64 << 20;

thread_local! {
    /// One client per HTTP thread: awc's client is not `Send`.
    static CLIENT: RefCell<Option<awc::Client>> = const { RefCell::new(None) };
}

fn client() -> awc::Client {
    CLIENT.with(|c| {
        c.borrow_mut()
            .get_or_insert_with(|| {
                awc::Client::builder()
                    .timeout(RENDER_TIMEOUT)
                    .disable_redirects()
                    .finish()
            })
            .clone()
    })
}

/// Replaces `facts.key` with the tokens an engine of `targets` renders for `body`; on any
/// failure the text key stays and the reason is said.
pub(super) async fn tokens(
    tokenizers: &Tokenizers,
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
    // One engine of the model, chosen by the body so retries ask the same one.
    let key = xxhash_rust::xxh3::xxh3_64_with_seed(body, endpoint as u64);
    let Some(target) = targets.get(key as usize % targets.len().max(1)) else {
        return TokenSource::text("no engine of the model renders prompts");
    };
    let engine = target.url.to_string();
    if let Some(ids) = tokenizers.rendered(key) {
        facts.key = RoutingText::Tokens(ids.to_vec());
        return TokenSource::Render {
            engine,
            cached: true,
        };
    }
    match ask(target, route, body).await {
        Ok(ids) => {
            let ids: Arc<[u32]> = ids.into();
            tokenizers.keep_rendered(key, ids.clone());
            facts.key = RoutingText::Tokens(ids.to_vec());
            TokenSource::Render {
                engine,
                cached: false,
            }
        }
        Err(e) => TokenSource::text(format!("the engine's render failed: {e}")),
    }
}

async fn ask(target: &RenderTarget, route: &str, body: &Bytes) -> Result<Vec<u32>, String> {
    let mut req = client()
        .post(target.url.join(route))
        .insert_header(("content-type", "application/json"));
    if let Some(k) = &target.key {
        req = req.bearer_auth(k.expose());
    }
    let mut resp = req
        .send_body(body.clone())
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("{route} answered {}", resp.status().as_u16()));
    }
    let v: Value = resp
        .json()
        .limit(ANSWER_LIMIT)
        .await
        .map_err(|e| e.to_string())?;
    read_ids(&v).ok_or_else(|| format!("{route} answered no token ids"))
}

/// The token ids of a render answer (see the module's shapes).
pub(super) fn read_ids(v: &Value) -> Option<Vec<u32>> {
    let one = |o: &Value| -> Option<Vec<u32>> {
        let ids = o.get("token_ids").or_else(|| o.get("prompt_token_ids"))?;
        ids.as_array()?
            .iter()
            .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect()
    };
    match v {
        Value::Array(items) => {
            let mut out = Vec::new();
            for item in items {
                out.extend(one(item)?);
            }
            (!out.is_empty()).then_some(out)
        }
        other => one(other),
    }
}

#[cfg(test)]
#[test]
fn render_answers_are_read_in_vllms_shapes() {
    use serde_json::json;
    assert_eq!(read_ids(&json!({"token_ids": [1, 2]})), Some(vec![1, 2]));
    assert_eq!(
        read_ids(&json!([{"prompt_token_ids": [1]}, {"prompt_token_ids": [2, 3]}])),
        Some(vec![1, 2, 3])
    );
    assert_eq!(read_ids(&json!({"token_ids": [1, -2]})), None);
    assert_eq!(read_ids(&json!({"text": "x"})), None);
    assert_eq!(read_ids(&json!([])), None);
}
