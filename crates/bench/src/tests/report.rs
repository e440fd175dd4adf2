//! Figures and how they are shown: percentiles, splits, the SVG and the targets a run misses.

use crate::*;

#[test]
fn percentiles_by_nearest_rank() {
    let v: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(percentile(&v, 50.0), Some(50.0));
    assert_eq!(percentile(&v, 99.0), Some(99.0));
    assert_eq!(percentile(&v, 100.0), Some(100.0));
    assert_eq!(percentile(&v, 0.0), Some(1.0));
    assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
    assert_eq!(percentile(&[], 50.0), None);
    let s = Summary::of(&[3.0, 1.0, 2.0, f64::NAN]);
    assert_eq!((s.count, s.p50, s.max, s.mean), (3, 2.0, 3.0, 2.0));
    assert_eq!(Summary::of(&[]), Summary::default());
}

#[test]
fn split_ratio_is_max_over_min() {
    assert_eq!(split_ratio(&[8, 16, 12]), Some(2.0));
    assert_eq!(split_ratio(&[5, 0]), None);
    assert_eq!(split_ratio(&[]), None);
}

/// Tags open and close in order, attributes are quoted, `&` starts an entity: enough to
/// call the hand-written SVG well-formed without an XML dependency.
fn assert_well_formed(xml: &str) {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = xml;
    while let Some(lt) = rest.find('<') {
        check_text(&rest[..lt]);
        let gt = rest[lt..].find('>').expect("tag closes") + lt;
        let tag = &rest[lt + 1..gt];
        rest = &rest[gt + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                stack.pop().as_deref(),
                Some(name.trim()),
                "mismatched </{name}>"
            );
            continue;
        }
        let self_closing = tag.ends_with('/');
        let body = tag.trim_end_matches('/');
        let name = body.split_whitespace().next().expect("tag name");
        assert_eq!(
            body.matches('"').count() % 2,
            0,
            "unbalanced quotes in <{tag}>"
        );
        check_text(body);
        if !self_closing {
            stack.push(name.to_owned());
        }
    }
    check_text(rest);
    assert!(stack.is_empty(), "unclosed {stack:?}");
}

fn check_text(t: &str) {
    for (i, _) in t.match_indices('&') {
        let ent = &t[i..];
        assert!(
            ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                .iter()
                .any(|e| ent.starts_with(e)),
            "bare & in {t:?}"
        );
    }
    assert!(!t.contains('<'));
}

#[test]
fn svg_chart_is_well_formed_xml() {
    let panels = vec![
        Panel {
            title: "hit rate / ideal".into(),
            bars: vec![
                Bar {
                    label: "cache_aware".into(),
                    value: Some(0.97),
                },
                Bar {
                    label: "a<b & \"c\"".into(),
                    value: None,
                },
            ],
            target: Some((0.95, "target 0.95".into())),
        },
        Panel {
            title: "empty".into(),
            bars: vec![],
            target: None,
        },
    ];
    let svg = chart("kvgate <bench> & co", "sub", &panels);
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_well_formed(&svg);
    assert!(svg.contains("a&lt;b &amp; &quot;c&quot;"));
    assert!(svg.contains("n/a"));
    assert_well_formed(&chart("none", "", &[]));
}

fn report(target: &str, split: Vec<u64>, cached: u64, p99: f64, reference: bool) -> RunReport {
    RunReport {
        workload: WorkloadKind::SharedPrefix,
        target: target.into(),
        reference,
        planned: 10,
        completed: 10,
        failed: 0,
        hits: Tokens {
            prompt: 1000,
            cached,
        },
        engine_counters: Tokens {
            prompt: 1000,
            cached,
        },
        ideal: Tokens {
            prompt: 1000,
            cached: 800,
        },
        ttft_ms: Summary {
            count: 10,
            p50: 1.0,
            p99,
            mean: 1.0,
            max: p99,
        },
        latency_ms: Summary::default(),
        wall_secs: 2.0,
        output_tokens: 160,
        split,
        capped: false,
        errors: vec![],
        setting: "4 engines".into(),
        replicas: 1,
    }
}

#[test]
fn targets_name_what_a_run_misses() {
    let t = Targets::for_workload(WorkloadKind::SharedPrefix);
    let good = report("cache_aware", vec![3, 3, 3, 3], 790, 5.0, false);
    let smg = report("smg:cache_aware", vec![5, 5, 0, 0], 800, 6.0, true);
    assert!(t.misses(&good, Some(6.0)).is_empty());
    assert_eq!(good.req_per_sec(), 5.0);
    let bad = report("round_robin", vec![4, 2, 2, 2], 200, 9.0, false);
    assert_eq!(
        t.misses(&bad, Some(6.0)),
        vec!["ratio<0.97", "split>1.3", "ttft p99>ref"]
    );
    assert_eq!(t.misses(&smg, Some(6.0)), vec!["split>1.3"]);
    let rows = vec![good, bad, smg];
    assert_eq!(reference_p99(&rows), Some(6.0));
    let text = table(&rows);
    assert_eq!(text.lines().count(), 4);
    assert!(text.contains("3/3/3/3"));
    assert_well_formed(&workload_chart(&rows));

    let burst = Targets::for_workload(WorkloadKind::Burst);
    let mut b = report("least_load", vec![16, 16], 0, 1.0, false);
    b.workload = WorkloadKind::Burst;
    assert!(burst.misses(&b, None).is_empty());
    b.split = vec![19, 13];
    assert_eq!(burst.misses(&b, None).len(), 1);
}
