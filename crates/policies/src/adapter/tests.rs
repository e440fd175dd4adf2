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
    // One engine reports room; the two that report nothing are taken to have room too,
    // and stay candidates.
    let ws = vec![w(1).load(running(&[], 4, 0)), w(2), w(3)];
    let d = pick(&cfg, &ws, &under("sql"), Some(&text_matches(20, &[])), 1);
    assert_eq!(d.candidates.len(), 3, "{d:?}");
    assert!(d.notes.contains(&DecisionNote::Adapter {
        fit: AdapterFit::Room
    }));
    // One that would have to evict is not.
    let full = vec![w(1).load(running(&["a"], 1, 0)), w(2), w(3)];
    let d = pick(&cfg, &full, &under("sql"), Some(&text_matches(20, &[])), 1);
    assert_eq!(d.candidates.len(), 2, "{d:?}");
}

#[test]
fn the_index_key_keeps_adapters_and_salts_apart() {
    use crate::snapshot::RoutingText;
    let base = text("p");
    assert!(!base.scoped());
    assert_eq!(*base.index_key(), base.key);
    let a = under("sql");
    let salted = RequestFacts {
        cache_salt: Some("tenant-1".into()),
        ..text("p")
    };
    let both = RequestFacts {
        cache_salt: Some("tenant-1".into()),
        ..under("sql")
    };
    let keys = [
        base.index_key().into_owned(),
        a.index_key().into_owned(),
        salted.index_key().into_owned(),
        both.index_key().into_owned(),
    ];
    let texts: Vec<String> = keys
        .iter()
        .map(|k| match k {
            RoutingText::Text(t) => t.to_cow().into_owned(),
            other => panic!("{other:?}"),
        })
        .collect();
    // Each scope leads with its own marker; the prompt follows whole; the salt is not shown.
    for (i, x) in texts.iter().enumerate() {
        assert!(
            x.ends_with("a prompt nobody holds") || x.ends_with('p'),
            "{x}"
        );
        assert!(!x.contains("tenant-1"), "{x}");
        for y in &texts[i + 1..] {
            assert_ne!(x.get(..24), y.get(..24), "{x} / {y}");
        }
    }
    let tokens = RequestFacts {
        key: RoutingText::Tokens(vec![5, 6]),
        cache_salt: Some("t".into()),
        ..RequestFacts::default()
    };
    match &*tokens.index_key() {
        RoutingText::Tokens(t) => {
            assert_eq!(t.len(), 5);
            assert_eq!(&t[3..], [5, 6]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_holder_of_the_prompt_under_the_adapter_fits_as_well_as_an_engine_running_it() {
    let cfg = PolicyConfig::with_kind(PolicyKind::CacheAware);
    // Worker 1 holds the prompt under the adapter, which is idle there; worker 2 runs it.
    let ws = vec![
        w(1).load(running(&[], 4, 0)),
        w(2).load(running(&["sql"], 4, 1)),
    ];
    let m = text_matches(2000, &[(1, 1800)]);
    for seed in 0..10 {
        let d = pick(&cfg, &ws, &under("sql"), Some(&m), seed);
        assert_eq!(d.worker, Some(id(1)), "{d:?}");
    }
}
