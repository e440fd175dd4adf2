//! Inference bodies read at the socket, in one buffer of their `Content-Length`.
//!
//! actix-http reads a connection 8 KiB at a time and hands a body on as one chunk per
//! read, which the handler then copies into one buffer: at 256 KiB that is 32 reads, 32
//! chunks through the payload channel and a copy of the whole body. [`Intake`] wraps each
//! accepted connection below actix-http and reads each request head first, with httparse
//! as actix-http does (its default settings, at most 96 headers), so it is a second
//! HTTP/1 parser on the request path; this is its contract.
//!
//! **Takes** the body of a head that httparse reads whole, within 64 KiB, when all hold:
//! - the method is `POST` and the path, before any `?`, is `/v1/chat/completions`,
//!   `/v1/completions` or `/generate`;
//! - exactly one `Content-Length`, its value (as httparse trims it) ASCII digits only,
//!   leading zeros allowed, from 1 to the payload limit;
//! - no `Transfer-Encoding`, `Upgrade` or `Expect` header;
//! - at most 94 headers besides its `content-length` and `x-kvgate-body` lines, so that
//!   the rewrite stays within 96;
//! - no earlier body of the connection is still waiting for its handler to take it.
//!
//! **Rewrites** a taken head only so: every `content-length` and `x-kvgate-body` line
//! (any case) is dropped, and `content-length: 0` and `x-kvgate-body: <token>` are added
//! after the last header line. Blank lines before the request line, the request line,
//! the other lines (bytes, order, CRLF or bare LF ends) and the blank line are kept.
//!
//! **Hands over** the body (the `Content-Length` bytes after the head) to the handler
//! that [`claim()`]s the token, whole, in one buffer, when it asks ([`BodyClaim::body`]).
//! Until then no more of it is read than came with the head, or up to 64 KiB once the
//! handler holds it ([`BodyClaim::hold`]) so a client that leaves is seen. A claim
//! dropped unread drops the rest of the body; a connection that ends first gives
//! [`BodyLost`]. A client's own token on a head passed as sent names no body it can know
//! of (tokens start at random per connection).
//!
//! **Passes byte for byte**, and reads the next head after the body (pipelining):
//! any other head httparse reads whole within 64 KiB, with no `Content-Length` or one
//! valid one, and that body (other routes and methods, bodies empty or over the limit,
//! `Expect: 100-continue`, an earlier body still waiting, no room for the two lines).
//!
//! **Stops**, passing everything from there on byte for byte, unread, for actix-http to
//! answer or refuse: a head httparse refuses (obs-fold, bare CR, bad tokens, more than
//! 96 headers) or still partial at 64 KiB; one longer than 64 KiB; `CONNECT`; any
//! `Transfer-Encoding` (chunked or not) or `Upgrade`; a `Content-Length` repeated (even
//! equal), listed (`5, 5`), signed, empty, not ASCII digits or over `u64`.
//!
//! It never answers or refuses a request itself. How a head is cut into reads does not
//! change what is done with it (only whether an earlier body is still waiting when it is
//! whole does). The properties in `intake/tests/` check all of this against a model
//! built on httparse.

use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use actix_web::http::header::HeaderName;
use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

mod claim;
mod head;

#[cfg_attr(
    not(test),
    expect(
        unused_imports,
        reason = "the error of `BodyClaim::body`, kept at its path though no caller names it"
    )
)]
pub(crate) use claim::BodyLost;
pub(crate) use claim::{Bodies, BodyClaim, claim};
use claim::{Entry, Want};
use head::{Look, look};

/// The header that carries a body's token to the handler. A client's own is dropped from
/// any head whose body is taken here, and one on any other request matches no body.
pub(crate) static BODY_TOKEN: HeaderName = HeaderName::from_static("x-kvgate-body");

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

/// An accepted connection as actix-http reads it (see the module's text). Generic over
/// its socket only so that tests can script reads.
#[derive(Debug)]
pub(crate) struct Intake<IO = TcpStream> {
    io: IO,
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

impl<IO> Intake<IO> {
    /// Wraps `io`; bodies up to `limit` bytes (the payload limit) are read here.
    pub(crate) fn new(io: IO, limit: usize) -> Intake<IO> {
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

    /// The connection's bodies, for its extensions (where [`claim()`] finds them).
    pub(crate) fn bodies(&self) -> Rc<Bodies> {
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
                            self.bodies.open(token);
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

impl<IO: AsyncRead + Unpin> AsyncRead for Intake<IO> {
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

impl<IO: AsyncWrite + Unpin> AsyncWrite for Intake<IO> {
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
