//! The upstream client against a scripted loopback server: framing, pooling and failure
//! cases. Over 600 lines because the server and every case it scripts are kept together.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use bytes::Bytes;
use kvgate_core::WorkerUrl;
use proptest::prelude::*;

use super::chunked::{Chunked, MAX_LINE, MAX_TRAILER, decode_all, encode_chunked};
use super::guard::ConnectGuard;
use super::head::{Framing, parse_head};
use super::*;

/// What the test server does for one request.
struct Reply {
    /// Written one after another, each after the previous one's gate (if any) opens.
    parts: Vec<Vec<u8>>,
    /// Closes the connection after the last part.
    close: bool,
    /// The server waits on this before writing each part after the first.
    gate: Option<mpsc::Receiver<()>>,
}

impl Reply {
    fn once(bytes: &[u8]) -> Reply {
        Reply {
            parts: vec![bytes.to_vec()],
            close: false,
            gate: None,
        }
    }
}

/// A loopback HTTP/1.1 server on its own threads: it reads each request (head and
/// `content-length` body), records its bytes and answers what `respond` gives for it.
struct Server {
    url: WorkerUrl,
    connections: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<Vec<u8>>>>,
    /// One message per connection the client closed (the server read EOF).
    closed: mpsc::Receiver<()>,
    /// One message per connection the server closed after a `close` reply.
    shut: mpsc::Receiver<()>,
}

fn read_request(s: &mut std::net::TcpStream) -> Option<Vec<u8>> {
    let mut req = Vec::new();
    let mut byte = [0u8; 1];
    while !req.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => req.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&req).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).ok()?;
    req.extend_from_slice(&body);
    Some(req)
}

/// `respond(n, k)`: `n` counts requests overall, `k` on their connection, from 0.
fn serve(respond: impl Fn(usize, usize) -> Reply + Send + Sync + 'static) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url =
        WorkerUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(Mutex::new(Vec::new()));
    let (closed_tx, closed) = mpsc::channel();
    let (shut_tx, shut) = mpsc::channel();
    let respond = Arc::new(respond);
    let (c, r) = (connections.clone(), requests.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            c.fetch_add(1, Ordering::SeqCst);
            let (r, respond) = (r.clone(), respond.clone());
            let (closed_tx, shut_tx) = (closed_tx.clone(), shut_tx.clone());
            std::thread::spawn(move || {
                for k in 0.. {
                    let Some(req) = read_request(&mut s) else {
                        let _ = closed_tx.send(());
                        return;
                    };
                    let n = {
                        let mut all = r.lock().expect("lock");
                        all.push(req);
                        all.len() - 1
                    };
                    let reply = respond(n, k);
                    for (i, part) in reply.parts.iter().enumerate() {
                        if i > 0
                            && let Some(g) = &reply.gate
                        {
                            let _ = g.recv();
                        }
                        if s.write_all(part).is_err() {
                            return;
                        }
                    }
                    if reply.close {
                        let _ = s.shutdown(Shutdown::Both);
                        let _ = shut_tx.send(());
                        return;
                    }
                }
            });
        }
    });
    Server {
        url,
        connections,
        requests,
        closed,
        shut,
    }
}

const OK: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";

fn pool() -> Pool {
    Pool::new(
        Duration::from_secs(2),
        Duration::from_secs(30),
        ConnectGuard::default(),
    )
}

/// Polls `done` every 5 ms until it holds; fails after 10 s naming `what`. For waiting on
/// state, never for asserting time.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn post_ok(pool: &Pool, url: &WorkerUrl) -> Bytes {
    let resp = pool
        .post(url, "/v1/x", &[], Bytes::from_static(b"{}"))
        .await
        .expect("post");
    assert_eq!(resp.status, StatusCode::OK);
    resp.body.collect(1024).await.expect("body")
}

#[test]
fn heads_say_how_the_body_ends() {
    let head = |raw: &str| {
        parse_head(raw.as_bytes())
            .expect("parses")
            .expect("complete")
    };
    let h = head("HTTP/1.1 200 OK\r\nContent-Length: 12\r\nx-a: 1\r\n\r\nbody");
    assert_eq!(h.framing, Framing::Length { left: 12, want: 12 });
    assert!(h.keep_alive);
    assert_eq!(h.len, 47);
    assert_eq!(h.headers.len(), 2);
    let h = head("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n");
    assert_eq!(h.framing, Framing::Chunked(Chunked::default()));
    let h = head("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
    assert!(!h.keep_alive);
    let h = head("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n");
    assert!(!h.keep_alive);
    let h = head("HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n");
    assert!(h.keep_alive);
    let h = head("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n");
    assert_eq!(h.framing, Framing::UntilClose);
    assert!(
        !h.keep_alive,
        "a body that ends with the connection leaves nothing to reuse"
    );
    let h = head("HTTP/1.1 204 No Content\r\n\r\n");
    assert_eq!(h.framing, Framing::Length { left: 0, want: 0 });
    assert!(
        parse_head(b"HTTP/1.1 200 OK\r\ncontent-le")
            .expect("partial")
            .is_none()
    );
    for bad in [
        "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n\r\n",
        "HTTP/1.1 999999 OK\r\n\r\n",
        "SMTP ready\r\n\r\n",
    ] {
        assert!(
            matches!(parse_head(bad.as_bytes()), Err(UpstreamError::Malformed(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn chunk_extensions_and_trailers_are_skipped() {
    let wire = b"5;name=value\r\nhello\r\n1\r\n \r\n0\r\nx-trailer: 1\r\n\r\n";
    assert_eq!(
        decode_all(wire, &[]).expect("decodes"),
        (b"hello ".to_vec(), true)
    );
    for bad in [
        &b"zz\r\n"[..],
        b"10000000000000000\r\n",
        b"2\r\nabc\r\n",
        b"\r\n",
        // A bare LF anywhere in the framing: a line a lenient peer would end elsewhere.
        b"3\nabc\r\n0\r\n\r\n",
        b"3\r\nabc\n0\r\n\r\n",
        b"3;ext\nabc\r\n0\r\n\r\n",
        b"3\r\nabc\r\n0\r\nx-t: 1\n\r\n",
        b"3\r\nabc\r\n0\r\n\n",
        b"3\r\nabc\r\r0\r\n\r\n",
    ] {
        assert!(
            matches!(decode_all(bad, &[]), Err(UpstreamError::Malformed(_))),
            "{bad:?}"
        );
    }
    assert!(matches!(
        decode_all(&[b'1'; MAX_LINE + 2], &[]),
        Err(UpstreamError::Malformed(_))
    ));
    // Trailer lines each within the line limit, but without end: refused once past the
    // section's bound, whatever the split.
    let mut endless = b"0\r\n".to_vec();
    while endless.len() < MAX_TRAILER + 200 {
        endless.extend_from_slice(b"x-trailer: 0123456789\r\n");
    }
    for cuts in [&[][..], &[7, 100, 5000]] {
        assert!(
            matches!(decode_all(&endless, cuts), Err(UpstreamError::Malformed(_))),
            "{cuts:?}"
        );
    }
    let mut bounded = b"1\r\nx\r\n0\r\n".to_vec();
    bounded.extend_from_slice(&endless[3..MAX_TRAILER / 2]);
    bounded.truncate(
        bounded
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i + 1),
    );
    bounded.extend_from_slice(b"\r\n");
    assert_eq!(
        decode_all(&bounded, &[]).expect("a trailer within the bound"),
        (b"x".to_vec(), true)
    );
}

proptest! {
    #[test]
    fn chunked_bodies_decode_whatever_the_split(
        parts in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..8),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let wire = encode_chunked(&refs);
        let (out, done) = decode_all(&wire, &cuts).expect("decodes");
        prop_assert!(done);
        prop_assert_eq!(out, parts.concat());
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_parsers(
        bytes in prop::collection::vec(any::<u8>(), 0..600),
        cuts in prop::collection::vec(any::<usize>(), 0..6),
    ) {
        let _ = decode_all(&bytes, &cuts);
        let _ = parse_head(&bytes);
        let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
        head.extend_from_slice(&bytes);
        let _ = parse_head(&head);
    }
}

#[actix_rt::test]
async fn a_request_goes_out_whole_and_its_connection_is_reused() {
    let server = serve(|_, _| Reply::once(OK));
    let pool = pool();
    let url = WorkerUrl::parse(&format!("{}/prefix", server.url)).expect("url");
    for _ in 0..3 {
        let resp = pool
            .post(
                &url,
                "/v1/x",
                &[("x-a", b"b")],
                Bytes::from_static(b"hello"),
            )
            .await
            .expect("post");
        assert_eq!(resp.status, StatusCode::OK);
        assert_eq!(
            resp.header(&actix_web::http::header::CONTENT_TYPE),
            Some("application/json")
        );
        assert_eq!(resp.body.collect(1024).await.expect("body"), &b"{}"[..]);
        assert_eq!(
            pool.idle_count(&url),
            1,
            "read to its end, the connection is pooled"
        );
    }
    assert_eq!(server.connections.load(Ordering::SeqCst), 1);
    let authority = server.url.authority();
    let want = format!(
        "POST /prefix/v1/x HTTP/1.1\r\nhost: {authority}\r\ncontent-length: 5\r\nx-a: b\r\n\r\nhello"
    );
    let got = server.requests.lock().expect("lock").clone();
    assert_eq!(got, vec![want.into_bytes(); 3]);
    let conn = pool.checkout(server.url.origin()).expect("pooled");
    assert!(
        conn.tcp().nodelay().expect("nodelay"),
        "Nagle is off on upstream connections"
    );
}

#[actix_rt::test]
async fn an_insertion_goes_into_the_body_at_its_place_small_or_large() {
    let server = serve(|_, _| Reply::once(OK));
    let pool = pool();
    let large = format!("{{\"text\":\"{}\"}}", "x".repeat(256 * 1024));
    for body in [r#"{"text":"hi"}"#.to_owned(), large] {
        let resp = pool
            .post_with(
                &server.url,
                "/generate",
                &[],
                Bytes::from(body.clone()),
                Some((1, b"\"routed_dp_rank\":1,")),
            )
            .await
            .expect("post");
        assert_eq!(resp.body.collect(1024).await.expect("body"), &b"{}"[..]);
        let sent = server
            .requests
            .lock()
            .expect("lock")
            .pop()
            .expect("a request");
        let want = format!("{{\"routed_dp_rank\":1,{}", &body[1..]);
        let at = sent
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("head")
            + 4;
        assert_eq!(String::from_utf8_lossy(&sent[at..]), want);
        let head = String::from_utf8_lossy(&sent[..at]).to_string();
        assert!(
            head.contains(&format!("content-length: {}\r\n", want.len())),
            "{head}"
        );
    }
}

#[actix_rt::test]
async fn a_body_cut_short_is_an_error_and_its_connection_is_dropped() {
    let server = serve(|_, _| Reply {
        parts: vec![b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabcd".to_vec()],
        close: true,
        gate: None,
    });
    let pool = pool();
    let resp = pool
        .post(&server.url, "/v1/x", &[], Bytes::new())
        .await
        .expect("head");
    let err = resp.body.collect(1024).await.expect_err("truncated");
    assert!(
        matches!(err, UpstreamError::Truncated { got: 4, want: 10 }),
        "{err}"
    );
    assert_eq!(pool.idle_count(&server.url), 0);

    let server = serve(|_, _| Reply {
        parts: vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n".to_vec()],
        close: true,
        gate: None,
    });
    let resp = pool
        .post(&server.url, "/v1/x", &[], Bytes::new())
        .await
        .expect("head");
    let err = resp.body.collect(1024).await.expect_err("truncated");
    assert!(matches!(err, UpstreamError::ChunkedTruncated), "{err}");
    assert_eq!(pool.idle_count(&server.url), 0);
}

#[actix_rt::test]
async fn a_worker_that_closes_before_answering_is_an_error() {
    let server = serve(|_, _| Reply {
        parts: vec![Vec::new()],
        close: true,
        gate: None,
    });
    let err = pool()
        .post(&server.url, "/v1/x", &[], Bytes::new())
        .await
        .expect_err("no answer");
    assert!(matches!(err, UpstreamError::ClosedBeforeHead), "{err}");
    assert_eq!(
        server.requests.lock().expect("lock").len(),
        1,
        "a new connection is not tried again"
    );
    let free = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url =
        WorkerUrl::parse(&format!("http://{}", free.local_addr().expect("addr"))).expect("url");
    drop(free);
    let err = pool()
        .post(&url, "/v1/x", &[], Bytes::new())
        .await
        .expect_err("refused");
    assert!(matches!(err, UpstreamError::Connect(_)), "{err}");
}

#[actix_rt::test]
async fn streamed_chunks_arrive_as_sent_and_a_dropped_body_closes_the_connection() {
    let (open, gate) = mpsc::channel();
    let gate = Mutex::new(Some(gate));
    let server = serve(move |_, _| {
        Reply {
        parts: vec![
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n8\r\ndata: 1\n\r\n".to_vec(),
            b"8\r\ndata: 2\n\r\n".to_vec(),
            b"0\r\n\r\n".to_vec(),
        ],
        close: false,
        gate: gate.lock().expect("lock").take(),
    }
    });
    let pool = pool();
    let resp = pool
        .post(&server.url, "/v1/x", &[], Bytes::new())
        .await
        .expect("head");
    let mut body = resp.body;
    // The second chunk is not written until the first has been read here.
    assert_eq!(
        body.next().await.expect("chunk").expect("ok"),
        &b"data: 1\n"[..]
    );
    open.send(()).expect("gate");
    assert_eq!(
        body.next().await.expect("chunk").expect("ok"),
        &b"data: 2\n"[..]
    );
    drop(body);
    assert_eq!(
        pool.idle_count(&server.url),
        0,
        "an unfinished body is not pooled"
    );
    // Lets the server write the end of the body and find the connection gone.
    drop(open);
    server
        .closed
        .recv_timeout(Duration::from_secs(10))
        .expect("the server sees the connection close");
}

#[actix_rt::test]
async fn closed_or_expired_idle_connections_are_not_reused() {
    // Answers with `connection: close`.
    let server = serve(|_, _| {
        Reply::once(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}")
    });
    let p = pool();
    post_ok(&p, &server.url).await;
    assert_eq!(p.idle_count(&server.url), 0);
    post_ok(&p, &server.url).await;
    assert_eq!(server.connections.load(Ordering::SeqCst), 2);

    // Closes the idle connection after answering, without saying so.
    let server = serve(|_, _| Reply {
        parts: vec![OK.to_vec()],
        close: true,
        gate: None,
    });
    let p = pool();
    post_ok(&p, &server.url).await;
    assert_eq!(p.idle_count(&server.url), 1);
    server
        .shut
        .recv_timeout(Duration::from_secs(10))
        .expect("the server closes");
    // Checkout sees a close only once the runtime has seen the socket readable: until it
    // has, the connection is put back as it was.
    let origin = server.url.origin();
    if let Some(conn) = p.checkout(origin) {
        tokio::time::timeout(Duration::from_secs(10), conn.tcp().readable())
            .await
            .expect("the close reaches the idle connection")
            .expect("readable");
        p.checkin(origin, conn);
    }
    // Reusing it would fail the request; checkout sees the EOF and connects again.
    post_ok(&p, &server.url).await;
    assert_eq!(server.connections.load(Ordering::SeqCst), 2);

    // Idle past the keep-alive.
    let server = serve(|_, _| Reply::once(OK));
    let p = Pool::new(
        Duration::from_secs(2),
        Duration::ZERO,
        ConnectGuard::default(),
    );
    post_ok(&p, &server.url).await;
    post_ok(&p, &server.url).await;
    assert_eq!(server.connections.load(Ordering::SeqCst), 2);
}

#[actix_rt::test]
async fn interim_answers_are_skipped_and_limits_hold() {
    let server = serve(|_, _| {
        Reply::once(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
    });
    assert_eq!(post_ok(&pool(), &server.url).await, &b"{}"[..]);

    let mut big = b"HTTP/1.1 200 OK\r\ncontent-length: 2000\r\n\r\n".to_vec();
    big.extend_from_slice(&[b'a'; 2000]);
    let server = serve(move |_, _| Reply::once(&big));
    let resp = pool()
        .post(&server.url, "/v1/x", &[], Bytes::new())
        .await
        .expect("head");
    let err = resp.body.collect(1000).await.expect_err("over the limit");
    assert!(matches!(err, UpstreamError::BodyTooLarge(1000)), "{err}");

    let mut huge = b"HTTP/1.1 200 OK\r\n".to_vec();
    huge.extend(std::iter::repeat_n(b"x-pad: aaaaaaaaaaaaaaaa\r\n".as_slice(), 4000).flatten());
    let server = serve(move |_, _| Reply::once(&huge));
    let err = pool()
        .post(&server.url, "/v1/x", &[], Bytes::new())
        .await
        .expect_err("huge head");
    assert!(matches!(err, UpstreamError::Malformed(_)), "{err}");
}

#[actix_rt::test]
async fn a_request_written_whole_on_a_pooled_connection_is_not_sent_again() {
    // Each connection answers its first request and closes on the second unanswered: the
    // worker may have acted on that second request, so this layer does not send it twice.
    let server = serve(|_, k| {
        if k == 0 {
            Reply::once(OK)
        } else {
            Reply {
                parts: vec![Vec::new()],
                close: true,
                gate: None,
            }
        }
    });
    let p = pool();
    post_ok(&p, &server.url).await;
    let err = p
        .post(&server.url, "/v1/x", &[], Bytes::from_static(b"{}"))
        .await
        .expect_err("closed without an answer");
    assert!(matches!(err, UpstreamError::ClosedBeforeHead), "{err}");
    assert_eq!(server.connections.load(Ordering::SeqCst), 1);
    assert_eq!(server.requests.lock().expect("lock").len(), 2);
}

#[actix_rt::test]
async fn a_pooled_connection_that_fails_while_the_request_is_written_is_tried_on_a_new_one() {
    // The second request on a connection gets its head read, then the connection is
    // reset: the 32 MiB body cannot all be written (more than loopback buffers hold), so
    // the worker never had the whole request and the pool sends it again.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url =
        WorkerUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let seen = bodies.clone();
    std::thread::spawn(move || {
        for (c, stream) in listener.incoming().enumerate() {
            let Ok(mut s) = stream else { return };
            let seen = seen.clone();
            std::thread::spawn(move || {
                for k in 0.. {
                    if c == 0 && k == 1 {
                        // Head only, then a close with the body unread, which Linux sends
                        // as a reset.
                        let mut head = Vec::new();
                        let mut byte = [0u8; 1];
                        while !head.ends_with(b"\r\n\r\n")
                            && s.read(&mut byte).is_ok_and(|n| n == 1)
                        {
                            head.push(byte[0]);
                        }
                        drop(s);
                        return;
                    }
                    let Some(req) = read_request(&mut s) else {
                        return;
                    };
                    if let Ok(mut b) = seen.lock() {
                        b.push(req.len());
                    }
                    if s.write_all(OK).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let p = pool();
    post_ok(&p, &url).await;
    let big = Bytes::from(vec![b'x'; 32 << 20]);
    let resp = p.post(&url, "/v1/x", &[], big).await.expect("sent again");
    assert_eq!(resp.status, StatusCode::OK);
    let sizes = bodies.lock().expect("lock").clone();
    assert_eq!(
        sizes.len(),
        2,
        "the first request and the big one, once, whole"
    );
    assert!(sizes[1] > 32 << 20);
}

#[actix_rt::test]
async fn bodies_that_leave_the_connection_in_doubt_are_not_pooled() {
    // The wire, the body read from it, and whether the server closes afterwards.
    let cases: [(&[u8], &[u8], bool); 3] = [
        // Runs to the connection's end.
        (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it",
            b"all of it",
            true,
        ),
        // Bytes after the declared length.
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}extra",
            b"{}",
            false,
        ),
        // A body where there can be none.
        (b"HTTP/1.1 204 No Content\r\n\r\nstray", b"", false),
    ];
    for (wire, want, close) in cases {
        let wire = wire.to_vec();
        let server = serve(move |_, _| Reply {
            parts: vec![wire.clone()],
            close,
            gate: None,
        });
        let p = pool();
        let resp = p
            .post(&server.url, "/v1/x", &[], Bytes::new())
            .await
            .expect("head");
        let body = tokio::time::timeout(Duration::from_secs(10), resp.body.collect(1024))
            .await
            .expect("the body ends")
            .expect("body");
        assert_eq!(body, want);
        assert_eq!(
            p.idle_count(&server.url),
            0,
            "{}",
            String::from_utf8_lossy(want)
        );
    }
}

#[actix_rt::test]
async fn idle_connections_past_the_keep_alive_are_closed_without_traffic() {
    let server = serve(|_, _| Reply::once(OK));
    let p = Pool::new(
        Duration::from_secs(2),
        Duration::from_millis(50),
        ConnectGuard::default(),
    );
    p.spawn_sweeper();
    post_ok(&p, &server.url).await;
    assert_eq!(p.idle_count(&server.url), 1);
    // No further request (`idle_count` prunes nothing): the sweeper alone closes it.
    until("the sweeper to close the idle connection", || {
        p.idle_count(&server.url) == 0
    })
    .await;
    assert!(
        p.workers_held() == 0,
        "a worker with no connections is forgotten"
    );
    server
        .closed
        .recv_timeout(Duration::from_secs(10))
        .expect("the server sees the connection close");
}

#[actix_rt::test]
async fn expired_connections_are_dropped_at_checkout() {
    let server = serve(|_, _| Reply::once(OK));
    let keep_alive = Duration::from_millis(100);
    let p = Pool::new(Duration::from_secs(2), keep_alive, ConnectGuard::default());
    // Two at once: two connections, both pooled.
    futures_util::future::join(post_ok(&p, &server.url), post_ok(&p, &server.url)).await;
    assert_eq!(p.idle_count(&server.url), 2);
    // Expiry reads the system clock, not tokio's: wait for it to pass the keep-alive.
    let pooled = Instant::now();
    until("the idle connections to pass the keep-alive", || {
        pooled.elapsed() > keep_alive
    })
    .await;
    post_ok(&p, &server.url).await;
    assert_eq!(server.connections.load(Ordering::SeqCst), 3);
    assert_eq!(
        p.idle_count(&server.url),
        1,
        "the two expired ones are gone"
    );
}

#[actix_rt::test]
async fn a_watched_name_that_now_resolves_outside_the_rule_is_never_connected_to() {
    let s = serve(|_, _| Reply::once(OK));
    let by_name = WorkerUrl::parse(&format!("http://localhost:{}", s.url.port())).expect("url");
    // As if `localhost` had been vetted at another address and DNS now answered loopback.
    let rebound = ConnectGuard::new(Arc::new(|_, ip: std::net::IpAddr| !ip.is_loopback()));
    let p = Pool::new(
        Duration::from_secs(2),
        Duration::from_secs(30),
        rebound.clone(),
    );
    post_ok(&p, &by_name).await;
    assert_eq!(
        s.connections.load(Ordering::SeqCst),
        1,
        "not watched: connects"
    );
    rebound.watch("localhost");
    let fresh = Pool::new(Duration::from_secs(2), Duration::from_secs(30), rebound);
    let e = fresh
        .post(&by_name, "/v1/x", &[], Bytes::from_static(b"{}"))
        .await
        .err();
    assert!(matches!(e, Some(UpstreamError::Guard(_))), "{e:?}");
    assert_eq!(
        s.connections.load(Ordering::SeqCst),
        1,
        "watched: no connection"
    );
    // An address the rule allows is connected to by the name's resolution.
    let v4 = ConnectGuard::new(Arc::new(|_, ip: std::net::IpAddr| {
        ip == std::net::IpAddr::from([127, 0, 0, 1])
    }));
    v4.watch("localhost");
    let p = Pool::new(Duration::from_secs(2), Duration::from_secs(30), v4);
    post_ok(&p, &by_name).await;
    assert_eq!(s.connections.load(Ordering::SeqCst), 2);
}
