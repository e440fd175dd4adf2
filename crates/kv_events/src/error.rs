//! Errors of this crate. Every decode error comes from bytes a worker sent: the same bytes
//! will fail again, so a consumer counts the frame and skips it rather than retrying.

use thiserror::Error;

/// Why a frame or payload from a worker was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The multipart message has the wrong number of frames.
    #[error("expected {expected} frames, got {found}")]
    Frames { expected: usize, found: usize },
    /// The sequence frame is not 8 bytes.
    #[error("sequence frame is {len} bytes, expected 8")]
    Sequence { len: usize },
    /// A replay frame does not start with the empty delimiter frame.
    #[error("replay frame does not start with an empty delimiter")]
    Delimiter,
    /// The payload is not one msgpack value (truncated, invalid, or nested too deep).
    #[error("payload is not msgpack: {0}")]
    Msgpack(String),
    /// Bytes follow the payload's msgpack value.
    #[error("{extra} bytes after the msgpack value")]
    Trailing { extra: usize },
    /// The value decodes but does not have the expected shape.
    #[error("{what}: {reason}")]
    Shape {
        what: &'static str,
        reason: &'static str,
    },
}

impl DecodeError {
    pub(crate) fn shape(what: &'static str, reason: &'static str) -> Self {
        DecodeError::Shape { what, reason }
    }
}

/// Why no endpoints could be derived from a `kv_events` descriptor. The descriptor or the
/// worker URL comes from configuration or the worker's `/server_info`: a retry only helps
/// once either changes.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EndpointError {
    #[error("worker URL {0:?} has no host")]
    NoHost(String),
    #[error("publisher {0:?} is not zmq")]
    Publisher(String),
    #[error("dp_size 0 advertises no rank")]
    NoRank,
    #[error("port base {base} + rank {rank} is past 65535")]
    Port { base: u16, rank: u32 },
}
