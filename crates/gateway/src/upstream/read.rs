//! Reading a connection into a buffer, for the answer's head and its body.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;

use super::UpstreamError;
use super::tls::Conn;

pub(super) async fn read_more(conn: &mut Conn, buf: &mut BytesMut) -> Result<usize, UpstreamError> {
    poll_fn(|cx| poll_read_more(conn, buf, cx)).await
}

pub(super) fn poll_read_more(
    conn: &mut Conn,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<Result<usize, UpstreamError>> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(16 * 1024);
    }
    // Through `poll_read`, which takes a short read as the socket drained: the checkout's
    // liveness test then costs no system call unless the socket has been readable since.
    tokio_util::io::poll_read_buf(Pin::new(conn), cx, buf).map_err(UpstreamError::Read)
}
