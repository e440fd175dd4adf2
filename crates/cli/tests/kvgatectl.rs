//! kvgatectl against a real gateway and simulated engines.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::process::Command;

use kvgate_engine_sim::{SimConfig, SimFleet};
use kvgate_gateway::{Gateway, GatewayConfig};

fn ctl(gw: &Gateway, args: &[&str]) -> (bool, String, String) {
    let url = gw.url();
    let mut all = vec!["--url", url.as_str()];
    all.extend_from_slice(args);
    run(&all)
}

#[test]
fn lists_adds_and_removes_workers() {
    let fleet = SimFleet::start(2, SimConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = GatewayConfig {
        port: 0,
        http_workers: Some(1),
        data_dir: dir.path().join("d"),
        worker_urls: vec![fleet.urls()[0].clone()],
        ..GatewayConfig::default()
    };
    let gw = Gateway::start(cfg).unwrap();

    let (ok, out, _) = ctl(&gw, &["workers"]);
    assert!(ok);
    assert!(out.starts_with("ID"), "{out}");
    assert!(
        out.contains(&fleet.urls()[0]) && out.contains("ready"),
        "{out}"
    );

    let (ok, out, err) = ctl(&gw, &["add", &fleet.urls()[1]]);
    assert!(ok, "{err}");
    assert!(out.contains("added"), "{out}");
    let (ok, out, _) = ctl(&gw, &["--json", "workers"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["workers"].as_array().unwrap().len(), 2);

    let (ok, _, err) = ctl(&gw, &["add", &fleet.urls()[1]]);
    assert!(!ok);
    assert!(err.contains("409"), "{err}");

    let (ok, _, err) = ctl(&gw, &["remove", &fleet.urls()[1]]);
    assert!(ok, "{err}");
    let (ok, out, _) = ctl(&gw, &["health"]);
    assert!(ok);
    assert!(out.starts_with("ready (1 of 1"), "{out}");
    let (ok, out, _) = ctl(&gw, &["models"]);
    assert!(ok && out.contains("kvgate-sim-model"), "{out}");
}

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvgatectl"))
        .args(args)
        .output()
        .expect("kvgatectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn snapshot_inspect_reads_a_stopped_gateways_store() {
    let fleet = SimFleet::start(2, SimConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let cfg = GatewayConfig {
        port: 0,
        http_workers: Some(1),
        data_dir: data.clone(),
        worker_urls: fleet.urls(),
        ..GatewayConfig::default()
    };
    let gw = Gateway::start(cfg).unwrap();
    let url = gw.url();
    actix_rt::System::new().block_on(async {
        let c = awc::Client::default();
        for i in 0..6 {
            let body = serde_json::json!({"prompt": format!("a prompt of some length, number {i}"), "max_tokens": 1});
            let r = c.post(format!("{url}/v1/completions")).send_json(&body).await.unwrap();
            assert!(r.status().is_success());
        }
        let r = c.post(format!("{url}/workers")).send_json(&serde_json::json!({"url": "http://127.0.0.1:9"})).await.unwrap();
        assert_eq!(r.status().as_u16(), 201);
    });
    gw.stop();

    let d = data.to_str().unwrap();
    let (ok, out, err) = run(&["snapshot", "inspect", "--data-dir", d]);
    assert!(ok, "{err}");
    assert!(out.contains("format version:  3"), "{out}");
    assert!(out.contains("generation"), "{out}");
    assert!(out.contains("model \"kvgate-sim-model\""), "{out}");
    assert!(
        out.contains("added through the API: http://127.0.0.1:9"),
        "{out}"
    );

    let (ok, out, _) = run(&["--json", "snapshot", "inspect", "--data-dir", d]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["format_version"], 3);
    let workers = v["models"][0]["workers"].as_array().unwrap();
    let units: u64 = workers.iter().map(|w| w["units"].as_u64().unwrap()).sum();
    let entries: u64 = workers.iter().map(|w| w["entries"].as_u64().unwrap()).sum();
    // Six prompts share a 32-byte head: each worker that got one holds the head once.
    assert!(entries >= 6 && units >= 32 + 6, "{v}");
    assert!(
        workers.iter().all(|w| w["url"]
            .as_str()
            .is_some_and(|u| fleet.urls().contains(&u.to_owned()))),
        "{v}"
    );

    // No engine published KV events: no chain-index section.
    assert!(v["events"].is_null(), "{v}");
    assert!(!out.contains("KV-event index"), "{out}");

    // A missing or unusable directory is a clear error, not a panic.
    let (ok, _, err) = run(&["snapshot", "inspect", "--data-dir", "/proc/nonexistent/x"]);
    assert!(!ok);
    assert!(err.contains("reading the store"), "{err}");
}

#[test]
fn an_unreachable_gateway_or_another_service_is_a_clear_error() {
    // A port nothing listens on (bound, then released).
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (ok, out, err) = run(&["--url", &format!("http://{dead}"), "workers"]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.contains(&format!("http://{dead}/workers")), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // Some other web service, answering 200 with a page.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let body = "<html>hello</html>";
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let (ok, out, err) = run(&["--url", &url, "workers"]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(
        err.contains("not a kvgate answer") && err.contains("<html>hello"),
        "{err}"
    );
}

#[test]
fn the_admin_key_opens_a_keyed_gateway() {
    let fleet = SimFleet::start(1, SimConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(GatewayConfig {
        port: 0,
        http_workers: Some(1),
        data_dir: dir.path().join("d"),
        worker_urls: fleet.urls(),
        access: kvgate_gateway::AccessConfig {
            control_plane_api_keys: vec![kvgate_gateway::Secret::new("sk-ops")],
            ..Default::default()
        },
        ..GatewayConfig::default()
    })
    .unwrap();
    let (ok, _, err) = ctl(&gw, &["workers"]);
    assert!(!ok);
    assert!(err.contains("401"), "{err}");
    let (ok, out, err) = ctl(&gw, &["--admin-key", "sk-ops", "workers"]);
    assert!(ok, "{err}");
    assert!(out.contains(&fleet.urls()[0]), "{out}");
}

#[test]
fn explains_lists_decisions_loads_and_the_index() {
    let fleet = SimFleet::start(
        2,
        SimConfig {
            enable_cache_report: true,
            ..SimConfig::default()
        },
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(GatewayConfig {
        port: 0,
        http_workers: Some(1),
        data_dir: dir.path().join("d"),
        worker_urls: fleet.urls(),
        ..GatewayConfig::default()
    })
    .unwrap();
    // `--gateway` is the flag; `--url` (used by `ctl`) its alias.
    let url = gw.url();
    let (ok, out, err) = run(&[
        "--gateway",
        url.as_str(),
        "explain",
        "--prompt",
        "hello there",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("path:    miss"), "{out}");
    assert!(out.contains("WORKER") && out.contains("SCORE MS"), "{out}");
    assert_eq!(
        out.matches("* http://").count(),
        1,
        "one chosen worker: {out}"
    );
    let (ok, out, _) = ctl(
        &gw,
        &[
            "--json",
            "explain",
            "--route",
            "completions",
            "--prompt",
            "x",
        ],
    );
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["route"], "/v1/completions");
    assert_eq!(v["dispatched"], false);
    // A whole body from a file, for /generate with token ids.
    let body = dir.path().join("request.json");
    std::fs::write(
        &body,
        r#"{"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 1}}"#,
    )
    .unwrap();
    let (ok, out, err) = ctl(
        &gw,
        &[
            "--json",
            "explain",
            "--route",
            "generate",
            "--file",
            body.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["prompt"],
        serde_json::json!({"kind": "tokens", "tokens": 4, "tokens_from": {"source": "request"}})
    );

    // One request through the gateway, then the log and the index show it.
    let system = "You are the kvgatectl test's assistant. ".repeat(20);
    let body = serde_json::json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "q"}], "max_tokens": 2});
    {
        use std::io::{Read, Write};
        let b = body.to_string();
        let mut s = std::net::TcpStream::connect(url.trim_start_matches("http://")).unwrap();
        write!(s, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}", b.len()).unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let mut out = String::new();
    for _ in 0..250 {
        let (ok, o, err) = ctl(&gw, &["decisions"]);
        assert!(ok, "{err}");
        out = o;
        if out.contains(" ok") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(out.starts_with("SEQ"), "{out}");
    assert!(out.contains("chat") && out.contains(" ok"), "{out}");
    assert!(out.lines().all(|l| l.chars().count() <= 100), "{out}");
    let (ok, out, _) = ctl(&gw, &["--json", "decisions", "--limit", "5"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["decisions"].as_array().unwrap().len(), 1, "{v}");

    let (ok, out, err) = ctl(&gw, &["index"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("MODEL") && out.contains("100%"), "{out}");
    let (ok, out, _) = ctl(&gw, &["index", "--model", "no-such-model"]);
    assert!(ok && out.lines().count() == 1, "header only: {out}");
    let (ok, out, err) = ctl(&gw, &["loads"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("URL") && out.lines().count() == 3, "{out}");
    let (ok, out, _) = ctl(&gw, &["workers"]);
    assert!(ok && out.contains("INDEX") && out.contains("100%"), "{out}");
    assert!(out.lines().all(|l| l.chars().count() <= 100), "{out}");
}

#[test]
fn bad_input_is_one_line_on_stderr_and_a_failure() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for args in [
        vec![
            "--gateway".to_owned(),
            format!("http://{dead}"),
            "explain".into(),
        ],
        vec![
            "--gateway".to_owned(),
            format!("http://{dead}"),
            "decisions".into(),
        ],
        vec!["no-such-command".to_owned()],
        vec!["workers".to_owned(), "--no-such-flag".to_owned()],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, out, err) = run(&args);
        assert!(!ok && out.is_empty(), "{args:?}: {out}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
    // KVGATE_URL names the gateway when no flag does.
    let out = Command::new(env!("CARGO_BIN_EXE_kvgatectl"))
        .env("KVGATE_URL", format!("http://{dead}"))
        .arg("loads")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("http://{dead}/workers")),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn decisions_follow_prints_new_decisions_as_they_come() {
    use std::io::{BufRead, BufReader, Read, Write};
    let fleet = SimFleet::start(1, SimConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(GatewayConfig {
        port: 0,
        http_workers: Some(1),
        data_dir: dir.path().join("d"),
        worker_urls: fleet.urls(),
        ..GatewayConfig::default()
    })
    .unwrap();
    let url = gw.url();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgatectl"))
        .args(["--gateway", url.as_str(), "--json", "decisions", "--follow"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Two requests after the follower started: each comes out as one JSON line, in order.
    let mut ids = Vec::new();
    for q in ["first", "second"] {
        let b = serde_json::json!({"prompt": q, "max_tokens": 1}).to_string();
        let mut s = std::net::TcpStream::connect(url.trim_start_matches("http://")).unwrap();
        write!(s, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Request-Id: follow-{q}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}", b.len()).unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        ids.push(format!("follow-{q}"));
    }
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let line = lines.next().expect("a line").unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        seen.push(v["request_id"].as_str().unwrap().to_owned());
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(seen, ids);
}

#[test]
fn snapshot_inspect_shows_each_ranks_kv_event_blocks_and_sequence() {
    let sim = SimConfig {
        kv_events_port: Some(0),
        kv_events_replay_port: Some(0),
        dp_size: 2,
        ..SimConfig::default()
    };
    let fleet = SimFleet::start(1, sim).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let cfg = GatewayConfig {
        port: 0,
        http_workers: Some(1),
        data_dir: data.clone(),
        worker_urls: fleet.urls(),
        ..GatewayConfig::default()
    };
    let gw = Gateway::start(cfg).unwrap();
    let url = gw.url();
    actix_rt::System::new().block_on(async {
        let c = awc::Client::default();
        // `GET /workers` until `ok` holds of it; a test failure after 10 s.
        let until = |what: &'static str, ok: fn(&serde_json::Value) -> bool| {
            let (c, url) = (c.clone(), url.clone());
            async move {
                for _ in 0..500 {
                    let mut r = c.get(format!("{url}/workers")).send().await.unwrap();
                    let v: serde_json::Value = r.json().await.unwrap();
                    if ok(&v) {
                        return;
                    }
                    actix_rt::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                panic!("timed out waiting for {what}");
            }
        };
        // Until the events are live, then one prompt of 40 tokens on rank 1.
        until("live events", |v| v["workers"][0]["events"]["state"] == "live").await;
        let ids: Vec<u32> = (100..140).collect();
        let body = serde_json::json!({"input_ids": ids, "routed_dp_rank": 1, "sampling_params": {"max_new_tokens": 1}});
        let r = c.post(format!("{}/generate", fleet.urls()[0])).send_json(&body).await.unwrap();
        assert!(r.status().is_success());
        until("the 40 blocks", |v| {
            v["workers"][0]["events"]["blocks"].as_u64() >= Some(40)
        })
        .await;
    });
    gw.stop();

    let d = data.to_str().unwrap();
    let (ok, out, _) = run(&["--json", "snapshot", "inspect", "--data-dir", d]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ranks = v["events"]["ranks"].as_array().cloned().unwrap_or_default();
    let row = |rank: u64| {
        ranks
            .iter()
            .find(|r| r["rank"] == rank)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(ranks.len(), 2, "{v}");
    assert_eq!(row(0)["blocks"], 0, "{v}");
    assert!(row(1)["blocks"].as_u64() >= Some(40), "{v}");
    assert!(row(1)["next_seq"].as_u64() >= Some(1), "{v}");
    assert_eq!(row(1)["url"], fleet.urls()[0].as_str(), "{v}");

    let (ok, out, err) = run(&["snapshot", "inspect", "--data-dir", d]);
    assert!(ok, "{err}");
    assert!(out.contains("KV-event index: written"), "{out}");
    assert!(out.contains("NEXT-SEQ"), "{out}");
}

#[test]
fn speaks_https_to_a_gateway_through_its_ca() {
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tls");
    let fleet = SimFleet::start(1, SimConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = GatewayConfig {
        port: 0,
        http_workers: Some(1),
        data_dir: dir.path().join("d"),
        worker_urls: fleet.urls(),
        ..GatewayConfig::default()
    };
    cfg.tls.tls_cert_path = Some(fixtures.join("cert.pem"));
    cfg.tls.tls_key_path = Some(fixtures.join("key.pem"));
    let gw = Gateway::start(cfg).unwrap();
    let url = gw.url();
    assert!(url.starts_with("https://"), "{url}");
    let ca = fixtures.join("ca.pem");
    let ca = ca.to_str().unwrap();
    let (ok, out, err) = run(&["--gateway", &url, "--ca-cert", ca, "workers"]);
    assert!(ok, "{err}");
    assert!(out.contains(&fleet.urls()[0]), "{out}");
    // Without the CA the gateway's certificate is refused, and said so.
    let (ok, _, err) = run(&["--gateway", &url, "health"]);
    assert!(!ok);
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // A CA file that holds none is named.
    let readme = fixtures.join("README.md");
    let (ok, _, err) = run(&[
        "--gateway",
        &url,
        "--ca-cert",
        readme.to_str().unwrap(),
        "health",
    ]);
    assert!(!ok && err.contains("README.md"), "{err}");
}
