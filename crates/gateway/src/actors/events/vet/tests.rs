use super::*;

fn desc(v: serde_json::Value) -> KvEventsDescriptor {
    serde_json::from_value(v).expect("descriptor")
}

fn url(s: &str) -> WorkerUrl {
    WorkerUrl::parse(s).expect("url")
}

#[test]
fn more_than_1024_ranks_are_refused() {
    let with = |n: u32| desc(serde_json::json!({"endpoint_port_base": 5557, "dp_size": n}));
    assert_eq!(too_many_ranks(&with(1)), None);
    assert_eq!(too_many_ranks(&with(1024)), None);
    let why = too_many_ranks(&with(1025)).expect("refused");
    assert!(why.contains("1025") && why.contains("1024"), "{why}");
    assert!(too_many_ranks(&with(65_000)).is_some());
    assert_eq!(
        too_many_ranks(&desc(serde_json::json!({"endpoint_port_base": 1}))),
        None
    );
}

/// The host `foreign_host` finds for a worker at `worker` advertising `host`.
fn check(worker: &str, host: Option<&str>, want: Option<&str>) {
    let d = desc(
        serde_json::json!({"endpoint_host": host, "endpoint_port_base": 5557,
        "replay_endpoint_port_base": 5600, "dp_size": 2}),
    );
    let eps = rank_endpoints(worker, &d).expect("endpoints");
    assert_eq!(
        foreign_host(&url(worker), &eps).as_deref(),
        want,
        "{worker} advertising {host:?}"
    );
}

#[test]
fn an_endpoint_host_other_than_the_workers_is_named() {
    // The worker's own host, said or implied: nothing to check.
    check("http://10.0.0.5:30000", None, None);
    check("http://10.0.0.5:30000", Some("*"), None);
    check("http://10.0.0.5:30000", Some("0.0.0.0"), None);
    check("http://10.0.0.5:30000", Some("10.0.0.5"), None);
    check("http://GPU-1.example:30000", Some("gpu-1.example."), None);
    check("http://[fd00::5]:30000", Some("fd00::5"), None);
    check("http://[fd00::5]:30000", Some("[::]"), None);
    // Anywhere else is checked.
    check(
        "http://10.0.0.5:30000",
        Some("169.254.169.254"),
        Some("169.254.169.254"),
    );
    check("http://10.0.0.5:30000", Some("10.0.0.6"), Some("10.0.0.6"));
    check(
        "http://gpu-1.example:30000",
        Some("Metadata.Google.Internal"),
        Some("metadata.google.internal"),
    );
    check("http://10.0.0.5:30000", Some("fe80::1"), Some("fe80::1"));
}
