//! kvgatectl against a real gateway and simulated engines.

use std::process::Command;

use kvgate_engine_sim::{SimConfig, SimFleet};
use kvgate_gateway::{Gateway, GatewayConfig};

fn ctl(gw: &Gateway, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvgatectl"))
        .arg("--url")
        .arg(gw.url())
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
