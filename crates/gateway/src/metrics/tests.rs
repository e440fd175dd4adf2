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
