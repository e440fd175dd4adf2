//! The head of a worker's answer: status, headers, and how its body is framed
//! (RFC 9112 §6).

use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderName, HeaderValue};

use super::UpstreamError;
use super::chunked::Chunked;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// `Content-Length`: this many bytes are still to come.
    Length {
        left: u64,
        want: u64,
    },
    Chunked(Chunked),
    /// No length: the body runs to the end of the connection.
    UntilClose,
}

#[derive(Debug)]
pub(super) struct Head {
    pub(super) len: usize,
    pub(super) status: StatusCode,
    pub(super) headers: Vec<(HeaderName, HeaderValue)>,
    pub(super) framing: Framing,
    pub(super) keep_alive: bool,
}

/// Parses a complete response head at the start of `buf`, or `None` if more is needed.
pub(super) fn parse_head(buf: &[u8]) -> Result<Option<Head>, UpstreamError> {
    let malformed = |m: String| UpstreamError::Malformed(m);
    // Uninitialised slots: zeroing all 96 was a sixth of this function's instructions.
    let mut slots = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; 96];
    let mut resp = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut resp, buf, &mut slots);
    let len = match parsed {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(malformed(format!("{e}"))),
    };
    let code = resp.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|_| malformed(format!("status {code}")))?;
    let http10 = resp.version == Some(0);
    let mut keep_alive = !http10;
    let mut length: Option<u64> = None;
    let mut coded = false;
    let mut chunked = false;
    let mut headers = Vec::with_capacity(resp.headers.len());
    for h in resp.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| malformed(format!("header name {:?}", h.name)))?;
        let value = HeaderValue::from_bytes(h.value)
            .map_err(|_| malformed(format!("value of {}", h.name)))?;
        if name == actix_web::http::header::CONTENT_LENGTH {
            let digits = h.value.trim_ascii();
            let n = std::str::from_utf8(digits)
                .ok()
                .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|d| d.parse::<u64>().ok())
                .ok_or_else(|| malformed("content-length is not a number".into()))?;
            if length.is_some_and(|l| l != n) {
                return Err(malformed("conflicting content-length headers".into()));
            }
            length = Some(n);
        } else if name == actix_web::http::header::TRANSFER_ENCODING {
            coded = true;
            // Only the last coding frames the body.
            chunked = h
                .value
                .rsplit(|b| *b == b',')
                .next()
                .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name == actix_web::http::header::CONNECTION {
            for token in h.value.split(|b| *b == b',') {
                let t = token.trim_ascii();
                if t.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if t.eq_ignore_ascii_case(b"keep-alive") && http10 {
                    keep_alive = true;
                }
            }
        }
        headers.push((name, value));
    }
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(malformed("the worker switched protocols".into()));
    }
    // RFC 9112 §6.1, §6.3: a coded body next to a length, or a coded body in HTTP/1.0,
    // leaves the connection's framing in doubt, so it is not reused.
    if coded && (length.is_some() || http10) {
        keep_alive = false;
    }
    let no_body = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let framing = if no_body {
        Framing::Length { left: 0, want: 0 }
    } else if chunked {
        Framing::Chunked(Chunked::default())
    } else if let Some(n) = length.filter(|_| !coded) {
        Framing::Length { left: n, want: n }
    } else {
        // No length, or a coding other than chunked last: the body ends with the connection.
        keep_alive = false;
        Framing::UntilClose
    };
    Ok(Some(Head {
        len,
        status,
        headers,
        framing,
        keep_alive,
    }))
}
