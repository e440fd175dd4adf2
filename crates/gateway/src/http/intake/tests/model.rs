//! A model of the intake's decisions built on httparse, and the heads it is checked on.
//!
//! httparse reads a head the way actix-http does (its default configuration, 96 headers);
//! the rules of the contract in `intake.rs` then decide from what it read, without the
//! intake's own scanning. The generators make heads the contract speaks of: inference and
//! other routes, every kind of `Content-Length`, `Transfer-Encoding`, `Expect`, `Upgrade`,
//! obs-fold lines, bare LF and bare CR line ends, malformed lines and header counts
//! around the limit.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use super::super::head::{Look, MAX_HEAD};

/// The inference routes, whose bodies the intake takes.
pub(super) const ROUTES: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/generate"];
/// Headers actix-http parses per head (and so the intake).
pub(super) const MAX_HEADERS: usize = 96;
/// The first token the tests' intakes hand out: far from any a generated client sends.
pub(super) const TOKEN: u64 = 1 << 60;

/// A head as httparse read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Head {
    /// Bytes of the head, its blank line included.
    pub len: usize,
    pub method: String,
    pub path: String,
    pub version: u8,
    pub headers: Vec<(String, Vec<u8>)>,
}

#[derive(Debug)]
pub(super) enum Parsed {
    Partial,
    Refused,
    Complete(Head),
}

/// `input`'s head as httparse reads it.
pub(super) fn parse(input: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(input) {
        Ok(httparse::Status::Complete(len)) => Parsed::Complete(Head {
            len,
            method: req.method.unwrap_or_default().to_owned(),
            path: req.path.unwrap_or_default().to_owned(),
            version: req.version.unwrap_or_default(),
            headers: req
                .headers
                .iter()
                .map(|h| (h.name.to_owned(), h.value.to_vec()))
                .collect(),
        }),
        Ok(httparse::Status::Partial) => Parsed::Partial,
        Err(_) => Parsed::Refused,
    }
}

impl Head {
    pub(super) fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    pub(super) fn has(&self, name: &str) -> bool {
        self.values(name).next().is_some()
    }

    /// The body length the head declares, as the contract reads it: none is 0; exactly
    /// one `Content-Length` of ASCII digits within `u64` is its value; any other is
    /// framing the intake does not follow.
    pub(super) fn length(&self) -> Option<u64> {
        let mut values = self.values("content-length");
        let Some(v) = values.next() else {
            return Some(0);
        };
        if values.next().is_some() || v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(v).ok()?.parse().ok()
    }

    /// Whether the contract lets the intake follow this head's framing at all.
    pub(super) fn framed(&self) -> bool {
        !self.has("transfer-encoding")
            && !self.has("upgrade")
            && self.method != "CONNECT"
            && self.length().is_some()
    }

    /// Its headers but `content-length` and `x-kvgate-body`, in order.
    pub(super) fn kept(&self) -> Vec<(String, Vec<u8>)> {
        self.headers
            .iter()
            .filter(|(n, _)| {
                !n.eq_ignore_ascii_case("content-length")
                    && !n.eq_ignore_ascii_case("x-kvgate-body")
            })
            .cloned()
            .collect()
    }
}

/// What the contract says the intake does with the head at the start of `input`.
pub(super) fn judge(input: &[u8], limit: usize, may_take: bool) -> Look {
    let head = match parse(input) {
        Parsed::Partial if input.len() < MAX_HEAD => return Look::Partial,
        Parsed::Complete(h) if h.len <= MAX_HEAD => h,
        _ => return Look::Raw,
    };
    let Some(body) = head.length().filter(|_| head.framed()) else {
        return Look::Raw;
    };
    let route = head.path.split('?').next().unwrap_or_default();
    let take = head.method == "POST"
        && ROUTES.contains(&route)
        && body >= 1
        && body <= limit as u64
        && may_take
        && !head.has("expect")
        && head.kept().len() + 2 <= MAX_HEADERS;
    if take {
        Look::Take {
            head: head.len,
            body: body as usize,
        }
    } else {
        Look::Pass {
            head: head.len,
            body,
        }
    }
}

/// The intake's own decision, and what it put out.
pub(super) fn look(input: &[u8], limit: usize, may_take: bool) -> (Look, BytesMut) {
    let mut out = BytesMut::new();
    let l = super::super::head::look(input, &mut out, limit, TOKEN, may_take);
    (l, out)
}

/// One of `items`, each as often as its weight says (a weight may be 0).
fn weighted(items: &[(u32, &'static str)]) -> impl Strategy<Value = &'static str> + use<> {
    let all: Vec<&'static str> = items
        .iter()
        .flat_map(|&(w, s)| std::iter::repeat_n(s, w as usize))
        .collect();
    prop::sample::select(all)
}

fn method(wild: bool) -> impl Strategy<Value = &'static str> {
    let w = u32::from(wild);
    weighted(&[
        (12, "POST"),
        (2, "GET"),
        (1, "PUT"),
        (w, "CONNECT"),
        (w, "post"),
        (w, "P@ST"),
        (w, ""),
    ])
}

fn target(wild: bool) -> impl Strategy<Value = &'static str> {
    let w = u32::from(wild);
    weighted(&[
        (4, ROUTES[0]),
        (4, ROUTES[1]),
        (4, ROUTES[2]),
        (1, "/generate?x=1"),
        (1, "/v1/chat/completions?stream=1&a=b"),
        (1, "/v1/chat/completions/x"),
        (1, "/workers"),
        (w, "*"),
        (w, "http://gw/generate"),
        (w, "/generate#f"),
        (w, "/gen erate"),
    ])
}

fn version(wild: bool) -> impl Strategy<Value = &'static str> {
    let w = u32::from(wild);
    weighted(&[
        (10, "HTTP/1.1"),
        (2, "HTTP/1.0"),
        (w, "HTTP/2.0"),
        (w, "HTTP/1.1 "),
        (w, "http/1.1"),
    ])
}

/// A line's end: CRLF mostly, bare LF (which httparse takes), bare CR (which it refuses).
fn eol(wild: bool) -> impl Strategy<Value = &'static str> {
    weighted(&[(24, "\r\n"), (8, "\n"), (u32::from(wild), "\r")])
}

/// A `Content-Length` value: mostly small lengths, and every malformed kind.
pub(super) fn length_value() -> impl Strategy<Value = String> {
    prop_oneof![
        30 => (0u64..=300).prop_map(|n| n.to_string()),
        6 => (0u64..=3000).prop_map(|n| n.to_string()),
        4 => (0u64..=300).prop_map(|n| format!("00{n}")),
        1 => Just("+5".to_owned()),
        1 => Just("-5".to_owned()),
        1 => Just("5, 5".to_owned()),
        1 => Just("5,5".to_owned()),
        1 => Just(" 7".to_owned()),
        1 => Just("7 ".to_owned()),
        1 => Just("7\t".to_owned()),
        1 => Just("18446744073709551615".to_owned()),
        1 => Just("18446744073709551616".to_owned()),
        1 => Just("99999999999999999999999".to_owned()),
        1 => Just(String::new()),
        1 => Just("5a".to_owned()),
        1 => Just("0x10".to_owned()),
        1 => Just("\u{0665}".to_owned()),
        1 => Just("1e3".to_owned()),
    ]
}

fn length_name() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        4 => Just("content-length"),
        2 => Just("Content-Length"),
        1 => Just("CONTENT-LENGTH"),
    ]
}

/// One group of header lines (most are one line; a duplicated length is two). Not
/// `wild`, no line is one httparse refuses.
fn lines(wild: bool) -> impl Strategy<Value = Vec<String>> {
    let one = |s: &'static str| Just(vec![s.to_owned()]).boxed();
    let mut options = vec![
        (
            1,
            (length_name(), length_value())
                .prop_map(|(n, v)| vec![format!("{n}: {v}")])
                .boxed(),
        ),
        (
            1,
            (length_name(), length_value())
                .prop_map(|(n, v)| vec![format!("{n}: {v}"), format!("content-length: {v}")])
                .boxed(),
        ),
        (6, prop_oneof![one("host: gw"), one("Host: kvgate")].boxed()),
        (
            12,
            ("[a-z][a-z0-9-]{0,8}", "[ -~]{0,12}")
                .prop_map(|(n, v)| vec![format!("x-{n}: {v}")])
                .boxed(),
        ),
        (
            1,
            prop_oneof![
                one("transfer-encoding: chunked"),
                one("Transfer-Encoding: identity"),
                one("transfer-encoding: gzip, chunked"),
            ]
            .boxed(),
        ),
        (
            1,
            prop_oneof![
                one("expect: 100-continue"),
                one("Expect: 100-Continue"),
                one("expect: nothing"),
            ]
            .boxed(),
        ),
        (
            1,
            prop_oneof![one("upgrade: websocket"), one("Upgrade: h2c")].boxed(),
        ),
        (
            1,
            prop_oneof![
                one("connection: close"),
                one("connection: keep-alive"),
                one("Connection: upgrade"),
            ]
            .boxed(),
        ),
        (
            2,
            (0u64..1000, prop::bool::ANY)
                .prop_map(|(t, upper)| {
                    let name = if upper {
                        "X-Kvgate-Body"
                    } else {
                        "x-kvgate-body"
                    };
                    vec![format!("{name}: {t}")]
                })
                .boxed(),
        ),
    ];
    if wild {
        // obs-fold: a continuation of the line before.
        options.push((1, prop_oneof![one(" folded"), one("\tfolded")].boxed()));
        options.push((
            1,
            prop_oneof![
                one("bad header: x"),
                one("content-length : 5"),
                one(": x"),
                one("x-nul: a\0b"),
                one("x-cr: a\rb"),
                one("x-del: a\u{7f}b"),
            ]
            .boxed(),
        ));
    }
    options.push((1, one("x-empty:")));
    prop::strategy::Union::new_weighted(options)
}

/// A request head: leading blank lines now and then, a request line, header lines
/// (sometimes padded to around the header limit) each with its own line end, the blank
/// line. Half of them have nothing httparse refuses, so that many are taken.
pub(super) fn head() -> impl Strategy<Value = Bytes> {
    prop::bool::ANY.prop_flat_map(head_of)
}

fn head_of(wild: bool) -> impl Strategy<Value = Bytes> {
    let lead = prop_oneof![8 => Just(""), 1 => Just("\r\n"), 1 => Just("\n")];
    let padding = prop_oneof![8 => Just(0usize), 1 => 88usize..=97];
    (
        lead,
        (method(wild), target(wild), version(wild), eol(wild)),
        padding,
        prop::collection::vec((lines(wild), eol(wild)), 0..6),
        (
            prop::option::weighted(0.85, (length_name(), length_value(), eol(wild))),
            any::<prop::sample::Index>(),
        ),
        eol(wild),
    )
        .prop_map(
            |(lead, (m, t, v, e), padding, mut groups, (length, at), last)| {
                // Most heads have one length, anywhere among their lines.
                if let Some((name, value, e)) = length {
                    let at = at.index(groups.len() + 1);
                    groups.insert(at, (vec![format!("{name}: {value}")], e));
                }
                let mut h = format!("{lead}{m} {t} {v}{e}");
                for i in 0..padding {
                    h.push_str(&format!("x-pad-{i}: p\r\n"));
                }
                for (group, e) in groups {
                    for line in group {
                        h.push_str(&line);
                        h.push_str(e);
                    }
                }
                h.push_str(last);
                Bytes::from(h)
            },
        )
}
/// A head the intake follows the framing of (one valid length or none, no
/// `Transfer-Encoding`, nothing httparse refuses), whether it takes its body or not: the
/// stuff of pipelined streams.
pub(super) fn framed_head() -> impl Strategy<Value = Bytes> {
    let one = |s: &'static str| Just(s.to_owned());
    let line = prop_oneof![
        3 => prop_oneof![one("host: gw"), one("Host: kvgate")],
        6 => ("[a-z][a-z0-9-]{0,8}", "[ -~]{0,12}").prop_map(|(n, v)| format!("x-{n}: {v}")),
        1 => prop_oneof![one("expect: 100-continue"), one("connection: close")],
        1 => (0u64..1000).prop_map(|t| format!("x-kvgate-body: {t}")),
    ];
    let length = prop_oneof![
        8 => (0u64..=300).prop_map(|n| n.to_string()),
        2 => (0u64..=3000).prop_map(|n| n.to_string()),
        1 => (0u64..=300).prop_map(|n| format!("00{n}")),
    ];
    (
        (method(false), target(false), version(false), eol(false)),
        prop::collection::vec((line, eol(false)), 0..5),
        (
            prop::option::weighted(0.9, (length_name(), length, eol(false))),
            any::<prop::sample::Index>(),
        ),
        eol(false),
    )
        .prop_map(|((m, t, v, e), mut lines, (length, at), last)| {
            if let Some((name, value, e)) = length {
                let at = at.index(lines.len() + 1);
                lines.insert(at, (format!("{name}: {value}"), e));
            }
            let mut h = format!("{m} {t} {v}{e}");
            for (line, e) in lines {
                h.push_str(&line);
                h.push_str(e);
            }
            h.push_str(last);
            Bytes::from(h)
        })
}

/// Bytes that may follow a head in a stream: nothing, another request, or noise.
pub(super) fn after() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        2 => Just(Bytes::new()),
        1 => Just(Bytes::from_static(b"POST /generate HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}")),
        1 => prop::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from),
    ]
}
