//! Retries that cannot multiply load: a budget across requests, a failure the engine may
//! have started retried once at most, and a plain answer that never begins counted as a
//! failure and tried elsewhere once.

use std::time::Duration;

use futures_util::StreamExt;
use kvgate_engine_sim::{Fault, SimConfig};
use kvgate_gateway::GatewayConfig;
use kvgate_policies::PolicyKind;
use kvgate_tests::{Harness, Reply, get, post_json, until_workers};
use serde_json::json;

/// `n` engines behind a round-robin gateway with short backoffs.
fn fleet(n: usize, tweak: impl FnOnce(&mut GatewayConfig)) -> Harness {
    Harness::start(n, SimConfig::default(), |c| {
        c.policy.kind = PolicyKind::RoundRobin;
        c.retry.initial_backoff = Duration::from_millis(1);
        c.retry.max_backoff = Duration::from_millis(5);
        tweak(c);
    })
}

/// Inference requests that reached each engine, faulted ones included.
fn engine_requests(h: &Harness) -> u64 {
    (0..h.fleet.len())
        .map(|i| h.fleet.engine(i).stats().http_requests)
        .sum()
}

/// `n` completions, `in_flight` at a time.
async fn send(h: &Harness, n: usize, in_flight: usize) -> Vec<Reply> {
    let url = h.url("/v1/completions");
    futures_util::stream::iter(0..n)
        .map(|i| {
            let url = url.clone();
            async move {
                let body = json!({"prompt": format!("request {i}"), "max_tokens": 2});
                post_json(&url, &body).await
            }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await
}

fn set_all(h: &Harness, fault: &Fault) {
    for i in 0..h.fleet.len() {
        h.fleet.engine(i).set_fault(fault.clone());
    }
}

fn busy() -> Fault {
    Fault::ErrorStatus {
        status: 503,
        body: "overloaded".into(),
    }
}

#[actix_rt::test]
async fn a_shedding_fleet_gets_at_most_a_fifth_more_requests() {
    // Every circuit stays closed, so nothing but the budget stops the retries.
    let h = fleet(4, |c| c.circuit.disabled = true);
    set_all(&h, &busy());
    let replies = send(&h, 400, 8).await;
    for r in &replies {
        // A retry refused by the budget returns the last answer: the engine's own.
        assert_eq!(r.status.as_u16(), 503, "{}", r.text());
        assert_eq!(r.text(), "overloaded");
    }
    let sent = engine_requests(&h);
    assert!(sent <= 520, "400 requests made {sent} engine requests");
    assert!(sent > 400, "some retries fit in the budget: {sent}");
    let metrics = get(&h.url("/metrics")).await.text();
    let refused = metrics
        .lines()
        .find_map(|l| l.strip_prefix("kvgate_retries_refused_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_default();
    assert!(refused > 0.0, "{metrics}");
}

#[actix_rt::test]
async fn with_the_default_breaker_and_backoff_the_budget_holds_too() {
    // Circuits open and the panic threshold routes across them: still within budget.
    let h = Harness::start(4, SimConfig::default(), |_| {});
    set_all(&h, &busy());
    let replies = send(&h, 400, 16).await;
    assert!(replies.iter().all(|r| r.status.as_u16() == 503));
    let sent = engine_requests(&h);
    assert!(sent <= 520, "400 requests made {sent} engine requests");
}

#[actix_rt::test]
async fn quiet_traffic_still_retries_within_the_floor() {
    let h = fleet(2, |_| {});
    h.fleet.engine(0).set_fault(busy());
    // One request at a time: the share of so few is nothing, the floor lets each retry.
    for _ in 0..3 {
        let r = send(&h, 1, 1).await.remove(0);
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
}

#[actix_rt::test]
async fn a_failure_the_engine_may_have_started_is_retried_once() {
    let h = fleet(4, |c| {
        c.retry.max_retries = 4;
        c.retry.budget_min_per_sec = 1000;
        c.circuit.disabled = true;
    });
    // The answer breaks off mid-body on every engine: one retry, not four attempts.
    set_all(&h, &Fault::CrashMidStream { after_chunks: 1 });
    let r = send(&h, 1, 1).await.remove(0);
    r.assert_error(502, "upstream_failed");
    assert_eq!(engine_requests(&h), 2);
    // A 503 says the engine did not start: every attempt is used.
    set_all(&h, &busy());
    let r = send(&h, 1, 1).await.remove(0);
    assert_eq!(r.status.as_u16(), 503);
    assert_eq!(engine_requests(&h), 2 + 4);
}

#[actix_rt::test]
async fn an_engine_that_hangs_while_healthy_is_left_after_the_first_byte_limit() {
    let h = fleet(2, |c| {
        c.first_byte_timeout = Duration::from_millis(300);
        // Before the limit existed such a request waited for this, then failed.
        c.request_timeout = Duration::from_secs(20);
        c.circuit.failure_threshold = 2;
        c.retry.budget_min_per_sec = 1000;
    });
    h.fleet.engine(0).set_fault(Fault::Hang);
    for _ in 0..6 {
        let r = send(&h, 1, 1).await.remove(0);
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    // Two timeouts opened its circuit: the rest went to the other engine at once.
    assert_eq!(h.fleet.engine(0).stats().http_requests, 2);
    let url = h.fleet.urls()[0].clone();
    until_workers(&h.gw, "the hanging engine's circuit open", |ws| {
        ws.iter()
            .any(|w| w["url"] == url.as_str() && w["circuit"] == "open")
    })
    .await;
    // Hanging everywhere: tried on a second engine, never a third (it may have started).
    let h = fleet(3, |c| {
        c.first_byte_timeout = Duration::from_millis(300);
        c.request_timeout = Duration::from_secs(20);
        c.retry.budget_min_per_sec = 1000;
    });
    set_all(&h, &Fault::Hang);
    let r = send(&h, 1, 1).await.remove(0);
    r.assert_error(502, "upstream_failed");
    assert_eq!(engine_requests(&h), 2);
}
