//! Inference bodies read at the socket, in one buffer of their `Content-Length`.
//!
//! actix-http reads a connection 8 KiB at a time and hands a body on as one chunk per
//! read, which the handler then copies into one buffer: at 256 KiB that is 32 reads, 32
//! chunks through the payload channel and a copy of the whole body. [`Intake`] wraps each
//! accepted connection below actix-http. When it reads the head of a `POST` to an
//! inference route with a `Content-Length` within the payload limit, it reads the body
//! itself, straight into one buffer of that size, once the handler asks for it (after
//! admission), and gives actix-http the head with `content-length: 0` and an
//! `x-kvgate-body` token instead; the handler takes the body by that token ([`claim`]).
//! A body that came whole with its head's read (a small request) is kept at once, so the
//! handler's first ask finds it.
//! Everything else (other routes, chunked bodies, `Expect`,
//! bodies over the limit, anything it cannot parse) passes through untouched, so actix-http
//! answers it as before.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::future::poll_fn;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use actix_web::HttpRequest;
use actix_web::http::header::HeaderName;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use kvgate_core::Endpoint;

/// The header that carries a body's token to the handler. A client's own is dropped from
/// any head whose body is taken here, and one on any other request matches no body.
pub static BODY_TOKEN: HeaderName = HeaderName::from_static("x-kvgate-body");

/// Heads longer than this are left to actix-http (which refuses them).
const MAX_HEAD: usize = 64 * 1024;
/// Headers parsed per head; a head with more passes through.
const MAX_HEADERS: usize = 96;
/// What each read of a head asks for.
const HEAD_READ: usize = 16 * 1024;
/// Read of a body whose handler holds it but has not asked for it yet (a request waiting
/// for admission).
const PARKED: usize = 64 * 1024;
/// Room past a body's end in its buffer. The body's last read asks for more than is left
/// of it, so a client that sent nothing more gives a short read, which tells the runtime
/// the socket is drained: the next head's read waits for the socket instead of failing
/// with `EAGAIN`. What a pipelining client sent past the body moves on to `input`.
const BODY_SLACK: usize = 1024;

/// How far a body's handler has got with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// No handler yet: nothing of the body is read past what came with its head
    /// (actix-http is still on the head).
    Unclaimed,
    /// Its handler holds it ([`BodyClaim::hold`]) and waits for admission: up to `PARKED`
    /// of it is read, so that a client that leaves meanwhile is seen.
    Held,
    /// Asked for: read whole, straight into a buffer of its size.
    Wanted,
}

#[derive(Debug)]
enum Entry {
    /// Not whole yet; a request waiting for admission holds no more of its body than
    /// actix-http would.
    Pending {
        waker: Option<Waker>,
        want: Want,
    },
    Ready(Bytes),
    /// The client went away (or failed) before the whole body came.
    Lost,
}

/// Bodies read for the handlers of one connection, by token.
#[derive(Debug, Default)]
pub struct Bodies {
    entries: RefCell<Vec<(u64, Entry)>>,
}

impl Bodies {
    fn set(&self, token: u64, to: Entry) {
        let mut entries = self.entries.borrow_mut();
        if let Some((_, e)) = entries.iter_mut().find(|(t, _)| *t == token)
            && let Entry::Pending { waker, .. } = std::mem::replace(e, to)
            && let Some(w) = waker
        {
            w.wake();
        }
    }

    fn contains(&self, token: u64) -> bool {
        self.entries.borrow().iter().any(|(t, _)| *t == token)
    }

    /// How far `token`'s handler has got with its body; `None` once it let it go.
    fn want(&self, token: u64) -> Option<Want> {
        self.entries
            .borrow()
            .iter()
            .find(|(t, _)| *t == token)
            .map(|(_, e)| match e {
                Entry::Pending { want, .. } => *want,
                Entry::Ready(_) | Entry::Lost => Want::Wanted,
            })
    }

    /// Moves `token` on to `to` (never back), waking the connection's task so that the
    /// intake reads on.
    fn advance_to(&self, token: u64, to: Want, cx: &mut Context<'_>) {
        let mut entries = self.entries.borrow_mut();
        if let Some((_, Entry::Pending { want, .. })) =
            entries.iter_mut().find(|(t, _)| *t == token)
            && *want != Want::Wanted
            && *want != to
        {
            *want = to;
            cx.waker().wake_by_ref();
        }
    }

    fn is_empty(&self) -> bool {
        self.entries.borrow().is_empty()
    }
}

/// A handler's claim on its request's body; dropped unread (the request was refused
/// before its body was needed), the body goes with it.
#[derive(Debug)]
pub struct BodyClaim {
    bodies: Rc<Bodies>,
    token: u64,
}

/// The client closed its connection, or it failed, before its body had come whole.
#[derive(Debug, thiserror::Error)]
#[error("the connection ended before the body had come whole")]
pub struct BodyLost;

/// The claim on `req`'s body when [`Intake`] read it; `None` when the body is actix-http's
/// payload as usual.
pub fn claim(req: &HttpRequest) -> Option<BodyClaim> {
    let token: u64 = req
        .headers()
        .get(&BODY_TOKEN)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    let bodies = req.conn_data::<Rc<Bodies>>()?;
    bodies.contains(token).then(|| BodyClaim {
        bodies: bodies.clone(),
        token,
    })
}

impl BodyClaim {
    /// Says the handler holds the body: until [`body`](Self::body) asks for it, the intake
    /// reads a little of it, enough to see a client that leaves.
    pub async fn hold(&self) {
        poll_fn(|cx| {
            self.bodies.advance_to(self.token, Want::Held, cx);
            Poll::Ready(())
        })
        .await;
    }

    /// The whole body, once it has come.
    pub async fn body(self) -> Result<Bytes, BodyLost> {
        poll_fn(|cx| {
            self.bodies.advance_to(self.token, Want::Wanted, cx);
            let mut entries = self.bodies.entries.borrow_mut();
            let Some(i) = entries.iter().position(|(t, _)| *t == self.token) else {
                return Poll::Ready(Err(BodyLost));
            };
            match &mut entries[i].1 {
                Entry::Pending { waker, .. } => {
                    *waker = Some(cx.waker().clone());
                    Poll::Pending
                }
                Entry::Ready(_) | Entry::Lost => match entries.swap_remove(i).1 {
                    Entry::Ready(b) => Poll::Ready(Ok(b)),
                    _ => Poll::Ready(Err(BodyLost)),
                },
            }
        })
        .await
    }
}

impl Drop for BodyClaim {
    fn drop(&mut self) {
        self.bodies
            .entries
            .borrow_mut()
            .retain(|(t, _)| *t != self.token);
    }
}

#[derive(Debug)]
enum Mode {
    /// Reading the next request's head.
    Head,
    /// Reading a body for its handler: `want` bytes in all (`body` is allocated when
    /// the handler asks for it).
    Body {
        token: u64,
        body: BytesMut,
        want: usize,
    },
    /// Passing the rest of a body actix-http reads itself.
    Pass(u64),
    /// Dropping the rest of a body whose handler let it go.
    Skip(usize),
    /// Passing everything from here on (framing this module does not follow).
    Raw,
}

/// What a head asks of the intake.
#[derive(Debug, PartialEq, Eq)]
enum Look {
    /// Not whole yet.
    Partial,
    /// Everything from here on passes through.
    Raw,
    /// The head (`head` bytes) and a body of `body` bytes pass through.
    Pass { head: usize, body: u64 },
    /// The head (`head` bytes) went on rewritten; the body (`body` bytes) is read here.
    Take { head: usize, body: usize },
}

const INFERENCE: [Endpoint; 3] = [Endpoint::Chat, Endpoint::Completions, Endpoint::Generate];

/// Reads the head at the start of `input`: whether its body is taken (the head rewritten
/// for `token` onto `out`), passes, or the connection passes through from here on.
fn look(input: &[u8], out: &mut BytesMut, limit: usize, token: u64, may_take: bool) -> Look {
    // Left uninitialised: zeroing 96 headers would cost more than parsing a short head.
    let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let head = match req.parse_with_uninit_headers(input, &mut headers) {
        Ok(httparse::Status::Complete(n)) => n,
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
    match rewrite(&input[..head], req.headers, token, out) {
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

/// Puts `head` on `out` with its `content-length` (and any `x-kvgate-body`) lines dropped
/// and `content-length: 0` and the token added after its last header line; `None` when
/// the head is not laid out as expected (part of it may be on `out`).
fn rewrite(
    head: &[u8],
    headers: &[httparse::Header<'_>],
    token: u64,
    out: &mut BytesMut,
) -> Option<()> {
    let base = head.as_ptr() as usize;
    let line_end = |from: usize| memchr::memchr(b'\n', &head[from..]).map(|i| from + i + 1);
    // The request line's end, then each header line's.
    let mut at = line_end(0)?;
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
        }
        at = end;
    }
    out.extend_from_slice(b"content-length: 0\r\nx-kvgate-body: ");
    write!(out, "{token}\r\n").ok()?;
    out.extend_from_slice(&head[at..]);
    Some(())
}

/// An accepted connection as actix-http reads it (see the module's text).
#[derive(Debug)]
pub struct Intake {
    io: TcpStream,
    limit: usize,
    /// Read from the socket, not yet looked at.
    input: BytesMut,
    /// Ready for actix-http.
    out: BytesMut,
    mode: Mode,
    bodies: Rc<Bodies>,
    next_token: u64,
    /// The socket has ended: once `out` is given, actix-http reads the end.
    eof: bool,
    /// Reads of a body that went past its end.
    #[cfg(test)]
    past_the_end: usize,
}

impl Intake {
    /// Wraps `io`; bodies up to `limit` bytes (the payload limit) are read here.
    pub fn new(io: TcpStream, limit: usize) -> Intake {
        Intake {
            io,
            limit,
            input: BytesMut::new(),
            out: BytesMut::new(),
            mode: Mode::Head,
            bodies: Rc::default(),
            // Tokens of one connection say nothing of another's.
            next_token: rand::random::<u64>() >> 1,
            eof: false,
            #[cfg(test)]
            past_the_end: 0,
        }
    }

    /// The connection's bodies, for its extensions (where [`claim`] finds them).
    pub fn bodies(&self) -> Rc<Bodies> {
        self.bodies.clone()
    }

    #[cfg(test)]
    fn mode_name(&self) -> &'static str {
        match self.mode {
            Mode::Head => "head",
            Mode::Body { .. } => "body",
            Mode::Pass(_) => "pass",
            Mode::Skip(_) => "skip",
            Mode::Raw => "raw",
        }
    }

    /// Moves what `input` holds along as far as the mode allows.
    fn advance(&mut self) {
        loop {
            match &mut self.mode {
                Mode::Raw => {
                    let all = self.input.split();
                    self.out.unsplit(all);
                    return;
                }
                Mode::Pass(left) => {
                    let n = (*left).min(self.input.len() as u64) as usize;
                    if n == 0 {
                        return;
                    }
                    *left -= n as u64;
                    if *left == 0 {
                        self.mode = Mode::Head;
                    }
                    let part = self.input.split_to(n);
                    self.out.unsplit(part);
                }
                Mode::Skip(left) => {
                    let n = (*left).min(self.input.len());
                    if n == 0 {
                        return;
                    }
                    self.input.advance(n);
                    *left -= n;
                    if *left == 0 {
                        self.mode = Mode::Head;
                    }
                }
                Mode::Body { token, body, want } => {
                    let whole = body.capacity() == 0 && self.input.len() >= *want;
                    match self.bodies.want(*token) {
                        None => {
                            self.mode = Mode::Skip(*want - body.len());
                            continue;
                        }
                        // Read with its head: kept whole it holds no more memory than in
                        // `input`, and its handler finds it ready when it asks, where
                        // waiting for the ask cost the connection's task another poll.
                        Some(Want::Unclaimed | Want::Held) if whole => body.reserve(*want),
                        Some(Want::Unclaimed | Want::Held) => return,
                        Some(Want::Wanted) if body.capacity() == 0 => {
                            body.reserve(*want + BODY_SLACK);
                        }
                        Some(Want::Wanted) => {}
                    }
                    let n = (*want - body.len()).min(self.input.len());
                    body.extend_from_slice(&self.input[..n]);
                    self.input.advance(n);
                    if body.len() < *want {
                        return;
                    }
                    self.finish_body();
                }
                Mode::Head => {
                    if self.input.is_empty() {
                        return;
                    }
                    let token = self.next_token;
                    let may_take = self.bodies.is_empty();
                    match look(&self.input, &mut self.out, self.limit, token, may_take) {
                        Look::Partial => return,
                        Look::Raw => self.mode = Mode::Raw,
                        Look::Pass { head, body } => {
                            let head = self.input.split_to(head);
                            self.out.unsplit(head);
                            if body > 0 {
                                self.mode = Mode::Pass(body);
                            }
                        }
                        Look::Take { head, body } => {
                            self.next_token = token.wrapping_add(1);
                            self.input.advance(head);
                            self.bodies.entries.borrow_mut().push((
                                token,
                                Entry::Pending {
                                    waker: None,
                                    want: Want::Unclaimed,
                                },
                            ));
                            self.mode = Mode::Body {
                                token,
                                body: BytesMut::new(),
                                want: body,
                            };
                        }
                    }
                }
            }
        }
    }

    fn finish_body(&mut self) {
        if let Mode::Body { token, body, .. } = std::mem::replace(&mut self.mode, Mode::Head) {
            self.bodies.set(token, Entry::Ready(body.freeze()));
        }
    }

    /// The socket ended or failed: a body being read is lost, and what is left goes to
    /// actix-http as it is.
    fn ended(&mut self) {
        match std::mem::replace(&mut self.mode, Mode::Raw) {
            Mode::Body { token, .. } => {
                self.bodies.set(token, Entry::Lost);
                // What was read is part of that body, not a head for actix-http.
                self.input.clear();
            }
            Mode::Skip(_) => self.input.clear(),
            _ => {}
        }
        let rest = self.input.split();
        self.out.unsplit(rest);
        self.eof = true;
    }
}

impl AsyncRead for Intake {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            // Also where a body's handler asking for it, or letting it go, takes effect.
            this.advance();
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out[..n]);
                this.out.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let io = Pin::new(&mut this.io);
            let read = match &mut this.mode {
                // Nothing to rewrite: straight into actix-http's buffer.
                Mode::Raw => return io.poll_read(cx, buf),
                // Not asked for yet: the claim wakes this task when it is. While its
                // handler holds it, up to `PARKED` of it is read, so that a client gone
                // while its request waits for admission is seen, as actix-http would see it.
                Mode::Body { token, body, .. } if body.capacity() == 0 => {
                    if this.bodies.want(*token) != Some(Want::Held) {
                        return Poll::Pending;
                    }
                    let room = PARKED.saturating_sub(this.input.len());
                    if room == 0 {
                        return Poll::Pending;
                    }
                    this.input.reserve(room.min(HEAD_READ));
                    tokio_util::io::poll_read_buf(io, cx, &mut (&mut this.input).limit(room))
                }
                // Straight into the body's own buffer; anything past its end moves on.
                Mode::Body { body, want, .. } => {
                    let read = tokio_util::io::poll_read_buf(io, cx, body);
                    if body.len() > *want {
                        let over = body.split_off(*want);
                        this.input.unsplit(over);
                        #[cfg(test)]
                        {
                            this.past_the_end += 1;
                        }
                    }
                    read
                }
                Mode::Head | Mode::Pass(_) | Mode::Skip(_) => {
                    this.input.reserve(HEAD_READ);
                    tokio_util::io::poll_read_buf(io, cx, &mut this.input)
                }
            };
            match read {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => this.ended(),
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    this.ended();
                    return Poll::Ready(Err(e));
                }
            }
        }
    }
}

impl AsyncWrite for Intake {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
