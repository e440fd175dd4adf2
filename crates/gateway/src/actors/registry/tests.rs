use std::time::Duration;

use super::detect::read_server_info;
use super::*;

fn url(s: &str) -> WorkerUrl {
    WorkerUrl::parse(s).unwrap()
}

#[test]
fn a_server_info_field_of_another_type_costs_only_that_field() {
    let v = serde_json::json!({
        "max_running_requests": "48",
        "dp_size": 2,
        "page_size": 16,
        "startup_time": 1764000000.5,
        "kv_events": {"publisher": "zmq", "endpoint_port_base": 5557},
        "other": [1, 2],
    });
    let mut i = Detected::default();
    read_server_info(&mut i, &url("http://w:1"), &v);
    assert_eq!(i.max_running_requests, None);
    assert_eq!((i.dp_size, i.page_size), (Some(2), Some(16)));
    assert_eq!(i.startup_time, Some(1764000000.5));
    assert_eq!(i.kv_events.unwrap()["endpoint_port_base"], 5557);
    let mut off = Detected::default();
    read_server_info(
        &mut off,
        &url("http://w:1"),
        &serde_json::json!({"kv_events": null, "dp_size": -1}),
    );
    assert!(off.kv_events.is_none() && off.dp_size.is_none());
}

fn rec() -> WorkerRecord {
    WorkerRecord {
        status: WorkerStatus::Ready,
        runtime: Runtime::Sglang,
        ..WorkerRecord::pending(url("http://x"), WorkerSource::Config, 1, None)
    }
}

fn check_cfg() -> RegistryConfig {
    RegistryConfig {
        health: HealthConfig {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            failure_threshold: 3,
            success_threshold: 2,
            endpoint: "/health".into(),
        },
        worker_key: None,
        kv_events: None,
    }
}

#[test]
fn health_has_hysteresis() {
    let cfg = check_cfg();
    let mut r = rec();
    let fail = || {
        Err(ProbeError::Status {
            url: "http://x/health".into(),
            status: 503,
        })
    };
    assert!(!settle(&mut r, fail(), &cfg));
    assert!(!settle(&mut r, fail(), &cfg));
    assert!(
        !settle(&mut r, Ok(None), &cfg),
        "a success resets the failure count"
    );
    assert!(!settle(&mut r, fail(), &cfg));
    assert!(!settle(&mut r, fail(), &cfg));
    assert!(settle(&mut r, fail(), &cfg));
    assert_eq!(r.status, WorkerStatus::Unhealthy);
    assert!(!settle(&mut r, Ok(None), &cfg));
    assert!(settle(&mut r, Ok(None), &cfg));
    assert_eq!(r.status, WorkerStatus::Ready);
}

#[test]
fn a_server_info_that_fails_once_leaves_what_was_learned() {
    let cfg = check_cfg();
    let mut r = rec();
    let seen = |startup: f64, info: bool| Detected {
        models: vec!["m".into()],
        runtime: Some(Runtime::Sglang),
        max_running_requests: info.then_some(48),
        startup_time: info.then_some(startup),
        server_info: info,
        ..Detected::default()
    };
    assert!(settle(&mut r, Ok(Some(seen(5.0, true))), &cfg));
    assert_eq!(
        (r.startup_time, r.max_running_requests),
        (Some(5.0), Some(48))
    );
    assert!(
        !settle(&mut r, Ok(Some(seen(0.0, false))), &cfg),
        "nothing changed"
    );
    assert_eq!(
        (r.startup_time, r.max_running_requests),
        (Some(5.0), Some(48))
    );
    assert!(
        settle(&mut r, Ok(Some(seen(9.0, true))), &cfg),
        "a restart is a change"
    );
    assert_eq!(r.startup_time, Some(9.0));
}

/// A loopback server answering every request with 302 to the same path at `to`; the
/// count of requests it read.
fn redirecting(to: &str) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let to = to.to_owned();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut out = conn.try_clone().unwrap();
            let mut reader = BufReader::new(conn);
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let mut h = String::new();
            while reader.read_line(&mut h).is_ok_and(|n| n > 2) {
                h.clear();
            }
            let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
            let _ = write!(
                out,
                "HTTP/1.1 302 Found\r\nlocation: {to}{path}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
        }
    });
    url
}

#[actix_rt::test]
async fn a_redirect_fails_a_probe_and_is_named() {
    // Where the redirect points: nothing listens, so following it would say "connect".
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let to = format!("http://{}", nowhere.local_addr().unwrap());
    drop(nowhere);
    let worker = url(&redirecting(&to));
    let client = detect::client(Duration::from_secs(5));
    let probe = Probe {
        client: &client,
        timeout: Duration::from_secs(5),
        key: None,
    };
    let health = detect::health(probe, &worker, "/health").await;
    let detected = detect(probe, &worker).await;
    for (e, route) in [(health.err(), "/health"), (detected.err(), "/v1/models")] {
        let e = e.expect("a failed probe");
        assert!(
            matches!(&e, ProbeError::Redirect { url, status: 302 } if url.ends_with(route)),
            "{e:?}"
        );
        assert!(e.to_string().contains("redirect refused"), "{e}");
    }
}

#[test]
fn only_a_refused_probe_marks_the_worker_gone() {
    let cfg = check_cfg();
    let mut r = rec();
    let slow = || {
        Err(ProbeError::Status {
            url: "http://x/health".into(),
            status: 503,
        })
    };
    for _ in 0..3 {
        settle(&mut r, slow(), &cfg);
    }
    assert_eq!((r.status, r.refused), (WorkerStatus::Unhealthy, false));
    let refused = Err(ProbeError::Send {
        url: "http://x/health".into(),
        source: awc::error::SendRequestError::Connect(awc::error::ConnectError::Io(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        )),
    });
    assert!(
        settle(&mut r, refused, &cfg),
        "published: its requests move"
    );
    assert!(r.refused);
    assert!(!settle(&mut r, Ok(None), &cfg));
    assert!(!r.refused, "a pass clears it");
}

#[test]
fn sglang_before_the_rename_is_sent_data_parallel_rank() {
    use super::RankVia;
    let with = |runtime: Runtime, version: Option<&str>| WorkerRecord {
        runtime,
        version: version.map(str::to_owned),
        ..rec()
    };
    for (v, field) in [
        (Some("0.5.9"), "data_parallel_rank"),
        (Some("v0.5.9.post2"), "data_parallel_rank"),
        (Some("0.4.10"), "data_parallel_rank"),
        (Some("0.5.10"), "routed_dp_rank"),
        (Some("0.5.10rc1"), "routed_dp_rank"),
        (Some("0.5.23"), "routed_dp_rank"),
        (Some("1.0"), "routed_dp_rank"),
        // Unknown: the current name.
        (Some("main"), "routed_dp_rank"),
        (None, "routed_dp_rank"),
    ] {
        assert_eq!(
            with(Runtime::Sglang, v).rank_via(),
            RankVia::Body(field),
            "{v:?}"
        );
    }
    assert_eq!(
        with(Runtime::Vllm, Some("0.5.9")).rank_via(),
        RankVia::Header
    );
}
