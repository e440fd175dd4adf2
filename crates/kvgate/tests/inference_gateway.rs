//! The picker's manifests (`deploy/kubernetes/inference-gateway`) checked offline: the
//! InferencePool against the rules of its CRD (`inference.networking.k8s.io/v1`, from the
//! Gateway API Inference Extension's `config/crd/bases/inference.networking.k8s.io_inferencepools.yaml`:
//! `selector.matchLabels` and 1 to 8 distinct `targetPorts` required, `endpointPickerRef`
//! with a `name` and, for a Service, a `port`, `failureMode` FailOpen or FailClose); the
//! pieces against each other (pool, picker Service, kvgate's flags, probes, route, RBAC);
//! and the container's flags through the real binary, which must open the picker. No
//! cluster is needed. `.ci/run` also validates the InferencePool against the CRD's schema
//! itself (`scripts/check-inferencepools.py`, the CRD in `tests/fixtures/crds/`) and the
//! built-in kinds with `kubernetes-validate`.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/inference-gateway")
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("manifest readable");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

fn kustomization() -> Value {
    documents(&dir().join("kustomization.yaml")).remove(0)
}

fn resources() -> Vec<Value> {
    let k = kustomization();
    k["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .flat_map(|f| documents(&dir().join(f.as_str().expect("a file name"))))
        .collect()
}

fn find<'a>(all: &'a [Value], kind: &str) -> &'a Value {
    all.iter()
        .find(|r| r["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in inference-gateway"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

fn container(all: &[Value]) -> &Value {
    &find(all, "Deployment")["spec"]["template"]["spec"]["containers"][0]
}

fn arg<'a>(args: &'a [String], flag: &str) -> &'a str {
    let i = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} in {args:?}"));
    args.get(i + 1).map_or("", String::as_str)
}

fn port_named(ports: &Value, name: &str) -> Value {
    ports
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no port {name} in {ports}"))
}

#[test]
fn the_kustomization_lists_every_manifest() {
    let listed: BTreeSet<String> = strings(&kustomization()["resources"]).into_iter().collect();
    let present: BTreeSet<String> = std::fs::read_dir(dir())
        .expect("the directory")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, present);
}

#[test]
fn the_pool_keeps_the_rules_of_its_crd() {
    let all = resources();
    let pool = find(&all, "InferencePool");
    assert_eq!(pool["apiVersion"], "inference.networking.k8s.io/v1");
    let spec = &pool["spec"];
    let labels = spec["selector"]["matchLabels"]
        .as_object()
        .expect("selector.matchLabels");
    assert!(!labels.is_empty());
    let ports: Vec<u64> = spec["targetPorts"]
        .as_array()
        .expect("targetPorts")
        .iter()
        .map(|p| p["number"].as_u64().expect("a port number"))
        .collect();
    assert!((1..=8).contains(&ports.len()), "{ports:?}");
    assert!(ports.iter().all(|p| (1..=65_535).contains(p)));
    assert_eq!(ports.iter().collect::<BTreeSet<_>>().len(), ports.len());
    let picker = &spec["endpointPickerRef"];
    assert!(picker["name"].is_string());
    let kind = picker["kind"].as_str().unwrap_or("Service");
    if kind == "Service" {
        assert!(
            picker["port"]["number"].is_u64(),
            "a Service picker needs a port"
        );
    }
    let mode = picker["failureMode"].as_str().unwrap_or("FailClose");
    assert!(["FailOpen", "FailClose"].contains(&mode), "{mode}");
    let known: BTreeSet<&str> = [
        "selector",
        "targetPorts",
        "appProtocol",
        "endpointPickerRef",
    ]
    .into_iter()
    .collect();
    for key in spec.as_object().expect("spec").keys() {
        assert!(known.contains(key.as_str()), "not in the CRD: spec.{key}");
    }
}

#[test]
fn pool_service_flags_probes_route_and_role_agree() {
    let all = resources();
    let pool = &find(&all, "InferencePool")["spec"];
    let service = find(&all, "Service");
    let c = container(&all);
    let args = strings(&c["args"]);
    // The pool names the picker's Service and its ext_proc port, which reaches kvgate's.
    assert_eq!(
        pool["endpointPickerRef"]["name"],
        service["metadata"]["name"]
    );
    let ext = port_named(&service["spec"]["ports"], "ext-proc");
    assert_eq!(ext["port"], pool["endpointPickerRef"]["port"]["number"]);
    assert_eq!(ext["appProtocol"], "http2", "gRPC in cleartext");
    let target = port_named(
        &c["ports"],
        ext["targetPort"].as_str().expect("a named target"),
    );
    assert_eq!(
        target["containerPort"].to_string(),
        arg(&args, "--ext-proc-port")
    );
    assert_eq!(arg(&args, "--ext-proc-host"), "0.0.0.0");
    // Discovery follows the pool itself: its labels and its port.
    assert_eq!(
        arg(&args, "--inference-pool"),
        find(&all, "InferencePool")["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
    );
    assert!(
        !args.iter().any(|a| a == "--selector"),
        "the pool's selector is used"
    );
    // The kubelet probes gRPC health on --grpc-health-port.
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert_eq!(
            c[probe]["grpc"]["port"].to_string(),
            arg(&args, "--grpc-health-port"),
            "{probe}"
        );
    }
    // The route sends to the pool, through the gateway it names.
    let route = find(&all, "HTTPRoute");
    let backend = &route["spec"]["rules"][0]["backendRefs"][0];
    assert_eq!(backend["group"], "inference.networking.k8s.io");
    assert_eq!(backend["kind"], "InferencePool");
    assert_eq!(
        backend["name"],
        find(&all, "InferencePool")["metadata"]["name"]
    );
    assert_eq!(
        route["spec"]["parentRefs"][0]["name"],
        find(&all, "Gateway")["metadata"]["name"]
    );
    // The account reads pods and inferencepools, and writes nothing.
    let role = find(&all, "Role");
    let granted: BTreeSet<(String, String)> = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .flat_map(|r| {
            let verbs = strings(&r["verbs"]);
            assert_eq!(verbs, ["get", "list", "watch"], "{r}");
            let groups = strings(&r["apiGroups"]);
            strings(&r["resources"])
                .into_iter()
                .flat_map(move |res| groups.clone().into_iter().map(move |g| (g, res.clone())))
        })
        .collect();
    let want: BTreeSet<(String, String)> = [
        ("", "pods"),
        ("inference.networking.k8s.io", "inferencepools"),
    ]
    .map(|(g, r)| (g.to_owned(), r.to_owned()))
    .into();
    assert_eq!(granted, want);
    let account = &find(&all, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"];
    assert_eq!(&find(&all, "RoleBinding")["subjects"][0]["name"], account);
    assert_eq!(&find(&all, "ServiceAccount")["metadata"]["name"], account);
}

/// `args` with the value after `flag` replaced.
fn with_value(args: &[String], flag: &str, value: &str) -> Vec<String> {
    let mut out = args.to_vec();
    let i = out.iter().position(|a| a == flag).expect("the flag");
    out[i + 1] = value.to_owned();
    out
}

#[test]
fn kvgate_starts_the_picker_with_the_manifests_flags() {
    let all = resources();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut args = strings(&container(&all)["args"]);
    for flag in ["--port", "--ext-proc-port", "--grpc-health-port"] {
        args = with_value(&args, flag, "0");
    }
    args = with_value(&args, "--data-dir", dir.path().to_str().expect("UTF-8"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(&args)
        .env_clear()
        .env(
            "KVGATE_CONTROL_PLANE_API_KEYS",
            "a-test-admin-key-of-some-length",
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kvgate runs");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut picker = false;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            picker |= line.contains("endpoint picker (ext_proc) listening");
            if line.contains("kvgate listening") {
                let _ = tx.send(picker);
                return;
            }
        }
    });
    let outcome = rx.recv_timeout(Duration::from_secs(20));
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        outcome,
        Ok(true),
        "kvgate listening with its picker: {args:?}"
    );
}
