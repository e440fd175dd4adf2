//! Workers discovered from the Kubernetes API (`--service-discovery`): a fake API server on
//! loopback speaking the real list/watch protocol (`kvgate_tests::kube`), and simulated
//! engines on 127.0.0.2, 127.0.0.3, ... as the pods' IPs. Every engine listens on one port,
//! chosen free on all those addresses, as the pods of a Deployment do: the gateway's one
//! `--service-discovery-port` then fits them all, with no test-only per-pod port.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kvgate_engine_sim::SimFleet;
use kvgate_gateway::testing::{AddDiscovered, PodRef};
use kvgate_gateway::{DiscoverySection, Gateway, GatewayConfig};
use kvgate_tests::kube::FakeApi;
use kvgate_tests::{
    delete, engine_at, get, port_free_on, test_config, until_workers, wait_for, workers,
};
use serde_json::{Value, json};

fn discovery_config(api: &FakeApi, dir: &tempfile::TempDir, port: u16) -> GatewayConfig {
    let mut cfg = test_config(dir);
    cfg.discovery = DiscoverySection {
        service_discovery: true,
        selector: vec!["app=sglang".into()],
        service_discovery_namespace: Some(api.namespace.clone()),
        service_discovery_port: port,
        service_discovery_kubeconfig: Some(api.kubeconfig(dir.path())),
        inference_pool: None,
    };
    cfg
}

fn sglang() -> Value {
    json!({"app": "sglang", "pod-template-hash": "7d4b9c"})
}

/// An engine on each of `ips` at one free port, each behind a Ready pod of the selector:
/// `engine-a`, `engine-b`, ... in namespace `ml`.
fn ready_pods(ips: &[&str]) -> (u16, Vec<SimFleet>, FakeApi) {
    let port = port_free_on(ips);
    let engines = ips.iter().map(|ip| engine_at(ip, port)).collect();
    let api = FakeApi::start("ml");
    for (name, ip) in ('a'..).zip(ips) {
        api.create(api.pod(&format!("engine-{name}"), ip, true, sglang()));
    }
    (port, engines, api)
}

/// The URLs of the discovered workers that are ready, sorted.
fn ready(ws: &[Value]) -> Vec<String> {
    let mut urls: Vec<String> = (ws.iter())
        .filter(|w| w["source"] == "kubernetes" && w["status"] == "ready")
        .filter_map(|w| w["url"].as_str().map(str::to_owned))
        .collect();
    urls.sort();
    urls
}

fn urls(ws: &[Value]) -> Vec<String> {
    let mut urls: Vec<String> = (ws.iter())
        .filter_map(|w| w["url"].as_str().map(str::to_owned))
        .collect();
    urls.sort();
    urls
}

/// Chat completions through the gateway in `lanes` loops until `stop`, each answer
/// counted: the steady load under which pods change.
#[derive(Debug, Default)]
struct Load {
    ok: Cell<u64>,
    failures: RefCell<Vec<String>>,
    stop: Cell<bool>,
}

impl Load {
    async fn lane(&self, url: String, lane: usize) {
        let client = kvgate_tests::client();
        let mut i = 0u64;
        while !self.stop.get() {
            let body = json!({"model": "kvgate-sim-model", "max_tokens": 8,
                "messages": [{"role": "user", "content": format!("lane {lane} question {i}")}]});
            match client.post(&url).send_json(&body).await {
                Ok(mut r) if r.status().is_success() => {
                    let _ = r.body().await;
                    self.ok.set(self.ok.get() + 1);
                }
                Ok(mut r) => {
                    let body = r.body().await.unwrap_or_default();
                    self.failures.borrow_mut().push(format!(
                        "{}: {}",
                        r.status(),
                        String::from_utf8_lossy(&body)
                    ));
                }
                Err(e) => self.failures.borrow_mut().push(e.to_string()),
            }
            i += 1;
        }
    }

    /// Waits until `n` more requests have succeeded.
    async fn more(&self, n: u64) {
        let target = self.ok.get() + n;
        wait_for(30, "more answers under load", || self.ok.get() >= target).await;
    }
}

#[actix_rt::test]
async fn pods_join_leave_and_come_back_while_every_request_succeeds() {
    let ips = [
        "127.0.0.2",
        "127.0.0.3",
        "127.0.0.4",
        "127.0.0.5",
        "127.0.0.6",
    ];
    let port = port_free_on(&ips);
    let at = |ip: &str| format!("http://{ip}:{port}");
    let mut engines: BTreeMap<&str, SimFleet> = ips[..4]
        .iter()
        .map(|ip| (*ip, engine_at(ip, port)))
        .collect();
    let api = FakeApi::start("ml");
    api.create(api.pod("engine-a", ips[0], true, sglang()));
    api.create(api.pod("engine-b", ips[1], true, sglang()));
    // A ready pod with a live engine that the selector leaves out.
    api.create(api.pod("web-c", ips[2], true, json!({"app": "web"})));
    api.create(api.pod("engine-d", ips[3], false, sglang()));
    let dir = tempfile::tempdir().expect("temp dir");
    let gw = Gateway::start(discovery_config(&api, &dir, port)).expect("gateway starts");

    let ws = until_workers(&gw, "the two ready pods", |ws| {
        ready(ws) == [at(ips[0]), at(ips[1])]
    })
    .await;
    let a = ws.iter().find(|w| w["url"] == at(ips[0])).expect("a");
    assert_eq!(a["source"], "kubernetes", "{a}");
    assert_eq!(a["pod"], "engine-a", "{a}");
    assert_eq!(a["namespace"], "ml", "{a}");
    assert_eq!(a["pod_uid"], api.get("engine-a")["metadata"]["uid"], "{a}");
    assert_eq!(urls(&ws).len(), 2, "only the matching ready pods: {ws:?}");
    // Listed with the selector, then watched from the list's version with bookmarks.
    let reqs = api.requests();
    assert!(
        reqs.iter()
            .any(|r| r.starts_with("/api/v1/namespaces/ml/pods?")
                && r.contains("labelSelector=app=sglang")),
        "{reqs:?}"
    );
    assert!(
        reqs.iter().any(|r| r.contains("watch=true")
            && r.contains("allowWatchBookmarks=true")
            && r.contains("resourceVersion=")),
        "{reqs:?}"
    );

    let load = Load::default();
    let gw_url = format!("{}/v1/chat/completions", gw.url());
    let lanes = futures_util::future::join_all((0..3).map(|i| load.lane(gw_url.clone(), i)));
    let scenario = async {
        load.more(10).await;

        // Ready: it joins and takes its share.
        api.set_ready("engine-d", true);
        until_workers(&gw, "d ready", |ws| ready(ws).contains(&at(ips[3]))).await;
        let d = engines[ips[3]].engine(0).clone();
        wait_for(30, "d serving", || d.stats().requests > 0).await;
        // A readiness flap: unready, ready again at once. The same engine: it serves on,
        // the same registration, nothing cut.
        let incarnation = |ws: &[Value]| {
            (ws.iter().find(|w| w["url"] == at(ips[3]))).map(|w| w["incarnation"].clone())
        };
        let before = incarnation(&workers(&gw).await);
        api.set_ready("engine-d", false);
        api.set_ready("engine-d", true);
        load.more(10).await;
        let ws = until_workers(&gw, "d ready after its flap", |ws| {
            ready(ws).contains(&at(ips[3]))
        })
        .await;
        assert_eq!(incarnation(&ws), before, "{ws:?}");
        assert_eq!(d.stats().aborted, 0);

        // Unready, its engine still up: drained, then removed, and sent nothing more.
        api.set_ready("engine-a", false);
        until_workers(&gw, "a removed", |ws| !urls(ws).contains(&at(ips[0]))).await;
        let a = engines[ips[0]].engine(0).clone();
        let s = a.stats();
        // Removed only once drained: everything it accepted has finished.
        assert_eq!((s.completed, s.aborted), (s.requests, 0), "{s:?}");
        let served = s.requests;
        load.more(20).await;
        assert_eq!(
            a.stats().requests,
            served,
            "a removed worker got new requests"
        );

        // Deleted in the kubelet's order: the deletion timestamp (it drains at once, still
        // Ready), not ready, the engine gone once drained, then DELETED.
        api.mark_deleting("engine-b");
        until_workers(&gw, "b removed", |ws| !urls(ws).contains(&at(ips[1]))).await;
        let s = engines[ips[1]].engine(0).stats();
        assert_eq!((s.completed, s.aborted), (s.requests, 0), "{s:?}");
        assert!(s.requests > 0, "b served before it went");
        api.set_ready("engine-b", false);
        engines.remove(ips[1]).expect("b's engine").stop();
        load.more(10).await;
        api.delete("engine-b");

        // Re-created under the same name with a new IP: a new worker.
        engines.insert(ips[4], engine_at(ips[4], port));
        api.create(api.pod("engine-b", ips[4], true, sglang()));
        let ws = until_workers(&gw, "b back at its new IP", |ws| {
            ready(ws) == [at(ips[3]), at(ips[4])]
        })
        .await;
        let b = ws.iter().find(|w| w["url"] == at(ips[4])).expect("new b");
        assert_eq!(b["pod"], "engine-b");
        assert_eq!(b["pod_uid"], api.get("engine-b")["metadata"]["uid"]);
        let e = engines[ips[4]].engine(0).clone();
        wait_for(30, "the new b serving", || e.stats().requests > 0).await;
        load.more(10).await;
        load.stop.set(true);
    };
    futures_util::future::join(scenario, lanes).await;

    assert_eq!(load.failures.borrow().as_slice(), [] as [String; 0]);
    // What `more` waited for, at least.
    assert!(load.ok.get() >= 50, "{} answers", load.ok.get());
    // The stranger's engine, alive all along, was never a worker.
    assert_eq!(engines[ips[2]].engine(0).stats().requests, 0);
    assert_eq!(
        urls(&workers(&gw).await),
        [at(ips[3]), at(ips[4])],
        "only the serving pods remain"
    );
    gw.stop();
}

#[actix_rt::test]
async fn the_watch_resumes_after_bookmarks_drops_410_and_an_outage() {
    let ips = ["127.0.0.7", "127.0.0.8", "127.0.0.9"];
    let port = port_free_on(&ips);
    let at = |ip: &str| format!("http://{ip}:{port}");
    let _engines: Vec<SimFleet> = ips.iter().map(|ip| engine_at(ip, port)).collect();
    let api = FakeApi::start("ml");
    api.create(api.pod("engine-a", ips[0], true, sglang()));
    let dir = tempfile::tempdir().expect("temp dir");
    let gw = Gateway::start(discovery_config(&api, &dir, port)).expect("gateway starts");
    until_workers(&gw, "a", |ws| ready(ws) == [at(ips[0])]).await;

    // Every step under a steady load that must lose nothing.
    let load = Load::default();
    let gw_url = format!("{}/v1/chat/completions", gw.url());
    let lanes = futures_util::future::join_all((0..3).map(|i| load.lane(gw_url.clone(), i)));
    let scenario = async {
        load.more(5).await;
        // Changes the selector filters out move the version on; a bookmark carries it, and
        // a watch cut mid-event resumes from there, not from the list's version.
        api.create(api.pod("web", "10.9.9.9", true, json!({"app": "web"})));
        let marked = api.resource_version();
        api.bookmark();
        api.drop_watches();
        let resumed = format!("resourceVersion={marked}");
        let resumed_from_mark =
            || (api.requests().iter()).any(|r| r.contains("watch=true") && r.contains(&resumed));
        for _ in 0..1500 {
            if resumed_from_mark() {
                break;
            }
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(resumed_from_mark(), "{marked}: {:#?}", api.requests());
        api.create(api.pod("engine-b", ips[1], true, sglang()));
        until_workers(&gw, "b after the cut", |ws| {
            ready(ws) == [at(ips[0]), at(ips[1])]
        })
        .await;
        load.more(5).await;

        // A change lost to compaction, then 410 Gone on the watch: only a new list shows it.
        let lists = api.lists();
        api.set_silent(true);
        api.set_ready("engine-a", false);
        api.set_silent(false);
        api.expire();
        until_workers(&gw, "a gone after the relist", |ws| {
            urls(ws) == [at(ips[1])]
        })
        .await;
        assert!(api.lists() > lists, "a 410 makes the watcher list again");
        load.more(5).await;

        // The API server gone for seconds: routing and readiness go on with what is known.
        api.go_away();
        let away = Instant::now();
        let before = load.ok.get();
        while away.elapsed() < Duration::from_secs(3) {
            let ready = get(&format!("{}/readiness", gw.url())).await;
            assert_eq!(ready.status.as_u16(), 200);
            actix_rt::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(load.ok.get() > before, "no answer while the API was away");
        // What changes meanwhile is seen once it is back.
        api.set_ready("engine-a", true);
        api.create(api.pod("engine-c", ips[2], true, sglang()));
        assert_eq!(
            urls(&workers(&gw).await),
            [at(ips[1])],
            "nothing seen while away"
        );
        api.come_back();
        until_workers(&gw, "converged after the outage", |ws| {
            ready(ws) == [at(ips[0]), at(ips[1]), at(ips[2])]
        })
        .await;
        load.more(10).await;
        load.stop.set(true);
    };
    futures_util::future::join(scenario, lanes).await;
    assert_eq!(load.failures.borrow().as_slice(), [] as [String; 0]);
    gw.stop();
}

#[actix_rt::test]
async fn an_admin_removal_holds_until_the_pod_changes_and_nothing_is_persisted() {
    let ips = ["127.0.0.10", "127.0.0.11"];
    let (port, _engines, api) = ready_pods(&ips);
    let at = |ip: &str| format!("http://{ip}:{port}");
    let dir = tempfile::tempdir().expect("temp dir");
    let gw = Gateway::start(discovery_config(&api, &dir, port)).expect("gateway starts");
    let ws = until_workers(&gw, "a and b", |ws| ready(ws).len() == 2).await;
    let a = ws.iter().find(|w| w["url"] == at(ips[0])).expect("a");
    let id = a["id"].as_str().expect("id").to_owned();
    let pod = PodRef {
        pod: "engine-a".into(),
        namespace: "ml".into(),
        pod_uid: a["pod_uid"].as_str().expect("uid").into(),
    };

    let r = delete(&format!("{}/workers/{id}", gw.url())).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    // The answer says what happens next.
    let v = r.json();
    assert_eq!(v["excluded_until"], "pod_change", "{v}");
    let message = v["message"].as_str().unwrap_or_default();
    assert!(message.contains("ml/engine-a"), "{message}");
    assert_eq!(urls(&workers(&gw).await), [at(ips[1])]);
    // The same pod, still Ready, announced again (a relist, a watch started over): kept out.
    api.modify("engine-a", |p| {
        p["metadata"]["annotations"] = json!({"touched": "yes"})
    });
    let lists = api.lists();
    api.expire();
    wait_for(30, "a relist", || api.lists() > lists).await;
    let again = gw.actors().registry.send(AddDiscovered {
        url: at(ips[0]),
        pod: pod.clone(),
        kv_events_config: None,
    });
    assert_eq!(
        again.await.expect("registry answers").expect("no error"),
        None
    );
    // A marker change behind it: once b's change is seen, a's would have been too.
    api.set_ready("engine-b", false);
    until_workers(&gw, "b unready", |ws| ws.is_empty()).await;
    api.set_ready("engine-b", true);

    // The pod changes (unready, then ready again): it comes back.
    api.set_ready("engine-a", false);
    api.set_ready("engine-a", true);
    until_workers(&gw, "a back after its pod changed", |ws| {
        ready(ws).len() == 2
    })
    .await;
    gw.stop();

    // Not persisted: a gateway on the same data dir, without discovery, has no worker,
    // and a configured worker at a's address is not taken for one the API removed.
    let mut cfg = test_config(&dir);
    let gw = Gateway::start(cfg.clone()).expect("gateway restarts");
    assert!(workers(&gw).await.is_empty(), "{:?}", workers(&gw).await);
    gw.stop();
    cfg.worker_urls = vec![at(ips[0])];
    let gw = Gateway::start(cfg).expect("gateway restarts");
    let ws = workers(&gw).await;
    assert_eq!(urls(&ws), [at(ips[0])]);
    assert_eq!(ws[0]["source"], "config");
    assert!(ws[0].get("pod").is_none(), "{}", ws[0]);
    gw.stop();
}

#[actix_rt::test]
async fn an_unreachable_api_server_stops_neither_start_nor_readiness() {
    let engine = engine_at("127.0.0.1", 0);
    // A port with nothing behind it.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let api = FakeApi::start("ml");
    api.go_away();
    drop(dead);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = discovery_config(&api, &dir, 8000);
    cfg.worker_urls = engine.urls();
    let gw = Gateway::start(cfg).expect("gateway starts without the API server");
    let r = get(&format!("{}/readiness", gw.url())).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let body = json!({"model": "kvgate-sim-model", "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello"}]});
    let r = kvgate_tests::post_json(&format!("{}/v1/chat/completions", gw.url()), &body).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    gw.stop();
}

#[actix_rt::test]
async fn a_pod_at_a_configured_workers_address_leaves_that_worker_as_it_is() {
    let ips = ["127.0.0.12", "127.0.0.13"];
    let (port, _engines, api) = ready_pods(&ips);
    let at = |ip: &str| format!("http://{ip}:{port}");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = discovery_config(&api, &dir, port);
    cfg.worker_urls = vec![at(ips[0])];
    let gw = Gateway::start(cfg).expect("gateway starts");
    let ws = until_workers(&gw, "b discovered beside the configured a", |ws| {
        ready(ws) == [at(ips[1])]
    })
    .await;
    // One worker per address: a stays the configured one.
    assert_eq!(urls(&ws), [at(ips[0]), at(ips[1])], "{ws:?}");
    let a = ws.iter().find(|w| w["url"] == at(ips[0])).expect("a");
    assert_eq!(a["source"], "config", "{a}");
    assert!(a.get("pod").is_none(), "{a}");
    // Its pod going unready, then away, does not touch it; b's does.
    api.set_ready("engine-a", false);
    api.set_ready("engine-b", false);
    until_workers(&gw, "b drained and removed", |ws| urls(ws) == [at(ips[0])]).await;
    api.delete("engine-a");
    // A marker behind it: once b is back, a's deletion has been seen too.
    api.set_ready("engine-b", true);
    let ws = until_workers(&gw, "b back", |ws| ready(ws) == [at(ips[1])]).await;
    assert_eq!(urls(&ws), [at(ips[0]), at(ips[1])], "{ws:?}");
    let a = ws.iter().find(|w| w["url"] == at(ips[0])).expect("a");
    assert_eq!(a["source"], "config", "{a}");
    gw.stop();
}
