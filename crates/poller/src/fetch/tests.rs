use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

/// A loopback server answering each request line's path with `answer`; the count of
/// requests it read.
fn serve(answer: impl Fn(&str) -> String + Send + 'static) -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(AtomicU64::new(0));
    let count = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let Ok(mut out) = conn.try_clone() else {
                continue;
            };
            let mut reader = BufReader::new(conn);
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            // The rest of the head: polls send no body.
            let mut h = String::new();
            while reader.read_line(&mut h).is_ok_and(|n| n > 2) {
                h.clear();
            }
            count.fetch_add(1, Ordering::SeqCst);
            let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
            let _ = out.write_all(answer(&path).as_bytes());
        }
    });
    (url, seen)
}

fn fetch_of(url: &str, try_loads: bool) -> Fetch {
    Fetch {
        client: client(Duration::from_secs(5)),
        url: WorkerUrl::parse(url).unwrap(),
        api_key: Some("sk-worker".into()),
        timeout: Duration::from_secs(5),
        epoch: Instant::now(),
        try_loads,
    }
}

#[actix_rt::test]
async fn a_redirect_is_a_failed_poll_and_is_not_followed() {
    let loads = r#"{"loads":[{"dp_rank":0,"num_running_reqs":3}]}"#;
    let (elsewhere, reached) = serve(move |_| {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{loads}",
            loads.len()
        )
    });
    let to = elsewhere.clone();
    let (worker, _) = serve(move |path| {
        format!(
            "HTTP/1.1 302 Found\r\nlocation: {to}{path}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        )
    });
    for (try_loads, route) in [(true, "/v1/loads"), (false, "/metrics")] {
        let got = fetch(fetch_of(&worker, try_loads)).await;
        let err = got.result.expect_err("a redirect is no load");
        assert!(
            matches!(err, PollError::Redirect { route: r, status } if r == route && status == StatusCode::FOUND),
            "{err:?}"
        );
        assert!(err.to_string().contains("redirect refused"), "{err}");
        // A redirect says nothing about whether the worker has /v1/loads.
        assert!(!got.no_loads);
    }
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "no poll reached the target"
    );
    // The same target is polled when asked directly: the server itself works.
    let direct = fetch(fetch_of(&elsewhere, true)).await;
    assert!(direct.result.is_ok(), "{:?}", direct.result);
}
