//! The intake as actix-http and its handlers meet it: pipelined requests cut into reads
//! anyhow, each body claimed, held, asked for or let go at any moment, checked against
//! what a plain reader (httparse heads, `Content-Length` framing) makes of the bytes as
//! the client sent them.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use proptest::prelude::*;
use tokio::io::{AsyncRead, ReadBuf};

use super::super::head::Look;
use super::super::{BodyClaim, BodyLost, Intake};
use super::model::{self, Parsed, TOKEN, parse};

/// A socket that gives its chunks in order, a read taking at most one chunk (less when
/// the reader's buffer is shorter), `Pending` first where a chunk says so, then the end.
struct Script {
    chunks: VecDeque<(Vec<u8>, bool)>,
}

impl AsyncRead for Script {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let Some((chunk, gap)) = self.chunks.front_mut() else {
            return Poll::Ready(Ok(()));
        };
        if std::mem::take(gap) {
            // The driver polls again; no waker is needed.
            return Poll::Pending;
        }
        let n = chunk.len().min(buf.remaining());
        buf.put_slice(&chunk[..n]);
        chunk.drain(..n);
        if chunk.is_empty() {
            self.chunks.pop_front();
        }
        Poll::Ready(Ok(()))
    }
}

/// A request as a plain reader sees it; `body` is `None` where its handler let it go.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    method: String,
    path: String,
    version: u8,
    /// Without `content-length` and `x-kvgate-body`.
    headers: Vec<(String, Vec<u8>)>,
    body: Option<Vec<u8>>,
}

/// A request and where it lies in its stream; `taken` when its head named a body of
/// `taken`.
#[derive(Debug)]
struct Framed {
    request: Request,
    span: Range<usize>,
    taken: bool,
}

/// The requests at the start of `wire`, framed by their `Content-Length`, except that a
/// head naming a token of `taken` gets that body; and where the reading stopped (at a
/// head it cannot frame, or the end).
fn read(wire: &[u8], taken: &HashMap<u64, Option<Vec<u8>>>) -> (Vec<Framed>, usize) {
    let mut requests = Vec::new();
    let mut at = 0;
    while at < wire.len() {
        let Parsed::Complete(head) = parse(&wire[at..]) else {
            break;
        };
        let Some(length) = head.length().filter(|_| head.framed()) else {
            break;
        };
        let token = head
            .values("x-kvgate-body")
            .next()
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
            .filter(|t| taken.contains_key(t));
        let start = at;
        let body = match token {
            Some(t) => {
                at += head.len;
                taken[&t].clone()
            }
            None => {
                let Some(end) = usize::try_from(length)
                    .ok()
                    .and_then(|n| (at + head.len).checked_add(n))
                    .filter(|&end| end <= wire.len())
                else {
                    break;
                };
                let body = wire[at + head.len..end].to_vec();
                at = end;
                Some(body)
            }
        };
        requests.push(Framed {
            request: Request {
                headers: head.kept(),
                method: head.method,
                path: head.path,
                version: head.version,
                body,
            },
            span: start..at,
            taken: token.is_some(),
        });
    }
    (requests, at)
}

/// A handler of a taken body, as far as it got.
enum Handler {
    Seen(BodyClaim),
    Held(BodyClaim),
    Asked(Pin<Box<dyn Future<Output = Result<Bytes, BodyLost>>>>),
}

/// What actix-http was given, and the bodies its handlers took (`None`: let go).
struct Run {
    out: Vec<u8>,
    taken: HashMap<u64, Option<Vec<u8>>>,
}

/// The intake over `wire` cut as `cuts` says, read into buffers of the sizes `acts`
/// picks, its handlers acting as `acts` says between reads.
fn drive(
    wire: &[u8],
    cuts: &[(usize, bool)],
    acts: &[u8],
    limit: usize,
) -> Result<Run, TestCaseError> {
    let mut chunks = VecDeque::new();
    let mut rest = wire;
    for &(n, gap) in cuts.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (chunk, after) = rest.split_at(n.min(rest.len()));
        chunks.push_back((chunk.to_vec(), gap));
        rest = after;
    }
    let mut intake = Intake::new(Script { chunks }, limit);
    intake.next_token = TOKEN;
    let bodies = intake.bodies();
    let mut cx = Context::from_waker(Waker::noop());
    let mut acts = acts.iter().copied().cycle();
    let mut handlers: Vec<(u64, Handler)> = Vec::new();
    let mut taken = HashMap::new();
    let mut out = Vec::new();
    let mut scanned = 0;
    let mut stalled = 0;
    for step in 0.. {
        prop_assert!(step < 100_000, "no end after {step} reads");
        // A handler for each token actix-http has been given.
        while let Some(i) = memchr::memmem::find(&out[scanned..], b"x-kvgate-body: ") {
            let from = scanned + i + 15;
            let Some(len) = memchr::memchr(b'\r', &out[from..]) else {
                break;
            };
            scanned = from + len;
            let token: Option<u64> = std::str::from_utf8(&out[from..scanned])
                .ok()
                .and_then(|t| t.parse().ok());
            if let Some(token) = token.filter(|&t| t >= TOKEN) {
                let claim = BodyClaim {
                    bodies: bodies.clone(),
                    token,
                };
                handlers.push((token, Handler::Seen(claim)));
            }
        }
        // Each acts, or not; after the intake waited twice, every one asks.
        for (token, h) in std::mem::take(&mut handlers) {
            let act = if stalled >= 2 {
                4
            } else {
                acts.next().unwrap_or(0) % 8
            };
            let next = match h {
                Handler::Seen(c) if act == 2 => {
                    let mut hold = Box::pin(c.hold());
                    prop_assert!(hold.as_mut().poll(&mut cx).is_ready());
                    drop(hold);
                    Some(Handler::Held(c))
                }
                Handler::Seen(c) | Handler::Held(c) if act == 7 => {
                    drop(c);
                    taken.insert(token, None);
                    None
                }
                Handler::Seen(c) | Handler::Held(c) if act >= 3 => {
                    Some(Handler::Asked(Box::pin(c.body())))
                }
                Handler::Asked(mut f) => match f.as_mut().poll(&mut cx) {
                    Poll::Ready(Ok(b)) => {
                        taken.insert(token, Some(b.to_vec()));
                        None
                    }
                    Poll::Ready(Err(BodyLost)) => {
                        return Err(TestCaseError::fail(format!("body {token} lost")));
                    }
                    Poll::Pending => Some(Handler::Asked(f)),
                },
                waiting => Some(waiting),
            };
            handlers.extend(next.map(|h| (token, h)));
        }
        let size = 1 + usize::from(acts.next().unwrap_or(0)) * 31;
        let mut buf = vec![0u8; size];
        let mut rb = ReadBuf::new(&mut buf);
        match Pin::new(&mut intake).poll_read(&mut cx, &mut rb) {
            Poll::Ready(Ok(())) if rb.filled().is_empty() => break,
            Poll::Ready(Ok(())) => {
                out.extend_from_slice(rb.filled());
                stalled = 0;
            }
            Poll::Ready(Err(e)) => return Err(TestCaseError::fail(format!("read failed: {e}"))),
            Poll::Pending => stalled += 1,
        }
        // A body is taken only while no other is held for its handler.
        prop_assert!(bodies.entries.borrow().len() <= 1, "two bodies held");
    }
    // The connection ended; the handlers still waiting ask now.
    for (token, h) in handlers {
        let mut f = match h {
            Handler::Seen(c) | Handler::Held(c) => Box::pin(c.body()),
            Handler::Asked(f) => f,
        };
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(b)) => {
                taken.insert(token, Some(b.to_vec()));
            }
            other => {
                return Err(TestCaseError::fail(format!(
                    "body {token} not whole at the end: {other:?}"
                )));
            }
        }
    }
    Ok(Run { out, taken })
}

/// One request of a stream: its head, then its whole body where the head frames one
/// (`true`: a request may follow), or whatever bytes (`false`: the stream ends there).
fn request() -> impl Strategy<Value = (Bytes, Bytes, bool)> {
    prop_oneof![6 => model::framed_head(), 1 => model::head()].prop_flat_map(|head| {
        let length = match parse(&head) {
            Parsed::Complete(h) if h.framed() => h.length().filter(|&n| n <= 3000),
            _ => None,
        };
        let rest = match length {
            Some(n) => body(n as usize).prop_map(|b| (b, true)).boxed(),
            None => model::after().prop_map(|b| (b, false)).boxed(),
        };
        (Just(head), rest).prop_map(|(h, (b, more))| (h, b, more))
    })
}

/// A body of `n` bytes: one byte over and over, or requests that a reader not framing
/// it by its length would take for the next ones.
fn body(n: usize) -> impl Strategy<Value = Bytes> {
    const SMUGGLED: &[u8] = b"POST /generate HTTP/1.1\r\ncontent-length: 5\r\n\r\nhello";
    prop_oneof![
        any::<u8>().prop_map(move |b| Bytes::from(vec![b; n])),
        Just(Bytes::from(
            SMUGGLED
                .iter()
                .copied()
                .cycle()
                .take(n)
                .collect::<Vec<u8>>()
        )),
    ]
}

/// Requests back to back, up to the first that ends the stream.
fn wire() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(request(), 1..6).prop_map(|requests| {
        let mut w = Vec::new();
        for (head, body, more) in requests {
            w.extend_from_slice(&head);
            w.extend_from_slice(&body);
            if !more {
                break;
            }
        }
        Bytes::from(w)
    })
}

fn cuts() -> impl Strategy<Value = Vec<(usize, bool)>> {
    let size = prop_oneof![1usize..16, 1usize..400, 1usize..4000];
    prop::collection::vec((size, prop::bool::weighted(0.2)), 1..20)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(768))]

    /// However the bytes are cut into reads and whenever the handlers act, actix-http and
    /// the handlers see the requests the client sent, in order: the same heads save the
    /// two lines the intake owns, the same bodies (bar those let go); and every byte but
    /// a taken request's head and body reaches actix-http as sent.
    #[test]
    fn actix_http_and_the_handlers_see_the_requests_as_sent(
        wire in wire(),
        cuts in cuts(),
        acts in prop::collection::vec(any::<u8>(), 1..64),
        limit in 1usize..=2000,
    ) {
        let run = drive(&wire, &cuts, &acts, limit)?;
        let (sent, _) = read(&wire, &HashMap::new());
        let (got, _) = read(&run.out, &run.taken);
        prop_assert_eq!(got.len(), sent.len(), "requests seen");
        prop_assert_eq!(
            got.iter().filter(|g| g.taken).count(),
            run.taken.len(),
            "a body taken for no head"
        );
        let mut rebuilt = Vec::new();
        let mut at = 0;
        for (g, s) in got.iter().zip(&sent) {
            let (g_request, s_request) = (&g.request, &s.request);
            prop_assert_eq!(
                (&g_request.method, &g_request.path, g_request.version, &g_request.headers),
                (&s_request.method, &s_request.path, s_request.version, &s_request.headers)
            );
            match &g_request.body {
                Some(b) => prop_assert_eq!(Some(b), s_request.body.as_ref()),
                None => prop_assert!(g.taken, "a passed body missing"),
            }
            if g.taken {
                // Taken at a head the client sent, one the contract lets it take.
                let judged = model::judge(&wire[s.span.start..], limit, true);
                prop_assert!(matches!(judged, Look::Take { .. }), "took a head it may not: {judged:?}");
                rebuilt.extend_from_slice(&wire[at..s.span.start]);
                rebuilt.extend_from_slice(&run.out[g.span.clone()]);
                at = s.span.end;
            }
        }
        rebuilt.extend_from_slice(&wire[at..]);
        prop_assert!(rebuilt == run.out, "bytes changed besides the taken requests");
    }
}
