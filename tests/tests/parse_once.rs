//! A request's facts are read once per client request, whatever happens to its dispatch:
//! through retries on other workers and through a selector that restarted on it. Alone in
//! its test binary: the count is per process.

use kvgate_engine_sim::{Fault, SimConfig};
use kvgate_gateway::testing::inject::{SelectorPanic, facts_parsed};
use kvgate_tests::{Harness, get, post_json};
use serde_json::json;

#[actix_rt::test]
async fn facts_are_read_once_through_retries_and_a_selector_restart() {
    let h = Harness::start(2, SimConfig::default(), |_| {});
    let chat =
        |text: &str| json!({"messages": [{"role": "user", "content": text}], "max_tokens": 2});

    // Both engines shed: the request is tried on each, then answered with the last 503.
    for i in 0..2 {
        h.fleet.engine(i).set_fault(Fault::ErrorStatus {
            status: 503,
            body: "busy".into(),
        });
    }
    let before = facts_parsed();
    let r = post_json(&h.url("/v1/chat/completions"), &chat("tried twice")).await;
    assert_eq!((r.status.as_u16(), r.text().as_str()), (503, "busy"));
    let log = get(&h.url("/admin/decisions")).await.json();
    let mut tried: Vec<(u64, String)> = (log["decisions"].as_array().expect("decisions").iter())
        .map(|d| (d["attempt"].as_u64().unwrap_or(0), d["worker"].to_string()))
        .collect();
    tried.sort();
    assert_eq!(tried.len(), 2, "{log}");
    assert_eq!((tried[0].0, tried[1].0), (1, 2), "{log}");
    assert_ne!(tried[0].1, tried[1].1, "one attempt on each engine: {log}");
    assert_eq!(facts_parsed() - before, 1, "read once for two attempts");

    // The selector panics on the next decision and restarts; the request asks again.
    for i in 0..2 {
        h.fleet.engine(i).set_fault(Fault::None);
    }
    h.gw.actors()
        .selector
        .send(SelectorPanic)
        .await
        .expect("selector");
    let before = facts_parsed();
    let r = post_json(&h.url("/v1/chat/completions"), &chat("after a restart")).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert_eq!(facts_parsed() - before, 1, "read once across the restart");
}
