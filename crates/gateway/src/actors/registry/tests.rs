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
