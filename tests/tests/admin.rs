//! Worker admin: REST and the sglang-router legacy routes.

use kvgate_engine_sim::{SimConfig, SimFleet};
use kvgate_tests::{delete, get, post, post_json, test_config};
use serde_json::json;

#[actix_rt::test]
async fn workers_come_and_go_through_the_api() {
    let fleet = SimFleet::start(3, SimConfig::default()).unwrap();
    let urls = fleet.urls();
    let dir = tempfile::tempdir().unwrap();
    let gw = kvgate_gateway::Gateway::start(test_config(&dir)).unwrap();
    let base = gw.url();

    let r = post_json(&format!("{base}/workers"), &json!({"url": urls[0]})).await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let w = r.json();
    assert_eq!(w["url"], urls[0].as_str());
    assert_eq!(w["healthy"], true);
    assert_eq!(w["status"], "ready");
    assert_eq!(w["runtime"], "sglang");
    assert_eq!(w["models"], json!(["kvgate-sim-model"]));
    assert_eq!(
        w["max_running_requests"],
        SimConfig::default().max_running_requests
    );
    assert!(w["startup_time"].as_f64().is_some(), "{w}");
    let id = w["id"].as_str().unwrap().to_owned();
    assert_eq!(r.header("location").unwrap(), format!("/workers/{id}"));

    post_json(&format!("{base}/workers"), &json!({"url": urls[0]}))
        .await
        .assert_error(409, "worker_already_exists");
    post_json(&format!("{base}/workers"), &json!({"url": "ftp://x"}))
        .await
        .assert_error(400, "invalid_request");
    post(&format!("{base}/workers"), "{")
        .await
        .assert_error(400, "json_parse_error");
    post_json(&format!("{base}/workers"), &json!({"uri": "x"}))
        .await
        .assert_error(400, "invalid_request");

    // Legacy forms.
    let r = post(&format!("{base}/add_worker?url={}", urls[1]), "").await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert_eq!(r.json()["status"], "success");
    post(&format!("{base}/add_worker"), "")
        .await
        .assert_error(400, "invalid_request");
    let r = post_json(&format!("{base}/workers"), &json!({"url": urls[2]})).await;
    assert_eq!(r.status.as_u16(), 201);

    let list = get(&format!("{base}/workers")).await.json();
    assert_eq!(list["workers"].as_array().unwrap().len(), 3);
    for w in list["workers"].as_array().unwrap() {
        for key in ["id", "url", "models", "healthy", "status", "in_flight"] {
            assert!(w.get(key).is_some(), "missing {key}: {w}");
        }
    }
    let legacy = get(&format!("{base}/list_workers")).await.json();
    assert_eq!(legacy["urls"].as_array().unwrap().len(), 3);

    // Remove by id, by URL-encoded URL, and through the legacy route.
    let one = get(&format!("{base}/workers/{id}")).await;
    assert_eq!(one.status.as_u16(), 200);
    assert_eq!(
        delete(&format!("{base}/workers/{id}"))
            .await
            .status
            .as_u16(),
        200
    );
    delete(&format!("{base}/workers/{id}"))
        .await
        .assert_error(404, "worker_not_found");
    let encoded = urls[1].replace(':', "%3A").replace('/', "%2F");
    let r = delete(&format!("{base}/workers/{encoded}")).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let r = post(&format!("{base}/remove_worker?url={}", urls[2]), "").await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    post(&format!("{base}/remove_worker?url={}", urls[2]), "")
        .await
        .assert_error(404, "worker_not_found");
    assert_eq!(
        get(&format!("{base}/workers")).await.json()["workers"],
        json!([])
    );
    post_json(&format!("{base}/v1/completions"), &json!({"prompt": "x"}))
        .await
        .assert_error(503, "no_available_workers");
}

#[actix_rt::test]
async fn an_unreachable_worker_is_kept_pending_and_not_routed() {
    let fleet = SimFleet::start(1, SimConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = test_config(&dir);
    cfg.worker_urls = fleet.urls();
    let gw = kvgate_gateway::Gateway::start(cfg).unwrap();
    // A port nothing listens on (bound then released).
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let r = post_json(
        &format!("{}/workers", gw.url()),
        &json!({"url": format!("http://{dead}")}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 201);
    assert_eq!(r.json()["status"], "pending");
    assert_eq!(r.json()["healthy"], false);
    for i in 0..6 {
        let r = post_json(
            &format!("{}/v1/completions", gw.url()),
            &json!({"prompt": format!("{i}"), "max_tokens": 1}),
        )
        .await;
        assert_eq!(r.status.as_u16(), 200);
    }
    assert_eq!(fleet.engine(0).stats().requests, 6);
}

#[actix_rt::test]
async fn vllm_and_older_sglang_workers_are_detected_and_polled() {
    use kvgate_engine_sim::Flavor;
    let vllm = SimFleet::start(
        1,
        SimConfig {
            flavor: Flavor::Vllm,
            ..SimConfig::default()
        },
    )
    .unwrap();
    let legacy = SimFleet::start(
        1,
        SimConfig {
            flavor: Flavor::SglangLegacy,
            enable_metrics: true,
            ..SimConfig::default()
        },
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = test_config(&dir);
    cfg.worker_urls = vec![vllm.urls()[0].clone(), legacy.urls()[0].clone()];
    let gw = kvgate_gateway::Gateway::start(cfg).unwrap();
    let list = get(&format!("{}/workers", gw.url())).await.json();
    let find = |url: &str| {
        list["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["url"] == url)
            .unwrap()
            .clone()
    };
    let v = find(&vllm.urls()[0]);
    assert_eq!(
        (v["runtime"].as_str(), v["status"].as_str()),
        (Some("vllm"), Some("ready")),
        "{v}"
    );
    assert!(
        v["startup_time"].is_null() && v["max_running_requests"].is_null(),
        "vLLM has no /server_info: {v}"
    );
    // The legacy engine answers only /get_server_info: what it says is kept all the same.
    let l = find(&legacy.urls()[0]);
    assert_eq!(l["runtime"], "sglang", "{l}");
    let defaults = SimConfig::default();
    assert_eq!(
        l["max_running_requests"], defaults.max_running_requests as u64,
        "{l}"
    );
    assert_eq!(l["page_size"], defaults.page_size as u64, "{l}");
    assert!(l["startup_time"].as_f64().is_some_and(|t| t > 0.0), "{l}");
    // Both get load reports: vLLM and old SGLang from /metrics.
    let sel = gw.actors().selector.clone();
    gw.actors().poller.do_send(kvgate_poller::PollNow);
    kvgate_tests::wait_for_async(10, "a load report from both", || {
        let sel = sel.clone();
        async move {
            sel.send(kvgate_gateway::testing::GetViews)
                .await
                .map(|v| v.len() == 2 && v.iter().all(|w| w.load.is_some()))
                .unwrap_or(false)
        }
    })
    .await;
    for i in 0..4 {
        let r = post_json(
            &format!("{}/v1/completions", gw.url()),
            &json!({"prompt": format!("p{i}"), "max_tokens": 1}),
        )
        .await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    assert_eq!(
        vllm.engine(0).stats().requests + legacy.engine(0).stats().requests,
        4
    );
}

#[actix_rt::test]
async fn a_worker_that_lists_no_model_is_pending_and_not_routed() {
    use std::io::{BufRead, BufReader, Write};
    // Answers every request with an empty model list, as an engine still loading might.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let body = r#"{"object":"list","data":[]}"#;
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let gw = kvgate_gateway::Gateway::start(test_config(&dir)).unwrap();
    let r = post_json(&format!("{}/workers", gw.url()), &json!({"url": url})).await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let w = r.json();
    assert_eq!(
        (w["status"].as_str(), w["healthy"].as_bool()),
        (Some("pending"), Some(false)),
        "{w}"
    );
    assert!(
        w["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("no model")),
        "{w}"
    );
    post_json(
        &format!("{}/v1/completions", gw.url()),
        &json!({"prompt": "x"}),
    )
    .await
    .assert_error(503, "no_available_workers");
}

#[actix_rt::test]
async fn the_reference_gateways_worker_body_is_accepted() {
    let fleet = SimFleet::start(1, SimConfig::default()).unwrap();
    let url = fleet.urls()[0].clone();
    let dir = tempfile::tempdir().unwrap();
    let gw = kvgate_gateway::Gateway::start(test_config(&dir)).unwrap();
    let workers = format!("{}/workers", gw.url());
    // A disaggregated role is refused with the reason, and nothing is registered.
    let prefill = json!({"url": url, "worker_type": "prefill"});
    let r = post_json(&workers, &prefill).await;
    r.assert_error(400, "invalid_request");
    assert!(r.text().contains("worker_type"), "{}", r.text());
    assert_eq!(get(&workers).await.json()["total"], 0);
    let body = json!({
        "url": url,
        "worker_type": "regular",
        "model_id": "llama-3-8b",
        "api_key": "engine-key",
        "priority": 50,
        "cost": 1.0,
        "labels": {"zone": "a"},
    });
    let r = post_json(&workers, &body).await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let w = r.json();
    assert_eq!(w["url"], url.as_str());
    assert_eq!(
        w["ignored_fields"],
        json!({"model_id": "llama-3-8b", "priority": 50, "cost": 1.0, "labels": {"zone": "a"}})
    );
    assert!(
        !r.text().contains("engine-key"),
        "the key is never shown: {w}"
    );
    assert_eq!(get(&workers).await.json()["total"], 1);
}
