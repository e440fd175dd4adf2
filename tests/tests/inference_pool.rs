//! Engines from an InferencePool (`--inference-pool`): the fake API server serves the
//! pool and the pods (`kvgate_tests::kube`), simulated engines stand on 127.0.0.2, ...
//! as the pods' IPs on one port. The pool's selector and target port choose the pods;
//! a pool that changes moves the workers with it, one deleted leaves none.

use kvgate_engine_sim::SimFleet;
use kvgate_gateway::{DiscoverySection, Gateway};
use kvgate_tests::kube::FakeApi;
use kvgate_tests::{engine_at, port_free_on, test_config, until_workers};
use serde_json::{Value, json};

/// The URLs of the workers that are ready, sorted.
fn ready(ws: &[Value]) -> Vec<String> {
    let mut urls: Vec<String> = (ws.iter())
        .filter(|w| w["status"] == "ready")
        .filter_map(|w| w["url"].as_str().map(str::to_owned))
        .collect();
    urls.sort();
    urls
}

#[actix_rt::test]
async fn the_engines_are_the_pools_and_follow_it() {
    let api = FakeApi::start("inference");
    let hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];
    let port = port_free_on(&hosts);
    let _engines: Vec<SimFleet> = hosts.iter().map(|h| engine_at(h, port)).collect();
    let at = |h: &str| format!("http://{h}:{port}");
    for (name, ip, app) in [
        ("a-1", hosts[0], "a"),
        ("a-2", hosts[1], "a"),
        ("b-1", hosts[2], "b"),
    ] {
        api.create(api.pod(name, ip, true, json!({"app": app})));
    }
    api.put_pool("engines", json!({"app": "a"}), port);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = test_config(&dir);
    cfg.discovery = DiscoverySection {
        inference_pool: Some("engines".into()),
        service_discovery_namespace: Some(api.namespace.clone()),
        service_discovery_kubeconfig: Some(api.kubeconfig(dir.path())),
        ..DiscoverySection::default()
    };
    let gw = Gateway::start(cfg).expect("gateway starts");
    until_workers(&gw, "the pool's two engines", |ws| {
        ready(ws) == [at(hosts[0]), at(hosts[1])]
    })
    .await;
    // The pool's selector changes: its old engines are drained and dropped, the new one's
    // pod is added.
    api.put_pool("engines", json!({"app": "b"}), port);
    until_workers(&gw, "the changed pool's engine alone", |ws| {
        ws.len() == 1 && ready(ws) == [at(hosts[2])]
    })
    .await;
    // The pool is deleted: no engine is left to it.
    api.delete_pool("engines");
    until_workers(&gw, "no engine", <[Value]>::is_empty).await;
    assert!(
        api.requests()
            .iter()
            .any(|r| r.contains("inferencepools")
                && r.contains("fieldSelector=metadata.name=engines")),
        "{:?}",
        api.requests()
    );
    gw.stop();
}
