//! Forwards a request to the chosen worker and relays the answer: buffered when it is a
//! plain JSON body, chunk by chunk (byte for byte) when it streams.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use actix_web::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, HttpResponseBuilder};
use awc::error::{PayloadError, SendRequestError};
use bytes::Bytes;
use futures_util::Stream;
use tracing::warn;

use crate::error::ApiError;
use crate::selector::Booking;

/// Request headers passed to workers; everything else stays at the gateway.
const FORWARDED: [&str; 9] = [
    "content-type",
    "accept",
    "authorization",
    "x-correlation-id",
    "traceparent",
    "tracestate",
    "x-kvgate-routing-key",
    "x-smg-routing-key",
    "user-agent",
];

fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "trailers"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
            | "date"
            | "server"
    )
}

fn copy_response_headers(from: &HeaderMap, to: &mut HttpResponseBuilder) {
    for (name, value) in from {
        if !hop_by_hop(name) {
            to.append_header((name.clone(), value.clone()));
        }
    }
}

/// The upstream client of one HTTP thread: a keep-alive pool whose idle connections are
/// dropped before the engines' own 5 s keep-alive would close them under us, with
/// `TCP_NODELAY` on every connection (awc leaves Nagle's algorithm on).
pub fn client(connect_timeout: Duration, request_timeout: Duration) -> awc::Client {
    let tcp = actix_tls::connect::Connector::default().service();
    let connector = awc::Connector::new()
        .connector(NoDelay { tcp })
        .timeout(connect_timeout)
        .conn_keep_alive(Duration::from_secs(3))
        .limit(0);
    awc::Client::builder()
        .connector(connector)
        .timeout(request_timeout)
        .disable_redirects()
        .finish()
}

/// A TCP connector that turns Nagle's algorithm off on the connections it makes.
#[derive(Clone)]
struct NoDelay<S> {
    tcp: S,
}

type TcpConn = actix_tls::connect::Connection<awc::http::Uri, actix_rt::net::TcpStream>;

impl<S> actix_service::Service<actix_tls::connect::ConnectInfo<awc::http::Uri>> for NoDelay<S>
where
    S: actix_service::Service<
            actix_tls::connect::ConnectInfo<awc::http::Uri>,
            Response = TcpConn,
            Error = actix_tls::connect::ConnectError,
        >,
    S::Future: 'static,
{
    type Response = TcpConn;
    type Error = actix_tls::connect::ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<TcpConn, Self::Error>>>>;

    actix_service::forward_ready!(tcp);

    fn call(&self, req: actix_tls::connect::ConnectInfo<awc::http::Uri>) -> Self::Future {
        let connecting = self.tcp.call(req);
        Box::pin(async move {
            let conn = connecting.await?;
            if let Err(e) = conn.io_ref().set_nodelay(true) {
                warn!(error = %e, "cannot set TCP_NODELAY on an upstream connection");
            }
            Ok(conn)
        })
    }
}

/// What one upstream call needs besides the body.
pub struct Upstream<'a> {
    pub client: &'a awc::Client,
    pub worker_url: &'a str,
    pub path: &'static str,
    pub request_id: &'a str,
    pub timeout: Duration,
    pub max_response: usize,
    pub stream: bool,
}

fn send_error(worker: &str, timeout: Duration, e: SendRequestError) -> ApiError {
    match e {
        SendRequestError::Timeout => ApiError::UpstreamTimeout {
            worker: worker.to_owned(),
            secs: timeout.as_secs_f64(),
        },
        other => ApiError::Upstream {
            worker: worker.to_owned(),
            reason: other.to_string(),
        },
    }
}

/// Sends `body` to the worker and relays its answer. Upstream error statuses and bodies
/// pass through unchanged.
pub async fn forward(
    up: Upstream<'_>,
    req: &HttpRequest,
    body: Bytes,
    guard: Booking,
) -> Result<HttpResponse, ApiError> {
    let started = Instant::now();
    let url = format!("{}{}", up.worker_url, up.path);
    let mut out = up.client.post(url).timeout(up.timeout);
    for name in FORWARDED {
        for v in req.headers().get_all(name) {
            out = out.append_header((name, v.clone()));
        }
    }
    out = out.insert_header(("x-request-id", up.request_id));
    let resp = out
        .send_body(body)
        .await
        .map_err(|e| send_error(up.worker_url, up.timeout, e))?;
    let status = resp.status();
    let is_sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    let mut builder = HttpResponse::build(status);
    copy_response_headers(resp.headers(), &mut builder);
    if up.stream || is_sse {
        let deadline = up.timeout.saturating_sub(started.elapsed());
        builder.insert_header((header::CACHE_CONTROL, HeaderValue::from_static("no-cache")));
        return Ok(builder.streaming(Relay {
            inner: Box::pin(resp),
            guard: Some(guard),
            deadline: Box::pin(actix_rt::time::sleep(deadline)),
            worker: up.worker_url.to_owned(),
            request_id: up.request_id.to_owned(),
            timeout: up.timeout,
            done: false,
            tail: Tail::default(),
            sse: is_sse,
        }));
    }
    let remaining = up.timeout.saturating_sub(started.elapsed());
    let declared_len = resp
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut resp = resp;
    let read = resp.body().limit(up.max_response);
    let body = match actix_rt::time::timeout(remaining, read).await {
        Err(_) => {
            return Err(ApiError::UpstreamTimeout {
                worker: up.worker_url.to_owned(),
                secs: up.timeout.as_secs_f64(),
            });
        }
        Ok(Err(e)) => {
            return Err(ApiError::Upstream {
                worker: up.worker_url.to_owned(),
                reason: format!("reading the response body: {e}"),
            });
        }
        Ok(Ok(b)) => b,
    };
    // awc ends a body quietly when the worker closes early; the declared length tells.
    if let Some(len) = declared_len
        && len != body.len() as u64
    {
        return Err(ApiError::Upstream {
            worker: up.worker_url.to_owned(),
            reason: format!("the body ended after {} of {len} bytes", body.len()),
        });
    }
    drop(guard);
    Ok(builder.body(body))
}

/// The last bytes relayed, to tell a finished LLM stream (`data: [DONE]`) from one the
/// worker abandoned: awc reports a connection closed mid-body as a clean end.
#[derive(Default)]
struct Tail {
    buf: [u8; 32],
    len: usize,
}

impl Tail {
    fn push(&mut self, b: &[u8]) {
        let keep = self.buf.len();
        if b.len() >= keep {
            self.buf.copy_from_slice(&b[b.len() - keep..]);
            self.len = keep;
        } else {
            let total = (self.len + b.len()).min(keep);
            let old = total - b.len();
            self.buf.copy_within(self.len - old..self.len, 0);
            self.buf[old..total].copy_from_slice(b);
            self.len = total;
        }
    }

    fn is_done(&self) -> bool {
        let t = self.buf[..self.len].trim_ascii_end();
        t.ends_with(b"data: [DONE]") || t.ends_with(b"data:[DONE]")
    }
}

/// The relay of a streamed answer. Chunks pass unchanged; an upstream that fails or runs
/// past the deadline ends the client's stream with one SSE error event instead of a
/// silent truncation. Dropping the relay (client gone) drops the upstream connection,
/// which aborts the request on the engine, and releases the in-flight slot.
struct Relay<S> {
    inner: Pin<Box<S>>,
    guard: Option<Booking>,
    deadline: Pin<Box<actix_rt::time::Sleep>>,
    worker: String,
    request_id: String,
    timeout: Duration,
    done: bool,
    tail: Tail,
    /// Only event streams are expected to end with `[DONE]`.
    sse: bool,
}

impl<S> Relay<S> {
    fn fail(&mut self, err: ApiError) -> Poll<Option<Result<Bytes, actix_web::Error>>> {
        warn!(worker = %self.worker, request_id = %self.request_id, error = %err, "upstream stream failed");
        self.done = true;
        self.guard = None;
        let event = format!("data: {}\n\n", err.body());
        Poll::Ready(Some(Ok(Bytes::from(event))))
    }
}

impl<S> Stream for Relay<S>
where
    S: Stream<Item = Result<Bytes, PayloadError>>,
{
    type Item = Result<Bytes, actix_web::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.inner.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(b))) => {
                self.tail.push(&b);
                if let Some(g) = self.guard.as_mut() {
                    g.first_byte();
                }
                return Poll::Ready(Some(Ok(b)));
            }
            Poll::Ready(Some(Err(e))) => {
                let worker = self.worker.clone();
                return self.fail(ApiError::Upstream {
                    worker,
                    reason: format!("the stream broke: {e}"),
                });
            }
            Poll::Ready(None) => {
                if self.sse && !self.tail.is_done() {
                    let worker = self.worker.clone();
                    return self.fail(ApiError::Upstream {
                        worker,
                        reason: "the stream ended before data: [DONE]".into(),
                    });
                }
                self.done = true;
                self.guard = None;
                return Poll::Ready(None);
            }
            Poll::Pending => {}
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            let worker = self.worker.clone();
            let secs = self.timeout.as_secs_f64();
            return self.fail(ApiError::UpstreamTimeout { worker, secs });
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use actix_service::Service;

    use super::{NoDelay, Tail};

    #[actix_rt::test]
    async fn upstream_connections_have_nagle_off() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let connector = NoDelay {
            tcp: actix_tls::connect::Connector::default().service(),
        };
        let uri: awc::http::Uri = format!("http://127.0.0.1:{port}/").parse().expect("uri");
        let conn = connector
            .call(actix_tls::connect::ConnectInfo::new(uri))
            .await
            .expect("connect");
        assert!(conn.io_ref().nodelay().expect("nodelay"));
    }

    #[test]
    fn tail_sees_done_across_chunks() {
        let mut t = Tail::default();
        t.push(b"data: {\"x\":1}\n\ndata: [DO");
        assert!(!t.is_done());
        t.push(b"NE]\n\n");
        assert!(t.is_done());
        t.push(b"data: {}\n\n");
        assert!(!t.is_done());
        let mut t = Tail::default();
        t.push(&[b'x'; 100]);
        t.push(b"data: [DONE]\r\n\r\n");
        assert!(t.is_done());
    }
}
