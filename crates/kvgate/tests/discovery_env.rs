//! The real binary finds the Kubernetes API by kube's standard resolution, here through
//! `KUBECONFIG` with no kvgate flag naming a kubeconfig (in a pod it is the service
//! account), and lists pods in `default` when neither a flag nor a pod names a namespace.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvgate_tests::kube::FakeApi;
use serde_json::json;

/// Kills the child when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[actix_rt::test]
async fn the_binary_finds_the_api_server_through_kubeconfig() {
    let api = FakeApi::start("default");
    api.create(api.pod("engine-a", "127.0.0.2", true, json!({"app": "sglang"})));
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = api.kubeconfig(dir.path());
    let data = dir.path().join("data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["--port", "0", "--service-discovery"])
        .args([
            "--selector",
            "app=sglang",
            "--service-discovery-port",
            "8000",
        ])
        .arg("--data-dir")
        .arg(&data)
        // Nothing inherited: no KUBERNETES_SERVICE_HOST, no ~/.kube/config of this machine.
        .env_clear()
        .env("KUBECONFIG", &kubeconfig)
        .env("HOME", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kvgate runs");
    let stdout = child.stdout.take().expect("piped stdout");
    let _running = Running(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) = line.split("addr=").nth(1) {
                let _ = tx.send(addr.split_whitespace().next().unwrap_or("").to_owned());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("kvgate listens");

    let deadline = Instant::now() + Duration::from_secs(20);
    let worker = loop {
        let ws = kvgate_tests::get(&format!("http://{addr}/workers"))
            .await
            .json();
        let found = ws["workers"].as_array().and_then(|ws| {
            ws.iter()
                .find(|w| w["url"] == "http://127.0.0.2:8000")
                .cloned()
        });
        if let Some(w) = found {
            break w;
        }
        assert!(Instant::now() < deadline, "no discovered worker: {ws}");
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(worker["source"], "kubernetes", "{worker}");
    assert_eq!(worker["pod"], "engine-a", "{worker}");
    assert_eq!(worker["namespace"], "default", "{worker}");
    let asked = api.requests();
    assert!(
        asked
            .iter()
            .any(|r| r.starts_with("/api/v1/namespaces/default/pods?")
                && r.contains("labelSelector=app=sglang")),
        "{asked:?}"
    );
}
