//! Rendering, request bodies and URL escaping, without a gateway.

use serde_json::json;

use crate::client::percent_encode;
use crate::explain::explain_body;
use crate::fleet::workers_table;
use crate::render::{clip, host, route_name, table};

#[test]
fn tables_align() {
    let t = table(&["A", "LONG"], &[vec!["xyz".into(), "1".into()]]);
    assert_eq!(t, "A    LONG\nxyz  1\n");
}

#[test]
fn tables_fit_a_hundred_columns() {
    let long = "x".repeat(300);
    let t = table(&["A", "B"], &[vec![long.clone(), long]]);
    assert!(t.lines().all(|l| l.chars().count() <= 100), "{t}");
}

#[test]
fn renders_workers() {
    let v = json!({"workers": [{"id": "ab", "url": "http://x:1", "status": "ready", "in_flight": 2, "models": ["m"],
        "source": "config", "load": {"running": 3, "waiting": 1, "kv_usage": 0.25}, "index_share": 0.5}]});
    let t = workers_table(&v);
    let row: Vec<&str> = t.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row,
        ["ab", "http://x:1", "m", "ready", "2", "3/1", "25%", "50%"],
        "{t}"
    );
    assert!(!t.contains("SOURCE"), "{t}");
}

#[test]
fn a_discovered_worker_names_its_pod() {
    let v = json!({"workers": [{"id": "ab", "url": "http://x:1", "status": "ready", "in_flight": 2, "models": ["m"],
        "source": "config"},
        {"id": "cd", "url": "http://10.1.0.7:8000", "status": "draining", "in_flight": 1, "models": ["m"],
        "source": "kubernetes", "pod": "sglang-0", "namespace": "ml", "pod_uid": "u"}]});
    let t = workers_table(&v);
    let line = |i: usize| -> Vec<String> {
        let l = t.lines().nth(i).unwrap();
        l.split_whitespace().map(str::to_owned).collect()
    };
    assert_eq!(line(0)[4], "SOURCE", "{t}");
    assert_eq!(line(1)[4], "config", "{t}");
    assert_eq!(
        line(2)[..6],
        [
            "cd",
            "http://10.1.0.7:8000",
            "m",
            "draining",
            "kubernetes:ml/sglang-0",
            "1"
        ],
        "{t}"
    );
}

#[test]
fn explain_bodies_follow_the_route() {
    let chat = explain_body(Some("hi"), None, "chat", Some("m")).unwrap();
    assert_eq!(
        chat,
        json!({"messages": [{"role": "user", "content": "hi"}], "model": "m"})
    );
    let gen_body = explain_body(Some("hi"), None, "/generate", None).unwrap();
    assert_eq!(gen_body, json!({"text": "hi"}));
    let completion = explain_body(Some("hi"), None, "completions", None).unwrap();
    assert_eq!(completion, json!({"prompt": "hi"}));
    assert!(explain_body(None, None, "chat", None).is_err());
}

#[test]
fn narrow_cells() {
    assert_eq!(host(&json!("http://10.0.0.1:8000")), "10.0.0.1:8000");
    assert_eq!(route_name(&json!("/v1/chat/completions")), "chat");
    assert_eq!(clip("req-abcdefghijklmnop".into(), 8), "req-abc…");
    assert_eq!(clip("short".into(), 8), "short");
}

#[test]
fn encodes_urls() {
    assert_eq!(percent_encode("http://a:8/x"), "http%3A%2F%2Fa%3A8%2Fx");
    // RFC 3986's unreserved characters stay; anything else, UTF-8 included, is escaped.
    assert_eq!(percent_encode("a-b_c.d~e f/é"), "a-b_c.d~e%20f%2F%C3%A9");
}

#[test]
fn ids_and_urls_are_never_wrapped() {
    // Copied from the output into `kvgatectl remove`: wide cells beside them wrap instead.
    let v = json!({"workers": [{"id": "bb8cf756b6a73977", "url": "http://127.0.0.1:34619",
        "status": "ready", "in_flight": 0, "models": ["a-model-with-a-rather-long-name"],
        "source": "kubernetes", "pod": "sglang-engine-0", "namespace": "inference", "pod_uid": "u"}]});
    let t = workers_table(&v);
    assert!(t.lines().all(|l| l.chars().count() <= 100), "{t}");
    assert!(
        t.contains("bb8cf756b6a73977") && t.contains("http://127.0.0.1:34619"),
        "{t}"
    );
}
