//! The HTTP and watch framing the fake API server speaks: query strings, JSON answers,
//! chunked watch lines, the `410 Gone` Status.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;

use serde_json::{Value, json};

/// Percent-decodes a query value.
pub(super) fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(super) fn query(target: &str) -> (String, BTreeMap<String, String>) {
    let (path, q) = target.split_once('?').unwrap_or((target, ""));
    let params = q
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect();
    (path.to_owned(), params)
}

pub(super) fn respond(out: &mut TcpStream, status: &str, body: &Value) -> std::io::Result<()> {
    let body = body.to_string();
    write!(
        out,
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()
}

pub(super) fn chunk(out: &mut TcpStream, line: &Value) -> std::io::Result<()> {
    let text = format!("{line}\n");
    write!(out, "{:x}\r\n{text}\r\n", text.len())?;
    out.flush()
}

/// The Status a real server sends for an expired resourceVersion.
pub(super) fn gone(rv: u64) -> Value {
    json!({"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure",
        "message": format!("too old resource version: {rv}"),
        "reason": "Expired", "code": 410
    }})
}

pub(super) fn query_text(params: &BTreeMap<String, String>) -> String {
    let parts: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    parts.join("&")
}
