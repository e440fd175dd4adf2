use kvgate_policies::DecisionPath;

use std::sync::Arc;

use super::{Fleet, Metrics, PATHS, path_slot};
use kvgate_core::Endpoint;

#[test]
fn each_dispatched_path_counts_under_its_own_name() {
    use DecisionPath::*;
    let all = [
        Hit, Spill, Miss, KvPressure, Hash, Load, RoundRobin, Random, Fallback, NoWorker, Saturated,
    ];
    for p in all {
        if let Some(i) = path_slot(p) {
            assert_eq!(PATHS[i], p.name());
        }
    }
    let m = Metrics::default();
    m.dispatched(Hit, 1, super::Door::Http);
    m.dispatched(Miss, 2, super::Door::ExtProc);
    m.dispatched(NoWorker, 1, super::Door::Http);
    let counts = m.decision_counts();
    let count = |p: &str| counts.iter().find(|(n, _)| *n == p).map(|(_, c)| *c);
    assert_eq!(count("hit"), Some(1));
    assert_eq!(count("miss"), Some(0));
    assert_eq!(count("retry"), Some(1));
    assert_eq!(m.retries.get(), 1);
    let text = m.encode(&Fleet::default()).expect("encodes");
    for (door, n) in [("http", 2), ("ext_proc", 1)] {
        let line = format!("kvgate_front_door_decisions_total{{door=\"{door}\"}} {n}");
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
}

#[test]
fn a_model_counts_under_its_name_whichever_copy_of_it_is_given() {
    let m = Metrics::default();
    // Two copies of one name (the selector's, before and after a rebuild) and none.
    let (a, b): (Arc<str>, Arc<str>) = (Arc::from("m"), Arc::from("m"));
    m.request(Endpoint::Chat, 200, Some(&a));
    m.request(Endpoint::Chat, 200, Some(&b));
    m.request(Endpoint::Chat, 200, Some(&Arc::from("n")));
    m.request(Endpoint::Generate, 503, None);
    assert_eq!(m.requests_total(), 4);
    let text = m.encode(&Fleet::default()).expect("encodes");
    const CHAT: &str = "route=\"/v1/chat/completions\"";
    let count = |labels: &[&str]| {
        text.lines()
            .filter(|l| l.starts_with("kvgate_requests_total{"))
            .find(|l| labels.iter().all(|x| l.contains(x)))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    assert_eq!(
        count(&["model=\"m\"", "status=\"2xx\"", CHAT]).as_deref(),
        Some("2")
    );
    assert_eq!(
        count(&["model=\"n\"", "status=\"2xx\"", CHAT]).as_deref(),
        Some("1")
    );
    assert_eq!(
        count(&["model=\"\"", "status=\"5xx\"", "route=\"/generate\""]).as_deref(),
        Some("1")
    );
}

fn worker(url: &str, circuit: i64) -> super::FleetWorker {
    super::FleetWorker {
        url: url.to_owned(),
        healthy: true,
        in_flight: 0,
        circuit,
        events_state: 0,
        event_blocks: 0,
        ranks: Vec::new(),
    }
}

fn has(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[test]
fn counters_are_totals_circuits_are_one_series_per_state_and_removed_workers_go() {
    let m = Metrics::default();
    m.health_transition("http://a:1", false);
    m.health_transition("http://b:1", true);
    let fleet = Fleet {
        workers: vec![worker("http://a:1", 2), worker("http://b:1", 0)],
        snapshots_written: 3,
        snapshot_failures: 1,
        ..Fleet::default()
    };
    let text = m.encode(&fleet).expect("encodes");
    for line in [
        "kvgate_snapshots_written_total 3",
        "kvgate_snapshot_write_failures_total 1",
        "kvgate_worker_circuit{worker=\"http://a:1\",state=\"open\"} 1",
        "kvgate_worker_circuit{worker=\"http://a:1\",state=\"closed\"} 0",
        "kvgate_worker_circuit{worker=\"http://b:1\",state=\"closed\"} 1",
        "kvgate_worker_health_transitions_total{worker=\"http://a:1\",to=\"unhealthy\"} 1",
        concat!(
            "kvgate_build_info{version=\"",
            env!("CARGO_PKG_VERSION"),
            "\"} 1"
        ),
    ] {
        assert!(has(&text, line), "{line} in\n{text}");
    }
    assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    #[cfg(target_os = "linux")]
    for name in [
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_cpu_seconds_total ",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "{name} in\n{text}"
        );
    }
    // Worker a leaves; the counters only move up to the store's counts.
    let fleet = Fleet {
        workers: vec![worker("http://b:1", 0)],
        snapshots_written: 5,
        snapshot_failures: 1,
        ..Fleet::default()
    };
    let text = m.encode(&fleet).expect("encodes");
    assert!(!text.contains("http://a:1"), "{text}");
    assert!(has(&text, "kvgate_snapshots_written_total 5"), "{text}");
    assert!(
        has(
            &text,
            "kvgate_worker_health_transitions_total{worker=\"http://b:1\",to=\"healthy\"} 1"
        ),
        "{text}"
    );
}
