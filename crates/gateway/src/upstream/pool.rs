//! The keep-alive pool of one HTTP thread, and the exchange of one request for the head
//! of its answer.

use std::io::{self, Write as _};
use std::rc::Rc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use kvgate_core::WorkerUrl;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::warn;

use super::UpstreamError;
use super::body::{Body, Response};
use super::guard::ConnectGuard;
use super::head::parse_head;
use super::idle::IdleConns;
use super::read::read_more;
use super::tls::Conn;

/// A response head larger than this is refused.
const MAX_HEAD: usize = 64 * 1024;

struct Inner {
    idle: IdleConns,
    connect_timeout: Duration,
    guard: ConnectGuard,
}

/// The upstream connections of one HTTP thread. Cloning shares the pool.
#[derive(Clone)]
pub(crate) struct Pool(Rc<Inner>);

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("idle", &self.0.idle.len())
            .field("keep_alive", &self.0.idle.keep_alive())
            .finish()
    }
}

impl Pool {
    /// `keep_alive` must be shorter than the workers' own idle timeout (uvicorn's is 5 s),
    /// so the pool drops a connection before the worker closes it under a request.
    /// `guard` names the hosts whose addresses are vetted again at each connection.
    pub(crate) fn new(
        connect_timeout: Duration,
        keep_alive: Duration,
        guard: ConnectGuard,
    ) -> Pool {
        Pool(Rc::new(Inner {
            idle: IdleConns::new(keep_alive),
            connect_timeout,
            guard,
        }))
    }

    /// Idle connections held for `worker`.
    #[cfg(test)]
    pub(crate) fn idle_count(&self, worker: &WorkerUrl) -> usize {
        self.0.idle.count(worker.origin())
    }

    /// Workers with an idle-connection list.
    #[cfg(test)]
    pub(super) fn workers_held(&self) -> usize {
        self.0.idle.workers()
    }

    /// A live idle connection to the worker at `origin`, as a request takes one.
    #[cfg(test)]
    pub(super) fn checkout(&self, origin: &str) -> Option<Conn> {
        self.0.idle.checkout(origin)
    }

    /// Gives a connection back, as a body read to its end does.
    #[cfg(test)]
    pub(super) fn checkin(&self, origin: &str, conn: Conn) {
        self.0.idle.checkin(origin, conn);
    }

    /// Sweeps the idle connections every keep-alive period (see [`IdleConns`]).
    pub(crate) fn spawn_sweeper(&self) {
        self.0.idle.spawn_sweeper();
    }

    /// A new connection, its TLS handshake included for an `https://` worker, within the
    /// connect timeout. A handshake that fails is a connection that failed: the worker saw
    /// no request.
    async fn connect(&self, w: &WorkerUrl) -> Result<Conn, UpstreamError> {
        let secs = self.0.connect_timeout.as_secs_f64();
        let connecting = async {
            let tcp = match self.0.guard.addresses(w.host(), w.port()).await {
                None => TcpStream::connect((w.host(), w.port()))
                    .await
                    .map_err(UpstreamError::Connect)?,
                Some(Ok(addrs)) => TcpStream::connect(&addrs[..])
                    .await
                    .map_err(UpstreamError::Connect)?,
                Some(Err(e)) => return Err(UpstreamError::Guard(e)),
            };
            // Requests and answers are single small writes; Nagle would hold them back.
            if let Err(e) = tcp.set_nodelay(true) {
                warn!(error = %e, "cannot set TCP_NODELAY on an upstream connection");
            }
            if !w.is_tls() {
                return Ok(Conn::Plain(tcp));
            }
            let config = self.0.guard.tls().ok_or_else(|| {
                UpstreamError::Connect(io::Error::other("no TLS settings for https:// workers"))
            })?;
            Conn::tls(config, w.host(), tcp)
                .await
                .map_err(UpstreamError::Connect)
        };
        tokio::time::timeout(self.0.connect_timeout, connecting)
            .await
            .map_err(|_| UpstreamError::ConnectTimeout(secs))?
    }

    /// POSTs `body` to `worker` + `path` and returns once the answer's head is read.
    /// `headers` must hold valid header names and values (they come from a parsed request).
    pub(crate) async fn post(
        &self,
        worker: &WorkerUrl,
        path: &str,
        headers: &[(&str, &[u8])],
        body: Bytes,
    ) -> Result<Response, UpstreamError> {
        self.post_with(worker, path, headers, body, None).await
    }

    /// [`Pool::post`] with `insert = (at, bytes)`: `bytes` go into the body before its byte
    /// `at`, without copying the body (a member added to a JSON object, say).
    pub(crate) async fn post_with(
        &self,
        worker: &WorkerUrl,
        path: &str,
        headers: &[(&str, &[u8])],
        body: Bytes,
        insert: Option<(usize, &[u8])>,
    ) -> Result<Response, UpstreamError> {
        let (at, extra) = insert
            .filter(|(at, _)| *at <= body.len())
            .unwrap_or((0, &[]));
        let mut head = request_head(worker, path, headers, body.len() + extra.len());
        head.extend_from_slice(&body[..at]);
        head.extend_from_slice(extra);
        let rest = body.slice(at..);
        if let Some(conn) = self.0.idle.checkout(worker.origin()) {
            match self.exchange(conn, worker, &head, &rest).await {
                Ok(r) => return Ok(r),
                // The pooled connection failed before the whole request went out (the
                // worker closed it as it left): the worker cannot have acted on it, so it
                // goes once more, on a new connection.
                Err((_, Sent::Partly)) => {}
                // Written whole: the worker may have it, and it is not sent twice from
                // here. Trying another worker is the caller's decision.
                Err((e, Sent::Whole)) => return Err(e),
            }
        }
        let conn = self.connect(worker).await?;
        self.exchange(conn, worker, &head, &rest)
            .await
            .map_err(|(e, _)| e)
    }

    /// Writes one request on `conn` and reads the answer's head.
    async fn exchange(
        &self,
        mut conn: Conn,
        worker: &WorkerUrl,
        head: &[u8],
        rest: &[u8],
    ) -> Result<Response, (UpstreamError, Sent)> {
        let partly = |e| (UpstreamError::Write(e), Sent::Partly);
        write_request(&mut conn, head, rest).await.map_err(partly)?;
        let whole = |e| (e, Sent::Whole);
        let mut buf = BytesMut::with_capacity(8 * 1024);
        let mut got_any = false;
        loop {
            if let Some(head) = parse_head(&buf).map_err(whole)? {
                buf.advance(head.len);
                // An interim answer (100 Continue) is followed by the real one.
                if head.status.is_informational() {
                    continue;
                }
                return Ok(Response {
                    status: head.status,
                    headers: head.headers,
                    body: Body::new(
                        conn,
                        buf,
                        head.framing,
                        head.keep_alive,
                        self.0.idle.clone(),
                        worker,
                    ),
                });
            }
            if buf.len() >= MAX_HEAD {
                return Err(whole(UpstreamError::Malformed(format!(
                    "response head over {MAX_HEAD} bytes"
                ))));
            }
            match read_more(&mut conn, &mut buf).await.map_err(whole)? {
                0 if got_any => {
                    return Err(whole(UpstreamError::Malformed(
                        "the connection closed inside the head".into(),
                    )));
                }
                0 => return Err(whole(UpstreamError::ClosedBeforeHead)),
                _ => got_any = true,
            }
        }
    }
}

/// Writes `head` then `body`: one vectored write when the socket takes both, the body
/// never copied; then flushed, which sends what TLS still holds (nothing for plain TCP).
async fn write_request(conn: &mut Conn, mut head: &[u8], mut body: &[u8]) -> io::Result<()> {
    while !head.is_empty() || !body.is_empty() {
        let n = if head.is_empty() {
            conn.write(body).await?
        } else {
            let parts = [io::IoSlice::new(head), io::IoSlice::new(body)];
            conn.write_vectored(&parts).await?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let from_head = n.min(head.len());
        head = &head[from_head..];
        body = &body[n - from_head..];
    }
    conn.flush().await
}

/// How much of a request reached the socket before a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Partly,
    Whole,
}

fn request_head(w: &WorkerUrl, path: &str, headers: &[(&str, &[u8])], len: usize) -> Vec<u8> {
    let extra: usize = headers.iter().map(|(n, v)| n.len() + v.len() + 4).sum();
    let (prefix, authority) = (w.prefix(), w.authority());
    let mut h = Vec::with_capacity(96 + prefix.len() + path.len() + authority.len() + extra);
    h.extend_from_slice(b"POST ");
    h.extend_from_slice(prefix.as_bytes());
    h.extend_from_slice(path.as_bytes());
    h.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    h.extend_from_slice(authority.as_bytes());
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
