//! Keys, the admin boundary, the worker allow-list, the keys sent to workers, and
//! overload answered with 429 and `Retry-After`.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::time::Duration;

use kvgate_engine_sim::{Fault, SimConfig, SimFleet};
use kvgate_gateway::{AccessConfig, Gateway, GatewayConfig, Secret, StartError};
use kvgate_tests::{Harness, Reply, client, test_config};
use serde_json::json;

async fn send(
    method: &str,
    url: &str,
    key: Option<&str>,
    body: Option<serde_json::Value>,
) -> Reply {
    let c = client();
    let mut req = match method {
        "GET" => c.get(url),
        "DELETE" => c.delete(url),
        _ => c.post(url),
    };
    if let Some(k) = key {
        req = req.insert_header(("authorization", format!("Bearer {k}")));
    }
    let resp = match body {
        Some(b) => req.send_json(&b).await,
        None => req.send().await,
    }
    .expect("request sent");
    kvgate_tests::finish_reply(resp).await
}

/// `n` completions sent at once, their answers in order.
async fn at_once(h: &Harness, n: usize) -> Vec<Reply> {
    let url = h.url("/v1/completions");
    let body = json!({"prompt": "x", "max_tokens": 1});
    futures_util::future::join_all((0..n).map(|_| send("POST", &url, None, Some(body.clone()))))
        .await
}

fn keyed(c: &mut GatewayConfig) {
    c.access.api_keys = vec![Secret::new("sk-client")];
    c.access.control_plane_api_keys = vec![Secret::new("ops:Ops:admin:sk-admin")];
}

#[actix_rt::test]
async fn client_keys_open_inference_and_models_only() {
    let h = Harness::start(1, SimConfig::default(), keyed);
    let chat = h.url("/v1/chat/completions");
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    send("POST", &chat, None, Some(body.clone()))
        .await
        .assert_error(401, "invalid_api_key");
    send("POST", &chat, Some("sk-wrong"), Some(body.clone()))
        .await
        .assert_error(401, "invalid_api_key");
    let ok = send("POST", &chat, Some("sk-client"), Some(body.clone())).await;
    assert_eq!(ok.status.as_u16(), 200, "{}", ok.text());
    send("GET", &h.url("/v1/models"), None, None)
        .await
        .assert_error(401, "invalid_api_key");
    assert_eq!(
        send("GET", &h.url("/v1/models"), Some("sk-client"), None)
            .await
            .status
            .as_u16(),
        200
    );
    // The client key does not open the admin routes; the admin key does.
    for (m, path) in [
        ("GET", "/workers"),
        ("GET", "/list_workers"),
        ("POST", "/flush_cache"),
        ("GET", "/admin/index"),
        ("POST", "/admin/explain/v1/chat/completions"),
        ("GET", "/admin/decisions"),
        ("POST", "/add_worker?url=http://127.0.0.1:1"),
    ] {
        send(m, &h.url(path), Some("sk-client"), None)
            .await
            .assert_error(403, "forbidden");
        send(m, &h.url(path), None, None)
            .await
            .assert_error(401, "invalid_api_key");
    }
    let w = send("GET", &h.url("/workers"), Some("sk-admin"), None).await;
    assert_eq!(w.status.as_u16(), 200, "{}", w.text());
    // Probes stay open: a load balancer has no key.
    assert_eq!(
        send("GET", &h.url("/health"), None, None)
            .await
            .status
            .as_u16(),
        200
    );
    // No answer echoes a key back.
    for r in [w, ok] {
        assert!(!r.text().contains("sk-"), "{}", r.text());
    }
}

#[actix_rt::test]
async fn a_non_loopback_bind_without_an_admin_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = GatewayConfig {
        host: "0.0.0.0".into(),
        ..test_config(&dir)
    };
    match Gateway::start(cfg.clone()) {
        Err(StartError::OpenAdmin { host }) => assert_eq!(host, "0.0.0.0"),
        other => panic!("started: {other:?}"),
    }
    let open = Gateway::start(GatewayConfig {
        access: AccessConfig {
            allow_open_admin: true,
            ..Default::default()
        },
        ..cfg.clone()
    })
    .expect("allowed on purpose");
    open.stop();
    let keyed = Gateway::start(GatewayConfig {
        access: AccessConfig {
            control_plane_api_keys: vec![Secret::new("sk-admin")],
            ..Default::default()
        },
        ..cfg
    })
    .expect("an admin key closes the admin routes");
    keyed.stop();
}

#[actix_rt::test]
async fn workers_outside_the_allow_list_are_refused() {
    let fleet = SimFleet::start(1, SimConfig::default()).expect("engine");
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(GatewayConfig {
        access: AccessConfig {
            worker_allow: vec!["10.0.0.0/8".into(), "127.0.0.1".into()],
            ..Default::default()
        },
        ..test_config(&dir)
    })
    .expect("gateway");
    let add = |url: String| {
        let gw = gw.url();
        async move {
            send(
                "POST",
                &format!("{gw}/workers"),
                None,
                Some(json!({"url": url})),
            )
            .await
        }
    };
    add("http://192.168.1.1:8000".into())
        .await
        .assert_error(403, "worker_not_allowed");
    let ok = add(fleet.urls()[0].clone()).await;
    assert_eq!(ok.status.as_u16(), 201, "{}", ok.text());
    // The legacy form is checked too.
    send(
        "POST",
        &format!("{}/add_worker?url=http://172.16.0.1:1", gw.url()),
        None,
        None,
    )
    .await
    .assert_error(403, "worker_not_allowed");
    gw.stop();
}

#[actix_rt::test]
async fn the_worker_key_replaces_the_clients_and_is_never_shown() {
    let sim = SimConfig {
        api_key: Some("sk-engine".into()),
        ..SimConfig::default()
    };
    let h = Harness::start(1, sim, |c| {
        c.access.worker_api_key = Some(Secret::new("sk-engine"));
        c.access.api_keys = vec![Secret::new("sk-client")];
        c.access.allow_open_admin = true;
    });
    // Registration probed with the key: the worker is ready.
    let w = send("GET", &h.url("/workers"), None, None).await;
    assert_eq!(w.json()["workers"][0]["status"], "ready", "{}", w.text());
    assert!(!w.text().contains("sk-engine"), "{}", w.text());
    let r = send(
        "POST",
        &h.url("/v1/completions"),
        Some("sk-client"),
        Some(json!({"prompt": "x", "max_tokens": 2})),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    // A worker added through the API with its own key.
    let other = SimFleet::start(
        1,
        SimConfig {
            api_key: Some("sk-other".into()),
            ..SimConfig::default()
        },
    )
    .expect("engine");
    let added = send(
        "POST",
        &h.url("/workers"),
        None,
        Some(json!({"url": other.urls()[0], "api_key": "sk-other"})),
    )
    .await;
    assert_eq!(added.status.as_u16(), 201, "{}", added.text());
    assert_eq!(added.json()["status"], "ready", "{}", added.text());
    assert!(!added.text().contains("sk-other"));
}

#[actix_rt::test]
async fn a_full_queue_is_429_with_retry_after_and_exactly_limit_plus_queue_are_served() {
    let h = Harness::start(1, SimConfig::default(), |c| {
        c.admission.max_concurrent_requests = Some(8);
        c.admission.queue_size = 8;
        c.admission.queue_timeout = Duration::from_secs(60);
    });
    // Every answer takes a while, so all 100 arrive while the first 8 run.
    h.fleet
        .engine(0)
        .set_fault(Fault::Latency(Duration::from_secs(4)));
    let all = at_once(&h, 100).await;
    let ok = all.iter().filter(|r| r.status.as_u16() == 200).count();
    let refused: Vec<&Reply> = all.iter().filter(|r| r.status.as_u16() == 429).collect();
    assert_eq!((ok, refused.len()), (16, 84));
    for r in refused {
        r.assert_error(429, "queue_full");
        assert!(
            r.header("retry-after")
                .is_some_and(|v| v.parse::<u64>().is_ok())
        );
    }
}

#[actix_rt::test]
async fn a_queue_wait_past_its_timeout_is_503_with_retry_after() {
    let h = Harness::start(1, SimConfig::default(), |c| {
        c.admission.max_concurrent_requests = Some(1);
        c.admission.queue_size = 4;
        c.admission.queue_timeout = Duration::from_millis(200);
    });
    h.fleet
        .engine(0)
        .set_fault(Fault::Latency(Duration::from_millis(1500)));
    let all = at_once(&h, 3).await;
    let codes: Vec<u16> = all.iter().map(|r| r.status.as_u16()).collect();
    assert_eq!(codes.iter().filter(|c| **c == 200).count(), 1, "{codes:?}");
    for r in all.iter().filter(|r| r.status.as_u16() != 200) {
        r.assert_error(503, "queue_timeout");
        assert!(r.header("retry-after").is_some());
    }
}

/// A client on a raw socket that sends a request head and then one body byte a second
/// until the returned flag is set.
fn slow_uploader(gateway: &str) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let addr = gateway.trim_start_matches("http://").to_owned();
    let flag = stop.clone();
    std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(&addr).expect("connect");
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: 200\r\n\r\n{{"
        );
        s.write_all(head.as_bytes()).expect("head sent");
        while !flag.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1000));
            if s.write_all(b" ").is_err() {
                return;
            }
        }
    });
    stop
}

#[actix_rt::test]
async fn slow_uploads_hold_no_admission_slot() {
    let h = Harness::start(1, SimConfig::default(), |c| {
        c.admission.max_concurrent_requests = Some(2);
        c.admission.queue_size = 0;
    });
    let uploaders = [slow_uploader(&h.gw.url()), slow_uploader(&h.gw.url())];
    // Their heads are in and their handlers wait on the bodies.
    actix_rt::time::sleep(Duration::from_millis(500)).await;
    let asked = client()
        .post(h.url("/v1/completions"))
        .timeout(Duration::from_secs(5))
        .send_json(&json!({"prompt": "x", "max_tokens": 1}));
    let r = kvgate_tests::finish_reply(asked.await.expect("answered within 5 s")).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    for u in uploaders {
        u.store(true, std::sync::atomic::Ordering::Release);
    }
}

#[actix_rt::test]
async fn the_rate_limit_is_per_client_key() {
    let h = Harness::start(1, SimConfig::default(), |c| {
        c.admission.rate_limit_tokens_per_second = Some(2.0);
        c.access.api_keys = vec![Secret::new("sk-a"), Secret::new("sk-b")];
    });
    let url = h.url("/v1/completions");
    let body = json!({"prompt": "x", "max_tokens": 1});
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(send("POST", &url, Some("sk-a"), Some(body.clone())).await);
    }
    // The bucket holds two: the third and fourth of a quick burst are refused.
    assert_eq!(
        codes.iter().map(|r| r.status.as_u16()).collect::<Vec<_>>()[..2],
        [200, 200]
    );
    let limited = codes.iter().filter(|r| r.status.as_u16() == 429).count();
    assert!(limited >= 1, "a burst of 4 at 2/s");
    for r in codes.iter().filter(|r| r.status.as_u16() == 429) {
        r.assert_error(429, "rate_limited");
        assert!(r.header("retry-after").is_some());
    }
    // Another key has its own bucket.
    let other = send("POST", &url, Some("sk-b"), Some(body)).await;
    assert_eq!(other.status.as_u16(), 200);
}

#[actix_rt::test]
async fn a_gateway_key_is_never_forwarded_to_an_engine() {
    use kvgate_tests::raw::{RawUpstream, Script};
    let up = RawUpstream::start(Script {
        status: 200,
        content_type: "application/json",
        chunks: vec![b"{}".to_vec()],
        crash: false,
    });
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(GatewayConfig {
        worker_urls: vec![up.url.clone()],
        access: AccessConfig {
            api_keys: vec![Secret::new("sk-client")],
            ..Default::default()
        },
        ..test_config(&dir)
    })
    .expect("gateway");
    let r = send(
        "POST",
        &format!("{}/v1/completions", gw.url()),
        Some("sk-client"),
        Some(json!({"prompt": "x"})),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let seen = up.seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 1);
    let head = seen[0].0.to_ascii_lowercase();
    assert!(!head.contains("authorization"), "{head}");
    assert!(!head.contains("sk-client"), "{head}");
    gw.stop();
}

#[test]
fn user_role_entries_and_keys_with_spaces_are_refused() {
    for (key, value) in [
        ("control_plane_api_keys", "ops:Ops:user:sk-x"),
        ("api_keys", "sk with space"),
    ] {
        let e = GatewayConfig::load(
            None,
            &std::collections::HashMap::new(),
            vec![(key.to_owned(), vec![value.to_owned()].into())],
        )
        .expect_err("refused");
        assert!(e.to_string().contains(key), "{e}");
    }
}
