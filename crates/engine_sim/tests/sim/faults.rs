//! Each injected fault, as a client sees it.

use std::time::Duration;

use awc::http::StatusCode;
use kvgate_engine_sim::Fault;
use serde_json::{Value, json};

use crate::support::{
    endless, fast, get, one, post, post_json, raw_post, read_to_close, sse_data, wait_until,
};

fn body(max_new: u64, stream: bool) -> Value {
    json!({"text": "abcdefgh", "stream": stream, "sampling_params": {"max_new_tokens": max_new}})
}

#[actix_rt::test]
async fn latency_delays_but_still_answers() {
    let (fleet, url) = one(fast());
    fleet
        .engine(0)
        .set_fault(Fault::Latency(Duration::from_millis(50)));
    let answer = post_json(&format!("{url}/generate"), &body(2, false)).await;
    assert_eq!(answer["meta_info"]["completion_tokens"], 2);
    assert_eq!(fleet.engine(0).stats().completed, 1);
}

#[actix_rt::test]
async fn error_status_answers_the_given_status_and_body() {
    let (fleet, url) = one(fast());
    fleet.engine(0).set_fault(Fault::ErrorStatus {
        status: 503,
        body: "{\"error\":\"overloaded\"}".into(),
    });
    for path in ["/generate", "/v1/completions", "/v1/chat/completions"] {
        let (status, raw) = post(&format!("{url}{path}"), &json!({})).await;
        assert_eq!(
            (status, &raw[..]),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                &b"{\"error\":\"overloaded\"}"[..]
            )
        );
    }
    assert_eq!(get(&format!("{url}/health")).await.0, StatusCode::OK);
    assert_eq!(fleet.engine(0).stats().requests, 0);
}

#[actix_rt::test]
async fn hang_accepts_and_never_answers() {
    let (fleet, url) = one(fast());
    fleet.engine(0).set_fault(Fault::Hang);
    let client = awc::Client::builder()
        .timeout(Duration::from_millis(200))
        .finish();
    let outcome = client
        .post(format!("{url}/generate"))
        .send_json(&body(1, false))
        .await;
    assert!(
        matches!(outcome, Err(awc::error::SendRequestError::Timeout)),
        "{outcome:?}"
    );
    assert_eq!(fleet.engine(0).stats().requests, 0);

    fleet.engine(0).set_fault(Fault::None);
    post_json(&format!("{url}/generate"), &body(1, false)).await;
}

#[actix_rt::test]
async fn crash_mid_stream_drops_the_connection_after_n_chunks() {
    let (fleet, url) = one(endless());
    fleet
        .engine(0)
        .set_fault(Fault::CrashMidStream { after_chunks: 2 });
    let mut conn = raw_post(&url, "/generate", &body(30_000, true));
    let answer = read_to_close(&mut conn);
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert_eq!(answer.matches("data: ").count(), 2, "{answer}");
    assert!(!answer.contains("[DONE]"));
    assert!(
        !answer.ends_with("0\r\n\r\n"),
        "no terminating chunk: {answer}"
    );
    wait_until("the request is aborted", || {
        fleet.engine(0).stats().aborted == 1
    })
    .await;

    // Whole-body requests get the head and half the body, then the connection drops.
    let mut conn = raw_post(&url, "/generate", &body(2, false));
    let answer = read_to_close(&mut conn);
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    let json_start = answer.find('{').unwrap();
    assert!(serde_json::from_str::<Value>(&answer[json_start..]).is_err());
}

#[actix_rt::test]
async fn malformed_body_is_200_and_not_json() {
    let (fleet, url) = one(fast());
    fleet.engine(0).set_fault(Fault::MalformedBody);
    let (status, raw) = post(&format!("{url}/v1/completions"), &json!({"prompt": "abcd"})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(serde_json::from_slice::<Value>(&raw).is_err());

    let (status, raw) = post(
        &format!("{url}/v1/chat/completions"),
        &json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let data = sse_data(&raw);
    assert!(data.len() > 1);
    for frame in &data[..data.len() - 1] {
        assert!(serde_json::from_str::<Value>(frame).is_err(), "{frame}");
    }
}

#[actix_rt::test]
async fn health_down_fails_health_routes_only() {
    let (fleet, url) = one(fast());
    fleet.engine(0).set_fault(Fault::HealthDown);
    for path in ["/health", "/health_generate", "/ready"] {
        assert_eq!(
            get(&format!("{url}{path}")).await.0,
            StatusCode::SERVICE_UNAVAILABLE,
            "{path}"
        );
    }
    post_json(&format!("{url}/generate"), &body(1, false)).await;
    fleet.engine(0).set_fault(Fault::None);
    assert_eq!(get(&format!("{url}/health")).await.0, StatusCode::OK);
}
