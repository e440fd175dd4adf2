//! kvgate's HTTP/1.1 client for inference calls to workers.
//!
//! One [`Pool`] per HTTP thread keeps idle keep-alive connections per worker. A request
//! goes out in one write (head and body together up to [`COALESCE`] bytes); the answer's
//! head is parsed with `httparse` and its body framed by `Content-Length`, chunked
//! encoding or the end of the connection. A connection goes back to the pool only after
//! its body was read to the end, so a dropped [`Body`] (a client that went away) closes
//! the connection, which is what aborts the request on the engine. Only a pooled
//! connection that the worker closed under a request, before any byte of an answer, is
//! tried again (once, on a new connection).
//!
//! Why not awc: awc builds a codec per request whose date service spawns a task and arms
//! a timer, waking the runtime's driver once per request (docs/benchmarks.md, "Proxy
//! overhead, session 4"); this client does only the socket work a proxy needs.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::poll_fn;
use std::io::{self, Write as _};
use std::rc::Rc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderName, HeaderValue};
use bytes::{Buf, Bytes, BytesMut};
use thiserror::Error;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::warn;

/// Bodies up to this size are copied behind the head so the request is one `send`.
pub const COALESCE: usize = 64 * 1024;
/// A response head larger than this is refused.
const MAX_HEAD: usize = 64 * 1024;
/// A chunk-size or trailer line longer than this is refused.
const MAX_LINE: usize = 4096;
/// Idle connections kept per worker and thread; more are closed.
const MAX_IDLE: usize = 256;

/// What can go wrong between the gateway and a worker.
#[derive(Debug, Error)]
pub enum UpstreamError {
    #[error("invalid worker URL {0}")]
    BadUrl(String),
    #[error("cannot connect: {0}")]
    Connect(io::Error),
    #[error("connecting timed out after {0:.1}s")]
    ConnectTimeout(f64),
    #[error("sending the request: {0}")]
    Write(io::Error),
    #[error("reading the response: {0}")]
    Read(io::Error),
    #[error("the worker closed the connection before answering")]
    ClosedBeforeHead,
    #[error("malformed response: {0}")]
    Malformed(String),
    #[error("the body ended after {got} of {want} bytes")]
    Truncated { got: u64, want: u64 },
    #[error("the worker closed the connection inside a chunked body")]
    ChunkedTruncated,
    #[error("the response body exceeds {0} bytes")]
    BodyTooLarge(usize),
}

/// A worker URL split into what the wire needs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin<'a> {
    /// `host:port` as written, used as the `Host` header and the pool key.
    authority: &'a str,
    host: &'a str,
    port: u16,
    /// A path prefix the worker is mounted under, without a trailing slash.
    prefix: &'a str,
}

fn origin(url: &str) -> Result<Origin<'_>, UpstreamError> {
    let bad = || UpstreamError::BadUrl(url.to_owned());
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !authority.ends_with(']') => (h, p.parse().map_err(|_| bad())?),
        _ => (authority, 80),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    // Both go into the request line and the Host header as they are.
    let visible = |s: &str| s.bytes().all(|b| b.is_ascii_graphic());
    if host.is_empty() || !visible(authority) || !visible(prefix) {
        return Err(bad());
    }
    Ok(Origin {
        authority,
        host,
        port,
        prefix: prefix.trim_end_matches('/'),
    })
}

struct Idle {
    conn: TcpStream,
    since: Instant,
}

struct Inner {
    idle: RefCell<HashMap<String, Vec<Idle>>>,
    connect_timeout: Duration,
    keep_alive: Duration,
}

/// The upstream connections of one HTTP thread. Cloning shares the pool.
#[derive(Clone)]
pub struct Pool(Rc<Inner>);

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let idle: usize = self.0.idle.borrow().values().map(Vec::len).sum();
        f.debug_struct("Pool")
            .field("idle", &idle)
            .field("keep_alive", &self.0.keep_alive)
            .finish()
    }
}

impl Pool {
    /// `keep_alive` must be shorter than the workers' own idle timeout (uvicorn's is 5 s),
    /// so the pool drops a connection before the worker closes it under a request.
    pub fn new(connect_timeout: Duration, keep_alive: Duration) -> Pool {
        Pool(Rc::new(Inner {
            idle: RefCell::new(HashMap::new()),
            connect_timeout,
            keep_alive,
        }))
    }

    /// Idle connections held for `worker_url`.
    #[cfg(test)]
    pub fn idle_count(&self, worker_url: &str) -> usize {
        origin(worker_url).map_or(0, |o| {
            self.0.idle.borrow().get(o.authority).map_or(0, Vec::len)
        })
    }

    /// A live idle connection, newest first; expired or closed ones are dropped.
    fn checkout(&self, authority: &str) -> Option<TcpStream> {
        let mut idle = self.0.idle.borrow_mut();
        let list = idle.get_mut(authority)?;
        prune(list, self.0.keep_alive);
        while let Some(Idle { conn, .. }) = list.pop() {
            // A closed peer has made the socket readable (EOF); a live idle one has not.
            match conn.try_read(&mut [0u8; 1]) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Some(conn),
                _ => continue,
            }
        }
        None
    }

    /// Expired connections are left to the next checkout or sweep.
    fn checkin(&self, authority: &str, conn: TcpStream) {
        let mut idle = self.0.idle.borrow_mut();
        let entry = Idle {
            conn,
            since: Instant::now(),
        };
        // Looked up first: the key is allocated only for a worker's first connection.
        match idle.get_mut(authority) {
            Some(list) if list.len() >= MAX_IDLE => {}
            Some(list) => list.push(entry),
            None => {
                idle.insert(authority.to_owned(), vec![entry]);
            }
        }
    }

    /// Closes every connection idle past the keep-alive and forgets workers with none left.
    fn sweep(&self) {
        let mut idle = self.0.idle.borrow_mut();
        idle.retain(|_, list| {
            prune(list, self.0.keep_alive);
            !list.is_empty()
        });
    }

    /// Sweeps the pool every keep-alive period on this thread's runtime, so connections to
    /// a worker that gets no more traffic (or was removed) are closed too; the task ends
    /// with the pool. Must be called on an actix or tokio local runtime.
    pub fn spawn_sweeper(&self) {
        let pool = Rc::downgrade(&self.0);
        let every = self.0.keep_alive.max(Duration::from_millis(10));
        actix_rt::spawn(async move {
            loop {
                actix_rt::time::sleep(every).await;
                match pool.upgrade() {
                    Some(inner) => Pool(inner).sweep(),
                    None => return,
                }
            }
        });
    }

    async fn connect(&self, o: &Origin<'_>) -> Result<TcpStream, UpstreamError> {
        let secs = self.0.connect_timeout.as_secs_f64();
        let conn =
            tokio::time::timeout(self.0.connect_timeout, TcpStream::connect((o.host, o.port)))
                .await
                .map_err(|_| UpstreamError::ConnectTimeout(secs))?
                .map_err(UpstreamError::Connect)?;
        // Requests and answers are single small writes; Nagle would hold them back.
        if let Err(e) = conn.set_nodelay(true) {
            warn!(error = %e, "cannot set TCP_NODELAY on an upstream connection");
        }
        Ok(conn)
    }

    /// POSTs `body` to `worker_url` + `path` and returns once the answer's head is read.
    /// `headers` must hold valid header names and values (they come from a parsed request).
    pub async fn post(
        &self,
        worker_url: &str,
        path: &str,
        headers: &[(&str, &[u8])],
        body: Bytes,
    ) -> Result<Response, UpstreamError> {
        let o = origin(worker_url)?;
        let mut head = request_head(&o, path, headers, body.len());
        // Small bodies go out with the head in one write.
        let rest = if body.len() <= COALESCE {
            head.extend_from_slice(&body);
            Bytes::new()
        } else {
            body
        };
        if let Some(conn) = self.checkout(o.authority) {
            match self.exchange(conn, &o, &head, &rest).await {
                Ok(r) => return Ok(r),
                // The worker closed this idle connection as the request went out (its
                // keep-alive ran out first): no byte of an answer came back, so the
                // request goes once more, on a new connection.
                Err((_, Answered::Nothing)) => {}
                Err((e, Answered::Something)) => return Err(e),
            }
        }
        let conn = self.connect(&o).await?;
        self.exchange(conn, &o, &head, &rest)
            .await
            .map_err(|(e, _)| e)
    }

    /// Writes one request on `conn` and reads the answer's head.
    async fn exchange(
        &self,
        mut conn: TcpStream,
        o: &Origin<'_>,
        head: &[u8],
        rest: &[u8],
    ) -> Result<Response, (UpstreamError, Answered)> {
        let nothing = |e| (e, Answered::Nothing);
        conn.write_all(head)
            .await
            .map_err(|e| nothing(UpstreamError::Write(e)))?;
        if !rest.is_empty() {
            conn.write_all(rest)
                .await
                .map_err(|e| nothing(UpstreamError::Write(e)))?;
        }
        let mut buf = BytesMut::with_capacity(8 * 1024);
        let mut got_any = false;
        loop {
            let something = |e| (e, Answered::Something);
            if let Some(head) = parse_head(&buf).map_err(something)? {
                buf.advance(head.len);
                // An interim answer (100 Continue) is followed by the real one.
                if head.status.is_informational() {
                    continue;
                }
                return Ok(Response {
                    status: head.status,
                    headers: head.headers,
                    body: Body {
                        conn: Some(conn),
                        buf,
                        framing: head.framing,
                        reusable: head.keep_alive,
                        pool: self.clone(),
                        authority: o.authority.to_owned(),
                        read: 0,
                    },
                });
            }
            if buf.len() >= MAX_HEAD {
                return Err(something(UpstreamError::Malformed(format!(
                    "response head over {MAX_HEAD} bytes"
                ))));
            }
            match read_more(&mut conn, &mut buf).await {
                Ok(0) if got_any => {
                    return Err(something(UpstreamError::Malformed(
                        "the connection closed inside the head".into(),
                    )));
                }
                Ok(0) => return Err(nothing(UpstreamError::ClosedBeforeHead)),
                Ok(_) => got_any = true,
                Err(e) if got_any => return Err(something(e)),
                Err(e) => return Err(nothing(e)),
            }
        }
    }
}

/// Whether any byte of an answer came back before a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answered {
    Nothing,
    Something,
}

/// Drops the connections idle past `keep_alive`: the oldest, at the front.
fn prune(list: &mut Vec<Idle>, keep_alive: Duration) {
    let now = Instant::now();
    let expired = list.partition_point(|i| now.duration_since(i.since) >= keep_alive);
    list.drain(..expired);
}

fn request_head(o: &Origin<'_>, path: &str, headers: &[(&str, &[u8])], len: usize) -> Vec<u8> {
    let extra: usize = headers.iter().map(|(n, v)| n.len() + v.len() + 4).sum();
    let mut h = Vec::with_capacity(96 + o.prefix.len() + path.len() + o.authority.len() + extra);
    h.extend_from_slice(b"POST ");
    h.extend_from_slice(o.prefix.as_bytes());
    h.extend_from_slice(path.as_bytes());
    h.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    h.extend_from_slice(o.authority.as_bytes());
    // Writing into a Vec cannot fail.
    let _ = write!(h, "\r\ncontent-length: {len}\r\n");
    for (name, value) in headers {
        h.extend_from_slice(name.as_bytes());
        h.extend_from_slice(b": ");
        h.extend_from_slice(value);
        h.extend_from_slice(b"\r\n");
    }
    h.extend_from_slice(b"\r\n");
    h
}

async fn read_more(conn: &mut TcpStream, buf: &mut BytesMut) -> Result<usize, UpstreamError> {
    poll_fn(|cx| poll_read_more(conn, buf, cx)).await
}

fn poll_read_more(
    conn: &mut TcpStream,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<Result<usize, UpstreamError>> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(16 * 1024);
    }
    loop {
        ready!(conn.poll_read_ready(cx)).map_err(UpstreamError::Read)?;
        match conn.try_read_buf(buf) {
            Ok(n) => return Poll::Ready(Ok(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Poll::Ready(Err(UpstreamError::Read(e))),
        }
    }
}

/// How the body of an answer ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
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
struct Head {
    len: usize,
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    framing: Framing,
    keep_alive: bool,
}

/// Parses a complete response head at the start of `buf`, or `None` if more is needed.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, UpstreamError> {
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

/// An answer whose head has been read.
#[derive(Debug)]
pub struct Response {
    pub status: StatusCode,
    /// As received, in order, hop-by-hop headers included.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Body,
}

impl Response {
    /// The first value of `name`, if it is text.
    pub fn header(&self, name: &HeaderName) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.to_str().ok())
    }
}

/// The body of an answer, read as it arrives. Reading it to the end gives the connection
/// back to the pool; dropping it earlier closes the connection.
pub struct Body {
    conn: Option<TcpStream>,
    buf: BytesMut,
    framing: Framing,
    reusable: bool,
    pool: Pool,
    authority: String,
    /// Body bytes handed out so far.
    read: u64,
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Body")
            .field("framing", &self.framing)
            .field("read", &self.read)
            .field("open", &self.conn.is_some())
            .finish()
    }
}

impl Body {
    /// The whole body, refused once it passes `limit` bytes.
    pub async fn collect(mut self, limit: usize) -> Result<Bytes, UpstreamError> {
        let first = match self.next().await {
            None => return Ok(Bytes::new()),
            Some(c) => c?,
        };
        if first.len() > limit {
            return Err(UpstreamError::BodyTooLarge(limit));
        }
        // The common answer arrives in one piece: no copy.
        let second = match self.next().await {
            None => return Ok(first),
            Some(c) => c?,
        };
        let mut all = BytesMut::from(&first[..]);
        let mut chunk = Some(second);
        while let Some(c) = chunk {
            if all.len() + c.len() > limit {
                return Err(UpstreamError::BodyTooLarge(limit));
            }
            all.extend_from_slice(&c);
            chunk = self.next().await.transpose()?;
        }
        Ok(all.freeze())
    }

    /// The next piece of the body, `None` at its end.
    pub async fn next(&mut self) -> Option<Result<Bytes, UpstreamError>> {
        poll_fn(|cx| self.poll_chunk(cx)).await
    }

    fn finish(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.reusable
            && self.buf.is_empty()
        {
            self.pool.checkin(&self.authority, conn);
        }
    }

    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        loop {
            if self.conn.is_none() {
                return Poll::Ready(None);
            }
            match &mut self.framing {
                Framing::Length { left, .. } => {
                    if *left == 0 {
                        self.finish();
                        return Poll::Ready(None);
                    }
                    if !self.buf.is_empty() {
                        let n = (self.buf.len() as u64).min(*left);
                        *left -= n;
                        self.read += n;
                        // `n` fits: it is at most the buffer's length.
                        let out = self.buf.split_to(n as usize).freeze();
                        return Poll::Ready(Some(Ok(out)));
                    }
                }
                Framing::Chunked(c) => match c.step(&mut self.buf) {
                    Err(e) => return self.fail(e),
                    Ok(Step::Data(d)) => {
                        self.read += d.len() as u64;
                        return Poll::Ready(Some(Ok(d)));
                    }
                    Ok(Step::Done) => {
                        self.finish();
                        return Poll::Ready(None);
                    }
                    Ok(Step::More) => {}
                },
                Framing::UntilClose => {
                    if !self.buf.is_empty() {
                        let out = self.buf.split().freeze();
                        self.read += out.len() as u64;
                        return Poll::Ready(Some(Ok(out)));
                    }
                }
            }
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(poll_read_more(conn, &mut self.buf, cx)) {
                Err(e) => return self.fail(e),
                Ok(0) => {
                    let err = match self.framing {
                        Framing::UntilClose => {
                            self.conn = None;
                            return Poll::Ready(None);
                        }
                        Framing::Length { want, .. } => UpstreamError::Truncated {
                            got: self.read,
                            want,
                        },
                        Framing::Chunked(_) => UpstreamError::ChunkedTruncated,
                    };
                    return self.fail(err);
                }
                Ok(_) => {}
            }
        }
    }

    fn fail(&mut self, e: UpstreamError) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        self.conn = None;
        Poll::Ready(Some(Err(e)))
    }
}

impl futures_util::Stream for Body {
    type Item = Result<Bytes, UpstreamError>;

    fn poll_next(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_chunk(cx)
    }
}

/// Where a chunked body's decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum ChunkState {
    #[default]
    Size,
    Data(u64),
    DataEnd,
    Trailer,
    Done,
}

/// An incremental decoder of chunked transfer coding (RFC 9112 §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Chunked {
    state: ChunkState,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Data(Bytes),
    /// Nothing more can be decoded from what is buffered.
    More,
    Done,
}

/// Takes one line (without its CRLF or LF) off the front of `buf`.
fn take_line(buf: &mut BytesMut) -> Result<Option<BytesMut>, UpstreamError> {
    match buf.iter().position(|b| *b == b'\n') {
        Some(i) if i <= MAX_LINE => {
            let mut line = buf.split_to(i + 1);
            line.truncate(i);
            if line.last() == Some(&b'\r') {
                line.truncate(i - 1);
            }
            Ok(Some(line))
        }
        Some(_) => Err(UpstreamError::Malformed("chunk line too long".into())),
        None if buf.len() > MAX_LINE => Err(UpstreamError::Malformed("chunk line too long".into())),
        None => Ok(None),
    }
}

impl Chunked {
    /// Decodes what it can from the front of `buf`, consuming it.
    pub(crate) fn step(&mut self, buf: &mut BytesMut) -> Result<Step, UpstreamError> {
        loop {
            match self.state {
                ChunkState::Size => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(Step::More);
                    };
                    let line: &[u8] = &line;
                    let digits = line
                        .split(|b| *b == b';')
                        .next()
                        .unwrap_or(&[])
                        .trim_ascii();
                    if digits.is_empty() || digits.len() > 15 {
                        return Err(UpstreamError::Malformed("bad chunk size".into()));
                    }
                    let mut size = 0u64;
                    for d in digits {
                        let v = (*d as char)
                            .to_digit(16)
                            .ok_or_else(|| UpstreamError::Malformed("bad chunk size".into()))?;
                        size = size * 16 + u64::from(v);
                    }
                    self.state = if size == 0 {
                        ChunkState::Trailer
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Step::More);
                    }
                    let n = (buf.len() as u64).min(left);
                    self.state = if n == left {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left - n)
                    };
                    // `n` fits: it is at most the buffer's length.
                    return Ok(Step::Data(buf.split_to(n as usize).freeze()));
                }
                ChunkState::DataEnd => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(Step::More);
                    };
                    if !line.is_empty() {
                        return Err(UpstreamError::Malformed(
                            "chunk longer than its size".into(),
                        ));
                    }
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailer => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(Step::More);
                    };
                    if line.is_empty() {
                        self.state = ChunkState::Done;
                    }
                }
                ChunkState::Done => return Ok(Step::Done),
            }
        }
    }
}

// Only used by the tests, to build chunked bodies.
#[cfg(test)]
pub(crate) fn encode_chunked(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts.iter().filter(|p| !p.is_empty()) {
        out.extend_from_slice(format!("{:x}\r\n", p.len()).as_bytes());
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

#[cfg(test)]
mod tests;
