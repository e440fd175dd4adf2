use std::task::Waker;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::head::MAX_HEAD;
use super::*;

mod heads;
mod model;
mod stream;

const LIMIT: usize = 1 << 20;

fn chat(body: &[u8], extra: &str) -> Vec<u8> {
    let mut r = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
         {extra}content-length: {}\r\nx-trace: 1\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

fn head_len(r: &[u8]) -> usize {
    memchr::memmem::find(r, b"\r\n\r\n").map_or(0, |i| i + 4)
}

#[test]
fn an_inference_post_within_the_limit_is_taken_and_its_head_rewritten() {
    let r = chat(b"{\"messages\":[]}", "");
    let mut rewritten = BytesMut::new();
    let Look::Take { head, body } = look(&r, &mut rewritten, LIMIT, 7, true) else {
        panic!("not taken");
    };
    assert_eq!((head, body), (head_len(&r), 15));
    assert_eq!(
        String::from_utf8(rewritten.to_vec()).unwrap(),
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
         x-trace: 1\r\ncontent-length: 0\r\nx-kvgate-body: 7\r\n\r\n"
    );
}

#[test]
fn a_clients_own_body_token_is_dropped_from_a_taken_head() {
    let r = chat(b"{}", "X-Kvgate-Body: 7\r\n");
    let mut rewritten = BytesMut::new();
    let Look::Take { .. } = look(&r, &mut rewritten, LIMIT, 9, true) else {
        panic!("not taken");
    };
    let text = String::from_utf8(rewritten.to_vec()).unwrap();
    assert!(!text.contains("X-Kvgate-Body"), "{text}");
    assert_eq!(text.matches("x-kvgate-body: 9\r\n").count(), 1, "{text}");
}

#[test]
fn every_route_and_query_of_the_inference_routes_is_taken() {
    for path in [
        "/v1/chat/completions",
        "/v1/completions",
        "/generate",
        "/generate?x=1",
    ] {
        let r = format!("POST {path} HTTP/1.1\r\ncontent-length: 2\r\n\r\n{{}}");
        assert!(
            matches!(
                look(r.as_bytes(), &mut BytesMut::new(), LIMIT, 1, true),
                Look::Take { body: 2, .. }
            ),
            "{path}"
        );
    }
}

#[test]
fn what_is_not_taken_passes_with_its_body_or_ends_the_parsing() {
    let pass = |r: &str, body: u64| {
        let want = Look::Pass {
            head: head_len(r.as_bytes()),
            body,
        };
        let mut out = BytesMut::new();
        assert_eq!(look(r.as_bytes(), &mut out, 16, 1, true), want, "{r}");
        assert!(out.is_empty(), "{r}");
    };
    pass("GET /health HTTP/1.1\r\nhost: gw\r\n\r\n", 0);
    pass("POST /workers HTTP/1.1\r\ncontent-length: 10\r\n\r\n", 10);
    pass("GET /v1/chat/completions HTTP/1.1\r\n\r\n", 0);
    pass(
        "POST /v1/chat/completions/x HTTP/1.1\r\ncontent-length: 3\r\n\r\n",
        3,
    );
    // Over the limit: actix-http answers 413 from the declared length.
    pass("POST /generate HTTP/1.1\r\ncontent-length: 17\r\n\r\n", 17);
    pass("POST /generate HTTP/1.1\r\ncontent-length: 0\r\n\r\n", 0);
    pass(
        "POST /generate HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n",
        2,
    );
    // A body already waiting for its handler: the next one passes.
    let r = "POST /generate HTTP/1.1\r\ncontent-length: 2\r\n\r\n";
    assert_eq!(
        look(r.as_bytes(), &mut BytesMut::new(), 16, 1, false),
        Look::Pass {
            head: r.len(),
            body: 2
        }
    );
    let raw = |r: &str| {
        let look = look(r.as_bytes(), &mut BytesMut::new(), 16, 1, true);
        assert_eq!(look, Look::Raw, "{r}");
    };
    raw("POST /generate HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n");
    raw("POST /generate HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n");
    raw("POST /generate HTTP/1.1\r\ncontent-length: +2\r\n\r\n");
    raw("GET /ws HTTP/1.1\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n");
    raw("NOT HTTP AT ALL\r\n\r\n");
    assert_eq!(
        look(
            b"POST /generate HTTP/1.1\r\ncontent-le",
            &mut BytesMut::new(),
            16,
            1,
            true
        ),
        Look::Partial
    );
    let long = format!("GET / HTTP/1.1\r\nx: {}", "a".repeat(MAX_HEAD));
    raw(&long);
}

/// Heads around the length limit, whole and cut where the reads of a long head end: the
/// same decision either way (a head over the limit that came whole in one read was taken).
#[test]
fn a_head_over_the_length_limit_passes_through_whole_as_in_parts() {
    for len in [MAX_HEAD - 1, MAX_HEAD, MAX_HEAD + 1, MAX_HEAD + 5000] {
        let start = "POST /generate HTTP/1.1\r\ncontent-length: 2\r\nx-long: ";
        let end = "\r\n\r\n";
        let fill = len - start.len() - end.len();
        let mut input = format!("{start}{}{end}", "a".repeat(fill)).into_bytes();
        assert_eq!(input.len(), len);
        input.extend_from_slice(b"{}");
        let whole = || {
            if len <= MAX_HEAD {
                Look::Take { head: len, body: 2 }
            } else {
                Look::Raw
            }
        };
        assert_eq!(
            look(&input, &mut BytesMut::new(), 16, 1, true),
            whole(),
            "a head of {len} bytes"
        );
        for cut in [16 * 1024, 32 * 1024, MAX_HEAD - 1, MAX_HEAD, MAX_HEAD + 1] {
            let expected = match cut {
                _ if cut >= len => whole(),
                _ if cut >= MAX_HEAD => Look::Raw,
                _ => Look::Partial,
            };
            let part = look(&input[..cut], &mut BytesMut::new(), 16, 1, true);
            assert_eq!(part, expected, "a head of {len} bytes cut at {cut}");
        }
    }
}

/// The two lines a taken head gets must leave it within the 96 headers actix-http parses
/// (it refused a rewritten head of 96 headers with 400).
#[test]
fn a_head_with_no_room_for_the_two_headers_passes() {
    let head = |fillers: usize, extra: &str| {
        let mut r = String::from("POST /generate HTTP/1.1\r\n");
        for i in 0..fillers {
            r.push_str(&format!("x-{i}: v\r\n"));
        }
        r.push_str(extra);
        r.push_str("content-length: 2\r\n\r\n{}");
        r
    };
    let decide = |r: &str| {
        let mut out = BytesMut::new();
        let l = look(r.as_bytes(), &mut out, LIMIT, 1, true);
        (l, out)
    };
    let (l, out) = decide(&head(94, ""));
    assert!(matches!(l, Look::Take { body: 2, .. }), "{l:?}");
    let mut headers = [httparse::EMPTY_HEADER; 96];
    let parsed = httparse::Request::new(&mut headers).parse(&out);
    assert!(
        matches!(parsed, Ok(httparse::Status::Complete(_))),
        "{parsed:?}"
    );
    let r = head(95, "");
    assert_eq!(
        decide(&r),
        (
            Look::Pass {
                head: r.len() - 2,
                body: 2
            },
            BytesMut::new()
        )
    );
    // A client's own token line makes room.
    let (l, _) = decide(&head(94, "x-kvgate-body: 5\r\n"));
    assert!(matches!(l, Look::Take { .. }), "{l:?}");
}

/// httparse skips blank lines before a request line, as RFC 9112 lets a server do: such a
/// head is taken like any other, its blank lines kept (it used to pass).
#[test]
fn blank_lines_before_the_request_line_are_kept_and_the_body_taken() {
    for lead in ["\r\n", "\n", "\r\n\r\n"] {
        let r =
            format!("{lead}POST /generate HTTP/1.1\r\nhost: gw\r\ncontent-length: 2\r\n\r\n{{}}");
        let mut out = BytesMut::new();
        let l = look(r.as_bytes(), &mut out, LIMIT, 4, true);
        assert_eq!(
            l,
            Look::Take {
                head: r.len() - 2,
                body: 2
            },
            "{lead:?}"
        );
        assert_eq!(
            String::from_utf8(out.to_vec()).unwrap(),
            format!(
                "{lead}POST /generate HTTP/1.1\r\nhost: gw\r\ncontent-length: 0\r\nx-kvgate-body: 4\r\n\r\n"
            )
        );
    }
}

/// Marks every body as asked for, as its handler would.
fn want_all(bodies: &Bodies) {
    for (_, e) in bodies.entries.borrow_mut().iter_mut() {
        if let Entry::Pending { want, .. } = e {
            *want = Want::Wanted;
        }
    }
}

/// An `Intake` over a loopback connection whose client wrote `sent` and closed, read to
/// its end with every body asked for.
async fn through(sent: Vec<u8>, limit: usize) -> (Vec<u8>, Rc<Bodies>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    #[expect(clippy::disallowed_methods, reason = "a test peer the test joins")]
    let client = tokio::spawn(async move {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        // In pieces, so heads and bodies are split across reads.
        for piece in sent.chunks(1000) {
            c.write_all(piece).await.unwrap();
            tokio::task::yield_now().await;
        }
        c.shutdown().await.unwrap();
        c
    });
    let (io, _) = l.accept().await.unwrap();
    let mut intake = Intake::new(io, limit);
    let out = read_to_end(&mut intake).await;
    drop(client.await.unwrap());
    (out, intake.bodies())
}

/// What `intake` gives actix-http until its socket ends, every body asked for as it comes.
async fn read_to_end(intake: &mut Intake) -> Vec<u8> {
    let bodies = intake.bodies();
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 4096];
    loop {
        want_all(&bodies);
        let n = intake.read(&mut chunk).await.unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&chunk[..n]);
    }
    out
}

fn taken(bodies: &Bodies) -> Vec<(u64, Option<Bytes>)> {
    bodies
        .entries
        .borrow()
        .iter()
        .map(|(t, e)| {
            let b = match e {
                Entry::Ready(b) => Some(b.clone()),
                _ => None,
            };
            (*t, b)
        })
        .collect()
}

#[tokio::test]
async fn a_taken_body_comes_whole_and_what_follows_it_passes_as_sent() {
    let body: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut sent = chat(&body, "");
    let after = b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n".to_vec();
    sent.extend_from_slice(&after);
    let (out, bodies) = through(sent.clone(), LIMIT).await;
    let got = taken(&bodies);
    assert_eq!(got.len(), 1);
    let (token, b) = &got[0];
    assert_eq!(b.as_deref(), Some(&body[..]));
    let head = String::from_utf8(out[..out.len() - after.len()].to_vec()).unwrap();
    assert!(head.ends_with(&format!(
        "content-length: 0\r\nx-kvgate-body: {token}\r\n\r\n"
    )));
    assert_eq!(&out[out.len() - after.len()..], &after[..]);
}

/// Pipelined requests already whole in the socket: the body's last read also takes the
/// start of what follows (`BODY_SLACK`), which must reach actix-http as sent.
#[tokio::test]
async fn what_a_bodys_last_read_takes_past_its_end_passes_as_sent() {
    let first: Vec<u8> = (0..40_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut sent = chat(&first, "");
    // Not taken while the first body is unclaimed: it passes whole.
    let mut rest = chat(&[b'q'; 700], "");
    rest.extend_from_slice(b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n");
    sent.extend_from_slice(&rest);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut c = tokio::net::TcpStream::connect(l.local_addr().unwrap())
        .await
        .unwrap();
    let (io, _) = l.accept().await.unwrap();
    // All of it is in the socket before the first read.
    c.write_all(&sent).await.unwrap();
    c.shutdown().await.unwrap();
    let mut intake = Intake::new(io, LIMIT);
    let out = read_to_end(&mut intake).await;
    let got = taken(&intake.bodies());
    assert_eq!(got.len(), 1);
    assert!(got[0].1.as_deref() == Some(&first[..]), "the body differs");
    assert_eq!(intake.past_the_end, 1, "no read went past the body's end");
    assert!(out.ends_with(&rest), "what followed the body changed");
    assert_eq!(out.len(), head_len(&out) + rest.len());
}

#[tokio::test]
async fn bodies_that_are_not_taken_pass_byte_for_byte() {
    let mut sent = b"POST /workers HTTP/1.1\r\ncontent-length: 5000\r\n\r\n".to_vec();
    sent.extend(std::iter::repeat_n(b'x', 5000));
    // Over the limit of 100 given below.
    sent.extend_from_slice(b"POST /generate HTTP/1.1\r\ncontent-length: 200\r\n\r\n");
    sent.extend(std::iter::repeat_n(b'y', 200));
    sent.extend_from_slice(b"POST /generate HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n");
    sent.extend_from_slice(
        b"3\r\nabc\r\n0\r\n\r\nPOST /generate HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}",
    );
    let (out, bodies) = through(sent.clone(), 100).await;
    assert_eq!(out, sent);
    assert!(taken(&bodies).is_empty());
}

#[tokio::test]
async fn a_client_gone_before_its_body_came_loses_it_and_the_claim_says_so() {
    let mut sent = chat(&[b'z'; 50_000], "");
    sent.truncate(sent.len() - 10_000);
    let (_, bodies) = through(sent, LIMIT).await;
    let got = taken(&bodies);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, None);
    let claim = BodyClaim {
        bodies: bodies.clone(),
        token: got[0].0,
    };
    assert!(claim.body().await.is_err());
    assert!(bodies.is_empty());
}

/// A loopback connection: its client end, and its server end in an `Intake`.
async fn connected() -> (tokio::net::TcpStream, Intake) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let c = tokio::net::TcpStream::connect(l.local_addr().unwrap())
        .await
        .unwrap();
    let (io, _) = l.accept().await.unwrap();
    (c, Intake::new(io, LIMIT))
}

/// A body that came with its head is kept whole at once: its handler's first ask finds it,
/// with no other poll of the connection in between (a small request's usual case).
#[tokio::test]
async fn a_body_read_with_its_head_is_ready_at_the_first_ask() {
    let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let mut sent = chat(body, "");
    let next = b"GET /health HTTP/1.1\r\n\r\n";
    sent.extend_from_slice(next);
    let (mut c, mut intake) = connected().await;
    let bodies = intake.bodies();
    // All of it is in the socket before the first read.
    c.write_all(&sent).await.unwrap();
    let mut head = vec![0; 4096];
    let n = intake.read(&mut head).await.unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).contains("x-kvgate-body: "));
    // The body is taken out of the stream: the next request follows its head.
    assert!(
        head[..n].ends_with(next),
        "{:?}",
        String::from_utf8_lossy(&head[..n])
    );
    let token = bodies.entries.borrow()[0].0;
    let claim = BodyClaim {
        bodies: bodies.clone(),
        token,
    };
    claim.hold().await;
    let mut ask = std::pin::pin!(claim.body());
    let first = ask.as_mut().poll(&mut Context::from_waker(Waker::noop()));
    assert!(
        matches!(&first, Poll::Ready(Ok(b)) if b == &body[..]),
        "the first ask got {first:?}"
    );
    assert!(bodies.is_empty());
    drop(c);
}

#[tokio::test]
async fn a_claim_waits_for_its_body_and_one_dropped_unread_lets_it_go() {
    let body = vec![b'q'; 200_000];
    let sent = chat(&body, "");
    let (mut c, mut intake) = connected().await;
    let bodies = intake.bodies();
    let h = head_len(&sent);
    c.write_all(&sent[..h + 100]).await.unwrap();
    let mut head = vec![0; 4096];
    let n = intake.read(&mut head).await.unwrap();
    let text = String::from_utf8(head[..n].to_vec()).unwrap();
    let token: u64 = text
        .rsplit("x-kvgate-body: ")
        .next()
        .and_then(|t| t.trim_end().parse().ok())
        .unwrap();
    let claim = BodyClaim {
        bodies: bodies.clone(),
        token,
    };
    // The rest of the body arrives while the claim waits; the intake reads it as
    // actix-http would, by being polled for more.
    let rest = sent[h + 100..].to_vec();
    #[expect(clippy::disallowed_methods, reason = "a test peer the test joins")]
    let writer = tokio::spawn(async move {
        c.write_all(&rest).await.unwrap();
        c
    });
    let read_on = async {
        let mut more = [0u8; 64];
        loop {
            if intake.read(&mut more).await.unwrap() == 0 {
                break;
            }
        }
    };
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::select! {
            got = claim.body() => got,
            () = read_on => panic!("the connection ended first"),
        }
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(got, body);
    assert!(bodies.is_empty());
    drop(writer.await.unwrap());

    // Dropped unread: the table is empty again, so the next body can be taken.
    let b = Rc::new(Bodies::default());
    b.entries.borrow_mut().push((
        3,
        Entry::Pending {
            waker: None,
            want: Want::Unclaimed,
        },
    ));
    drop(BodyClaim {
        bodies: b.clone(),
        token: 3,
    });
    assert!(b.is_empty());
}

#[tokio::test]
async fn a_body_is_not_read_before_its_handler_asks_and_one_let_go_is_skipped() {
    let body = vec![b'w'; 300_000];
    let mut sent = chat(&body, "");
    let next = b"GET /health HTTP/1.1\r\n\r\n";
    sent.extend_from_slice(next);
    let (mut c, mut intake) = connected().await;
    let bodies = intake.bodies();
    c.write_all(&sent).await.unwrap();
    let mut chunk = vec![0u8; 4096];
    let n = intake.read(&mut chunk).await.unwrap();
    assert!(String::from_utf8_lossy(&chunk[..n]).contains("x-kvgate-body: "));
    // Nobody asked: nothing more is read, however long the client has been sending.
    let idle = tokio::time::timeout(Duration::from_millis(200), intake.read(&mut chunk)).await;
    assert!(idle.is_err(), "read on: {idle:?}");
    assert_eq!(intake.mode_name(), "body");
    assert!(intake.input.len() <= PARKED, "{}", intake.input.len());
    // Let go unread (a refused request): the rest of the body is dropped, and the next
    // request comes through as sent.
    let token = bodies.entries.borrow()[0].0;
    drop(BodyClaim {
        bodies: bodies.clone(),
        token,
    });
    let n = tokio::time::timeout(Duration::from_secs(5), intake.read(&mut chunk))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&chunk[..n], next);
    drop(c);
}

#[tokio::test]
async fn a_client_gone_while_its_body_waits_to_be_asked_for_is_seen() {
    let sent = chat(&[b'v'; 200_000], "");
    let (mut c, mut intake) = connected().await;
    let bodies = intake.bodies();
    c.write_all(&sent[..head_len(&sent) + 30_000])
        .await
        .unwrap();
    let mut chunk = vec![0u8; 4096];
    let n = intake.read(&mut chunk).await.unwrap();
    assert!(String::from_utf8_lossy(&chunk[..n]).contains("x-kvgate-body: "));
    // Its handler holds it (waiting for admission) and has not asked for it.
    let token = bodies.entries.borrow()[0].0;
    let claim = BodyClaim {
        bodies: bodies.clone(),
        token,
    };
    claim.hold().await;
    drop(c);
    // Nobody asked for the body, yet the end of the connection comes through, and none
    // of the body is handed on as if it were a request.
    let n = tokio::time::timeout(Duration::from_secs(5), intake.read(&mut chunk))
        .await
        .expect("the end is seen")
        .unwrap();
    assert_eq!(n, 0);
    assert!(matches!(bodies.entries.borrow()[0].1, Entry::Lost));
    assert!(claim.body().await.is_err());
}
