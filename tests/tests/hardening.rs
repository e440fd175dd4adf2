//! What a hostile neighbour can make the gateway do: a browser page of another site
//! changing an open admin, a worker bouncing probes elsewhere with redirects or naming a
//! foreign KV-event endpoint or too many ranks, error bodies that would tell a client where
//! workers are, and clients behind a proxy sharing one rate limit.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kvgate_engine_sim::{Fault, SimConfig, SimFleet};
use kvgate_gateway::{Gateway, Secret};
use kvgate_tests::{
    Harness, Reply, client, sse_events, test_config, until_workers, wait_for, workers,
};
use serde_json::{Value, json};

/// `method url` with `headers` and an optional body sent as is.
async fn send(method: &str, url: &str, headers: &[(&str, &str)], body: Option<&str>) -> Reply {
    let c = client();
    let mut req = match method {
        "DELETE" => c.delete(url),
        "GET" => c.get(url),
        _ => c.post(url),
    };
    for (k, v) in headers {
        req = req.insert_header((*k, *v));
    }
    let resp = match body {
        Some(b) => req.send_body(b.to_owned()).await,
        None => req.send().await,
    }
    .expect("request sent");
    kvgate_tests::finish_reply(resp).await
}

const JSON: (&str, &str) = ("content-type", "application/json");

#[actix_rt::test]
async fn a_page_of_another_site_cannot_change_an_open_admin() {
    let h = Harness::start(1, SimConfig::default(), |_| {});
    let spare = SimFleet::start(1, SimConfig::default()).expect("engine");
    let (mine, other) = (h.fleet.urls()[0].clone(), spare.urls()[0].clone());
    let add_body = json!({"url": other}).to_string();
    let explain_body = json!({"prompt": "x"}).to_string();
    let id = workers(&h.gw).await[0]["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    for foreign in [
        ("origin", "http://evil.example"),
        ("origin", "null"),
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-site", "same-site"),
    ] {
        for (method, path, body) in [
            ("POST", format!("/add_worker?url={other}"), None),
            ("POST", "/workers".to_owned(), Some(add_body.as_str())),
            ("POST", format!("/remove_worker?url={mine}"), None),
            ("DELETE", format!("/workers/{id}"), None),
            ("POST", "/flush_cache".to_owned(), None),
            (
                "POST",
                "/admin/explain/v1/completions".to_owned(),
                Some(explain_body.as_str()),
            ),
        ] {
            let r = send(method, &h.url(&path), &[foreign, JSON], body).await;
            r.assert_error(403, "cross_site_request");
        }
        // Reading is no change: a GET from anywhere is answered.
        let r = send("GET", &h.url("/workers"), &[foreign], None).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    assert_eq!(
        workers(&h.gw).await.len(),
        1,
        "nothing was added or removed"
    );
    assert_eq!(spare.engine(0).stats().requests, 0);

    // A form or text/plain body, which a page may send anywhere without asking first, is
    // not JSON: refused whatever it holds, with or without an Origin.
    for ct in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        let headers: Vec<(&str, &str)> = ct.map(|c| ("content-type", c)).into_iter().collect();
        for path in ["/workers", "/admin/explain/v1/completions"] {
            let r = send("POST", &h.url(path), &headers, Some(&add_body)).await;
            r.assert_error(415, "unsupported_media_type");
        }
    }
    assert_eq!(workers(&h.gw).await.len(), 1);

    // Scripts and curl send no Origin: the legacy query forms and JSON keep working, and
    // so does the gateway's own origin.
    let own = h.gw.url();
    for legacy in ["add_worker", "remove_worker"] {
        let r = send("POST", &h.url(&format!("/{legacy}?url={other}")), &[], None).await;
        assert_eq!(r.status.as_u16(), 200, "{legacy}: {}", r.text());
    }
    let r = send(
        "POST",
        &h.url("/workers"),
        &[
            ("origin", own.as_str()),
            ("sec-fetch-site", "same-origin"),
            JSON,
        ],
        Some(&add_body),
    )
    .await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let r = send(
        "POST",
        &h.url("/admin/explain/v1/completions"),
        &[("content-type", "Application/JSON; charset=utf-8")],
        Some(&explain_body),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
}

#[actix_rt::test]
async fn an_admin_key_opens_the_admin_from_any_origin() {
    let spare = SimFleet::start(1, SimConfig::default()).expect("engine");
    let h = Harness::start(1, SimConfig::default(), |c| {
        c.access.control_plane_api_keys = vec![Secret::new("sk-admin")];
    });
    let add = h.url(&format!("/add_worker?url={}", spare.urls()[0]));
    let evil = ("origin", "http://evil.example");
    // From another site, anything but a valid admin key is refused as such.
    for key in [None, Some("Bearer sk-wrong")] {
        let mut headers = vec![evil];
        headers.extend(key.map(|k| ("authorization", k)));
        send("POST", &add, &headers, None)
            .await
            .assert_error(403, "cross_site_request");
    }
    // Without an Origin, the usual answer to a missing key.
    send("POST", &add, &[], None)
        .await
        .assert_error(401, "invalid_api_key");
    assert_eq!(
        spare.engine(0).stats().requests,
        0,
        "never probed: not added"
    );
    let r = send(
        "POST",
        &add,
        &[evil, ("authorization", "Bearer sk-admin")],
        None,
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    // The key is checked before the body's type: without it, 401 and not 415.
    send("POST", &h.url("/workers"), &[], Some("{}"))
        .await
        .assert_error(401, "invalid_api_key");
}

/// A loopback HTTP server that answers each request with `answer(path)` (a whole HTTP
/// response) and closes the connection; the count of requests it read.
fn serve(answer: impl Fn(&str) -> String + Send + Sync + 'static) -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = Arc::new(AtomicU64::new(0));
    let (count, answer) = (seen.clone(), Arc::new(answer));
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (count, answer) = (count.clone(), answer.clone());
            std::thread::spawn(move || {
                let Ok(mut out) = conn.try_clone() else {
                    return;
                };
                let mut reader = BufReader::new(conn);
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                let mut h = String::new();
                while reader.read_line(&mut h).is_ok_and(|n| n > 2) {
                    h.clear();
                }
                count.fetch_add(1, Ordering::SeqCst);
                let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let _ = out.write_all(answer(&path).as_bytes());
            });
        }
    });
    (url, seen)
}

fn json_answer(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

const MODELS: &str =
    r#"{"object":"list","data":[{"id":"m","object":"model","owned_by":"sglang"}]}"#;

/// A worker whose routes answer 302 to the same path at `to`, but for its first
/// `/v1/models` when `detectable` (then it is registered ready, and the redirects meet its
/// health checks and load polls).
fn redirecting(to: String, detectable: bool) -> String {
    let models_left = AtomicU64::new(u64::from(detectable));
    serve(move |path| {
        let take = |n: u64| n.checked_sub(1);
        if path == "/v1/models" && models_left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, take).is_ok() {
            return json_answer(MODELS);
        }
        format!(
            "HTTP/1.1 302 Found\r\nlocation: {to}{path}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        )
    })
    .0
}

fn reason_of(w: &Value) -> String {
    w["reason"].as_str().unwrap_or_default().to_owned()
}

#[actix_rt::test]
async fn probes_and_polls_never_follow_a_redirect() {
    // Where the redirects point: it would pass every probe, were it reached.
    let (elsewhere, reached) = serve(|path| match path {
        "/v1/models" => json_answer(MODELS),
        p if p.starts_with("/v1/loads") => {
            json_answer(r#"{"loads":[{"dp_rank":0,"num_running_reqs":1}]}"#)
        }
        _ => json_answer("{}"),
    });
    let bounced_at_detection = redirecting(elsewhere.clone(), false);
    let bounced_later = redirecting(elsewhere.clone(), true);
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = vec![bounced_at_detection.clone(), bounced_later.clone()];
    cfg.health.interval = Duration::from_millis(100);
    cfg.health.failure_threshold = 1;
    let gw = Gateway::start(cfg).expect("gateway");
    let fleet = until_workers(&gw, "a redirect refused by each worker's probes", |ws| {
        ws.len() == 2
            && ws
                .iter()
                .all(|w| reason_of(w).contains("redirect refused") && w["status"] != "ready")
    })
    .await;
    let by_url = |u: &str| {
        fleet
            .iter()
            .find(|w| w["url"] == u)
            .cloned()
            .unwrap_or_default()
    };
    // Never detected: its /v1/models bounced.
    let first = by_url(&bounced_at_detection);
    assert_eq!(first["status"], "pending", "{first}");
    assert!(reason_of(&first).contains("/v1/models"), "{first}");
    assert!(reason_of(&first).contains("302"), "{first}");
    // Registered ready, then its checks bounced: taken out, never polled into a load.
    let second = by_url(&bounced_later);
    assert_eq!(second["status"], "unhealthy", "{second}");
    assert!(second["load"].is_null(), "{second}");
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "nothing reached the target"
    );
    gw.stop();
}

#[actix_rt::test]
async fn link_local_and_metadata_workers_are_refused_without_an_allow_list() {
    let h = Harness::start(1, SimConfig::default(), |_| {});
    for (url, kind) in [
        ("http://169.254.169.254:80", "metadata"),
        ("http://[fd00:ec2::254]:80", "metadata"),
        ("http://100.100.100.200:80", "metadata"),
        ("http://metadata.google.internal:80", "metadata"),
        ("http://169.254.10.1:8000", "link-local"),
        ("http://[fe80::1]:8000", "link-local"),
    ] {
        let r = send(
            "POST",
            &h.url("/workers"),
            &[JSON],
            Some(&json!({"url": url}).to_string()),
        )
        .await;
        r.assert_error(403, "worker_not_allowed");
        let message = r.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        assert!(message.contains(kind), "{url}: {message}");
        send("POST", &h.url(&format!("/add_worker?url={url}")), &[], None)
            .await
            .assert_error(403, "worker_not_allowed");
    }
    assert_eq!(workers(&h.gw).await.len(), 1, "none was added");
}

/// An engine at `127.0.0.1` whose `/server_info` advertises KV events at `host:port`.
fn advertising(host: &str, port: u16) -> String {
    advertising_ranks(host, port, 1)
}

/// Like [`advertising`], with `dp_size` ranks.
fn advertising_ranks(host: &str, port: u16, dp_size: u32) -> String {
    let info = json!({"kv_events": {"publisher": "zmq", "endpoint_host": host,
        "endpoint_port_base": port, "topic": "kv", "block_size": 4, "dp_size": dp_size}})
    .to_string();
    serve(move |path| match path {
        "/v1/models" => json_answer(MODELS),
        "/server_info" => json_answer(&info),
        "/health" => json_answer("{}"),
        _ => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".into(),
    })
    .0
}

/// A TCP listener at `addr` that counts the connections made to it.
fn counting_listener(addr: &str) -> (u16, Arc<AtomicU64>) {
    let listener = TcpListener::bind(addr).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let seen = Arc::new(AtomicU64::new(0));
    let count = seen.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(conn);
        }
    });
    (port, seen)
}

fn events_of(w: &Value) -> (String, String) {
    let e = &w["events"];
    let text = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
    (text("state"), text("reason"))
}

#[actix_rt::test]
async fn an_event_endpoint_outside_the_allow_list_is_never_connected() {
    // 127.0.0.2 is loopback too, but another host than the worker's 127.0.0.1.
    let (port, connects) = counting_listener("127.0.0.2:0");
    let start = |allow: &[&str]| {
        let dir = tempfile::tempdir().expect("dir");
        let mut cfg = test_config(&dir);
        cfg.worker_urls = vec![advertising("127.0.0.2", port)];
        cfg.access.worker_allow = allow.iter().map(|a| (*a).to_owned()).collect();
        (Gateway::start(cfg).expect("gateway"), dir)
    };
    let (gw, _dir) = start(&["127.0.0.1"]);
    let w = until_workers(&gw, "the worker's KV events refused", |ws| {
        ws.first().is_some_and(|w| events_of(w).0 == "refused")
    })
    .await;
    let (_, reason) = events_of(&w[0]);
    assert!(reason.contains("127.0.0.2"), "{reason}");
    assert!(reason.contains("--worker-allow"), "{reason}");
    assert_eq!(w[0]["status"], "ready", "the worker itself still serves");
    assert_eq!(connects.load(Ordering::SeqCst), 0, "no socket was opened");
    gw.stop();
    // A list that names the host lets the subscription connect.
    let (gw, _dir) = start(&["127.0.0.1", "127.0.0.2"]);
    wait_for(10, "a subscription once the host is allowed", || {
        connects.load(Ordering::SeqCst) > 0
    })
    .await;
    gw.stop();
}

#[actix_rt::test]
async fn an_event_endpoint_at_a_metadata_address_is_refused_without_an_allow_list() {
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = vec![advertising("169.254.169.254", 5557)];
    let gw = Gateway::start(cfg).expect("gateway");
    let w = until_workers(&gw, "the worker's KV events refused", |ws| {
        ws.first().is_some_and(|w| events_of(w).0 == "refused")
    })
    .await;
    let (_, reason) = events_of(&w[0]);
    assert!(reason.contains("metadata"), "{reason}");
    gw.stop();
}

#[actix_rt::test]
async fn more_than_1024_event_ranks_are_refused_with_the_reason() {
    // At the worker's own host, so only the rank count is out of bounds; nothing listens
    // there, and no socket may be tried.
    let (port, connects) = counting_listener("127.0.0.1:0");
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = vec![advertising_ranks("127.0.0.1", port, 65_000)];
    let gw = Gateway::start(cfg).expect("gateway");
    let w = until_workers(&gw, "the worker's KV events refused", |ws| {
        ws.first().is_some_and(|w| events_of(w).0 == "refused")
    })
    .await;
    let (_, reason) = events_of(&w[0]);
    assert!(
        reason.contains("65000") && reason.contains("1024"),
        "{reason}"
    );
    assert_eq!(w[0]["status"], "ready", "the worker itself still serves");
    assert_eq!(connects.load(Ordering::SeqCst), 0, "no socket was opened");
    gw.stop();
}

/// The status of a small completion at `url` with `headers`.
async fn ask(url: &str, headers: &[(&str, &str)]) -> u16 {
    let body = json!({"prompt": "x", "max_tokens": 1}).to_string();
    let mut all = vec![JSON];
    all.extend_from_slice(headers);
    send("POST", url, &all, Some(&body)).await.status.as_u16()
}

/// Asserts `text` names no address of `worker` (`http://host:port`) and no OS error.
fn names_no_address(text: &str, worker: &str) {
    let authority = worker.trim_start_matches("http://");
    let port = authority.rsplit_once(':').map_or("", |(_, p)| p);
    for leak in [
        authority,
        "127.0.0.1",
        &format!(":{port}"),
        "os error",
        "connection refused",
    ] {
        assert!(!text.to_lowercase().contains(leak), "{leak:?} in {text}");
    }
}

#[actix_rt::test]
async fn an_upstream_failure_tells_the_client_what_not_where() {
    let Harness {
        fleet,
        gw,
        dir: _dir,
    } = Harness::start(1, SimConfig::default(), |_| {});
    let worker = fleet.urls()[0].clone();
    let chat = format!("{}/v1/chat/completions", gw.url());
    let ask = |stream: bool, id: &'static str| {
        let chat = chat.clone();
        async move {
            let body = json!({"messages": [{"role": "user", "content": "hi"}],
                "stream": stream, "max_tokens": 16})
            .to_string();
            send("POST", &chat, &[JSON, ("x-request-id", id)], Some(&body)).await
        }
    };
    // A streamed answer that breaks off: the error event names no worker.
    fleet
        .engine(0)
        .set_fault(Fault::CrashMidStream { after_chunks: 1 });
    let r = ask(true, "req-broken-stream").await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let (events, done) = sse_events(&r.text());
    assert!(!done);
    let last = events.last().cloned().unwrap_or_default();
    assert_eq!(last["error"]["code"], "upstream_failed", "{last}");
    assert_eq!(last["error"]["request_id"], "req-broken-stream", "{last}");
    names_no_address(&last.to_string(), &worker);
    // An answer that breaks off before anything was sent: a 502 with the request id.
    let r = ask(false, "req-broken").await;
    r.assert_error(502, "upstream_failed");
    names_no_address(&r.text(), &worker);
    assert_eq!(
        r.json()["error"]["request_id"],
        "req-broken",
        "{}",
        r.text()
    );
    assert_eq!(r.header("x-request-id").as_deref(), Some("req-broken"));
    // A worker that refuses the connection.
    fleet.stop();
    let r = ask(false, "req-refused").await;
    r.assert_error(502, "upstream_failed");
    names_no_address(&r.text(), &worker);
    let message = r.json()["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(message.contains("could not connect"), "{message}");
    assert_eq!(r.json()["error"]["request_id"], "req-refused");
    // Every error body the gateway makes carries the id the header carries.
    let r = ask(false, "req-after").await;
    let id = r.header("x-request-id").unwrap_or_default();
    assert_eq!(r.json()["error"]["request_id"], id.as_str(), "{}", r.text());
    // The detail stays where the operator looks: the log, and GET /workers.
    until_workers(&gw, "the refusal in last_error", |w| {
        w[0]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("127.0.0.1"))
    })
    .await;
    gw.stop();
}

#[actix_rt::test]
async fn behind_a_trusted_proxy_each_client_has_its_own_rate_limit() {
    // One request per 100 s per client: a second one is refused, whatever the timing.
    let start = |trusted: &[&str]| {
        let trusted: Vec<String> = trusted.iter().map(|t| (*t).to_owned()).collect();
        Harness::start(1, SimConfig::default(), move |c| {
            c.admission.rate_limit_tokens_per_second = Some(0.01);
            c.access.trusted_proxies = trusted;
        })
    };
    // The suite's client is the peer, at 127.0.0.1: trusted here.
    let h = start(&["127.0.0.0/8"]);
    let url = h.url("/v1/completions");
    assert_eq!(ask(&url, &[("x-forwarded-for", "203.0.113.1")]).await, 200);
    assert_eq!(ask(&url, &[("x-forwarded-for", "203.0.113.2")]).await, 200);
    assert_eq!(ask(&url, &[("forwarded", "for=203.0.113.3")]).await, 200);
    // A client's own header before the proxy's entry changes nothing.
    let spoofed = ("x-forwarded-for", "198.51.100.9, 203.0.113.1");
    assert_eq!(ask(&url, &[spoofed]).await, 429);
    assert_eq!(ask(&url, &[("x-forwarded-for", "203.0.113.2")]).await, 429);
    // Without a header the proxy itself is the client.
    assert_eq!(ask(&url, &[]).await, 200);
    assert_eq!(ask(&url, &[]).await, 429);
    h.gw.stop();

    // Untrusted, the header is anyone's to write: the peer is the client.
    let h = start(&["10.0.0.0/8"]);
    let url = h.url("/v1/completions");
    assert_eq!(ask(&url, &[("x-forwarded-for", "203.0.113.1")]).await, 200);
    assert_eq!(ask(&url, &[("x-forwarded-for", "203.0.113.2")]).await, 429);
    h.gw.stop();
}
