//! An incremental decoder of chunked transfer coding (RFC 9112 §7.1), strict where a
//! lenient reading would let one body be framed two ways: every line ends in CRLF (a bare
//! LF is refused), a size line and the whole trailer section are bounded, and the size is
//! read by `httparse::parse_chunk_size`.

use bytes::{Bytes, BytesMut};

use super::UpstreamError;

/// A chunk-size or trailer line longer than this is refused.
pub(super) const MAX_LINE: usize = 4096;
/// All trailer lines together longer than this are refused.
pub(super) const MAX_TRAILER: usize = 16 * 1024;

/// Where a chunked body's decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum ChunkState {
    #[default]
    Size,
    Data(u64),
    DataEnd,
    /// Bytes of trailer lines read so far.
    Trailer(usize),
    Done,
}

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

fn malformed(m: &str) -> UpstreamError {
    UpstreamError::Malformed(m.to_owned())
}

/// The length of the CRLF-terminated line at the front of `buf`, CRLF included, or
/// `None` if it has not all arrived.
fn line_len(buf: &[u8]) -> Result<Option<usize>, UpstreamError> {
    match buf.iter().take(MAX_LINE + 2).position(|b| *b == b'\n') {
        Some(0) => Err(malformed("bare LF in chunked framing")),
        Some(i) if buf[i - 1] != b'\r' => Err(malformed("bare LF in chunked framing")),
        Some(i) => Ok(Some(i + 1)),
        None if buf.len() > MAX_LINE + 1 => Err(malformed("chunk line too long")),
        None => Ok(None),
    }
}

impl Chunked {
    /// Decodes what it can from the front of `buf`, consuming it.
    pub(crate) fn step(&mut self, buf: &mut BytesMut) -> Result<Step, UpstreamError> {
        loop {
            match self.state {
                ChunkState::Size => {
                    let Some(n) = line_len(buf)? else {
                        return Ok(Step::More);
                    };
                    // httparse reads an empty size as 0; an empty line is no size.
                    if !buf[0].is_ascii_hexdigit() {
                        return Err(malformed("bad chunk size"));
                    }
                    let size = match httparse::parse_chunk_size(&buf[..n]) {
                        Ok(httparse::Status::Complete((used, size))) if used == n => size,
                        _ => return Err(malformed("bad chunk size")),
                    };
                    let _ = buf.split_to(n);
                    self.state = if size == 0 {
                        ChunkState::Trailer(0)
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
                    if buf.len() < 2 {
                        return Ok(Step::More);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(malformed("chunk data not followed by CRLF"));
                    }
                    let _ = buf.split_to(2);
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailer(seen) => {
                    let Some(n) = line_len(buf)? else {
                        return Ok(Step::More);
                    };
                    let _ = buf.split_to(n);
                    if n == 2 {
                        self.state = ChunkState::Done;
                    } else if seen + n > MAX_TRAILER {
                        return Err(malformed("trailer section too large"));
                    } else {
                        self.state = ChunkState::Trailer(seen + n);
                    }
                }
                ChunkState::Done => return Ok(Step::Done),
            }
        }
    }
}

/// A body in chunked coding, for the tests.
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

/// Decodes `wire` fed in the pieces `cuts` gives (positions, wrapped into its length): the
/// data, and whether the body ended. For the tests.
#[cfg(test)]
pub(crate) fn decode_all(wire: &[u8], cuts: &[usize]) -> Result<(Vec<u8>, bool), UpstreamError> {
    let mut dec = Chunked::default();
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut ends: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
    ends.push(wire.len());
    ends.sort_unstable();
    let mut at = 0;
    for end in ends {
        buf.extend_from_slice(&wire[at..end.max(at)]);
        at = end.max(at);
        loop {
            match dec.step(&mut buf)? {
                Step::Data(d) => out.extend_from_slice(&d),
                Step::More => break,
                Step::Done => return Ok((out, true)),
            }
        }
    }
    Ok((out, false))
}
