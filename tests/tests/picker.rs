//! kvgate as the endpoint picker of an Envoy-based gateway: the ext_proc protocol spoken as
//! Envoy speaks it (`kvgate_tests::envoy`), against simulated engines. The client forwards
//! each request to the engine the picker named and reports the response back, as Envoy
//! does. The same through a real Envoy is `picker_envoy.rs`.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use kvgate_engine_sim::SimConfig;
use kvgate_tests::envoy::{Answer, Envoy, subset};
use kvgate_tests::{Harness, get, post, wait_for_async};
use serde_json::{Value, json};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn sim() -> SimConfig {
    SimConfig {
        max_running_requests: 16,
        enable_cache_report: true,
        ..SimConfig::default()
    }
}

/// `n` engines and a gateway with the picker on (and its own health port).
fn picker(n: usize, tweak: impl FnOnce(&mut kvgate_gateway::GatewayConfig)) -> Harness {
    Harness::start(n, sim(), |c| {
        c.picker.ext_proc_port = Some(0);
        c.picker.grpc_health_port = Some(0);
        c.seed = Some(11);
        tweak(c);
    })
}

async fn envoy(h: &Harness) -> Envoy {
    Envoy::connect(h.gw.ext_proc_addr().expect("the picker listens")).await
}

/// `IP:PORT` of each engine, in fleet order.
fn endpoints(h: &Harness) -> Vec<String> {
    h.fleet
        .urls()
        .iter()
        .map(|u| {
            u.trim_start_matches("http://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect()
}

/// Each worker's in-flight count, by `IP:PORT`.
async fn in_flight(h: &Harness) -> HashMap<String, u64> {
    let w = get(&h.url("/workers")).await.json();
    w["workers"]
        .as_array()
        .expect("a worker list")
        .iter()
        .map(|w| {
            let url = w["url"].as_str().unwrap_or_default();
            let ep = url.trim_start_matches("http://").trim_end_matches('/');
            (ep.to_owned(), w["in_flight"].as_u64().unwrap_or(u64::MAX))
        })
        .collect()
}

async fn until_idle(h: &Harness) {
    wait_for_async(10, "every booking released", || async {
        in_flight(h).await.values().all(|&n| n == 0)
    })
    .await;
}

fn chat(system: &str, question: &str, stream: bool) -> Vec<u8> {
    let body = json!({
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "max_tokens": 4,
        "stream": stream,
    });
    body.to_string().into_bytes()
}

#[actix_rt::test]
async fn health_answers_for_every_name_the_gateways_probe() {
    let h = picker(1, |_| {});
    let addrs = [h.gw.ext_proc_addr(), h.gw.grpc_health_addr()];
    for addr in addrs.into_iter().map(|a| a.expect("listening")) {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("an endpoint")
            .connect()
            .await
            .expect("health connects");
        let mut c = HealthClient::new(channel);
        for service in [
            "",
            "liveness",
            "readiness",
            "inference-extension",
            "envoy.service.ext_proc.v3.ExternalProcessor",
        ] {
            let r = c
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .expect("a health answer")
                .into_inner();
            assert_eq!(
                r.status,
                ServingStatus::Serving as i32,
                "{addr} {service:?}"
            );
        }
    }
    h.gw.stop();
}

#[actix_rt::test]
async fn readiness_turns_to_not_serving_when_the_gateway_drains() {
    let h = picker(1, |_| {});
    let addr = h.gw.grpc_health_addr().expect("the health port");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("an endpoint")
        .connect()
        .await
        .expect("health connects");
    let mut c = HealthClient::new(channel);
    let Harness { gw, fleet, dir } = h;
    // The drain keeps the listeners up for its delay, readiness already down.
    let drain = std::thread::spawn(move || gw.drain_after(Duration::from_secs(2), Duration::ZERO));
    wait_for_async(10, "readiness not serving", || {
        let mut c = c.clone();
        async move {
            c.check(HealthCheckRequest {
                service: "readiness".into(),
            })
            .await
            .is_ok_and(|r| r.into_inner().status == ServingStatus::NotServing as i32)
        }
    })
    .await;
    let r = c
        .check(HealthCheckRequest {
            service: "envoy.service.ext_proc.v3.ExternalProcessor".into(),
        })
        .await
        .expect("a health answer");
    assert_eq!(r.into_inner().status, ServingStatus::NotServing as i32);
    drain.join().expect("the drain ends");
    drop((fleet, dir));
}

#[actix_rt::test]
async fn a_streamed_request_is_picked_forwarded_and_its_answer_passed_through() {
    let h = picker(2, |_| {});
    let eps = endpoints(&h);
    let e = envoy(&h).await;
    let body = chat("You are terse. ".repeat(40).as_str(), "Say hi.", true);
    let (mut ex, answer) = e.route("/v1/chat/completions", &body, 3, None).await;
    let Answer::Pick {
        header,
        metadata,
        clear_route_cache,
        body: back,
    } = answer.clone()
    else {
        panic!("no pick: {answer:?}");
    };
    assert_eq!(
        header, metadata,
        "the header and the metadata carry one value"
    );
    assert!(clear_route_cache, "Envoy must route again on the header");
    assert_eq!(back, body, "the body goes back whole, in order");
    // The pick first, then the other engine as the fallback.
    let list = answer.endpoints();
    assert_eq!(list.len(), 2, "{list:?}");
    assert_eq!(
        list.iter().collect::<BTreeSet<_>>(),
        eps.iter().collect::<BTreeSet<_>>()
    );
    let picked = &list[0];
    // Booked while the request runs.
    assert_eq!(in_flight(&h).await[picked], 1);
    let reply = post(
        &format!("http://{picked}/v1/chat/completions"),
        body.clone(),
    )
    .await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    let relayed = ex.respond(200, Some(picked), &reply.body, 4).await;
    assert_eq!(
        relayed,
        reply.body.to_vec(),
        "the stream passes through unchanged"
    );
    until_idle(&h).await;
    let metrics = get(&h.url("/metrics")).await.text();
    assert!(
        metrics
            .lines()
            .any(|l| l == "kvgate_front_door_decisions_total{door=\"ext_proc\"} 1"),
        "{metrics}"
    );
    let log = get(&h.url("/admin/decisions")).await.json();
    let last = log["decisions"]
        .as_array()
        .and_then(|d| d.last())
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(last["answer"]["outcome"], "ok", "{last}");
    h.gw.stop();
}

#[actix_rt::test]
async fn a_long_body_goes_back_in_chunks_of_at_most_62000_bytes() {
    let h = picker(2, |_| {});
    let e = envoy(&h).await;
    // About 256 KiB, in two chunks from Envoy: five or more back (`route` checks each).
    let body = chat(&"a long system prompt ".repeat(12_500), "q", false);
    let (mut ex, answer) = e.route("/v1/chat/completions", &body, 2, None).await;
    let Answer::Pick { body: back, .. } = &answer else {
        panic!("no pick: {answer:?}");
    };
    assert_eq!(*back, body);
    ex.respond(200, Some(&answer.endpoints()[0]), b"{}", 1)
        .await;
    until_idle(&h).await;
    h.gw.stop();
}

#[actix_rt::test]
async fn the_http_port_keeps_its_inference_routes_only_when_asked() {
    let body = chat("http door", "q", false);
    let h = picker(1, |_| {});
    let r = post(&h.url("/v1/chat/completions"), body.clone()).await;
    r.assert_error(404, "route_not_found");
    assert_eq!(get(&h.url("/workers")).await.status.as_u16(), 200);
    h.gw.stop();
    let h = picker(1, |c| c.picker.http_inference = true);
    let r = post(&h.url("/v1/chat/completions"), body).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    h.gw.stop();
}

#[actix_rt::test]
async fn the_subset_hint_restricts_the_pick() {
    let h = picker(4, |_| {});
    let eps = endpoints(&h);
    let e = envoy(&h).await;
    for only in [&eps[2], &eps[0]] {
        let body = chat("Subset test.", only, false);
        let md = subset(&[only.as_str(), "10.255.255.1:9"]);
        let (mut ex, answer) = e.route("/v1/chat/completions", &body, 2, Some(md)).await;
        assert_eq!(
            answer.endpoints(),
            vec![only.clone()],
            "only the subset's worker"
        );
        ex.respond(200, Some(only), b"{}", 1).await;
    }
    // A subset with no worker of kvgate's: 503.
    let md = subset(&["10.255.255.1:9"]);
    let (_ex, answer) = e
        .route("/v1/chat/completions", &chat("x", "y", false), 1, Some(md))
        .await;
    let Answer::Refused { status, body } = answer else {
        panic!("picked outside the subset: {answer:?}");
    };
    assert_eq!(status, 503);
    assert_eq!(body["error"]["code"], "no_available_workers", "{body}");
    until_idle(&h).await;
    h.gw.stop();
}

#[actix_rt::test]
async fn no_ready_endpoint_is_an_immediate_503() {
    let h = picker(1, |c| c.worker_urls.clear());
    let e = envoy(&h).await;
    let (_ex, answer) = e
        .route("/v1/chat/completions", &chat("x", "y", false), 2, None)
        .await;
    let Answer::Refused { status, body } = answer else {
        panic!("picked with no worker: {answer:?}");
    };
    assert_eq!(status, 503);
    assert_eq!(body["error"]["code"], "no_available_workers", "{body}");
    assert_eq!(body["error"]["type"], "service_unavailable", "{body}");
    h.gw.stop();
}

#[actix_rt::test]
async fn the_admission_limit_is_an_immediate_429_with_the_json_body() {
    let h = picker(1, |c| {
        c.admission.max_concurrent_requests = Some(1);
        c.admission.queue_size = 0;
    });
    let e = envoy(&h).await;
    // The first request holds the only slot until its response ends.
    let (mut first, answer) = e
        .route("/v1/chat/completions", &chat("a", "b", false), 2, None)
        .await;
    let picked = answer.endpoints()[0].clone();
    let (_second, refused) = e
        .route("/v1/chat/completions", &chat("c", "d", false), 2, None)
        .await;
    let Answer::Refused { status, body } = refused else {
        panic!("admitted past the limit: {refused:?}");
    };
    assert_eq!(status, 429);
    assert_eq!(body["error"]["code"], "queue_full", "{body}");
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    first.respond(200, Some(&picked), b"{}", 1).await;
    // The slot is back: the next request is picked.
    let (mut third, answer) = e
        .route("/v1/chat/completions", &chat("e", "f", false), 1, None)
        .await;
    third
        .respond(200, Some(&answer.endpoints()[0]), b"{}", 1)
        .await;
    h.gw.stop();
}

#[actix_rt::test]
async fn the_served_endpoint_takes_the_booking_and_releases_it_at_the_end() {
    let h = picker(2, |_| {});
    let e = envoy(&h).await;
    let (mut ex, answer) = e
        .route("/v1/chat/completions", &chat("served", "q", false), 2, None)
        .await;
    let list = answer.endpoints();
    let (picked, fallback) = (list[0].clone(), list[1].clone());
    assert_eq!(in_flight(&h).await[&picked], 1);
    // Envoy's first try failed; the fallback served.
    ex.response_headers(200, Some(&fallback)).await;
    let now = in_flight(&h).await;
    assert_eq!((now[&picked], now[&fallback]), (0, 1), "{now:?}");
    ex.close();
    until_idle(&h).await;
    // The same when Envoy reports the pick itself: released when the body ends.
    let (mut ex, answer) = e
        .route("/v1/chat/completions", &chat("served", "r", false), 2, None)
        .await;
    let picked = answer.endpoints()[0].clone();
    ex.respond(200, Some(&picked), br#"{"usage": {"prompt_tokens": 3}}"#, 2)
        .await;
    until_idle(&h).await;
    h.gw.stop();
}

#[actix_rt::test]
async fn prompt_groups_stay_on_one_engine_and_spread_over_the_fleet() {
    let h = picker(4, |_| {});
    h.wait_for_load_reports().await;
    let eps = endpoints(&h);
    let e = envoy(&h).await;
    let systems: Vec<String> = (0..8)
        .map(|g| format!("System prompt {g}: ") + &format!("rules of group {g}; ").repeat(60))
        .collect();
    let mut served: Vec<Vec<usize>> = vec![Vec::new(); 8];
    // Round by round, groups interleaved, each request forwarded to its pick.
    for round in 0..4 {
        for (g, system) in systems.iter().enumerate() {
            let body = chat(system, &format!("question {round} of group {g}"), false);
            let (mut ex, answer) = e.route("/v1/chat/completions", &body, 3, None).await;
            let picked = answer.endpoints()[0].clone();
            let reply = post(&format!("http://{picked}/v1/chat/completions"), body).await;
            assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
            ex.respond(200, Some(&picked), &reply.body, 2).await;
            let i = eps.iter().position(|e| *e == picked).expect("an engine");
            served[g].push(i);
        }
    }
    let together = served
        .iter()
        .filter(|s| s.iter().all(|&i| i == s[0]))
        .count();
    let engines: BTreeSet<usize> = served.iter().map(|s| s[0]).collect();
    assert!(
        together >= 7,
        "groups kept together: {together} of 8: {served:?}"
    );
    assert!(
        engines.len() >= 3,
        "groups over {} engines: {served:?}",
        engines.len()
    );
    until_idle(&h).await;
    // The usage blocks passed back were read: the engines' cache hits are counted.
    let metrics = get(&h.url("/metrics")).await.text();
    let reported = metrics
        .lines()
        .find_map(|l| l.strip_prefix("kvgate_reported_cached_tokens_total "))
        .and_then(|v| v.parse::<f64>().ok());
    assert!(reported.is_some_and(|n| n > 0.0), "{reported:?}");
    h.gw.stop();
}
