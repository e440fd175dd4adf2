//! A hand-written HTTP/1.1 upstream for byte-level tests: it answers the registration
//! probes like an SGLang engine and streams a scripted body, chunk by chunk.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the upstream sends for an inference request.
#[derive(Debug, Clone)]
pub struct Script {
    pub status: u16,
    pub content_type: &'static str,
    /// Written as separate HTTP chunks, with a flush and a short pause between them.
    pub chunks: Vec<Vec<u8>>,
    /// Drop the connection after the chunks instead of sending the terminating chunk.
    pub crash: bool,
}

/// Requests as they arrived: head text and body.
pub type Seen = Mutex<Vec<(String, Vec<u8>)>>;

#[derive(Debug)]
pub struct RawUpstream {
    pub url: String,
    pub requests: Arc<AtomicU64>,
    /// Every inference request as it arrived: head (request line and headers) and body.
    pub seen: Arc<Seen>,
}

/// Reads one request: its path, its head as text and its body.
fn read_request(stream: &mut BufReader<TcpStream>) -> Option<(String, String, Vec<u8>)> {
    let mut line = String::new();
    stream.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_owned();
    let mut head = line;
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        stream.read_line(&mut h).ok()?;
        head.push_str(&h);
        if h == "\r\n" || h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; len];
    stream.read_exact(&mut body).ok()?;
    Some((path, head, body))
}

fn serve(conn: TcpStream, script: &Script, requests: &AtomicU64, seen: &Seen) {
    let Ok(write_half) = conn.try_clone() else {
        return;
    };
    let mut out = write_half;
    let mut reader = BufReader::new(conn);
    while let Some((path, head, body)) = read_request(&mut reader) {
        let json = |out: &mut TcpStream, status: &str, body: &str| {
            let _ = write!(
                out,
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
        };
        match path.as_str() {
            "/v1/models" => json(
                &mut out,
                "200 OK",
                r#"{"object":"list","data":[{"id":"raw-model","object":"model","owned_by":"sglang"}]}"#,
            ),
            "/health" => json(&mut out, "200 OK", "{}"),
            // Load polls are not inference requests: an engine without load reports.
            p if p.contains("server_info") || p.starts_with("/v1/loads") || p == "/metrics" => {
                json(&mut out, "404 Not Found", "{}")
            }
            _ => {
                if let Ok(mut s) = seen.lock() {
                    s.push((head, body));
                }
                requests.fetch_add(1, Ordering::SeqCst);
                let _ = write!(
                    out,
                    "HTTP/1.1 {} X\r\ncontent-type: {}\r\ntransfer-encoding: chunked\r\n\r\n",
                    script.status, script.content_type
                );
                for c in &script.chunks {
                    let _ = write!(out, "{:x}\r\n", c.len());
                    let _ = out.write_all(c);
                    let _ = out.write_all(b"\r\n");
                    let _ = out.flush();
                    std::thread::sleep(Duration::from_millis(5));
                }
                if script.crash {
                    let _ = out.shutdown(std::net::Shutdown::Both);
                    return;
                }
                let _ = out.write_all(b"0\r\n\r\n");
                let _ = out.flush();
            }
        }
    }
}

impl RawUpstream {
    pub fn start(script: Script) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let requests = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (counter, log) = (requests.clone(), seen.clone());
        let script = Arc::new(script);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (script, counter, log) = (script.clone(), counter.clone(), log.clone());
                std::thread::spawn(move || serve(conn, &script, &counter, &log));
            }
        });
        RawUpstream {
            url,
            requests,
            seen,
        }
    }
}
