//! KV-event endpoints given per worker: two vLLM engines on one host publish on ports of
//! their own, which one shared `--kv-events-config` cannot say. Each is added through the
//! admin API with its own settings, followed live, and comes back with them after a restart.

use kvgate_engine_sim::SimFleet;
use kvgate_gateway::Gateway;
use kvgate_tests::{
    port_free_on, post_json, test_config, unique_tokens, until_workers, vllm_publisher,
};
use serde_json::{Value, json};

fn blocks_of(ws: &[Value], url: &str) -> u64 {
    ws.iter()
        .find(|w| w["url"] == url)
        .and_then(|w| w["events"]["blocks"].as_u64())
        .unwrap_or(0)
}

#[actix_rt::test]
async fn each_engine_on_one_host_is_followed_at_its_own_event_ports() {
    let host = ["127.0.0.1"];
    let ports: Vec<u16> = (0..4).map(|_| port_free_on(&host)).collect();
    let fleet = SimFleet::start_each(
        host[0],
        0,
        vec![
            vllm_publisher(ports[0], ports[1], false),
            vllm_publisher(ports[2], ports[3], true),
        ],
    )
    .expect("engines");
    let urls = fleet.urls();
    // A prefix stored on each before the gateway knows them: replay must bring it.
    for (k, u) in urls.iter().enumerate() {
        let body = json!({"prompt": unique_tokens(k as u32, 64), "max_tokens": 1});
        let r = post_json(&format!("{u}/v1/completions"), &body).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    let dir = tempfile::tempdir().expect("dir");
    let cfg = test_config(&dir);
    let gw = Gateway::start(cfg.clone()).expect("gateway");
    // A config that is no config is refused with the reason.
    let bad = post_json(
        &format!("{}/workers", gw.url()),
        &json!({"url": urls[0], "kv_events_config": {"endpoint": "ipc:///tmp/x"}}),
    )
    .await;
    bad.assert_error(400, "invalid_request");
    assert!(bad.text().contains("tcp://"), "{}", bad.text());
    // One as the engine's JSON object, one as its text.
    for (k, u) in urls.iter().enumerate() {
        let events = json!({"publisher": "zmq", "endpoint": format!("tcp://*:{}", ports[2 * k]),
            "replay_endpoint": format!("tcp://*:{}", ports[2 * k + 1]), "topic": "kv-events"});
        let given = if k == 0 {
            events
        } else {
            json!(events.to_string())
        };
        let r = post_json(
            &format!("{}/workers", gw.url()),
            &json!({"url": u, "kv_events_config": given}),
        )
        .await;
        assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    }
    let live = |ws: &[Value]| {
        ws.len() == 2
            && ws.iter().all(|w| w["events"]["state"] == "live")
            && urls.iter().all(|u| blocks_of(ws, u) >= 4)
    };
    let ws = until_workers(&gw, "both engines live at their own ports", live).await;
    for (k, u) in urls.iter().enumerate() {
        let w = ws.iter().find(|w| w["url"] == *u.as_str()).expect("listed");
        assert_eq!(w["kv_events"]["endpoint_port_base"], ports[2 * k], "{w}");
        assert!(w["kv_events_config"].is_string(), "{w}");
        // Each prefix (hashes sent as integers by one, as bytes by the other) is matched
        // on its holder's events.
        let mut ids = unique_tokens(k as u32, 64);
        ids.extend(unique_tokens(100, 8));
        let e = post_json(
            &format!("{}/admin/explain/v1/completions", gw.url()),
            &json!({"prompt": ids}),
        )
        .await
        .json();
        assert_eq!(e["worker"], *u.as_str(), "prefix {k}: {e}");
    }
    // A restart registers them again with their own settings.
    gw.stop();
    let gw = Gateway::start(cfg).expect("gateway again");
    until_workers(&gw, "both engines live again after a restart", live).await;
    gw.stop();
}

#[actix_rt::test]
async fn a_discovered_pod_says_where_its_events_are_and_a_late_replica_replays_them() {
    let api = kvgate_tests::kube::FakeApi::start("ml");
    let ip = "127.0.0.9";
    let (port, events, replay) = (
        port_free_on(&[ip]),
        port_free_on(&[ip]),
        port_free_on(&[ip]),
    );
    let _engine = SimFleet::start_each(ip, port, vec![vllm_publisher(events, replay, false)])
        .expect("engine");
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.discovery = kvgate_gateway::DiscoverySection {
        service_discovery: true,
        selector: vec!["app=vllm".into()],
        service_discovery_namespace: Some(api.namespace.clone()),
        service_discovery_port: port,
        service_discovery_kubeconfig: Some(api.kubeconfig(dir.path())),
        inference_pool: None,
    };
    let mut pod = api.pod("engine-a", ip, true, json!({"app": "vllm"}));
    pod["metadata"]["annotations"] = json!({
        "kvgate.io/kv-events-config": format!(
            r#"{{"endpoint": "tcp://*:{events}", "replay_endpoint": "tcp://*:{replay}", "topic": "kv-events"}}"#
        )
    });
    api.create(pod);
    // What the engine cached before this replica started (another replica's traffic):
    // four blocks published to nobody yet.
    let early = json!({"prompt": unique_tokens(7, 64), "max_tokens": 1});
    let r = post_json(&format!("http://{ip}:{port}/v1/completions"), &early).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let gw = Gateway::start(cfg).expect("gateway");
    // A replica started late catches up through replay.
    let ws = until_workers(&gw, "the pod's events live, with what came before", |ws| {
        ws.len() == 1 && ws[0]["events"]["state"] == "live" && ws[0]["events"]["blocks"] == 4
    })
    .await;
    assert_eq!(ws[0]["source"], "kubernetes", "{ws:?}");
    assert_eq!(ws[0]["kv_events"]["endpoint_port_base"], events, "{ws:?}");
    gw.stop();
}
