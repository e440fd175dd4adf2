//! Every error the gateway produces has an OpenAI-style body and the right status.

use std::io::{Read, Write};
use std::time::Duration;

use kvgate_engine_sim::{Fault, SimConfig};
use kvgate_tests::{Harness, get, post, post_json, test_config};
use serde_json::json;

#[actix_rt::test]
async fn bad_requests_are_400_and_reach_no_worker() {
    let h = Harness::start(1, SimConfig::default(), |_| {});
    let url = h.url("/v1/chat/completions");
    post(&url, "{not json")
        .await
        .assert_error(400, "json_parse_error");
    post(&url, "").await.assert_error(400, "json_parse_error");
    post(&url, "[1,2,3]")
        .await
        .assert_error(400, "invalid_request");
    post(&url, r#"{"messages":"hello"}"#)
        .await
        .assert_error(400, "invalid_request");
    post(&url, r#"{"messages":[],"stream":"yes"}"#)
        .await
        .assert_error(400, "invalid_request");
    post(&h.url("/v1/completions"), b"{\"prompt\":\"\xff\"}".to_vec())
        .await
        .assert_error(400, "json_parse_error");
    let deep = format!(
        "{{\"prompt\":{}1{}}}",
        "[".repeat(200_000),
        "]".repeat(200_000)
    );
    post(&h.url("/v1/completions"), deep)
        .await
        .assert_error(400, "json_parse_error");
    post(&h.url("/generate"), r#"{"sampling_params":{}}"#)
        .await
        .assert_error(400, "invalid_request");
    assert_eq!(h.split(), vec![0], "no bad request reached the engine");
    // The gateway is still fine afterwards.
    let r = post_json(
        &h.url("/v1/completions"),
        &json!({"prompt": "ok", "max_tokens": 1}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200);
}

#[actix_rt::test]
async fn routing_errors() {
    let h = Harness::start(1, SimConfig::default(), |_| {});
    post_json(
        &h.url("/v1/completions"),
        &json!({"model": "nope", "prompt": "x"}),
    )
    .await
    .assert_error(404, "model_not_found");
    get(&h.url("/v2/unknown"))
        .await
        .assert_error(404, "route_not_found");
    // Under /v1/ the error lists what is served.
    let r = post_json(&h.url("/v1/images/generations"), &json!({"prompt": "x"})).await;
    r.assert_error(404, "route_not_found");
    let msg = r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        msg.contains("POST /v1/embeddings") && msg.contains("POST /v1/chat/completions"),
        "{msg}"
    );
    let m = get(&h.url("/v1/models/kvgate-sim-model")).await;
    assert_eq!(m.status.as_u16(), 200, "{}", m.text());
    assert_eq!(
        (m.json()["id"].as_str(), m.json()["object"].as_str()),
        (Some("kvgate-sim-model"), Some("model"))
    );
    get(&h.url("/v1/models/org/nope"))
        .await
        .assert_error(404, "model_not_found");
    get(&h.url("/v1/chat/completions"))
        .await
        .assert_error(405, "method_not_allowed");
    kvgate_tests::delete(&h.url("/health"))
        .await
        .assert_error(405, "method_not_allowed");
}

#[actix_rt::test]
async fn oversized_bodies_are_refused_from_the_declared_length() {
    let h = Harness::start(1, SimConfig::default(), |c| c.max_payload_size = 1024);
    let r = post(
        &h.url("/v1/completions"),
        format!("{{\"prompt\":\"{}\"}}", "a".repeat(2000)),
    )
    .await;
    r.assert_error(413, "payload_too_large");
    // Only the head is sent: the 413 must come without the body ever being read.
    let mut s = std::net::TcpStream::connect(h.gw.addr()).unwrap();
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10000000\r\n\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(head.contains("payload_too_large"), "{head}");
    assert_eq!(h.split(), vec![0]);
}

#[actix_rt::test]
async fn admin_body_errors_are_json_errors_too() {
    let h = Harness::start(1, SimConfig::default(), |_| {});
    let url = h.url("/workers");
    // Over the admin body limit (1 MiB), as declared and as sent.
    let big = format!("{{\"url\":\"{}\"}}", "a".repeat(2 << 20));
    post(&url, big).await.assert_error(413, "payload_too_large");
    post(&url, "{not json")
        .await
        .assert_error(400, "json_parse_error");
    post(&url, r#"{"url": 5}"#)
        .await
        .assert_error(400, "invalid_request");
    // A chunked body that breaks off is a 400, not a bare text answer.
    let mut s = std::net::TcpStream::connect(h.gw.addr()).unwrap();
    s.write_all(b"POST /workers HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("\"code\":\"invalid_request\""), "{answer}");
    let r = get(&h.url("/workers")).await;
    assert_eq!(r.json()["workers"].as_array().map(Vec::len), Some(1));
}

#[actix_rt::test]
async fn no_worker_is_503_until_one_is_added() {
    let dir = tempfile::tempdir().unwrap();
    let gw = kvgate_gateway::Gateway::start(test_config(&dir)).unwrap();
    let url = gw.url();
    post_json(&format!("{url}/v1/completions"), &json!({"prompt": "x"}))
        .await
        .assert_error(503, "no_available_workers");
    let r = get(&format!("{url}/readiness")).await;
    assert_eq!(r.status.as_u16(), 503);
    assert_eq!(r.json()["status"], "not ready");
    assert_eq!(get(&format!("{url}/health")).await.status.as_u16(), 200);

    let fleet = kvgate_engine_sim::SimFleet::start(1, SimConfig::default()).unwrap();
    let r = post_json(&format!("{url}/workers"), &json!({"url": fleet.urls()[0]})).await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let r = get(&format!("{url}/readiness")).await;
    assert_eq!(r.status.as_u16(), 200);
    assert_eq!(r.json()["healthy_workers"], 1);
    let r = post_json(
        &format!("{url}/v1/completions"),
        &json!({"prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200);
}

#[actix_rt::test]
async fn upstream_errors_pass_through_unchanged() {
    let h = Harness::start(1, SimConfig::default(), |_| {});
    let body = r#"{"error":{"message":"engine says no","type":"BadRequest","code":400}}"#;
    h.fleet.engine(0).set_fault(Fault::ErrorStatus {
        status: 400,
        body: body.into(),
    });
    let r = post_json(&h.url("/v1/completions"), &json!({"prompt": "x"})).await;
    assert_eq!(r.status.as_u16(), 400);
    assert_eq!(r.text(), body);
    h.fleet.engine(0).set_fault(Fault::ErrorStatus {
        status: 503,
        body: "overloaded".into(),
    });
    let r = post_json(&h.url("/v1/completions"), &json!({"prompt": "x"})).await;
    assert_eq!((r.status.as_u16(), r.text().as_str()), (503, "overloaded"));
}

#[actix_rt::test]
async fn a_hung_worker_is_504() {
    let h = Harness::start(1, SimConfig::default(), |c| {
        c.request_timeout = Duration::from_millis(300)
    });
    h.fleet.engine(0).set_fault(Fault::Hang);
    post_json(&h.url("/v1/completions"), &json!({"prompt": "x"}))
        .await
        .assert_error(504, "upstream_timeout");
    let w = get(&h.url("/workers")).await.json();
    assert_eq!(w["workers"][0]["in_flight"], 0);
}

#[actix_rt::test]
async fn a_dead_worker_is_502() {
    let fleet = kvgate_engine_sim::SimFleet::start(1, SimConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = test_config(&dir);
    cfg.worker_urls = fleet.urls();
    let gw = kvgate_gateway::Gateway::start(cfg).unwrap();
    // Registered and healthy, then gone before the next health check.
    fleet.stop();
    post_json(
        &format!("{}/v1/completions", gw.url()),
        &json!({"prompt": "x"}),
    )
    .await
    .assert_error(502, "upstream_failed");
}
