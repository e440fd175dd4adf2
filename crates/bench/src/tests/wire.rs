//! What the bench reads off the wire: wrk's report, HTTP/1.1 heads and chunked bodies, the raw client.

use crate::http1::{decode_chunked, parse_head};
use crate::*;

const WRK_OUT: &str = "Running 10s test @ http://127.0.0.1:8080/v1/chat/completions
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   635.91us    0.89ms  12.92ms   93.69%
    Req/Sec    56.20k     4.54k   70.34k    75.00%
  Latency Distribution
     50%  422.00us
     75%  539.00us
     90%    0.95ms
     99%    4.09ms
  559314 requests in 10.00s, 68.27MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 5
Requests/sec:  55917.71
Transfer/sec:      6.83MB
";

#[test]
fn wrk_output_parses() {
    let r = parse_wrk(WRK_OUT).expect("parses");
    assert_eq!(r.requests_per_sec, 55917.71);
    assert_eq!(r.requests, 559_314);
    assert_eq!(r.latency_avg_ms, Some(0.63591));
    assert_eq!(r.latency_p50_ms, Some(0.422));
    assert_eq!(r.latency_p99_ms, Some(4.09));
    assert_eq!(r.socket_errors, 3);
    assert_eq!(r.non_2xx, 5);
    assert!(parse_wrk("unable to connect to 127.0.0.1:1 Connection refused").is_err());
}

#[test]
fn wrk_script_posts_the_body_verbatim() {
    let script = post_script(r#"{"a":"]]"}"#);
    assert!(script.contains("wrk.method = \"POST\""));
    assert!(
        script.contains(r#"wrk.body = [=[{"a":"]]"}]=]"#),
        "{script}"
    );
}

#[test]
fn http_heads_and_chunked_bodies_parse() {
    let head = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nX: y\r\n\r\nhello";
    let h = parse_head(head).expect("valid").expect("complete");
    assert_eq!(
        (h.status, h.content_length, h.chunked, h.close),
        (200, Some(5), false, false)
    );
    assert_eq!(h.len, head.len() - 5);
    assert!(parse_head(b"HTTP/1.1 200 OK\r\n").expect("valid").is_none());
    assert!(parse_head(b"SSH-2.0\r\n\r\n").is_err());
    let h = parse_head(
        b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    )
    .expect("valid")
    .expect("complete");
    assert!(h.chunked && h.close && h.status == 404);

    let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\nNEXT";
    let (decoded, used) = decode_chunked(body).expect("valid").expect("complete");
    assert_eq!(decoded, b"hello world");
    assert_eq!(&body[used..], b"NEXT");
    assert!(decode_chunked(&body[..12]).expect("valid").is_none());
    assert!(decode_chunked(b"zz\r\n").is_err());
}

#[test]
fn urls_resolve_to_socket_addrs() {
    let a = socket_addr("http://127.0.0.1:8080/x").expect("addr");
    assert_eq!(a.port(), 8080);
    assert!(socket_addr("https://127.0.0.1:1").is_none());
}

#[test]
fn raw_client_reconnects_after_connection_close() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = std::thread::spawn(move || {
        for reply in [
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
            "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nyes\r\n0\r\n\r\n",
        ] {
            let (mut s, _) = listener.accept().expect("accept");
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).expect("request");
            s.write_all(reply.as_bytes()).expect("reply");
        }
    });
    let mut c = RawClient::connect(addr, std::time::Duration::from_secs(5)).expect("connect");
    let a = c.request("POST", "/x", b"{}").expect("first");
    assert_eq!((a.status, a.body.as_slice()), (200, &b"hi"[..]));
    let b = c
        .request("GET", "/y", b"")
        .expect("second, on a new connection");
    assert_eq!((b.status, b.body.as_slice()), (201, &b"yes"[..]));
    server.join().expect("server");
}
