//! The engines' render routes (vLLM's `/v1/chat/completions/render`,
//! `/v1/completions/render`) as a client: one request, its answer read in the shapes vLLM
//! gives: `{"token_ids": [...]}`, `{"prompt_token_ids": [...]}`, or a list of those (a
//! batch, one sequence).

use std::cell::RefCell;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;

use super::RenderTarget;

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

/// The token ids `target` renders for `body` at `route`.
pub(crate) async fn ask(
    target: &RenderTarget,
    route: &str,
    body: &Bytes,
) -> Result<Vec<u32>, RenderError> {
    let mut req = client()
        .post(target.url.join(route))
        .insert_header(("content-type", "application/json"));
    if let Some(k) = &target.key {
        req = req.bearer_auth(k.expose());
    }
    let mut resp = req
        .send_body(body.clone())
        .await
        .map_err(|e| RenderError::Failed(e.to_string()))?;
    let status = resp.status().as_u16();
    if matches!(status, 404 | 405) {
        return Err(RenderError::NoRoute(format!("{route} answered {status}")));
    }
    if !resp.status().is_success() {
        return Err(RenderError::Failed(format!("{route} answered {status}")));
    }
    let v: Value = resp
        .json()
        .limit(ANSWER_LIMIT)
        .await
        .map_err(|e| RenderError::Failed(e.to_string()))?;
    read_ids(&v).ok_or_else(|| RenderError::Failed(format!("{route} answered no token ids")))
}

/// Why a render gave no ids.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RenderError {
    /// The engine serves no such route: not asked again until the fleet changes.
    #[error("{0}")]
    NoRoute(String),
    #[error("{0}")]
    Failed(String),
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
