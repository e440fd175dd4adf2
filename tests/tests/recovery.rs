//! A sick fleet recovers at once: an engine that answers 500 to everything is ejected and
//! comes back when it answers, and a fleet-wide burst of 503s does not leave the fleet
//! dark until the circuits close (the panic threshold).

use std::time::{Duration, Instant};

use kvgate_engine_sim::{Fault, SimConfig};
use kvgate_gateway::GatewayConfig;
use kvgate_policies::PolicyKind;
use kvgate_tests::{Harness, Reply, get, post_json, until_workers};
use serde_json::{Value, json};

async fn complete(h: &Harness, i: usize) -> Reply {
    let body = json!({"prompt": format!("request {i} of the run"), "max_tokens": 2});
    post_json(&h.url("/v1/completions"), &body).await
}

fn broken(status: u16) -> Fault {
    Fault::ErrorStatus {
        status,
        body: "broken".into(),
    }
}

fn round_robin(n: usize, tweak: impl FnOnce(&mut GatewayConfig)) -> Harness {
    Harness::start(n, SimConfig::default(), |c| {
        c.policy.kind = PolicyKind::RoundRobin;
        tweak(c);
    })
}

fn circuit_of(ws: &[Value], url: &str) -> String {
    ws.iter()
        .find(|w| w["url"] == url)
        .and_then(|w| w["circuit"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[actix_rt::test]
async fn an_engine_that_answers_500_to_everything_is_ejected() {
    let h = round_robin(5, |_| {});
    h.fleet.engine(2).set_fault(broken(500));
    let reached = || h.fleet.engine(2).stats().http_requests;
    let mut five_hundreds = 0;
    let mut before_last = 0;
    for i in 0..300 {
        if i == 100 {
            before_last = reached();
        }
        let r = complete(&h, i).await;
        match r.status.as_u16() {
            200 => {}
            // Its 500 goes to the client as it is: no retry.
            500 => {
                assert_eq!(r.text(), "broken");
                five_hundreds += 1;
            }
            s => panic!("{s}: {}", r.text()),
        }
    }
    assert_eq!(reached(), before_last, "none of the last 200 reached it");
    assert_eq!(five_hundreds, reached(), "every 500 went to its client");
    assert_eq!(reached(), 5, "five in a row eject it");
    let url = h.fleet.urls()[2].clone();
    let ws = get(&h.url("/workers")).await.json();
    let ws = ws["workers"].as_array().cloned().unwrap_or_default();
    assert_eq!(circuit_of(&ws, &url), "open");
}

#[actix_rt::test]
async fn an_ejected_engine_returns_when_its_probe_passes() {
    let h = round_robin(2, |c| {
        c.circuit.consecutive_5xx = 2;
        c.circuit.open_for = Duration::from_millis(300);
        c.circuit.success_threshold = 1;
    });
    h.fleet.engine(0).set_fault(broken(500));
    let url = h.fleet.urls()[0].clone();
    for i in 0..6 {
        complete(&h, i).await;
    }
    assert_eq!(h.fleet.engine(0).stats().http_requests, 2);
    h.fleet.engine(0).set_fault(Fault::None);
    until_workers(&h.gw, "the repaired engine's circuit closed again", |ws| {
        circuit_of(ws, &url) != "open"
    })
    .await;
    for i in 0..20 {
        let r = complete(&h, i).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    let served = h.fleet.engine(0).stats().requests;
    assert!(served >= 5, "it serves again: {served}");
    let ws = get(&h.url("/workers")).await.json();
    let ws = ws["workers"].as_array().cloned().unwrap_or_default();
    assert_eq!(circuit_of(&ws, &url), "closed");
}

fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_default()
}

#[actix_rt::test]
async fn a_fleet_wide_burst_of_503s_leaves_no_blackout() {
    // The default policy and breaker: five failures open a circuit for 30 s.
    let h = Harness::start(4, SimConfig::default(), |_| {});
    for i in 0..4 {
        h.fleet.engine(i).set_fault(broken(503));
    }
    // The scenario's shape is timed; what is asserted is counts, never durations.
    let burst = Instant::now();
    let mut i = 0;
    while burst.elapsed() < Duration::from_secs(2) {
        let r = complete(&h, i).await;
        assert_eq!(r.status.as_u16(), 503, "{}", r.text());
        i += 1;
    }
    let ws = get(&h.url("/workers")).await.json();
    let ws = ws["workers"].as_array().cloned().unwrap_or_default();
    let open = ws.iter().filter(|w| w["circuit"] == "open").count();
    assert!(open > 2, "most circuits opened: {ws:?}");
    // Still routable, so still ready.
    let ready = get(&h.url("/readiness")).await;
    assert_eq!(ready.status.as_u16(), 200, "{}", ready.text());
    for e in 0..4 {
        h.fleet.engine(e).set_fault(Fault::None);
    }
    actix_rt::time::sleep(Duration::from_secs(3)).await;
    let mut ok = 0;
    for n in 0..50 {
        let r = complete(&h, i + n).await;
        ok += usize::from(r.status.as_u16() == 200);
    }
    assert!(ok >= 48, "{ok} of 50 served after the fleet recovered");
    // Said in the decision and in a metric.
    let log = get(&h.url("/admin/decisions?limit=1")).await.json();
    let notes = &log["decisions"][0]["notes"];
    assert!(
        notes
            .as_array()
            .is_some_and(|n| n.contains(&json!("panic"))),
        "{log}"
    );
    let body = json!({"prompt": "explain me"});
    let explained = post_json(&h.url("/admin/explain/v1/completions"), &body).await;
    assert!(
        explained.json()["notes"]
            .as_array()
            .is_some_and(|n| n.contains(&json!("panic"))),
        "{}",
        explained.text()
    );
    let metrics = get(&h.url("/metrics")).await.text();
    assert!(
        counter(&metrics, "kvgate_panic_routed_total ") >= 50.0,
        "{metrics}"
    );
}

#[actix_rt::test]
async fn a_restarted_engine_is_routed_to_again_without_waiting_out_its_circuit() {
    let mut h = round_robin(2, |c| {
        c.health.interval = Duration::from_millis(100);
        c.circuit.failure_threshold = 1;
        c.circuit.open_for = Duration::from_secs(3600);
    });
    let url = h.fleet.urls()[0].clone();
    h.fleet.handle(0).kill().await;
    // Its refusals open its circuit; every request is served by the other engine.
    for i in 0..4 {
        assert_eq!(complete(&h, i).await.status.as_u16(), 200);
    }
    until_workers(&h.gw, "the killed engine's circuit open", |ws| {
        circuit_of(ws, &url) == "open"
    })
    .await;
    h.fleet.revive(0).expect("the engine starts again");
    until_workers(&h.gw, "the restarted engine routable", |ws| {
        circuit_of(ws, &url) == "closed"
            && ws.iter().any(|w| w["url"] == url && w["healthy"] == true)
    })
    .await;
    for i in 4..12 {
        assert_eq!(complete(&h, i).await.status.as_u16(), 200);
    }
    assert_eq!(
        h.fleet.engine(0).stats().http_requests,
        4,
        "round robin: half of 8"
    );
}
