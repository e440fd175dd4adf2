//! kvgate's HTTP/1.1 client for inference calls to workers.
//!
//! One [`Pool`] per HTTP thread keeps idle keep-alive connections per worker (`pool`). A
//! request goes out in one vectored write (head and body, the body not copied); the
//! answer's head is parsed with `httparse` (`head`) and its body framed by
//! `Content-Length`, chunked coding (`chunked`) or the end of the connection (`body`). A
//! connection goes back to the pool only after its body was read to the end, so a dropped
//! [`Body`] (a client that went away) closes the connection, which is what aborts the
//! request on the engine. A request is sent again, once, on a new connection only when a
//! pooled connection failed before the request was fully written: once the worker may
//! have it, this layer never sends it twice.
//!
//! An `https://` worker is reached over rustls (`tls`): a connection is an enum, plain or
//! TLS, so the plain path pays one branch per read or write.
//!
//! Why not awc: awc builds a codec per request whose date service spawns a task and arms
//! a timer, waking the runtime's driver once per request (docs/benchmarks.md); this
//! client does only the socket work a proxy needs.

use std::io;

use thiserror::Error;

mod body;
mod chunked;
mod guard;
mod head;
mod idle;
mod pool;
mod read;
mod tls;

pub(crate) use body::{Body, Response};
pub(crate) use guard::{ConnectGuard, GuardError, Judge};
pub(crate) use pool::Pool;
pub(crate) use tls::{WorkerTlsFiles, provider, read_certs, read_key, worker_client_config};

/// What can go wrong between the gateway and a worker.
#[derive(Debug, Error)]
pub enum UpstreamError {
    #[error("cannot connect: {0}")]
    Connect(#[source] io::Error),
    #[error("connecting timed out after {0:.1}s")]
    ConnectTimeout(f64),
    /// A name re-vetted at connect time (`guard`) resolved to no allowed address.
    #[error("{0}")]
    Guard(#[source] GuardError),
    #[error("sending the request: {0}")]
    Write(#[source] io::Error),
    #[error("reading the response: {0}")]
    Read(#[source] io::Error),
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
    #[error("the stream ended before data: [DONE]")]
    StreamUnfinished,
    #[error("the worker answered {0}")]
    Status(u16),
    #[error("no first byte within {0:.1}s")]
    NoFirstToken(f64),
    #[error("the worker was taken out (unhealthy or removed) before it answered")]
    TakenOut,
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
