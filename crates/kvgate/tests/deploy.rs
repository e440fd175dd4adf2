//! The Kubernetes manifests (`deploy/kubernetes`) read as kvgate reads them: the kvgate
//! container's flags go through the real binary's parser, its `KVGATE_` variables through
//! the gateway's config loader, so a flag or key kvgate does not know fails here. The
//! schemas are checked in CI by `kubernetes-validate`; this file checks what they cannot:
//! that the pieces agree with each other, with kvgate and with the image (`Dockerfile`,
//! `scripts/image.sh`), and that the glibc floor `docs/operations.md` states is the one
//! the image script enforces.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use kvgate_gateway::GatewayConfig;
use serde::Deserialize;
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

fn repo_file(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every document of a YAML file (a file may hold several, split by `---`).
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("manifest readable");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

/// The resources the kustomization applies, read from the files it lists.
fn resources() -> Vec<Value> {
    let kustomization = &documents(&deploy_dir().join("kustomization.yaml"))[0];
    kustomization["resources"]
        .as_array()
        .expect("kustomization lists resources")
        .iter()
        .flat_map(|f| documents(&deploy_dir().join(f.as_str().expect("a file name"))))
        .collect()
}

fn find<'a>(all: &'a [Value], kind: &str, name: &str) -> &'a Value {
    all.iter()
        .find(|r| r["kind"] == kind && r["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/kubernetes"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().expect("a string").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn deployment(all: &[Value]) -> &Value {
    find(all, "Deployment", "kvgate")
}

fn container(all: &[Value]) -> &Value {
    deployment(all)["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == "kvgate")
        .expect("a container named kvgate")
}

/// The value after `flag` in the container's args.
fn arg<'a>(args: &'a [String], flag: &str) -> &'a str {
    let i = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} not in the container's args {args:?}"));
    args.get(i + 1).expect("a value after the flag")
}

/// The args with `flag`'s value replaced (port 0, a temporary data directory).
fn with_value(args: &[String], flag: &str, value: &str) -> Vec<String> {
    let mut out = args.to_vec();
    let i = out
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} not in {args:?}"));
    out[i + 1] = value.to_owned();
    out
}

/// The variables a Service makes the kubelet inject into every pod of its namespace
/// (`enableServiceLinks`), at a made-up cluster IP.
fn service_links(service: &Value) -> HashMap<String, String> {
    let ip = "10.96.17.4";
    let name = service["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_ascii_uppercase()
        .replace('-', "_");
    let ports = service["spec"]["ports"].as_array().expect("ports");
    let mut env = HashMap::from([(format!("{name}_SERVICE_HOST"), ip.to_owned())]);
    for (i, p) in ports.iter().enumerate() {
        let port = p["port"].as_u64().expect("a port number");
        let proto = p["protocol"].as_str().unwrap_or("TCP");
        let link = format!("{}://{ip}:{port}", proto.to_ascii_lowercase());
        let base = format!("{name}_PORT_{port}_{proto}");
        if i == 0 {
            env.insert(format!("{name}_SERVICE_PORT"), port.to_string());
            env.insert(format!("{name}_PORT"), link.clone());
        }
        if let Some(pname) = p["name"].as_str() {
            let pname = pname.to_ascii_uppercase().replace('-', "_");
            env.insert(format!("{name}_SERVICE_PORT_{pname}"), port.to_string());
        }
        env.insert(format!("{base}_PROTO"), proto.to_ascii_lowercase());
        env.insert(format!("{base}_PORT"), port.to_string());
        env.insert(format!("{base}_ADDR"), ip.to_owned());
        env.insert(base, link);
    }
    env
}

/// The kvgate container's environment as the kubelet builds it: `envFrom` ConfigMaps,
/// then `env` (literal, from a ConfigMap key, or a Secret's key as a stand-in value), and
/// the service links of every Service in the manifests.
fn container_env(all: &[Value]) -> HashMap<String, String> {
    let c = container(all);
    let mut env = HashMap::new();
    for s in all.iter().filter(|r| r["kind"] == "Service") {
        env.extend(service_links(s));
    }
    for from in c["envFrom"].as_array().into_iter().flatten() {
        let name = from["configMapRef"]["name"]
            .as_str()
            .expect("envFrom names a ConfigMap");
        let data = find(all, "ConfigMap", name)["data"]
            .as_object()
            .expect("ConfigMap data");
        for (k, v) in data {
            env.insert(k.clone(), v.as_str().expect("a string value").to_owned());
        }
    }
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().expect("a variable name").to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else if let Some(r) = e["valueFrom"]["configMapKeyRef"].as_object() {
            let cm = find(all, "ConfigMap", r["name"].as_str().expect("a name"));
            cm["data"][r["key"].as_str().expect("a key")]
                .as_str()
                .expect("the ConfigMap has the key")
                .to_owned()
        } else if e["valueFrom"]["secretKeyRef"].is_object() {
            // The Secret is made by the operator, not shipped: any visible ASCII key.
            "manifest-test-admin-key".to_owned()
        } else {
            panic!("{name}: a value source this test does not read: {e}");
        };
        env.insert(name, value);
    }
    env
}

#[test]
fn the_kustomization_lists_every_manifest() {
    let kustomization = &documents(&deploy_dir().join("kustomization.yaml"))[0];
    let listed: BTreeSet<String> = strings(&kustomization["resources"]).into_iter().collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(deploy_dir())
        .expect("deploy/kubernetes")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml") && f != "kustomization.yaml")
        .collect();
    assert_eq!(listed, on_disk);
    let images = kustomization["images"].as_array().expect("an images entry");
    assert!(
        images
            .iter()
            .any(|i| i["name"] == container(&resources())["image"])
    );
}

#[test]
fn every_kvgate_variable_loads_through_the_gateway_config() {
    let all = resources();
    let env = container_env(&all);
    let cfg = GatewayConfig::load(None, &env, Vec::new())
        .unwrap_or_else(|e| panic!("the manifests' variables: {e}\n{env:?}"));
    let config_map = &find(&all, "ConfigMap", "kvgate")["data"];
    // The engines come from discovery, named by the Deployment's flags.
    assert!(cfg.worker_urls.is_empty(), "{:?}", cfg.worker_urls);
    let args = strings(&container(&all)["args"]);
    for flag in [
        "--service-discovery",
        "--selector",
        "--service-discovery-port",
    ] {
        assert!(args.iter().any(|a| a == flag), "{flag} in {args:?}");
    }
    assert_eq!(
        cfg.policy.kind.to_string(),
        config_map["KVGATE_POLICY__KIND"]
    );
    assert_eq!(cfg.access.control_plane_api_keys.len(), 1);
    // The service links of the Service named kvgate are among them, and ignored.
    assert!(env.contains_key("KVGATE_PORT_30000_TCP_ADDR"), "{env:?}");

    // The same loader refuses a variable it does not know, naming it.
    let mut bad = env.clone();
    bad.insert("KVGATE_NO_SUCH_KEY".to_owned(), "1".to_owned());
    let e = GatewayConfig::load(None, &bad, Vec::new()).expect_err("an unknown key");
    assert!(e.to_string().contains("no_such_key"), "{e}");
}

/// What one start of the real binary came to: its listening line, or how it ended.
enum Start {
    Listening(String),
    Exited { code: Option<i32>, stderr: String },
}

/// Starts `kvgate` with exactly `args` and `env` (nothing inherited), waits up to 20 s
/// for its listening line or its exit, and stops it.
fn start(args: &[String], env: &HashMap<String, String>) -> Start {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(args)
        .env_clear()
        .envs(env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kvgate runs");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("kvgate listening") {
                let _ = tx.send(line);
                return;
            }
        }
    });
    let outcome = match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(line) => Start::Listening(line),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let status = child.wait().expect("wait");
            let mut stderr = String::new();
            let _ = child
                .stderr
                .take()
                .expect("piped stderr")
                .read_to_string(&mut stderr);
            return Start::Exited {
                code: status.code(),
                stderr,
            };
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kvgate neither listened nor exited within 20 s: {args:?}");
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    outcome
}

/// The container's args, made runnable here: OS-chosen ports, a temporary data directory.
fn runnable_args(all: &[Value], data_dir: &Path) -> Vec<String> {
    let args = strings(&container(all)["args"]);
    assert!(
        container(all)["command"].is_null(),
        "the image's entrypoint is kvgate; flags go in args"
    );
    assert!(
        args.iter().all(|a| !a.contains("$(")),
        "variable references in args are not expanded by this test: {args:?}"
    );
    let args = with_value(&args, "--port", "0");
    let args = with_value(&args, "--prometheus-port", "0");
    with_value(
        &args,
        "--data-dir",
        data_dir.to_str().expect("a UTF-8 path"),
    )
}

#[test]
fn the_binary_starts_with_the_manifests_flags_and_variables() {
    let all = resources();
    let env = container_env(&all);
    let dir = tempfile::tempdir().expect("temp dir");
    let args = runnable_args(&all, dir.path());
    match start(&args, &env) {
        Start::Listening(line) => {
            let policy = env["KVGATE_POLICY__KIND"].as_str();
            assert!(line.contains(policy), "{line}");
        }
        Start::Exited { code, stderr } => {
            panic!("kvgate refused the manifests ({code:?}): {stderr}\nargs {args:?}")
        }
    }
}

#[test]
fn a_flag_kvgate_does_not_know_fails_the_same_start() {
    let all = resources();
    let env = container_env(&all);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut args = runnable_args(&all, dir.path());
    args.extend(["--no-such-flag".to_owned(), "1".to_owned()]);
    match start(&args, &env) {
        Start::Exited { code, stderr } => {
            assert_eq!(code, Some(2), "{stderr}");
            assert!(stderr.contains("--no-such-flag"), "{stderr}");
        }
        Start::Listening(line) => panic!("an unknown flag was accepted: {line}"),
    }
    // And a variable it does not know, given as the ConfigMap would.
    let mut bad = env.clone();
    bad.insert("KVGATE_POLICY_KIND".to_owned(), "random".to_owned());
    match start(&runnable_args(&all, dir.path()), &bad) {
        Start::Exited { code, stderr } => {
            assert_ne!(code, Some(0), "{stderr}");
            assert!(stderr.contains("policy_kind"), "{stderr}");
        }
        Start::Listening(line) => panic!("an unknown variable was accepted: {line}"),
    }
}

fn secs(s: &str) -> u64 {
    s.parse::<f64>().expect("seconds").ceil() as u64
}

#[test]
fn the_deployment_drains_probes_and_runs_locked_down() {
    let all = resources();
    let d = deployment(&all);
    let pod = &d["spec"]["template"]["spec"];
    let c = container(&all);
    let args = strings(&c["args"]);
    assert_eq!(d["spec"]["replicas"], 2);

    // The kubelet's SIGKILL comes after kvgate's delay and drain, not during them.
    let delay = secs(arg(&args, "--shutdown-delay-secs"));
    let grace = secs(arg(&args, "--shutdown-grace-period-secs"));
    assert!(delay >= 1, "a delay lets the endpoints drop the pod first");
    let termination = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("a termination grace period");
    assert!(
        termination > delay + grace,
        "{termination} <= {delay} + {grace}"
    );

    // Probes on the listener's named port, at the routes kvgate serves.
    let ports: HashMap<&str, u64> = c["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().expect("a named port"),
                p["containerPort"].as_u64().expect("a number"),
            )
        })
        .collect();
    assert_eq!(ports["http"].to_string(), arg(&args, "--port"));
    assert_eq!(
        ports["metrics"].to_string(),
        arg(&args, "--prometheus-port")
    );
    for (probe, path) in [
        ("readinessProbe", "/readiness"),
        ("livenessProbe", "/liveness"),
        ("startupProbe", "/liveness"),
    ] {
        assert_eq!(c[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], "http", "{probe}");
    }
    let annotations = &d["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(
        annotations["prometheus.io/port"],
        arg(&args, "--prometheus-port")
    );

    // Non-root, read-only root, no escalation; only the data volume is written.
    let sc = &c["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let data_dir = arg(&args, "--data-dir");
    let mount = c["volumeMounts"]
        .as_array()
        .expect("volume mounts")
        .iter()
        .find(|m| m["mountPath"] == data_dir)
        .unwrap_or_else(|| panic!("{data_dir} is not on a volume"));
    assert!(
        pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .any(|v| v["name"] == mount["name"])
    );
    for kind in ["requests", "limits"] {
        for r in ["cpu", "memory"] {
            assert!(c["resources"][kind][r].is_string(), "resources.{kind}.{r}");
        }
    }

    // The admin key comes from a Secret, never from a literal in the manifests.
    let key = c["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == "KVGATE_CONTROL_PLANE_API_KEYS")
        .expect("the admin key's variable");
    assert!(
        key["valueFrom"]["secretKeyRef"]["name"].is_string(),
        "{key}"
    );
    assert_eq!(pod["serviceAccountName"], "kvgate");
}

/// The pods run the image as the Dockerfile builds it (and scripts/image.sh, whose smoke
/// checks it against the Dockerfile): its user, its data volume, its exposed ports.
#[test]
fn the_pods_run_the_image_as_the_dockerfile_sets_it_up() {
    let all = resources();
    let uid = deployment(&all)["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
        .as_u64()
        .expect("runAsUser");
    let user = format!("{uid}:{uid}");
    let dockerfile = repo_file("Dockerfile");
    let instruction = |name: &str| {
        dockerfile
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("the Dockerfile has no {name}"))
            .to_owned()
    };
    assert_eq!(instruction("USER"), user, "the Dockerfile's user");
    assert!(
        repo_file("scripts/image.sh").contains(&format!("IMAGE_UID:-{uid}}}")),
        "scripts/image.sh runs as {user}"
    );
    let args = strings(&container(&all)["args"]);
    assert_eq!(
        instruction("VOLUME"),
        format!("[\"{}\"]", arg(&args, "--data-dir")),
        "the data directory is the image's volume"
    );
    let exposed: BTreeSet<String> = instruction("EXPOSE")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let ports: BTreeSet<String> = container(&all)["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| p["containerPort"].to_string())
        .collect();
    assert_eq!(exposed, ports, "the container's ports are the image's");
}

#[test]
fn service_and_budget_select_the_gateway_pods_and_the_role_only_reads_pods() {
    let all = resources();
    let d = deployment(&all);
    let labels = d["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .expect("pod labels");
    let selects = |selector: &Value| {
        let s = selector.as_object().expect("a selector");
        !s.is_empty() && s.iter().all(|(k, v)| labels.get(k) == Some(v))
    };
    assert!(selects(&d["spec"]["selector"]["matchLabels"]));
    let svc = find(&all, "Service", "kvgate");
    assert!(selects(&svc["spec"]["selector"]));
    let c = container(&all);
    let named: BTreeSet<&str> = c["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    for p in svc["spec"]["ports"].as_array().expect("service ports") {
        let target = p["targetPort"].as_str().expect("a named target port");
        assert!(named.contains(target), "{target} is not a container port");
    }
    let pdb = find(&all, "PodDisruptionBudget", "kvgate");
    assert!(selects(&pdb["spec"]["selector"]["matchLabels"]));
    let replicas = d["spec"]["replicas"].as_u64().expect("replicas");
    let min = pdb["spec"]["minAvailable"].as_u64().expect("minAvailable");
    assert!(
        min >= 1 && min < replicas,
        "a drain can still evict one pod"
    );

    let role = find(&all, "Role", "kvgate");
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}])
    );
    let binding = find(&all, "RoleBinding", "kvgate");
    assert_eq!(binding["roleRef"]["name"], "kvgate");
    assert_eq!(binding["subjects"][0]["name"], "kvgate");
    assert!(all.iter().all(|r| r["kind"] != "ClusterRole"));
}

#[test]
fn the_stated_glibc_floor_is_the_one_the_image_script_checks() {
    let script = repo_file("scripts/image.sh");
    let floor = script
        .lines()
        .find_map(|l| l.strip_prefix("glibc_floor="))
        .expect("scripts/image.sh sets glibc_floor");
    let ops = repo_file("docs/operations.md");
    let stated = format!("glibc floor is **{floor}**");
    assert!(
        ops.contains(&stated),
        "docs/operations.md does not say \"{stated}\""
    );
    assert!(
        repo_file("Dockerfile").contains(&format!("glibc floor ({floor})")),
        "the Dockerfile's header names another floor than {floor}"
    );
}
