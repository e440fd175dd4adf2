//! The dependency graph is the architecture: what each crate may link, checked on the
//! workspace's own `cargo metadata`.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

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
    // A proc-macro runs in the compiler: what it uses is never linked into its user.
    let proc_macros: BTreeSet<&str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| {
            (p["targets"].as_array().into_iter().flatten())
                .flat_map(|t| t["kind"].as_array().into_iter().flatten())
                .any(|k| k == "proc-macro")
        })
        .filter_map(|p| p["id"].as_str())
        .collect();
    let mut g = HashMap::new();
    for node in meta["resolve"]["nodes"].as_array().expect("resolve") {
        let Some(name) = node["id"].as_str().and_then(|id| name_of.get(id)) else {
            continue;
        };
        if node["id"]
            .as_str()
            .is_some_and(|id| proc_macros.contains(id))
        {
            g.insert(name.to_string(), Vec::new());
            continue;
        }
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

/// Features that put test hooks in a build (an injected panic): only a dev-dependency
/// may turn them on, so `cargo build --workspace` never unifies them into a binary.
const TEST_ONLY_FEATURES: [&str; 1] = ["fault-injection"];

/// `(package, dependency, feature)` for each test-only feature a workspace package turns
/// on through a normal or build dependency.
fn test_hooks_outside_dev(meta: &Value) -> Vec<(String, String, String)> {
    let members: BTreeSet<&str> = (meta["workspace_members"].as_array().into_iter())
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut found = Vec::new();
    for p in meta["packages"].as_array().into_iter().flatten() {
        if !p["id"].as_str().is_some_and(|id| members.contains(id)) {
            continue;
        }
        for d in p["dependencies"].as_array().into_iter().flatten() {
            if d["kind"] == "dev" {
                continue;
            }
            for f in d["features"].as_array().into_iter().flatten() {
                if let Some(f) = f.as_str().filter(|f| TEST_ONLY_FEATURES.contains(f)) {
                    let name = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                    found.push((name(&p["name"]), name(&d["name"]), f.to_owned()));
                }
            }
        }
    }
    found
}

#[test]
fn test_hooks_stay_out_of_workspace_builds() {
    let (_, meta) = graph();
    assert_eq!(test_hooks_outside_dev(&meta), vec![]);
}

#[test]
fn the_test_hook_check_sees_a_normal_dependency() {
    let meta = serde_json::json!({
        "workspace_members": ["t"],
        "packages": [{"id": "t", "name": "kvgate-tests", "dependencies": [
            {"name": "kvgate-gateway", "kind": null, "features": ["fault-injection"]},
            {"name": "kvgate-gateway", "kind": "dev", "features": ["fault-injection"]},
        ]}],
    });
    assert_eq!(
        test_hooks_outside_dev(&meta),
        [(
            "kvgate-tests".to_owned(),
            "kvgate-gateway".to_owned(),
            "fault-injection".to_owned()
        )]
    );
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
    // Kubernetes discovery reads pods: no other kvgate crate, no actor, no server, no store.
    assert_links_none(
        &g,
        "kvgate-discovery",
        &[
            "kvgate-core",
            "kvgate-gateway",
            "actix",
            "actix-web",
            "sled",
            "openssl",
            "openssl-sys",
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
    // Embedders get the library alone: the binary's CLI, log subscriber, error type and
    // simulated engines are the binary crate's.
    assert_links_none(
        &g,
        "kvgate-gateway",
        &["kvgate-engine-sim", "clap", "anyhow", "tracing-subscriber"],
    );
    let binary = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "kvgate")
        .expect("the binary package");
    assert_eq!(
        binary["targets"][0]["kind"][0], "bin",
        "{}",
        binary["targets"]
    );
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

/// What the codemap gets wrong: the `required` files it does not name in backticks by
/// their path from the repository root, and the paths under `crates/` or `tests/` it names
/// in backticks that are `.rs` files not in the tree (`exists` says which are).
fn codemap_errors(
    doc: &str,
    required: &[String],
    exists: impl Fn(&str) -> bool,
) -> (Vec<String>, Vec<String>) {
    let missing: Vec<String> = (required.iter())
        .filter(|f| !doc.contains(&format!("`{f}`")))
        .cloned()
        .collect();
    let mut named = BTreeSet::new();
    for prefix in ["`crates/", "`tests/"] {
        for (at, _) in doc.match_indices(prefix) {
            let span = &doc[at + 1..];
            if let Some(end) = span.find('`') {
                named.insert(&span[..end]);
            }
        }
    }
    let stale: Vec<String> = (named.into_iter())
        .filter(|p| p.ends_with(".rs") && !exists(p))
        .map(str::to_owned)
        .collect();
    (missing, stale)
}

#[test]
fn the_codemap_names_every_source_file() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let map = std::fs::read_to_string(root.join("docs/architecture.md")).expect("codemap");
    let mut required = Vec::new();
    for c in std::fs::read_dir(root.join("crates"))
        .expect("crates")
        .flatten()
    {
        let mut files = Vec::new();
        sources(&c.path().join("src"), "", &mut files);
        let krate = c.file_name().to_string_lossy().into_owned();
        // `sources` skips `tests/` directories below the top of `src` only.
        required.extend(
            (files.iter())
                .map(|f| format!("crates/{krate}/src/{f}"))
                .filter(|f| !f.contains("/tests/")),
        );
    }
    required.sort();
    let (missing, stale) = codemap_errors(&map, &required, |p| root.join(p).is_file());
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/architecture.md does not name (as `crates/<crate>/src/<path>`): {missing:?}; \
         names files that are not in the tree: {stale:?}"
    );
}

#[test]
fn the_codemap_check_sees_a_missing_and_a_stale_path() {
    let tree = [
        "crates/a/src/lib.rs".to_owned(),
        "crates/a/src/b.rs".to_owned(),
    ];
    let exists = |p: &str| tree.iter().any(|f| f == p);
    // A bare file name names no path; a path that moved is stale.
    let doc = "`crates/a/src/lib.rs`: the root; `b.rs`; `crates/a/src/gone.rs`: moved.";
    assert_eq!(
        codemap_errors(doc, &tree, exists),
        (
            vec!["crates/a/src/b.rs".to_owned()],
            vec!["crates/a/src/gone.rs".to_owned()]
        )
    );
    // Files named together in braces are not paths of the tree either.
    let doc = "`crates/a/src/lib.rs`, `crates/a/src/{b,c}.rs`";
    assert_eq!(
        codemap_errors(doc, &tree, exists).1,
        ["crates/a/src/{b,c}.rs"]
    );
    let doc = "`crates/a/src/lib.rs` and `crates/a/src/b.rs`, under `crates/a/src/`.";
    assert_eq!(codemap_errors(doc, &tree, exists), (vec![], vec![]));
}

/// A crate's modules (`a::b`, the root as "") and the modules each one names through
/// `crate::` or `super::` paths, outside comments and test code.
fn module_graph(src: &std::path::Path) -> (BTreeSet<String>, BTreeSet<(String, String)>) {
    let mut files = Vec::new();
    sources(src, "", &mut files);
    let module_of = |f: &str| {
        let mut parts: Vec<&str> = f.trim_end_matches(".rs").split('/').collect();
        if matches!(parts.last(), Some(&("lib" | "main" | "mod"))) {
            parts.pop();
        }
        parts.join("::")
    };
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    // The longest module that is a prefix of `path`.
    let resolve = |path: &[&str]| {
        (0..=path.len())
            .rev()
            .map(|k| path[..k].join("::"))
            .find(|m| modules.contains(m))
    };
    let mut edges = BTreeSet::new();
    for f in &files {
        let here = module_of(f);
        let text = std::fs::read_to_string(src.join(f)).expect("source file");
        // Test modules come last in a file; what they use is not the module's.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (start, _) in line
                .match_indices("crate::")
                .chain(line.match_indices("super::"))
            {
                let before = line[..start].chars().last();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let tail: Vec<&str> = line[start..]
                    .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .next()
                    .unwrap_or("")
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .collect();
                let mut path: Vec<&str> = if tail.first() == Some(&"crate") {
                    Vec::new()
                } else if here.is_empty() {
                    continue;
                } else {
                    here.split("::").collect()
                };
                let mut rest = &tail[..];
                if rest.first() == Some(&"crate") {
                    rest = &rest[1..];
                }
                while rest.first() == Some(&"super") {
                    path.pop();
                    rest = &rest[1..];
                }
                path.extend_from_slice(rest);
                if let Some(to) = resolve(&path)
                    && to != here
                {
                    edges.insert((here.clone(), to));
                }
            }
        }
    }
    (modules, edges)
}

/// Whether one module is the other's ancestor (a parent uses its children and they use
/// what it holds for them: that is one room, not a circle).
fn related(a: &str, b: &str) -> bool {
    a.is_empty()
        || b.is_empty()
        || a.starts_with(&format!("{b}::"))
        || b.starts_with(&format!("{a}::"))
}

/// The module circles of a crate: groups of modules, none an ancestor of another, that
/// reach each other.
fn circles(src: &std::path::Path) -> Vec<Vec<String>> {
    let (modules, edges) = module_graph(src);
    let next = |m: &str| -> Vec<String> {
        edges
            .iter()
            .filter(|(a, b)| a == m && !related(a, b))
            .map(|(_, b)| b.clone())
            .collect()
    };
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = next(from);
        while let Some(m) = todo.pop() {
            if seen.insert(m.clone()) {
                todo.extend(next(&m));
            }
        }
        seen
    };
    let reached: HashMap<&String, BTreeSet<String>> =
        modules.iter().map(|m| (m, reach(m))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for m in &modules {
        let group: Vec<String> = (reached[m].iter())
            .filter(|o| reached.get(o).is_some_and(|r| r.contains(m)))
            .cloned()
            .collect();
        if !group.is_empty() && !out.iter().any(|g| g.contains(m)) {
            out.push(group);
        }
    }
    out
}

#[test]
fn no_crate_has_a_module_circle() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    for c in std::fs::read_dir(root.join("crates"))
        .expect("crates")
        .flatten()
    {
        let found = circles(&c.path().join("src"));
        assert!(
            found.is_empty(),
            "{}: modules that use each other: {found:?}",
            c.file_name().to_string_lossy()
        );
    }
}

/// The gateway's top-level modules from the front door down. A module uses only those in
/// the layers below its own (docs/architecture.md, "Layers of the gateway crate").
const GATEWAY_LAYERS: &[&[&str]] = &[
    &["server"],
    &["http", "picker"],
    &["pipeline"],
    &["facts"],
    &["actors"],
    &["upstream", "metrics", "telemetry"],
    &["config", "alloc"],
];

#[test]
fn the_gateway_layers_point_one_way() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let (modules, edges) = module_graph(&root.join("crates/gateway/src"));
    let top = |m: &str| m.split("::").next().unwrap_or("").to_owned();
    let layer = |m: &str| {
        GATEWAY_LAYERS
            .iter()
            .position(|l| l.contains(&top(m).as_str()))
    };
    for m in modules.iter().filter(|m| !m.is_empty()) {
        assert!(layer(m).is_some(), "{m} is in no layer of GATEWAY_LAYERS");
    }
    let upward: Vec<String> = edges
        .iter()
        .filter(|(a, b)| !a.is_empty() && !b.is_empty() && top(a) != top(b))
        .filter(|(a, b)| layer(a) >= layer(b))
        .map(|(a, b)| format!("{a} -> {b}"))
        .collect();
    assert!(upward.is_empty(), "uses that do not point down: {upward:?}");
}

#[test]
fn the_circle_check_sees_a_circle() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").expect("write");
    std::fs::write(src.join("a.rs"), "use crate::b::B;\npub struct A;\n").expect("write");
    std::fs::write(src.join("b.rs"), "pub struct B(super::a::A);\n").expect("write");
    assert_eq!(circles(src), vec![vec!["a".to_owned(), "b".to_owned()]]);
    std::fs::write(src.join("b.rs"), "pub struct B;\n").expect("write");
    assert!(circles(src).is_empty());
}
