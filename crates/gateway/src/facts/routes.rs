//! The bodies of the routes beyond chat, completions and generate: the Responses and
//! Messages APIs (a prompt, routed cache-aware), JSON routes without a prompt (their
//! `model` and `stream` only), multipart uploads (their form fields), and passthrough.

use std::borrow::Cow;

use bytes::Bytes;
use kvgate_policies::{PromptText, RoutingText};
use serde::Deserialize;

use super::{Content, FactsError, Message, Part};

/// `POST /v1/responses`: the prompt is `instructions` then `input`.
#[derive(Deserialize)]
pub(super) struct ResponsesBody<'a> {
    #[serde(default, borrow)]
    pub(super) model: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) stream: Option<bool>,
    #[serde(default, borrow)]
    pub(super) prompt_cache_key: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    instructions: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    input: Option<Input<'a>>,
    #[serde(default, borrow)]
    pub(super) previous_response_id: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Input<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    Items(#[serde(borrow)] Vec<Item<'a>>),
}

/// One input item: a message (`role`, `content`), or another item kind (a tool call's
/// output, say), read by its `type` and its text.
#[derive(Deserialize)]
struct Item<'a> {
    #[serde(default, borrow)]
    role: Option<Cow<'a, str>>,
    #[serde(default, rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    content: Option<Content<'a>>,
    #[serde(default, borrow)]
    output: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

impl ResponsesBody<'_> {
    pub(super) fn routing(&self, keep: bool, body: &Bytes) -> RoutingText {
        if !keep {
            return RoutingText::Empty;
        }
        let mut out = PromptText::over(body.clone());
        if let Some(i) = &self.instructions {
            turn(&mut out, "instructions", |o| o.push_body_str(i));
        }
        match &self.input {
            Some(Input::Text(t)) => turn(&mut out, "user", |o| o.push_body_str(t)),
            Some(Input::Items(items)) => {
                for it in items {
                    let role = it.role.as_deref().or(it.kind.as_deref()).unwrap_or("item");
                    turn(&mut out, role, |o| {
                        content(o, it.content.as_ref());
                        for t in [&it.output, &it.arguments].into_iter().flatten() {
                            o.push_body_str(t);
                        }
                    });
                }
            }
            None => {}
        }
        RoutingText::Text(out.seal())
    }
}

/// `POST /v1/messages`: the prompt is `system` then `messages`.
#[derive(Deserialize)]
pub(super) struct MessagesBody<'a> {
    #[serde(default, borrow)]
    pub(super) model: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) stream: Option<bool>,
    #[serde(default, borrow)]
    pub(super) prompt_cache_key: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    system: Option<Content<'a>>,
    #[serde(borrow)]
    messages: Vec<Message<'a>>,
}

impl MessagesBody<'_> {
    pub(super) fn routing(&self, keep: bool, body: &Bytes) -> RoutingText {
        if !keep {
            return RoutingText::Empty;
        }
        let mut out = PromptText::over(body.clone());
        if let Some(s) = &self.system {
            turn(&mut out, "system", |o| content(o, Some(s)));
        }
        for m in &self.messages {
            turn(&mut out, &m.role, |o| content(o, m.content.as_ref()));
        }
        RoutingText::Text(out.seal())
    }
}

/// One turn of a rendered prompt, as chat renders it: role, then its text.
fn turn(out: &mut PromptText, role: &str, text: impl FnOnce(&mut PromptText)) {
    out.push_str("<|");
    out.push_str(role);
    out.push_str("|>\n");
    text(out);
    out.push_str("\n");
}

fn content(out: &mut PromptText, c: Option<&Content<'_>>) {
    match c {
        Some(Content::Text(t)) => out.push_body_str(t),
        Some(Content::Parts(parts)) => {
            for t in parts.iter().filter_map(|p: &Part<'_>| p.text.as_deref()) {
                out.push_body_str(t);
            }
        }
        None => {}
    }
}

/// A JSON route without a prompt: what routing reads of it.
#[derive(Deserialize)]
pub(super) struct PlainBody<'a> {
    #[serde(default, borrow)]
    pub(super) model: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) stream: Option<bool>,
    #[serde(default, borrow)]
    pub(super) prompt_cache_key: Option<Cow<'a, str>>,
}

/// The `model` and `stream` fields of a `multipart/form-data` body whose content type is
/// `content_type`. A body that is not multipart, or has no boundary, is a 400: the
/// engine could not read it either.
pub(crate) fn multipart_fields(
    body: &[u8],
    content_type: &str,
) -> Result<(Option<String>, bool), FactsError> {
    let boundary = boundary(content_type).ok_or_else(|| {
        FactsError::BadRequest("expected Content-Type: multipart/form-data with a boundary".into())
    })?;
    let delimiter = [b"--", boundary.as_bytes()].concat();
    let (mut model, mut stream) = (None, false);
    let mut parts = memchr::memmem::find_iter(body, &delimiter).peekable();
    while let Some(start) = parts.next() {
        let Some(&next) = parts.peek() else { break };
        let part = &body[start + delimiter.len()..next];
        let Some(split) = memchr::memmem::find(part, b"\r\n\r\n") else {
            continue;
        };
        let (head, value) = (&part[..split], &part[split + 4..]);
        let value = value.strip_suffix(b"\r\n").unwrap_or(value);
        match field_name(head) {
            Some("model") => model = std::str::from_utf8(value).ok().map(str::to_owned),
            Some("stream") => stream = value.eq_ignore_ascii_case(b"true"),
            _ => {}
        }
    }
    Ok((model, stream))
}

/// The `boundary` parameter of a `multipart/form-data` content type.
fn boundary(content_type: &str) -> Option<&str> {
    let mut params = content_type.split(';');
    let kind = params.next()?.trim();
    if !kind.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.find_map(|p| {
        let (k, v) = p.split_once('=')?;
        (k.trim().eq_ignore_ascii_case("boundary"))
            .then(|| v.trim().trim_matches('"'))
            .filter(|b| !b.is_empty() && b.len() <= 70)
    })
}

/// The `name` of a part's `Content-Disposition: form-data; name="…"`.
fn field_name(head: &[u8]) -> Option<&str> {
    let head = std::str::from_utf8(head).ok()?;
    let line = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))?;
    line.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        (k.trim() == "name").then(|| v.trim().trim_matches('"'))
    })
}

#[cfg(test)]
mod tests {
    use super::multipart_fields;

    #[test]
    fn multipart_model_and_stream_are_read() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF\x00\x01--\r\n--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--XyZ\r\nContent-Disposition: form-data; name=\"stream\"\r\n\r\ntrue\r\n--XyZ--\r\n";
        let got = multipart_fields(body, "multipart/form-data; boundary=XyZ").unwrap();
        assert_eq!(got, (Some("whisper-1".to_owned()), true));
        let quoted = multipart_fields(body, "Multipart/Form-Data; boundary=\"XyZ\"").unwrap();
        assert_eq!(quoted.0.as_deref(), Some("whisper-1"));
    }

    #[test]
    fn a_body_that_is_not_multipart_is_refused() {
        assert!(multipart_fields(b"{}", "application/json").is_err());
        assert!(multipart_fields(b"--a--", "multipart/form-data").is_err());
        // Multipart without the fields: no model, not streamed.
        let none = multipart_fields(b"--b\r\n\r\nx\r\n--b--", "multipart/form-data; boundary=b");
        assert_eq!(none.unwrap(), (None, false));
    }
}
