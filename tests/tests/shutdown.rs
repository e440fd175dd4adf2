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

#[actix_rt::test]
async fn a_gateway_whose_data_directory_was_deleted_still_stops() {
    // The store's writer is stuck in the file system once its directory is gone: the
    // stop gives up on it after a bounded wait instead of hanging.
    let sim = SimConfig {
        context_length: 1 << 20,
        cache_capacity_tokens: 1 << 21,
        prefill_tokens_per_sec: 1e9,
        ..SimConfig::default()
    };
    let fleet = SimFleet::start(1, sim).expect("engine");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = fleet.urls();
    let gw = Gateway::start(cfg).expect("gateway");
    let url = gw.url();
    let prompt = "a long prompt the index holds at shutdown ".repeat(16_000);
    let r = post_json(
        &format!("{url}/v1/completions"),
        &json!({"prompt": prompt, "max_tokens": 1}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    std::fs::remove_dir_all(dir.path()).expect("data directory deleted");
    let (done, stopped) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        gw.stop();
        let _ = done.send(());
    });
    // Each wait on the writer is bounded (5 s); before, this never returned.
    assert!(
        stopped.recv_timeout(Duration::from_secs(60)).is_ok(),
        "the gateway did not stop"
    );
}
