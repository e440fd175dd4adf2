//! The orderly end under a load balancer: after SIGTERM readiness turns at once, the
//! listener keeps accepting for `--shutdown-delay-secs`, then the gateway drains and stops.

use std::time::Duration;

use kvgate_engine_sim::{SimConfig, SimFleet};
use kvgate_gateway::Gateway;
use kvgate_tests::{get, post_json, test_config, wait_for_async};
use serde_json::json;

#[actix_rt::test]
async fn readiness_turns_at_once_and_the_listener_accepts_for_the_delay() {
    let fleet = SimFleet::start(1, SimConfig::default()).expect("engine");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = fleet.urls();
    let gw = Gateway::start(cfg).expect("gateway");
    let (url, addr) = (gw.url(), gw.addr());
    assert_eq!(get(&format!("{url}/readiness")).await.status.as_u16(), 200);

    // What the binary does on SIGTERM with --shutdown-delay-secs 3.
    let stop = std::thread::spawn(move || {
        gw.drain_after(Duration::from_secs(3), Duration::from_secs(5));
    });
    wait_for_async(3, "readiness 503 once the end began", || async {
        get(&format!("{url}/readiness")).await.status.as_u16() == 503
    })
    .await;
    // Within the delay a new connection is still taken and served.
    let fresh = kvgate_tests::client();
    let r = fresh
        .post(format!("{url}/v1/completions"))
        .send_json(&json!({"prompt": "during the delay", "max_tokens": 1}))
        .await
        .expect("accepted during the delay");
    assert_eq!(r.status().as_u16(), 200);
    let r = post_json(
        &format!("{url}/v1/completions"),
        &json!({"prompt": "again", "max_tokens": 1}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200);

    stop.join().expect("the drain ends");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the listener is closed once drained"
    );
}
