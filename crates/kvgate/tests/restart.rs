//! Warm restarts through the real `kvgate` binary: SIGTERM and kill -9, the engines'
//! start times, damaged stores, and the registry.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvgate_engine_sim::{SimConfig, SimFleet};
use serde_json::{Value, json};

/// A `kvgate` process and what it has logged so far.
struct Kvgate {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    url: String,
}

impl Kvgate {
    /// Snapshots every 0.2 s.
    fn start(data_dir: &Path, workers: &[String], extra: &[&str]) -> Kvgate {
        Kvgate::start_with(data_dir, workers, "0.2", extra)
    }

    fn start_with(data_dir: &Path, workers: &[String], interval: &str, extra: &[&str]) -> Kvgate {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvgate"));
        cmd.args([
            "--port",
            "0",
            "--log-level",
            "info",
            "--snapshot-interval-secs",
            interval,
        ])
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        if !workers.is_empty() {
            cmd.arg("--worker-urls").args(workers);
        }
        let mut child = cmd.spawn().expect("kvgate starts");
        let lines = Arc::new(Mutex::new(Vec::new()));
        for out in [
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|e| Box::new(e) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(out).lines().map_while(Result::ok) {
                    lines.lock().expect("log lock").push(l);
                }
            });
        }
        let mut k = Kvgate {
            child,
            lines,
            url: String::new(),
        };
        let line = k.wait_line("kvgate listening");
        // A text line (`addr=...`) or, with `--log-json`, a JSON one.
        let json_addr = serde_json::from_str::<Value>(&line)
            .ok()
            .and_then(|v| v["addr"].as_str().map(str::to_owned));
        let addr = json_addr
            .or_else(|| {
                (line.split_whitespace())
                    .find_map(|w| w.strip_prefix("addr="))
                    .map(str::to_owned)
            })
            .expect("addr in the listening line");
        k.url = format!("http://{addr}");
        k
    }

    /// Waits (bounded) for a log line containing `needle`, and returns it.
    fn wait_line(&self, needle: &str) -> String {
        for _ in 0..1500 {
            if let Some(l) = self
                .lines
                .lock()
                .expect("log lock")
                .iter()
                .find(|l| l.contains(needle))
            {
                return l.clone();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "no log line {needle:?}; got:\n{}",
            self.lines.lock().expect("log lock").join("\n")
        );
    }

    fn sigterm(mut self) {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok);
        let status = self.child.wait().expect("kvgate exits");
        assert!(status.success(), "exit after SIGTERM: {status}");
    }

    fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
    }
}

impl Drop for Kvgate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http(method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    actix_rt::System::new().block_on(async {
        let c = awc::Client::builder()
            .timeout(Duration::from_secs(30))
            .finish();
        let req = match method {
            "POST" => c.post(url),
            "DELETE" => c.delete(url),
            _ => c.get(url),
        };
        let mut r = match body {
            Some(b) => req.send_json(&b).await,
            None => req.send().await,
        }
        .expect("request");
        let bytes = r.body().await.expect("body");
        (
            r.status().as_u16(),
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    })
}

fn prompt(i: usize) -> String {
    format!("Prefix group {i}: you answer questions about subject number {i}. ").repeat(30)
}

/// Sends one request for prefix `i` and returns the engine that served it.
fn route(gw: &Kvgate, fleet: &SimFleet, i: usize, q: &str) -> usize {
    let before: Vec<u64> = (0..fleet.len())
        .map(|e| fleet.engine(e).stats().requests)
        .collect();
    let (status, body) = http(
        "POST",
        &format!("{}/v1/chat/completions", gw.url),
        Some(
            json!({"messages": [{"role": "system", "content": prompt(i)}, {"role": "user", "content": q}], "max_tokens": 1}),
        ),
    );
    assert_eq!(status, 200, "{body}");
    (0..fleet.len())
        .find(|e| fleet.engine(*e).stats().requests > before[*e])
        .expect("one engine served it")
}

fn fleet() -> SimFleet {
    SimFleet::start(4, SimConfig::default()).expect("fleet")
}

fn first_pass(gw: &Kvgate, fleet: &SimFleet) -> Vec<usize> {
    (0..20)
        .map(|i| route(gw, fleet, i, "first question"))
        .collect()
}

#[test]
fn sigterm_restart_keeps_every_prefix_on_its_engine() {
    let fleet = fleet();
    let dir = tempfile::tempdir().expect("dir");
    // No periodic snapshot in this run: what survives is the one written at SIGTERM.
    let gw = Kvgate::start_with(dir.path(), &fleet.urls(), "3600", &[]);
    let placed = first_pass(&gw, &fleet);
    let mut used = placed.clone();
    used.sort();
    used.dedup();
    assert!(
        used.len() >= 3,
        "the first pass spreads over the fleet: {placed:?}"
    );
    gw.sigterm();

    let gw = Kvgate::start(dir.path(), &fleet.urls(), &[]);
    gw.wait_line("prefix index restored");
    // The restored index knows every prefix: each is a hit before it is sent again.
    assert_eq!(paths(&gw), ["hit"; 20]);
    let again: Vec<usize> = (0..20)
        .map(|i| route(&gw, &fleet, i, "after the restart"))
        .collect();
    assert_eq!(again, placed);
    drop(gw);

    // The control: a gateway with an empty data dir knows none of them. (New prefixes are
    // placed by a rendezvous ranking that every gateway shares, so where they would land
    // does not tell the two apart; what the index holds does.)
    let empty = tempfile::tempdir().expect("dir");
    let gw = Kvgate::start(empty.path(), &fleet.urls(), &[]);
    assert_eq!(paths(&gw), ["miss"; 20]);
}

/// The decision path `/admin/explain` gives each of the 20 prefixes with a new question.
fn paths(gw: &Kvgate) -> Vec<String> {
    (0..20)
        .map(|i| {
            let (status, d) = http(
                "POST",
                &format!("{}/admin/explain/chat", gw.url),
                Some(
                    json!({"messages": [{"role": "system", "content": prompt(i)},
                    {"role": "user", "content": "a question not asked before"}], "max_tokens": 1}),
                ),
            );
            assert_eq!(status, 200, "{d}");
            d["path"].as_str().unwrap_or("").to_owned()
        })
        .collect()
}

#[test]
fn kill_9_after_a_snapshot_keeps_routing() {
    let fleet = fleet();
    let dir = tempfile::tempdir().expect("dir");
    let gw = Kvgate::start(dir.path(), &fleet.urls(), &[]);
    let placed = first_pass(&gw, &fleet);
    // Wait (bounded) until a committed snapshot covers every request, then kill -9.
    let mut settled = false;
    for _ in 0..500 {
        let (_, v) = http("GET", &format!("{}/admin/index", gw.url), None);
        if v["persistence"]["pending"] == false
            && v["persistence"]["snapshots_written"].as_u64() > Some(0)
        {
            settled = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(settled, "a snapshot covering the requests was written");
    gw.kill9();

    let gw = Kvgate::start(dir.path(), &fleet.urls(), &[]);
    let again: Vec<usize> = (0..20)
        .map(|i| route(&gw, &fleet, i, "after kill -9"))
        .collect();
    assert_eq!(again, placed);
}

fn index_units(gw: &Kvgate) -> Vec<(String, u64)> {
    let (_, v) = http("GET", &format!("{}/admin/index", gw.url), None);
    let mut out: Vec<(String, u64)> = v["models"][0]["per_worker"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .map(|w| {
                    (
                        w["worker"].as_str().unwrap_or("").to_owned(),
                        w["units"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[test]
fn an_engine_that_restarted_loses_its_entries_and_only_it() {
    let fleet = fleet();
    let dir = tempfile::tempdir().expect("dir");
    let gw = Kvgate::start(dir.path(), &fleet.urls(), &[]);
    let placed = first_pass(&gw, &fleet);
    let (_, workers) = http("GET", &format!("{}/workers", gw.url), None);
    let ids: Vec<String> = (0..4)
        .map(|e| {
            workers["workers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|w| w["url"] == fleet.urls()[e].as_str())
                .unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let before = index_units(&gw);
    gw.sigterm();

    // An engine that holds prefixes, with others holding some too.
    let restarted = placed[0];
    assert!(placed.iter().any(|e| *e != restarted), "{placed:?}");
    fleet.engine(restarted).restart();
    let gw = Kvgate::start(dir.path(), &fleet.urls(), &[]);
    gw.wait_line("engine restarted");
    let after = index_units(&gw);
    let expect: Vec<(String, u64)> = before
        .into_iter()
        .filter(|(w, _)| *w != ids[restarted])
        .collect();
    assert!(!expect.is_empty());
    assert_eq!(after, expect);
    // The others still route as before.
    for i in (0..20).filter(|i| placed[*i] != restarted) {
        assert_eq!(route(&gw, &fleet, i, "again"), placed[i], "prefix {i}");
    }
}

#[test]
fn damaged_or_unusable_stores_are_reported_and_the_gateway_serves() {
    let fleet = SimFleet::start(1, SimConfig::default()).expect("fleet");
    let serves = |gw: &Kvgate| {
        let (status, body) = http(
            "POST",
            &format!("{}/v1/completions", gw.url),
            Some(json!({"prompt": "hi", "max_tokens": 1})),
        );
        assert_eq!(status, 200, "{body}");
    };

    // Garbage where sled's files are.
    let dir = tempfile::tempdir().expect("dir");
    std::fs::create_dir_all(dir.path().join("store")).unwrap();
    std::fs::write(dir.path().join("store").join("conf"), b"\xff\xfe not sled").unwrap();
    std::fs::write(dir.path().join("store").join("db"), vec![0xAB; 8192]).unwrap();
    let gw = Kvgate::start(dir.path(), &fleet.urls(), &[]);
    assert!(gw.wait_line("moved it to").contains("ERROR"));
    serves(&gw);
    drop(gw);

    // A store of another format version.
    let dir = tempfile::tempdir().expect("dir");
    kvgate_store::testing::store_of_format(dir.path(), 99).unwrap();
    let gw = Kvgate::start(dir.path(), &fleet.urls(), &[]);
    let line = gw.wait_line("format version 99");
    assert!(line.contains("moved it to"), "{line}");
    serves(&gw);
    drop(gw);

    // A data dir that cannot be created (its parent is a file).
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("file"), b"x").unwrap();
    let gw = Kvgate::start(&dir.path().join("file").join("data"), &fleet.urls(), &[]);
    gw.wait_line("running without persistence");
    serves(&gw);
}

#[test]
fn the_admin_registry_survives_a_restart() {
    let fleet = SimFleet::start(3, SimConfig::default()).expect("fleet");
    let urls = fleet.urls();
    let flags = vec![urls[0].clone(), urls[1].clone()];
    let dir = tempfile::tempdir().expect("dir");
    let gw = Kvgate::start(dir.path(), &flags, &[]);
    let (s, _) = http(
        "POST",
        &format!("{}/workers", gw.url),
        Some(json!({"url": urls[2]})),
    );
    assert_eq!(s, 201);
    let (s, _) = http(
        "DELETE",
        &format!(
            "{}/workers/{}",
            gw.url,
            urls[0].replace(':', "%3A").replace('/', "%2F")
        ),
        None,
    );
    assert_eq!(s, 200);
    gw.sigterm();

    let gw = Kvgate::start(dir.path(), &flags, &[]);
    let (_, v) = http("GET", &format!("{}/workers", gw.url), None);
    let mut got: Vec<&str> = v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["url"].as_str().unwrap())
        .collect();
    got.sort();
    let mut want = vec![urls[1].as_str(), urls[2].as_str()];
    want.sort();
    assert_eq!(got, want);
    // Added again through the API, it comes back for good.
    let (s, _) = http(
        "POST",
        &format!("{}/workers", gw.url),
        Some(json!({"url": urls[0]})),
    );
    assert_eq!(s, 201);
    gw.sigterm();
    let gw = Kvgate::start(dir.path(), &flags, &[]);
    let (_, v) = http("GET", &format!("{}/workers", gw.url), None);
    assert_eq!(v["workers"].as_array().unwrap().len(), 3);
}

#[test]
fn sigterm_turns_readiness_off_at_once_and_lets_requests_in_flight_finish() {
    let fleet = SimFleet::start(1, SimConfig::default()).expect("engines");
    fleet
        .engine(0)
        .set_fault(kvgate_engine_sim::Fault::Latency(Duration::from_millis(
            4000,
        )));
    let dir = tempfile::tempdir().expect("dir");
    let gw = Kvgate::start(
        dir.path(),
        &fleet.urls(),
        &["--shutdown-grace-period-secs", "20"],
    );
    assert_eq!(http("GET", &format!("{}/readiness", gw.url), None).0, 200);
    let url = format!("{}/v1/completions", gw.url);
    let slow = std::thread::spawn(move || {
        http(
            "POST",
            &url,
            Some(json!({"prompt": "finish me", "max_tokens": 2})),
        )
    });
    // The request is inside the engine before the signal.
    while fleet.engine(0).stats().http_requests == 0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = gw.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    gw.wait_line("shutting down");
    let (status, body) = http("GET", &format!("{}/readiness", gw.url), None);
    assert_eq!(
        (status, body["reason"].as_str()),
        (503, Some("shutting down")),
        "{body}"
    );
    let (status, body) = slow.join().expect("request thread");
    assert_eq!(status, 200, "the request in flight finished: {body}");
    let mut gw = gw;
    let exit = gw.child.wait().expect("kvgate exits");
    assert!(exit.success(), "{exit}");
    gw.wait_line("index snapshot written");
}

#[test]
fn keys_and_prompts_stay_out_of_the_logs() {
    let fleet = SimFleet::start(2, SimConfig::default()).expect("engines");
    fleet
        .engine(1)
        .set_fault(kvgate_engine_sim::Fault::ErrorStatus {
            status: 503,
            body: "overloaded".into(),
        });
    let dir = tempfile::tempdir().expect("dir");
    let gw = Kvgate::start(
        dir.path(),
        &fleet.urls(),
        &[
            "--api-key",
            "sk-client-secret",
            "--worker-api-key",
            "sk-worker-secret",
            "--policy",
            "round_robin",
        ],
    );
    let prompt = "a prompt that must never be logged 7f3a";
    for _ in 0..4 {
        let status = actix_rt::System::new().block_on(async {
            awc::Client::new()
                .post(format!("{}/v1/completions", gw.url))
                .bearer_auth("sk-client-secret")
                .send_json(&json!({"prompt": prompt, "max_tokens": 2}))
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        });
        assert_eq!(status, 200);
    }
    // The failures on engine 1 were logged, as retries.
    gw.wait_line("trying another worker");
    let lines = gw.lines.lock().expect("log lock").join("\n");
    for secret in ["sk-client-secret", "sk-worker-secret", prompt] {
        assert!(!lines.contains(secret), "{secret} in the logs:\n{lines}");
    }
}

#[test]
fn the_demos_engines_report_their_cached_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = Kvgate::start(dir.path(), &[], &["--demo"]);
    gw.wait_line("kvgate demo");
    for q in ["one", "two", "three"] {
        let body = json!({"messages": [{"role": "system", "content": prompt(7)}, {"role": "user", "content": q}], "max_tokens": 2});
        let (status, _) = http(
            "POST",
            &format!("{}/v1/chat/completions", gw.url),
            Some(body),
        );
        assert_eq!(status, 200);
    }
    let mut cached = Value::Null;
    for _ in 0..250 {
        cached = http("GET", &format!("{}/admin/state", gw.url), None).1["cached_tokens"].clone();
        if cached["reported"].as_u64() > Some(0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        cached["reported"].as_u64() > Some(0) && cached["predicted"].as_u64() > Some(0),
        "{cached}"
    );
}

fn chat_with_id(gw: &Kvgate, id: &str) {
    actix_rt::System::new().block_on(async {
        let body = json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2});
        let r = awc::Client::new()
            .post(format!("{}/v1/chat/completions", gw.url))
            .insert_header(("x-request-id", id))
            .send_json(&body)
            .await
            .expect("sent");
        assert_eq!(r.status().as_u16(), 200);
    });
}

#[test]
fn each_answered_request_has_one_access_log_line() {
    let engines = fleet();
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = Kvgate::start(dir.path(), &engines.urls(), &["--log-json"]);
    chat_with_id(&gw, "access-one");
    let line = gw.wait_line("\"access-one\"");
    let v: Value = serde_json::from_str(&line).expect("a JSON line");
    assert_eq!(v["target"], "kvgate::access", "{v}");
    assert_eq!(
        (&v["route"], &v["status"], &v["retries"], &v["path"]),
        (
            &json!("/v1/chat/completions"),
            &json!(200),
            &json!(0),
            &json!("miss")
        ),
        "{v}"
    );
    assert!(
        engines.urls().iter().any(|u| v["worker"] == u.as_str()),
        "{v}"
    );
    assert!(
        v["duration_ms"].as_f64().is_some() && v["prompt_tokens"].as_u64() > Some(0),
        "{v}"
    );
    let lines = gw.lines.lock().expect("log lock").clone();
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("\"access-one\""))
            .count(),
        1
    );
    drop(gw);
    // Off: the request is served and no line names it.
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = Kvgate::start(dir.path(), &engines.urls(), &["--access-log", "off"]);
    chat_with_id(&gw, "access-two");
    chat_with_id(&gw, "access-three");
    std::thread::sleep(Duration::from_millis(300));
    let lines = gw.lines.lock().expect("log lock").clone();
    assert!(!lines.iter().any(|l| l.contains("access-two")), "{lines:?}");
}
