//! The dependency graph is the architecture: what each crate may link, checked on the
//! workspace's own `cargo metadata`.

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

use serde_json::Value;

/// Package name → names of its normal (non-dev, non-build) dependencies, as resolved.
fn graph() -> (HashMap<String, Vec<String>>, Value) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    // This machine's platform only: the others' crates may not be downloaded.
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let vv = Command::new(rustc)
        .arg("-vV")
        .output()
        .expect("rustc -vV runs");
    let host = String::from_utf8_lossy(&vv.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc names its host");
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--locked"])
        .args(["--filter-platform", &host])
        .args(["--manifest-path", manifest])
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let name_of: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p["name"].as_str()?)))
        .collect();
    let mut g = HashMap::new();
    for node in meta["resolve"]["nodes"].as_array().expect("resolve") {
        let Some(name) = node["id"].as_str().and_then(|id| name_of.get(id)) else {
            continue;
        };
        let deps = node["deps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k["kind"].is_null())
            })
            .filter_map(|d| d["pkg"].as_str().and_then(|id| name_of.get(id)))
            .map(|n| n.to_string())
            .collect();
        g.insert(name.to_string(), deps);
    }
    (g, meta)
}

/// Every package `root` links, itself excluded.
fn closure(g: &HashMap<String, Vec<String>>, root: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![root.to_owned()];
    while let Some(p) = todo.pop() {
        for d in g.get(&p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

fn assert_links_none(g: &HashMap<String, Vec<String>>, root: &str, banned: &[&str]) {
    let all = closure(g, root);
    for b in banned {
        assert!(!all.contains(*b), "{root} links {b}");
    }
}

#[test]
fn each_crate_links_only_what_its_role_allows() {
    let (g, meta) = graph();
    let runtime = ["tokio", "actix", "actix-rt", "actix-web", "awc", "sled"];
    // The vocabulary: nothing async, no other kvgate crate (every crate may use it).
    assert_links_none(&g, "kvgate-core", &runtime);
    let kvgate_deps: Vec<&String> = (g.get("kvgate-core").into_iter().flatten())
        .filter(|d| d.starts_with("kvgate"))
        .collect();
    assert!(kvgate_deps.is_empty(), "kvgate-core uses {kvgate_deps:?}");
    // The pure crates: nothing async, no I/O.
    assert_links_none(&g, "kvgate-kv-index", &runtime);
    assert_links_none(&g, "kvgate-policies", &runtime);
    // The KV-event wire format: no sockets, no runtime, no other kvgate crate.
    assert_links_none(&g, "kvgate-kv-events", &runtime);
    assert_links_none(
        &g,
        "kvgate-kv-events",
        &["kvgate-kv-index", "kvgate-gateway", "kvgate-poller"],
    );
    // The tokenizer: no runtime (it runs on whatever thread calls it), no other kvgate crate.
    assert_links_none(&g, "kvgate-tokenize", &runtime);
    assert_links_none(
        &g,
        "kvgate-tokenize",
        &[
            "kvgate-kv-index",
            "kvgate-gateway",
            "kvgate-policies",
            "kvgate-engine-sim",
        ],
    );
    // The worker protocols know nothing of the gateway or its store.
    assert_links_none(
        &g,
        "kvgate-poller",
        &["kvgate-gateway", "kvgate-store", "actix-web", "sled"],
    );
    // The store knows no HTTP, actors or routing.
    assert_links_none(
        &g,
        "kvgate-store",
        &[
            "kvgate-gateway",
            "kvgate-policies",
            "actix",
            "actix-web",
            "tokio",
            "awc",
        ],
    );
    // The inspection tool talks HTTP and reads a stopped store: no gateway, no server.
    assert_links_none(&g, "kvgate-cli", &["kvgate-gateway", "actix-web"]);
    assert_links_none(&g, "kvgate-engine-sim", &["kvgate-gateway", "kvgate-store"]);
    // Only the store crate opens sled.
    let direct_sled: Vec<&String> = g
        .iter()
        .filter(|(p, deps)| p.starts_with("kvgate") && deps.iter().any(|d| d == "sled"))
        .map(|(p, _)| p)
        .collect();
    assert_eq!(direct_sled, ["kvgate-store"]);
    // Embedders can leave the simulator out: it is an optional dependency of the gateway.
    let gateway = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "kvgate-gateway")
        .expect("the gateway package");
    let sim = gateway["dependencies"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"] == "kvgate-engine-sim" && d["kind"].is_null())
        .expect("the simulator dependency");
    assert_eq!(sim["optional"], true);
}

/// Source files of `dir`, relative to it, without the unit-test files.
fn sources(dir: &std::path::Path, rel: &str, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        if e.path().is_dir() {
            sources(&e.path(), &path, out);
        } else if name.ends_with(".rs") && name != "tests.rs" && !path.contains("/tests/") {
            out.push(path);
        }
    }
}

#[test]
fn the_codemap_names_every_source_file() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let map = std::fs::read_to_string(root.join("docs/architecture.md")).expect("codemap");
    let mut missing = Vec::new();
    for c in std::fs::read_dir(root.join("crates"))
        .expect("crates")
        .flatten()
    {
        let mut files = Vec::new();
        sources(&c.path().join("src"), "", &mut files);
        for f in files {
            if !map.contains(&format!("`{f}`"))
                && !map.contains(&format!("{f},"))
                && !map.contains(&format!("{f} "))
            {
                missing.push(format!("{}/src/{f}", c.file_name().to_string_lossy()));
            }
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "not in docs/architecture.md: {missing:?}"
    );
}
