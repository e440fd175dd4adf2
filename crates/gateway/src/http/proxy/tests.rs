use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderName, HeaderValue};

use actix_web::HttpResponse;

use super::headers::copy_response_headers;
use super::rank_member;
use super::relay::{Tail, last_event_end};

#[test]
fn headers_the_worker_names_in_connection_are_not_relayed() {
    let h = |n: &str, v: &str| {
        (
            HeaderName::from_bytes(n.as_bytes()).expect("name"),
            HeaderValue::from_str(v).expect("value"),
        )
    };
    let from = vec![
        h("content-type", "application/json"),
        h("connection", "keep-alive, X-Hop"),
        h("connection", " x-other "),
        h("x-hop", "1"),
        h("x-other", "2"),
        h("x-kept", "3"),
        h("keep-alive", "timeout=5"),
        h("transfer-encoding", "chunked"),
        h("server", "uvicorn"),
    ];
    let mut b = HttpResponse::build(StatusCode::OK);
    copy_response_headers(from, &mut b);
    let resp = b.finish();
    let mut names: Vec<&str> = resp.headers().keys().map(|n| n.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["content-type", "x-kept"]);
}

#[test]
fn event_ends_are_found_for_every_line_ending() {
    assert_eq!(last_event_end(b"data: 1\n\ndata: 2", 0), Some(9));
    assert_eq!(last_event_end(b"data: 1\n\ndata: 2\n\n", 0), Some(18));
    assert_eq!(last_event_end(b"data: 1\r\n\r\nda", 0), Some(11));
    assert_eq!(last_event_end(b"data: 1\r\rda", 0), Some(9));
    assert_eq!(last_event_end(b"data: 1\n", 0), None);
    assert_eq!(last_event_end(b"data: 1\r\n\r", 0), None);
    assert_eq!(last_event_end(b"", 0), None);
    // Only ends after `from` count: the caller has already looked before it.
    assert_eq!(last_event_end(b"a\n\nbcdef", 4), None);
    assert_eq!(last_event_end(b"a\n\nb\n\n", 4), Some(6));
}

#[test]
fn the_rank_goes_first_in_the_object_unless_the_client_named_one() {
    let with = |body: &str, rank| {
        rank_member(body.as_bytes(), rank, "routed_dp_rank").map(|(at, m)| {
            let mut out = body.as_bytes()[..at].to_vec();
            out.extend(m);
            out.extend(&body.as_bytes()[at..]);
            String::from_utf8(out).expect("utf-8")
        })
    };
    assert_eq!(
        with(r#"{"text":"hi"}"#, 1).as_deref(),
        Some(r#"{"routed_dp_rank":1,"text":"hi"}"#)
    );
    assert_eq!(
        with(" \n{ }", 3).as_deref(),
        Some(" \n{\"routed_dp_rank\":3 }")
    );
    assert_eq!(with(r#"{"routed_dp_rank": 0, "text":"x"}"#, 1), None);
    assert_eq!(with(r#"{"data_parallel_rank": 0}"#, 1), None);
    // Only a member name counts: inside a string the quotes are escaped.
    assert_eq!(
        with(r#"{"text":"say \"routed_dp_rank\""}"#, 2).as_deref(),
        Some(r#"{"routed_dp_rank":2,"text":"say \"routed_dp_rank\""}"#)
    );
    assert_eq!(with("[1]", 1), None);
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

#[test]
fn the_failure_table_says_which_the_engine_may_have_started() {
    use super::{before_request, status_kind};
    use crate::pipeline::FailureKind::{MayHaveStarted, NotStarted};
    use crate::upstream::UpstreamError;
    for (status, kind) in [
        (503, NotStarted),
        (429, NotStarted),
        (502, MayHaveStarted),
        (504, MayHaveStarted),
    ] {
        let s = StatusCode::from_u16(status).expect("a status");
        assert_eq!(status_kind(s), kind, "{status}");
    }
    let io = |k| std::io::Error::from(k);
    for (e, before) in [
        (
            UpstreamError::Connect(io(std::io::ErrorKind::ConnectionRefused)),
            true,
        ),
        (UpstreamError::ConnectTimeout(1.0), true),
        (
            UpstreamError::Write(io(std::io::ErrorKind::BrokenPipe)),
            true,
        ),
        (
            UpstreamError::Read(io(std::io::ErrorKind::ConnectionReset)),
            false,
        ),
        (UpstreamError::ClosedBeforeHead, false),
        (UpstreamError::Truncated { got: 1, want: 2 }, false),
        (UpstreamError::ChunkedTruncated, false),
    ] {
        assert_eq!(before_request(&e), before, "{e}");
    }
}
