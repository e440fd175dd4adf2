use crate::decision::{AdapterFit, DecisionNote};
use crate::snapshot::{AdapterLoad, RequestFacts};
use crate::testkit::*;
use crate::{CacheMode, PolicyConfig, PolicyKind};

fn running(adapters: &[&str], max_loras: u32, in_flight: u64) -> crate::WorkerLoad {
    let mut l = waiting(0);
    l.ranks[0].num_running_reqs = in_flight;
    l.adapters = Some(AdapterLoad {
        active: adapters.iter().map(|a| (*a).to_owned()).collect(),
        max_loras,
    });
    l
}

fn under(adapter: &str) -> RequestFacts {
    RequestFacts {
        adapter: Some(adapter.into()),
        ..text("a prompt nobody holds")
    }
}

#[test]
fn the_adapter_goes_where_it_is_active_before_where_it_has_room_before_where_it_is_full() {
    for mode in [CacheMode::Cost, CacheMode::Threshold] {
        let cfg = PolicyConfig {
            cache_mode: mode,
            ..PolicyConfig::with_kind(PolicyKind::CacheAware)
        };
        let ws = vec![
            w(1).load(running(&["x", "y"], 2, 1)),
            w(2).load(running(&["sql"], 2, 1)),
            w(3).load(running(&["x"], 2, 1)),
        ];
        let matches = text_matches(20, &[]);
        for seed in 0..20 {
            let d = pick(&cfg, &ws, &under("sql"), Some(&matches), seed);
            assert_eq!(d.worker, Some(id(2)), "{mode:?}");
            assert!(d.notes.contains(&DecisionNote::Adapter {
                fit: AdapterFit::Active
            }));
        }
        // Not active anywhere: where loading it evicts nothing.
        for seed in 0..20 {
            let d = pick(&cfg, &ws, &under("chat"), Some(&matches), seed);
            assert!(
                matches!(d.worker, Some(x) if x == id(2) || x == id(3)),
                "{mode:?}"
            );
            assert!(d.notes.contains(&DecisionNote::Adapter {
                fit: AdapterFit::Room
            }));
        }
    }
}

#[test]
fn an_engine_over_the_gate_loses_its_adapter_requests_to_one_where_it_would_load() {
    let cfg = PolicyConfig::with_kind(PolicyKind::CacheAware);
    // Worker 1 runs the adapter but is far past the gate's margins.
    let ws = vec![
        w(1).load(running(&["sql"], 4, 60)).flight(60),
        w(2).load(running(&[], 4, 0)),
        w(3).load(running(&["a", "b", "c", "d"], 4, 0)),
    ];
    let d = pick(&cfg, &ws, &under("sql"), Some(&text_matches(20, &[])), 1);
    assert_eq!(d.worker, Some(id(2)));
    assert!(d.notes.contains(&DecisionNote::Adapter {
        fit: AdapterFit::Room
    }));
}

#[test]
fn a_request_without_an_adapter_is_not_narrowed() {
    let cfg = PolicyConfig::with_kind(PolicyKind::CacheAware);
    let ws = vec![
        w(1).load(running(&["sql"], 1, 0)),
        w(2).load(running(&["x"], 1, 0)),
    ];
    let picks = run(&cfg, &mut ws.clone(), &text("p"), None, 40, true, 3);
    assert_eq!(counts(&picks).len(), 2);
    let d = pick(&cfg, &ws, &text("p"), None, 1);
    assert!(
        !d.notes
            .iter()
            .any(|n| matches!(n, DecisionNote::Adapter { .. }))
    );
}

#[test]
fn engines_that_report_no_adapters_all_have_room() {
    let cfg = PolicyConfig::with_kind(PolicyKind::CacheAware);
    let ws = fleet(3);
    let picks = run(&cfg, &mut ws.clone(), &under("sql"), None, 30, true, 5);
    assert_eq!(counts(&picks).len(), 3, "{picks:?}");
}

#[test]
fn the_scope_keeps_adapters_and_salts_apart() {
    let base = text("p");
    assert!(!base.scoped());
    assert_eq!(base.cache_scope(), "");
    let a = under("sql");
    let salted = RequestFacts {
        cache_salt: Some("tenant-1".into()),
        ..text("p")
    };
    let both = RequestFacts {
        cache_salt: Some("tenant-1".into()),
        ..under("sql")
    };
    let scopes = [a.cache_scope(), salted.cache_scope(), both.cache_scope()];
    assert!(a.scoped() && salted.scoped() && both.scoped());
    for (i, x) in scopes.iter().enumerate() {
        for y in &scopes[i + 1..] {
            assert_ne!(x, y);
        }
    }
}
