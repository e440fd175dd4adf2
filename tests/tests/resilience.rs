//! Engines that die, freeze, slow down or refuse, under load: no request that could be
//! saved is lost, and the fleet view says what happened.
#![expect(
    clippy::disallowed_methods,
    reason = "streams and removals in flight while engines fail; the test awaits each"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use kvgate_engine_sim::{Fault, SimConfig};
use kvgate_policies::PolicyKind;
use kvgate_tests::{Harness, get, post_json, sse_events, wait_for, wait_for_async};
use serde_json::{Value, json};

fn sim() -> SimConfig {
    SimConfig {
        max_running_requests: 16,
        ..SimConfig::default()
    }
}

/// Five engines behind a gateway whose health checks run every 200 ms.
fn fleet(tweak: impl FnOnce(&mut kvgate_gateway::GatewayConfig)) -> Harness {
    Harness::start(5, sim(), |c| {
        c.health.interval = Duration::from_millis(200);
        c.health.timeout = Duration::from_millis(200);
        c.health.failure_threshold = 2;
        c.health.success_threshold = 1;
        c.policy.kind = PolicyKind::RoundRobin;
        tweak(c);
    })
}

/// Sends `n` requests, `in_flight` at a time; `done` counts the answers as they come.
/// Returns each request's status and whether a streamed answer ended with `[DONE]`.
async fn load(
    h: &Harness,
    n: usize,
    in_flight: usize,
    stream: bool,
    done: Arc<AtomicUsize>,
) -> Vec<(u16, bool)> {
    let url = h.url("/v1/completions");
    futures_util::stream::iter(0..n)
        .map(|i| {
            let (url, done) = (url.clone(), done.clone());
            async move {
                let body = json!({"prompt": format!("request {i} of the run"), "max_tokens": 4, "stream": stream});
                let r = post_json(&url, &body).await;
                let finished = !stream || sse_events(&r.text()).1;
                done.fetch_add(1, Ordering::SeqCst);
                (r.status.as_u16(), finished)
            }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await
}

fn assert_all_served(results: &[(u16, bool)], n: usize) {
    let ok = results.iter().filter(|(s, f)| *s == 200 && *f).count();
    let failed: Vec<_> = results.iter().filter(|(s, f)| *s != 200 || !*f).collect();
    assert_eq!(ok, n, "failed: {failed:?}");
}

async fn worker(h: &Harness, i: usize) -> Value {
    let url = h.fleet.urls()[i].clone();
    let all = get(&h.url("/workers")).await.json();
    all["workers"]
        .as_array()
        .and_then(|ws| ws.iter().find(|w| w["url"] == url.as_str()).cloned())
        .unwrap_or(Value::Null)
}

/// Runs 400 requests at 16 in flight and applies `fault` to engine 2 once 100 are answered.
async fn run_with_fault(
    h: &Harness,
    stream: bool,
    fault: impl FnOnce() -> futures_util::future::BoxFuture<'static, ()>,
) -> Vec<(u16, bool)> {
    let done = Arc::new(AtomicUsize::new(0));
    let watch = done.clone();
    run_with_fault_when(
        h,
        stream,
        move || watch.load(Ordering::SeqCst) >= 100,
        fault,
        done,
    )
    .await
}

/// Runs 400 requests at 16 in flight and applies `fault` once `when` holds.
async fn run_with_fault_when(
    h: &Harness,
    stream: bool,
    when: impl Fn() -> bool,
    fault: impl FnOnce() -> futures_util::future::BoxFuture<'static, ()>,
    done: Arc<AtomicUsize>,
) -> Vec<(u16, bool)> {
    let trigger = async move {
        while !when() {
            actix_rt::time::sleep(Duration::from_millis(5)).await;
        }
        fault().await;
    };
    let (results, ()) = futures_util::future::join(load(h, 400, 16, stream, done), trigger).await;
    results
}

#[actix_rt::test]
async fn an_engine_killed_mid_run_costs_no_request_and_is_shown_down() {
    let h = fleet(|_| {});
    let victim = h.fleet.handle(2);
    let results = run_with_fault(&h, false, move || {
        Box::pin(async move { victim.kill().await })
    })
    .await;
    assert_all_served(&results, 400);
    let w = worker(&h, 2).await;
    assert_eq!(w["status"], "unhealthy", "{w}");
    assert!(w["reason"].as_str().is_some_and(|r| !r.is_empty()), "{w}");
    // Traffic went on to the other four.
    let served: u64 = (0..5)
        .filter(|&i| i != 2)
        .map(|i| h.fleet.engine(i).stats().completed)
        .sum();
    assert!(served >= 300, "{served}");
}

#[actix_rt::test]
async fn streams_on_an_engine_killed_before_their_first_byte_are_all_served() {
    let h = fleet(|_| {});
    // Engine 2 holds every answer back: its requests are all before their first byte
    // when it dies.
    h.fleet
        .engine(2)
        .set_fault(Fault::Latency(Duration::from_secs(20)));
    let victim = h.fleet.handle(2);
    let held = victim.clone();
    // Killed once three streams wait on it, none of them started.
    let results = run_with_fault_when(
        &h,
        true,
        move || held.stats().http_requests >= 3,
        move || Box::pin(async move { victim.kill().await }),
        Arc::new(AtomicUsize::new(0)),
    )
    .await;
    assert_all_served(&results, 400);
}

#[actix_rt::test]
async fn a_frozen_engine_costs_no_request_and_is_shown_down() {
    let h = fleet(|_| {});
    let e = h.fleet.handle(2);
    let results = run_with_fault(&h, false, move || {
        Box::pin(async move { e.set_fault(Fault::Freeze) })
    })
    .await;
    assert_all_served(&results, 400);
    let w = worker(&h, 2).await;
    assert_eq!(w["status"], "unhealthy", "{w}");
    assert!(
        w["reason"]
            .as_str()
            .map(str::to_ascii_lowercase)
            .is_some_and(|r| r.contains("timeout") || r.contains("timed out")),
        "{w}"
    );
}

#[actix_rt::test]
async fn slow_health_answers_leave_the_waiting_requests_in_place() {
    let h = Harness::start(2, sim(), |c| {
        c.health.interval = Duration::from_millis(100);
        c.health.timeout = Duration::from_millis(100);
        c.health.failure_threshold = 3;
        c.health.success_threshold = 1;
    });
    for i in 0..2 {
        h.fleet
            .engine(i)
            .set_fault(Fault::Latency(Duration::from_secs(3)));
    }
    let url = h.url("/v1/completions");
    let asked = actix_rt::spawn(async move {
        post_json(&url, &json!({"prompt": "wait for me", "max_tokens": 2})).await
    });
    wait_for(10, "the request reaches an engine", || {
        (0..2).any(|i| h.fleet.engine(i).stats().http_requests > 0)
    })
    .await;
    let (x, y) = if h.fleet.engine(0).stats().http_requests > 0 {
        (0, 1)
    } else {
        (1, 0)
    };
    // Its /health now times out (the request already there goes on): three slow answers.
    h.fleet.engine(x).set_fault(Fault::Freeze);
    wait_for_async(10, "the engine marked unhealthy", || async {
        worker(&h, x).await["status"] == "unhealthy"
    })
    .await;
    let r = asked.await.expect("the request task");
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert_eq!(h.fleet.engine(x).stats().completed, 1);
    assert_eq!(
        h.fleet.engine(y).stats().http_requests,
        0,
        "not sent elsewhere"
    );
    // New requests avoid it meanwhile.
    h.fleet.engine(y).set_fault(Fault::None);
    let r = post_json(
        &h.url("/v1/completions"),
        &json!({"prompt": "new", "max_tokens": 2}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert_eq!(h.fleet.engine(y).stats().requests, 1);
}

#[actix_rt::test]
async fn a_slow_engine_costs_no_request() {
    let h = fleet(|_| {});
    let e = h.fleet.handle(2);
    let results = run_with_fault(&h, false, move || {
        Box::pin(async move { e.set_fault(Fault::Latency(Duration::from_millis(300))) })
    })
    .await;
    assert_all_served(&results, 400);
}

#[actix_rt::test]
async fn an_engine_answering_503_costs_no_request_and_its_circuit_opens() {
    let h = fleet(|c| {
        c.circuit.failure_threshold = 5;
        c.circuit.open_for = Duration::from_secs(600);
    });
    let e = h.fleet.handle(2);
    let results = run_with_fault(&h, false, move || {
        Box::pin(async move {
            e.set_fault(Fault::ErrorStatus {
                status: 503,
                body: r#"{"error":"overloaded"}"#.into(),
            })
        })
    })
    .await;
    assert_all_served(&results, 400);
    let w = worker(&h, 2).await;
    assert_eq!(w["circuit"], "open", "{w}");
    assert!(
        w["reason"].as_str().is_some_and(|r| r.contains("circuit")),
        "{w}"
    );
}

#[actix_rt::test]
async fn with_every_worker_failing_the_client_gets_the_last_answer() {
    let h = Harness::start(2, sim(), |c| c.retry.initial_backoff = Duration::ZERO);
    for i in 0..2 {
        h.fleet.engine(i).set_fault(Fault::ErrorStatus {
            status: 503,
            body: r#"{"error":"overloaded"}"#.into(),
        });
    }
    let r = post_json(&h.url("/v1/completions"), &json!({"prompt": "x"})).await;
    assert_eq!(r.status.as_u16(), 503, "{}", r.text());
    assert_eq!(r.json()["error"], "overloaded", "the worker's own answer");
    // Both workers were tried, each once; the third attempt found nobody left.
    for i in 0..2 {
        assert_eq!(h.fleet.engine(i).stats().http_requests, 1, "engine {i}");
    }
}

/// Requests served by engine `i` so far, counting those it failed on purpose.
async fn seen_by(h: &Harness, i: usize) -> u64 {
    let s = get(&format!("{}/sim/stats", h.fleet.urls()[i]))
        .await
        .json();
    s["http_requests"].as_u64().unwrap_or(0)
}

#[actix_rt::test]
async fn the_circuit_opens_probes_one_request_at_a_time_and_closes() {
    let h = Harness::start(2, sim(), |c| {
        c.policy.kind = PolicyKind::RoundRobin;
        c.circuit.failure_threshold = 3;
        c.circuit.success_threshold = 2;
        c.circuit.open_for = Duration::from_millis(1500);
        c.circuit.half_open_max = 1;
        c.retry.initial_backoff = Duration::ZERO;
    });
    let ask = || post_json_ok(&h);
    h.fleet.engine(0).set_fault(Fault::ErrorStatus {
        status: 502,
        body: "bad gateway".into(),
    });
    // Round robin sends every other request to engine 0 until three failures open it;
    // each failure is retried on engine 1, so every client is served.
    for _ in 0..6 {
        ask().await;
    }
    let failed = seen_by(&h, 0).await;
    assert_eq!(failed, 3, "three failures opened the circuit");
    for _ in 0..6 {
        ask().await;
    }
    assert_eq!(seen_by(&h, 0).await, failed, "no traffic while open");
    // Half-open with a slow, healthy engine 0: ten at once, exactly one probe goes there.
    h.fleet
        .engine(0)
        .set_fault(Fault::Latency(Duration::from_secs(2)));
    wait_for_async(10, "the circuit to be half-open", || async {
        worker(&h, 0).await["circuit"] == "half_open"
    })
    .await;
    futures_util::future::join_all((0..10).map(|_| ask())).await;
    assert_eq!(seen_by(&h, 0).await, failed + 1, "one probe at a time");
    // A second successful probe closes it: round robin reaches engine 0 again.
    futures_util::future::join_all((0..2).map(|_| ask())).await;
    wait_for_async(10, "the circuit to close", || async {
        worker(&h, 0).await["circuit"] == "closed"
    })
    .await;
}

async fn post_json_ok(h: &Harness) {
    let r = post_json(
        &h.url("/v1/completions"),
        &json!({"prompt": "hello", "max_tokens": 2}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
}

#[actix_rt::test]
async fn a_drained_worker_finishes_its_stream_before_it_is_removed() {
    let h = Harness::start(
        2,
        SimConfig {
            decode_step_base: Duration::from_millis(40),
            ..sim()
        },
        |c| c.policy.kind = PolicyKind::RoundRobin,
    );
    // A stream of 40 tokens (about a second) on whichever engine gets it.
    let url = h.url("/v1/completions");
    let stream = actix_rt::spawn(async move {
        post_json(
            &url,
            &json!({"prompt": "a long answer", "max_tokens": 150, "stream": true}),
        )
        .await
    });
    wait_for(10, "the stream to run", || {
        (0..2).any(|i| h.fleet.engine(i).stats().running == 1)
    })
    .await;
    let busy = (0..2)
        .find(|&i| h.fleet.engine(i).stats().running == 1)
        .unwrap_or(0);
    let target = h.fleet.urls()[busy].replace(':', "%3A").replace('/', "%2F");
    let del_url = h.url(&format!("/workers/{target}"));
    let removal = actix_rt::spawn(async move { kvgate_tests::delete(&del_url).await });
    wait_for_async(10, "the worker to show as draining", || async {
        worker(&h, busy).await["status"] == "draining"
    })
    .await;
    // New requests go to the other engine meanwhile.
    post_json_ok(&h).await;
    let r = stream.await.expect("stream task");
    let (_, done) = sse_events(&r.text());
    assert!(done, "the stream finished whole: {}", r.text());
    let del = removal.await.expect("removal task");
    assert_eq!(del.status.as_u16(), 200, "{}", del.text());
    assert!(
        worker(&h, busy).await.is_null(),
        "removed after its stream ended"
    );
}

#[actix_rt::test]
async fn a_retried_answer_says_how_many_attempts_it_took() {
    let h = Harness::start(2, sim(), |c| {
        c.policy.kind = PolicyKind::RoundRobin;
        c.retry.initial_backoff = Duration::ZERO;
    });
    h.fleet.engine(0).set_fault(Fault::ErrorStatus {
        status: 503,
        body: "busy".into(),
    });
    let (url, body) = (
        h.url("/v1/completions"),
        json!({"prompt": "x", "max_tokens": 1}),
    );
    let ask = || post_json(&url, &body);
    // Which engine round robin tries first depends on registration order, so
    // the header is checked against what the failing engine actually saw.
    let mut retried = 0;
    for _ in 0..4 {
        let before = h.fleet.engine(0).stats().http_requests;
        let r = ask().await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        let tried_failing = h.fleet.engine(0).stats().http_requests > before;
        let want = tried_failing.then(|| "2".to_string());
        assert_eq!(r.header("x-kvgate-attempts"), want);
        retried += usize::from(tried_failing);
    }
    assert!(
        retried >= 1,
        "round robin tried the failing engine at least once"
    );
    h.fleet.engine(0).set_fault(Fault::None);
    let r = ask().await;
    assert_eq!(
        r.header("x-kvgate-attempts"),
        None,
        "a first attempt says nothing"
    );
}

#[actix_rt::test]
async fn a_selector_restart_leaves_requests_in_flight_alone() {
    use kvgate_gateway::testing::inject::SelectorPanic;
    let h = Harness::start(1, sim(), |_| {});
    h.fleet
        .engine(0)
        .set_fault(Fault::Latency(Duration::from_secs(2)));
    let url = h.url("/v1/completions");
    let slow = actix_rt::spawn(async move {
        post_json(
            &url,
            &json!({"prompt": "in flight across the restart", "max_tokens": 1}),
        )
        .await
    });
    wait_for(10, "the request to reach the engine", || {
        h.fleet.engine(0).stats().http_requests == 1
    })
    .await;
    h.gw.actors()
        .selector
        .send(SelectorPanic)
        .await
        .expect("selector");
    h.fleet.engine(0).set_fault(Fault::None);
    let r = post_json(
        &h.url("/v1/completions"),
        &json!({"prompt": "after", "max_tokens": 1}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let slow = slow.await.expect("slow request");
    assert_eq!(slow.status.as_u16(), 200, "{}", slow.text());
    assert_eq!(
        h.fleet.engine(0).stats().http_requests,
        2,
        "nothing was sent twice"
    );
    wait_for_async(10, "the in-flight count back to 0", || async {
        worker(&h, 0).await["in_flight"] == 0
    })
    .await;
}

/// An attempt that fails before any byte reached the client leaves nothing in the prefix
/// index: the selector takes its record back, so the prompt is not credited to the engine
/// that never cached it.
#[actix_rt::test]
async fn a_failed_attempt_leaves_no_record_in_the_index() {
    let h = Harness::start(2, SimConfig::default(), |c| c.seed = Some(7));
    h.fleet.engine(0).set_fault(Fault::ErrorStatus {
        status: 503,
        body: "busy".into(),
    });
    let failing = h.fleet.urls()[0].clone();
    let mut retried = 0;
    for i in 0..4 {
        let prompt = format!("conversation {i}: {}", "a long shared context. ".repeat(40));
        let r = post_json(
            &h.url("/v1/completions"),
            &json!({"prompt": prompt, "max_tokens": 1}),
        )
        .await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        retried += usize::from(r.header("x-kvgate-attempts").as_deref() == Some("2"));
    }
    assert!(
        retried > 0,
        "no request was tried on the failing engine first"
    );
    let index = get(&h.url("/admin/index")).await.json();
    let units = |url: &str| -> u64 {
        (index["models"].as_array().into_iter().flatten())
            .flat_map(|m| m["per_worker"].as_array().into_iter().flatten())
            .filter(|w| w["url"].as_str() == Some(url))
            .filter_map(|w| w["units"].as_u64())
            .sum()
    };
    assert_eq!(units(&failing), 0, "{index}");
    assert!(units(&h.fleet.urls()[1]) > 0, "{index}");
}
