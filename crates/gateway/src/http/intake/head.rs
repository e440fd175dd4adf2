//! The intake's reading of one request head: whether its body is taken (and the head
//! rewritten), passes with it, or the connection passes through from there on.

use std::fmt::Write as _;
use std::mem::MaybeUninit;

use bytes::BytesMut;

use super::BODY_TOKEN;
use kvgate_core::Endpoint;

/// A head longer than this passes through, and all after it (actix-http reads it with a
/// limit of its own).
pub(super) const MAX_HEAD: usize = 64 * 1024;
/// Headers parsed per head; a head with more passes through.
const MAX_HEADERS: usize = 96;

/// What a head asks of the intake.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Look {
    /// Not whole yet.
    Partial,
    /// Everything from here on passes through.
    Raw,
    /// The head (`head` bytes) and a body of `body` bytes pass through.
    Pass { head: usize, body: u64 },
    /// The head (`head` bytes) went on rewritten; the body (`body` bytes) is read here.
    Take { head: usize, body: usize },
}

const INFERENCE: [Endpoint; Endpoint::ALL.len()] = Endpoint::ALL;

/// Reads the head at the start of `input`: whether its body is taken (the head rewritten
/// for `token` onto `out`), passes, or the connection passes through from here on.
pub(super) fn look(
    input: &[u8],
    out: &mut BytesMut,
    limit: usize,
    token: u64,
    may_take: bool,
) -> Look {
    // Left uninitialised: zeroing 96 headers would cost more than parsing a short head.
    let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let head = match req.parse_with_uninit_headers(input, &mut headers) {
        // Bounded whole as it is in parts, so that how a head is cut into reads does not
        // change what is done with it.
        Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD => n,
        Ok(httparse::Status::Partial) if input.len() < MAX_HEAD => return Look::Partial,
        // Too long, too many headers, or not HTTP/1 as httparse reads it: actix-http's to
        // answer.
        _ => return Look::Raw,
    };
    let mut length: Option<u64> = None;
    let mut lengths = 0;
    let mut expect = false;
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("transfer-encoding") || name.eq_ignore_ascii_case("upgrade") {
            return Look::Raw;
        }
        if name.eq_ignore_ascii_case("content-length") {
            lengths += 1;
            length = std::str::from_utf8(h.value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse().ok());
        } else if name.eq_ignore_ascii_case("expect") {
            expect = true;
        }
    }
    let body = match (lengths, length) {
        (0, _) => 0,
        (1, Some(n)) => n,
        // Lengths that disagree or do not parse: actix-http refuses the request.
        _ => return Look::Raw,
    };
    if req.method == Some("CONNECT") {
        return Look::Raw;
    }
    let path = req.path.unwrap_or("");
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    let inference = req.method == Some("POST") && INFERENCE.iter().any(|e| e.path() == path);
    let fits = usize::try_from(body).is_ok_and(|n| n > 0 && n <= limit);
    if !(inference && fits && may_take && !expect) {
        return Look::Pass { head, body };
    }
    let before = out.len();
    // httparse skips blank lines before the request line.
    let line = req.method.map_or(0, |m| {
        (m.as_ptr() as usize).saturating_sub(input.as_ptr() as usize)
    });
    match rewrite(&input[..head], line, req.headers, token, out) {
        Some(()) => Look::Take {
            head,
            body: body as usize,
        },
        None => {
            out.truncate(before);
            Look::Pass { head, body }
        }
    }
}

/// Puts `head` (its request line at `line`) on `out` with its `content-length` (and any
/// `x-kvgate-body`) lines dropped and `content-length: 0` and the token added after its
/// last header line; `None` when the head is not laid out as expected or the two lines
/// would take it over the header limit (part of it may be on `out`).
fn rewrite(
    head: &[u8],
    line: usize,
    headers: &[httparse::Header<'_>],
    token: u64,
    out: &mut BytesMut,
) -> Option<()> {
    let base = head.as_ptr() as usize;
    let line_end = |from: usize| memchr::memchr(b'\n', head.get(from..)?).map(|i| from + i + 1);
    // The request line's end, then each header line's.
    let mut at = line_end(line)?;
    let mut kept = 0;
    out.reserve(head.len() + 48);
    out.extend_from_slice(&head[..at]);
    for h in headers {
        let start = (h.name.as_ptr() as usize).checked_sub(base)?;
        if start != at {
            return None;
        }
        let end = line_end(start)?;
        let drop = h.name.eq_ignore_ascii_case("content-length")
            || h.name.eq_ignore_ascii_case(BODY_TOKEN.as_str());
        if !drop {
            out.extend_from_slice(&head[start..end]);
            kept += 1;
        }
        at = end;
    }
    // actix-http would refuse a head of more headers than it parses.
    if kept + 2 > MAX_HEADERS {
        return None;
    }
    out.extend_from_slice(b"content-length: 0\r\nx-kvgate-body: ");
    write!(out, "{token}\r\n").ok()?;
    out.extend_from_slice(&head[at..]);
    Some(())
}
