//! A minimal blocking HTTP/1.1 keep-alive client, for latency at one connection: no pool,
//! no runtime, nothing between the socket and the clock but a buffer.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// One keep-alive connection.
#[derive(Debug)]
pub struct RawClient {
    stream: TcpStream,
    addr: SocketAddr,
    timeout: Duration,
    host: String,
    buf: Vec<u8>,
    /// The server said `Connection: close`; the next request reconnects.
    closed: bool,
}

/// A response as read off the wire (chunked bodies decoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) status: u16,
    pub(crate) len: usize,
    pub(crate) content_length: Option<usize>,
    pub(crate) chunked: bool,
    pub(crate) close: bool,
}

const MAX_RESPONSE: usize = 64 * 1024 * 1024;

impl RawClient {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<RawClient> {
        Ok(RawClient {
            stream: open(addr, timeout)?,
            addr,
            timeout,
            host: addr.to_string(),
            buf: Vec::with_capacity(16 * 1024),
            closed: false,
        })
    }

    /// Whether the server has closed this connection while it sat idle (a server says
    /// nothing unasked, so a readable byte or EOF means it is gone); if so, the next
    /// request reconnects. For a caller that leaves a connection idle for seconds.
    pub fn closed_while_idle(&mut self) -> io::Result<bool> {
        if self.closed {
            return Ok(true);
        }
        self.stream.set_nonblocking(true)?;
        let gone = !matches!(
            self.stream.peek(&mut [0u8; 1]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock
        );
        self.stream.set_nonblocking(false)?;
        self.closed = gone;
        Ok(gone)
    }

    /// Sends one request (`body` empty for none) and reads the whole response.
    pub fn request(&mut self, method: &str, path: &str, body: &[u8]) -> io::Result<RawResponse> {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.host).into_bytes();
        if !body.is_empty() {
            req.extend_from_slice(
                format!(
                    "Content-Type: application/json\r\nContent-Length: {}\r\n",
                    body.len()
                )
                .as_bytes(),
            );
        }
        req.extend_from_slice(b"\r\n");
        req.extend_from_slice(body);
        if self.closed {
            self.stream = open(self.addr, self.timeout)?;
            self.buf.clear();
            self.closed = false;
        }
        self.stream.write_all(&req)?;
        self.read_response()
    }

    fn read_response(&mut self) -> io::Result<RawResponse> {
        let head = loop {
            if let Some(h) = parse_head(&self.buf)? {
                break h;
            }
            self.fill()?;
        };
        self.buf.drain(..head.len);
        let body = if head.chunked {
            loop {
                if let Some((body, used)) = decode_chunked(&self.buf)? {
                    self.buf.drain(..used);
                    break body;
                }
                self.fill()?;
            }
        } else if let Some(n) = head.content_length {
            while self.buf.len() < n {
                self.fill()?;
            }
            self.buf.drain(..n).collect()
        } else if head.status == 204 || head.status == 304 || head.status < 200 {
            Vec::new()
        } else {
            // Delimited by the close.
            while self.fill().is_ok() {}
            self.closed = true;
            std::mem::take(&mut self.buf)
        };
        self.closed |= head.close;
        Ok(RawResponse {
            status: head.status,
            body,
        })
    }

    fn fill(&mut self) -> io::Result<()> {
        if self.buf.len() > MAX_RESPONSE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "response too large",
            ));
        }
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed mid-response",
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

fn open(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

fn invalid(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The status line and the headers that frame the body; `None` until the head is complete.
pub(crate) fn parse_head(buf: &[u8]) -> io::Result<Option<Head>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let text =
        std::str::from_utf8(&buf[..end]).map_err(|_| invalid("response head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.split(' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(invalid("not an HTTP/1.x response"));
    }
    let status = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid("bad status line"))?;
    let mut head = Head {
        status,
        len: end + 4,
        content_length: None,
        chunked: false,
        close: version == "HTTP/1.0",
    };
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            head.content_length = Some(value.parse().map_err(|_| invalid("bad content-length"))?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            head.chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("connection") {
            let v = value.to_ascii_lowercase();
            head.close = v.contains("close") || (head.close && !v.contains("keep-alive"));
        }
    }
    Ok(Some(head))
}

/// A chunked body and the bytes it took (trailers included); `None` while incomplete.
pub(crate) fn decode_chunked(buf: &[u8]) -> io::Result<Option<(Vec<u8>, usize)>> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let Some(eol) = find_crlf(&buf[at..]) else {
            return Ok(None);
        };
        let size_line =
            std::str::from_utf8(&buf[at..at + eol]).map_err(|_| invalid("bad chunk size"))?;
        let size_hex = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| invalid("bad chunk size"))?;
        at += eol + 2;
        if size == 0 {
            // Trailers, then an empty line.
            loop {
                let Some(eol) = find_crlf(&buf[at..]) else {
                    return Ok(None);
                };
                at += eol + 2;
                if eol == 0 {
                    return Ok(Some((body, at)));
                }
            }
        }
        if buf.len() < at + size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&buf[at..at + size]);
        if &buf[at + size..at + size + 2] != b"\r\n" {
            return Err(invalid("chunk not followed by CRLF"));
        }
        at += size + 2;
    }
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

/// The socket address of an `http://host:port` URL (first resolved address).
pub fn socket_addr(url: &str) -> Option<SocketAddr> {
    let rest = url.strip_prefix("http://")?;
    let authority = rest.split('/').next()?;
    authority.to_socket_addrs().ok()?.next()
}
