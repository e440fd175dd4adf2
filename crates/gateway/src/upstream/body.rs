//! The body of a worker's answer, read as it arrives and framed as its head said.

use std::future::poll_fn;
use std::task::{Context, Poll, ready};

use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderName, HeaderValue};
use bytes::{Bytes, BytesMut};
use kvgate_core::WorkerUrl;

use super::UpstreamError;
use super::chunked::Step;
use super::head::Framing;
use super::idle::IdleConns;
use super::read::poll_read_more;
use super::tls::Conn;

#[derive(Debug)]
pub(crate) struct Response {
    pub status: StatusCode,
    /// As received, in order, hop-by-hop headers included.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Body,
}

impl Response {
    /// The first value of `name`, if it is text.
    pub(crate) fn header(&self, name: &HeaderName) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.to_str().ok())
    }
}

/// The body of an answer, read as it arrives. Reading it to the end gives the connection
/// back to the pool; dropping it earlier closes the connection.
pub(crate) struct Body {
    conn: Option<Conn>,
    buf: BytesMut,
    framing: Framing,
    reusable: bool,
    idle: IdleConns,
    /// Whose pool the connection goes back to.
    worker: WorkerUrl,
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
    pub(super) fn new(
        conn: Conn,
        buf: BytesMut,
        framing: Framing,
        reusable: bool,
        idle: IdleConns,
        worker: &WorkerUrl,
    ) -> Body {
        Body {
            conn: Some(conn),
            buf,
            framing,
            reusable,
            idle,
            worker: worker.clone(),
            read: 0,
        }
    }

    /// The whole body, refused once it passes `limit` bytes.
    pub(crate) async fn collect(mut self, limit: usize) -> Result<Bytes, UpstreamError> {
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
    pub(crate) async fn next(&mut self) -> Option<Result<Bytes, UpstreamError>> {
        poll_fn(|cx| self.poll_chunk(cx)).await
    }

    fn finish(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.reusable
            && self.buf.is_empty()
        {
            self.idle.checkin(self.worker.origin(), conn);
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
