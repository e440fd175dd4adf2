//! A Kubernetes API server on loopback that speaks the pods' list/watch protocol as the
//! real one does, for the discovery tests: `GET /api/v1/namespaces/{ns}/pods` answers a
//! `PodList` with its `metadata.resourceVersion`; with `watch=true` it streams
//! newline-delimited watch events (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`) after the
//! given `resourceVersion`, chunk by chunk. A test drives it: pods change, watches are
//! dropped mid-stream, expired (`410 Gone` as a real server sends it to a watch: HTTP 200
//! and one `ERROR` event carrying the Status), or the whole server goes away and comes
//! back on its port. InferencePools (`/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools`,
//! with a `metadata.name` field selector) are served the same way.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};

mod wire;

use wire::{chunk, gone, query, query_text, respond};

/// What the server holds and what it was asked.
#[derive(Debug, Default)]
struct State {
    /// The last resourceVersion given out (etcd's revision).
    rv: u64,
    /// By name, as last written (all in one namespace).
    pods: BTreeMap<String, Value>,
    /// The InferencePools (`inference.networking.k8s.io/v1`), by name.
    pools: BTreeMap<String, Value>,
    /// Every event, in order: its resourceVersion, its type, the object.
    history: Vec<(u64, &'static str, Value)>,
    /// A watch from below this is answered `410 Gone` (history compacted).
    compacted: u64,
    /// Bumped to drop every open watch mid-stream.
    drops: u64,
    /// Bumped to end every open watch with a `410 Gone` ERROR event.
    expiries: u64,
    /// Bumped to send every open watch a BOOKMARK at the current resourceVersion.
    bookmarks: u64,
    /// Bumped when the server goes away: every connection is closed.
    outages: u64,
    /// Whether it listens.
    up: bool,
    /// Changes written while silent make no events (as if compacted away unseen).
    silent: bool,
    /// The list and watch requests, as `path?query`.
    requests: Vec<String>,
    uids: u64,
    /// The owner dropped it: the accept loop ends.
    over: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The fake API server. Dropping it stops it.
#[derive(Debug)]
pub struct FakeApi {
    shared: Arc<Shared>,
    pub port: u16,
    pub namespace: String,
}

/// `key=value,...` as the server reads a labelSelector (equality only).
fn selects(selector: &str, pod: &Value) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|req| {
        let (k, v) = req.split_once('=').unwrap_or((req, ""));
        pod["metadata"]["labels"][k].as_str() == Some(v)
    })
}

/// What a list or watch asks for: a collection of a namespace, by labels and name.
#[derive(Debug)]
struct Filter {
    namespace: String,
    /// The objects' `kind`: `Pod` or `InferencePool`.
    kind: &'static str,
    labels: String,
    /// `metadata.name=NAME`, the only field selector served.
    name: Option<String>,
}

impl Filter {
    /// The collection a path names: pods, or the extension's InferencePools.
    fn of(path: &str, params: &BTreeMap<String, String>) -> Option<Filter> {
        let (namespace, kind) = if let Some(ns) = path
            .strip_prefix("/api/v1/namespaces/")
            .and_then(|r| r.strip_suffix("/pods"))
        {
            (ns, "Pod")
        } else {
            let ns = path
                .strip_prefix("/apis/inference.networking.k8s.io/v1/namespaces/")
                .and_then(|r| r.strip_suffix("/inferencepools"))?;
            (ns, "InferencePool")
        };
        (!namespace.contains('/')).then(|| Filter {
            namespace: namespace.to_owned(),
            kind,
            labels: params.get("labelSelector").cloned().unwrap_or_default(),
            name: params
                .get("fieldSelector")
                .and_then(|f| f.strip_prefix("metadata.name="))
                .map(str::to_owned),
        })
    }

    fn api_version(&self) -> &'static str {
        if self.kind == "Pod" {
            "v1"
        } else {
            "inference.networking.k8s.io/v1"
        }
    }

    fn takes(&self, o: &Value) -> bool {
        o["kind"] == self.kind
            && o["metadata"]["namespace"] == self.namespace.as_str()
            && selects(&self.labels, o)
            && self
                .name
                .as_ref()
                .is_none_or(|n| o["metadata"]["name"] == n.as_str())
    }
}

impl FakeApi {
    /// Starts on an OS-picked loopback port, serving `namespace`.
    pub fn start(namespace: &str) -> FakeApi {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let shared = Arc::new(Shared::default());
        shared.lock().up = true;
        let s = shared.clone();
        std::thread::spawn(move || accept_loop(listener, port, &s));
        FakeApi {
            shared,
            port,
            namespace: namespace.to_owned(),
        }
    }

    /// A kubeconfig for this server: plain HTTP, no credentials, this namespace.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: nobody\n    namespace: {}\n\
             current-context: fake\nusers:\n- name: nobody\n  user: {{}}\n",
            self.port, self.namespace
        );
        std::fs::write(&path, text).expect("kubeconfig written");
        path
    }

    fn write(&self, kind: &'static str, mut pod: Value) {
        let mut st = self.shared.lock();
        st.rv += 1;
        let rv = st.rv;
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        let name = pod["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let map = if pod["kind"] == "InferencePool" {
            &mut st.pools
        } else {
            &mut st.pods
        };
        if kind == "DELETED" {
            map.remove(&name);
        } else {
            map.insert(name, pod.clone());
        }
        if !st.silent {
            st.history.push((rv, kind, pod));
        }
        drop(st);
        self.shared.changed.notify_all();
    }

    /// A new pod object, as a Deployment's would look: Running, its containers' and the
    /// pod's readiness as given, labelled `labels`, with a fresh uid.
    pub fn pod(&self, name: &str, ip: &str, ready: bool, labels: Value) -> Value {
        let uid = {
            let mut st = self.shared.lock();
            st.uids += 1;
            format!("00000000-0000-4000-8000-{:012}", st.uids)
        };
        let flag = if ready { "True" } else { "False" };
        json!({
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "generateName": "engine-",
                "namespace": self.namespace,
                "uid": uid,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": labels,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "engine-7d4b9c", "uid": "rs-uid", "controller": true,
                    "blockOwnerDeletion": true}]
            },
            "spec": {
                "containers": [{"name": "engine", "image": "lmsysorg/sglang:latest",
                    "ports": [{"containerPort": 8000, "protocol": "TCP"}]}],
                "nodeName": "node-1",
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 30
            },
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "PodReadyToStartContainers", "status": "True"},
                    {"type": "Initialized", "status": "True"},
                    {"type": "Ready", "status": flag},
                    {"type": "ContainersReady", "status": flag},
                    {"type": "PodScheduled", "status": "True"}
                ],
                "hostIP": "10.0.0.1",
                "hostIPs": [{"ip": "10.0.0.1"}],
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "startTime": "2026-01-01T00:00:00Z",
                "qosClass": "BestEffort",
                "containerStatuses": [{"name": "engine", "ready": ready, "restartCount": 0,
                    "image": "lmsysorg/sglang:latest", "imageID": "", "started": true,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]
            }
        })
    }

    /// Creates a pod (`ADDED`).
    pub fn create(&self, pod: Value) {
        self.write("ADDED", pod);
    }

    /// The pod as the server holds it.
    pub fn get(&self, name: &str) -> Value {
        self.shared
            .lock()
            .pods
            .get(name)
            .cloned()
            .expect("a pod of that name")
    }

    /// Changes a pod (`MODIFIED`).
    pub fn modify(&self, name: &str, change: impl FnOnce(&mut Value)) {
        let mut pod = self.get(name);
        change(&mut pod);
        self.write("MODIFIED", pod);
    }

    /// The pod's `Ready` (and `ContainersReady`) condition.
    pub fn set_ready(&self, name: &str, ready: bool) {
        self.modify(name, |p| {
            let flag = if ready { "True" } else { "False" };
            for c in p["status"]["conditions"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                if c["type"] == "Ready" || c["type"] == "ContainersReady" {
                    c["status"] = json!(flag);
                }
            }
            p["status"]["containerStatuses"][0]["ready"] = json!(ready);
        });
    }

    /// The first step of a deletion: the deletion timestamp (the pod still Ready).
    pub fn mark_deleting(&self, name: &str) {
        self.modify(name, |p| {
            p["metadata"]["deletionTimestamp"] = json!("2026-01-01T01:00:00Z");
            p["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        });
    }

    /// The last step: the object is gone (`DELETED`).
    pub fn delete(&self, name: &str) {
        let pod = self.get(name);
        self.write("DELETED", pod);
    }

    /// Creates or changes the InferencePool `name`: engines labelled `labels`, on `port`,
    /// picked by `kvgate-picker`.
    pub fn put_pool(&self, name: &str, labels: Value, port: u16) {
        let exists = self.shared.lock().pools.contains_key(name);
        let pool = json!({
            "kind": "InferencePool",
            "apiVersion": "inference.networking.k8s.io/v1",
            "metadata": {"name": name, "namespace": self.namespace,
                "uid": format!("pool-{name}"), "generation": 1},
            "spec": {
                "selector": {"matchLabels": labels},
                "targetPorts": [{"number": port}],
                "endpointPickerRef": {"name": "kvgate-picker", "port": {"number": 9002}}
            }
        });
        self.write(if exists { "MODIFIED" } else { "ADDED" }, pool);
    }

    /// Deletes the InferencePool `name`.
    pub fn delete_pool(&self, name: &str) {
        let pool = self.shared.lock().pools.get(name).cloned();
        self.write("DELETED", pool.expect("a pool of that name"));
    }

    /// Every open watch is cut mid-stream: half an event, then the connection closes.
    pub fn drop_watches(&self) {
        self.shared.lock().drops += 1;
        self.shared.changed.notify_all();
    }

    /// The history up to now is compacted and every open watch is told so with a `410
    /// Gone` ERROR event: a watch can only resume by listing again.
    pub fn expire(&self) {
        let mut st = self.shared.lock();
        st.compacted = st.rv;
        st.expiries += 1;
        drop(st);
        self.shared.changed.notify_all();
    }

    /// Sends every open watch a BOOKMARK at the current resourceVersion.
    pub fn bookmark(&self) {
        self.shared.lock().bookmarks += 1;
        self.shared.changed.notify_all();
    }

    /// While silent, changes make no watch events (only a new list shows them).
    pub fn set_silent(&self, silent: bool) {
        self.shared.lock().silent = silent;
    }

    /// Stops listening and closes every connection, as a server that went away.
    pub fn go_away(&self) {
        let mut st = self.shared.lock();
        st.up = false;
        st.outages += 1;
        drop(st);
        self.shared.changed.notify_all();
    }

    /// Listens again on the same port, with the same state.
    pub fn come_back(&self) {
        self.shared.lock().up = true;
        self.shared.changed.notify_all();
    }

    /// The list and watch requests so far, as `path?query` (decoded).
    pub fn requests(&self) -> Vec<String> {
        self.shared.lock().requests.clone()
    }

    /// The lists (not watches) asked so far.
    pub fn lists(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| !r.contains("watch=true") && !r.contains("watch=1"))
            .count()
    }

    /// The resourceVersion the server is at.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.go_away();
        self.shared.lock().over = true;
    }
}

/// Accepts while up; while away, holds no listener at all (connections are refused).
fn accept_loop(listener: TcpListener, port: u16, shared: &Arc<Shared>) {
    let mut listener = Some(listener);
    loop {
        let (up, over) = {
            let st = shared.lock();
            (st.up, st.over)
        };
        if over {
            return;
        }
        match (&listener, up) {
            (Some(_), false) => listener = None,
            (None, true) => {
                listener = TcpListener::bind(("127.0.0.1", port)).ok();
                continue;
            }
            _ => {}
        }
        let Some(l) = &listener else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        l.set_nonblocking(true).expect("nonblocking");
        match l.accept() {
            Ok((conn, _)) => {
                conn.set_nonblocking(false).expect("blocking");
                let s = shared.clone();
                std::thread::spawn(move || serve(conn, &s));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// One connection: requests one after another (keep-alive) until it closes or the
/// server goes away.
fn serve(conn: TcpStream, shared: &Arc<Shared>) {
    let outage = shared.lock().outages;
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    // A watcher thread that closes this connection when the server goes away.
    let closer = conn.try_clone().ok();
    let s = shared.clone();
    std::thread::spawn(move || {
        let mut st = s.lock();
        while st.outages == outage {
            st = match s.changed.wait_timeout(st, Duration::from_millis(100)) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        if let Some(c) = closer {
            let _ = c.shutdown(Shutdown::Both);
        }
    });
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let target = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
        }
        let (path, params) = query(&target);
        let Some(filter) = Filter::of(&path, &params) else {
            let _ = respond(
                &mut out,
                "404 Not Found",
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "NotFound", "code": 404}),
            );
            continue;
        };
        shared
            .lock()
            .requests
            .push(format!("{path}?{}", query_text(&params)));
        let watching = matches!(params.get("watch").map(String::as_str), Some("true" | "1"));
        if !watching {
            let st = shared.lock();
            let items: Vec<Value> = (st.pods.values().chain(st.pools.values()))
                .filter(|p| filter.takes(p))
                .cloned()
                .collect();
            let body = json!({"kind": format!("{}List", filter.kind), "apiVersion": filter.api_version(),
                "metadata": {"resourceVersion": st.rv.to_string()}, "items": items});
            drop(st);
            if respond(&mut out, "200 OK", &body).is_err() {
                return;
            }
            continue;
        }
        let from: u64 = params
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let bookmarks = params.get("allowWatchBookmarks").map(String::as_str) == Some("true");
        match watch(&mut out, shared, &filter, from, bookmarks) {
            Ok(true) => {}
            // Cut, failed or the server went away: the connection is closed.
            _ => return,
        }
    }
}

/// Streams watch events after `from`; `Ok(true)` when it ended cleanly (410), the
/// connection reusable.
fn watch(
    out: &mut TcpStream,
    shared: &Arc<Shared>,
    filter: &Filter,
    from: u64,
    bookmarks: bool,
) -> std::io::Result<bool> {
    write!(
        out,
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    )?;
    out.flush()?;
    let (drops, expiries, mut marks, outages, compacted) = {
        let st = shared.lock();
        (
            st.drops,
            st.expiries,
            st.bookmarks,
            st.outages,
            st.compacted,
        )
    };
    if from < compacted {
        chunk(out, &gone(from))?;
        out.write_all(b"0\r\n\r\n")?;
        out.flush()?;
        return Ok(true);
    }
    let mut seen = from;
    loop {
        let (events, now) = {
            let st = shared.lock();
            let evs: Vec<(u64, &'static str, Value)> = (st.history.iter())
                .filter(|(rv, _, p)| *rv > seen && filter.takes(p))
                .cloned()
                .collect();
            (evs, st.rv)
        };
        for (rv, kind, pod) in events {
            chunk(out, &json!({"type": kind, "object": pod}))?;
            seen = seen.max(rv);
        }
        seen = seen.max(now);
        let mut st = shared.lock();
        if st.outages != outages {
            return Ok(false);
        }
        // Before a cut asked at the same time: the cut comes after what was sent.
        if st.bookmarks != marks {
            marks = st.bookmarks;
            let rv = st.rv;
            drop(st);
            if bookmarks {
                chunk(
                    out,
                    &json!({"type": "BOOKMARK", "object": {"kind": filter.kind, "apiVersion": filter.api_version(),
                        "metadata": {"resourceVersion": rv.to_string()}}}),
                )?;
            }
            continue;
        }
        if st.drops != drops {
            drop(st);
            // Half an event, then the connection is gone.
            out.write_all(b"40\r\n{\"type\":\"MODIF")?;
            out.flush()?;
            let _ = out.shutdown(Shutdown::Both);
            return Ok(false);
        }
        if st.expiries != expiries {
            drop(st);
            chunk(out, &gone(from))?;
            out.write_all(b"0\r\n\r\n")?;
            out.flush()?;
            return Ok(true);
        }
        let stale = st.history.last().is_some_and(|(rv, _, _)| *rv > seen) || st.rv > seen;
        if !stale {
            st = match shared.changed.wait_timeout(st, Duration::from_millis(200)) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        drop(st);
    }
}
