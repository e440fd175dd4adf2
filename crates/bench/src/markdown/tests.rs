use kvgate_bench::{RunReport, Summary, Tokens, WorkloadKind};

use super::*;
use crate::run::proxy::ProxyRow;
use crate::run::proxy::curve::CurvePoint;
use crate::run::soak::SoakReport;

fn run(kind: WorkloadKind, target: &str, cached: u64, p99: f64, split: Vec<u64>) -> RunReport {
    let tokens = |cached| Tokens {
        prompt: 1000,
        cached,
    };
    let shares = matches!(kind, WorkloadKind::SharedPrefix | WorkloadKind::MultiTurn);
    RunReport {
        workload: kind,
        target: target.into(),
        reference: target.starts_with("smg"),
        planned: 64,
        completed: 64,
        failed: 0,
        hits: tokens(cached),
        engine_counters: tokens(cached),
        ideal: tokens(if shares { 900 } else { 0 }),
        ttft_ms: Summary {
            count: 64,
            p50: 25.25,
            p99,
            mean: 30.0,
            max: p99,
        },
        latency_ms: Summary::default(),
        wall_secs: 2.0,
        output_tokens: 1024,
        split,
        capped: false,
        errors: Vec::new(),
        setting: String::new(),
        replicas: 1,
    }
}

#[test]
fn a_workload_run_gives_its_policies_and_one_value_per_run() {
    let rows = [
        run(
            WorkloadKind::SharedPrefix,
            "cache_aware",
            900,
            190.44,
            vec![16, 16, 16, 16],
        ),
        run(
            WorkloadKind::SharedPrefix,
            "smg:cache_aware",
            750,
            527.2,
            vec![31, 0, 16, 17],
        ),
        run(WorkloadKind::Burst, "cache_aware", 0, 75.9, vec![16, 16]),
    ];
    let text = merge("", workload(&rows, "chat"));
    let want = "\
<!-- kvgate-bench workload --markdown: shared-prefix, chat -->
| policy | hit | ideal | ratio | TTFT p50 ms | TTFT p99 ms | req/s | split | max/min |
|---|---|---|---|---|---|---|---|---|
| cache_aware | 0.900 | 0.900 | 1.000 | 25.2 | 190.4 | 32.0 | 16/16/16/16 | 1.00 |
| smg:cache_aware | 0.750 | 0.900 | 0.833 | 25.2 | 527.2 | 32.0 | 31/0/16/17 | inf |

<!-- kvgate-bench workload --markdown: burst, chat -->
| policy | hit | ideal | ratio | TTFT p50 ms | TTFT p99 ms | req/s | split | max/min |
|---|---|---|---|---|---|---|---|---|
| cache_aware | 0.000 | 0.000 | – | 25.2 | 75.9 | 32.0 | 16/16 | 1.00 |

<!-- kvgate-bench workload --markdown: hit ÷ ideal, one value per run -->
| workload | setting | cache_aware | smg:cache_aware |
|---|---|---|---|
| shared-prefix | chat | 1.000 | 0.833 |

<!-- kvgate-bench workload --markdown: split, one value per run -->
| workload | setting | cache_aware | smg:cache_aware |
|---|---|---|---|
| shared-prefix | chat | 16/16/16/16 | 31/0/16/17 |
| burst | chat | 16/16 | – |

<!-- kvgate-bench workload --markdown: TTFT p99 ms, one value per run -->
| workload | setting | cache_aware | smg:cache_aware |
|---|---|---|---|
| shared-prefix | chat | 190.4 | 527.2 |
| burst | chat | 75.9 | – |
";
    assert_eq!(text, want);
}

#[test]
fn the_next_run_adds_its_values_rows_and_targets_and_replaces_its_policies() {
    let seed = |cached, p99| {
        vec![run(
            WorkloadKind::MultiTurn,
            "cache_aware",
            cached,
            p99,
            vec![4, 4],
        )]
    };
    let first = merge("", workload(&seed(900, 74.9), "chat"));
    let second = merge(&first, workload(&seed(810, 75.8), "chat"));
    let mut burst = vec![run(WorkloadKind::Burst, "least_load", 0, 80.0, vec![9, 7])];
    burst.push(run(WorkloadKind::Burst, "cache_aware", 0, 76.6, vec![8, 8]));
    let third = merge(&second, workload(&burst, "tokens"));
    let want = "\
<!-- kvgate-bench workload --markdown: multi-turn, chat -->
| policy | hit | ideal | ratio | TTFT p50 ms | TTFT p99 ms | req/s | split | max/min |
|---|---|---|---|---|---|---|---|---|
| cache_aware | 0.810 | 0.900 | 0.900 | 25.2 | 75.8 | 32.0 | 4/4 | 1.00 |

<!-- kvgate-bench workload --markdown: hit ÷ ideal, one value per run -->
| workload | setting | cache_aware |
|---|---|---|
| multi-turn | chat | 1.000 / 0.900 |

<!-- kvgate-bench workload --markdown: split, one value per run -->
| workload | setting | cache_aware | least_load |
|---|---|---|---|
| multi-turn | chat | 4/4 / 4/4 |  |
| burst | tokens | 8/8 | 9/7 |

<!-- kvgate-bench workload --markdown: TTFT p99 ms, one value per run -->
| workload | setting | cache_aware | least_load |
|---|---|---|---|
| multi-turn | chat | 74.9 / 75.8 |  |
| burst | tokens | 76.6 | 80.0 |

<!-- kvgate-bench workload --markdown: burst, tokens -->
| policy | hit | ideal | ratio | TTFT p50 ms | TTFT p99 ms | req/s | split | max/min |
|---|---|---|---|---|---|---|---|---|
| least_load | 0.000 | 0.000 | – | 25.2 | 80.0 | 32.0 | 9/7 | 1.29 |
| cache_aware | 0.000 | 0.000 | – | 25.2 | 76.6 | 32.0 | 8/8 | 1.00 |
";
    assert_eq!(third, want);
}

fn proxy_row(target: &str, rps: f64, added_p50: Option<f64>, cpu: Option<f64>) -> ProxyRow {
    ProxyRow {
        target: target.into(),
        req_per_sec: rps,
        cpu_us_per_req: cpu,
        added_p50_ms: added_p50,
        ..ProxyRow::default()
    }
}

#[test]
fn a_proxy_run_gives_req_s_and_added_p50_and_kvgate_against_smg() {
    let run = |kvgate: f64| {
        vec![
            proxy_row("direct", 60_000.0, None, None),
            proxy_row("kvgate", kvgate, Some(0.1224), Some(15.4)),
            proxy_row("nginx", 33_919.2, Some(0.085), Some(9.0)),
            proxy_row("smg", 6_198.0, Some(0.321), Some(120.0)),
        ]
    };
    let one = merge("", vec![proxy(&run(28_465.0), "91 B")]);
    let two = merge(&one, vec![proxy(&run(30_649.4), "91 B")]);
    let want = "\
<!-- kvgate-bench proxy --markdown: 91 B body, one value per run -->
| target | req/s | added p50 ms |
|---|---|---|
| kvgate | 28 465 / 30 649 | +0.122 / +0.122 |
| nginx | 33 919 / 33 919 | +0.085 / +0.085 |
| smg | 6 198 / 6 198 | +0.321 / +0.321 |
| kvgate ÷ smg | 4.59× / 4.95× | 0.38 / 0.38 |
";
    assert_eq!(two, want);
}

#[test]
fn a_sweep_gives_a_row_per_size_and_a_cell_per_target() {
    let points = vec![
        CurvePoint {
            kib: 16,
            body_bytes: 16 * 1024,
            rows: vec![
                proxy_row("direct", 90_000.0, None, None),
                proxy_row("kvgate", 34_852.0, Some(0.0704), Some(24.4)),
                proxy_row("nginx", 41_223.0, Some(0.048), Some(18.0)),
                proxy_row("nginx-stock", 367.0, Some(44.2), Some(110.0)),
            ],
        },
        CurvePoint {
            kib: 1024,
            body_bytes: 1 << 20,
            rows: vec![
                proxy_row("kvgate", 1_209.0, Some(0.515), Some(534.0)),
                proxy_row("nginx", 1_222.0, Some(0.39), Some(1_511.4)),
            ],
        },
    ];
    let want = "\
<!-- kvgate-bench proxy --sweep-kib --markdown: req/s, × nginx, added p50, CPU per request -->
| body | kvgate | nginx | nginx-stock |
|---|---|---|---|
| 16 KiB | 34 852, 0.85×, +0.070 ms, 24 µs | 41 223, +0.048 ms, 18 µs | 367, +44 ms, 110 µs |
| 1 MiB | 1 209, 0.99×, +0.515 ms, 534 µs | 1 222, +0.390 ms, 1 511 µs | – |
";
    assert_eq!(merge("", vec![curve(&points, false)]), want);
}

#[test]
fn a_soak_gives_what_was_lost_and_the_memory() {
    let r = SoakReport {
        seconds: 602.46,
        sent: 24_001,
        broken_streams_started: 6,
        hung_up: 1_201,
        engine_restarts: 10,
        rss_every_minute_kib: vec![12_390, 16_896],
        ..SoakReport::default()
    };
    let want = "\
<!-- kvgate-bench soak --markdown -->
| sent | failed, not streamed | streams failed before their first byte | streams cut after it | hung up on purpose | engine restarts | in flight at the end | gateway RSS once a minute, MiB |
|---|---|---|---|---|---|---|---|
| 24 001 in 602.5 s | 0 | 0 | 6 | 1 201 | 10 | 0 | 12.1, 16.5 |
";
    assert_eq!(merge("", vec![soak(&r)]), want);
}

#[test]
fn numbers_are_grouped_by_three_and_pipes_survive_a_round_trip() {
    let cases = [
        (0.0, "0"),
        (999.4, "999"),
        (1_000.0, "1 000"),
        (123_456.7, "123 457"),
        (-1_234.0, "-1 234"),
    ];
    for (v, want) in cases {
        assert_eq!(thousands(v), want, "{v}");
    }
    let b = Block {
        title: "t".into(),
        header: vec!["k".into(), "v".into()],
        rows: vec![vec!["a|b".into(), "1".into()]],
        merge: Merge::PerRun { keys: 1 },
    };
    let text = merge("", vec![b.clone()]);
    assert_eq!(text, "<!-- t -->\n| k | v |\n|---|---|\n| a\\|b | 1 |\n");
    let again = merge(&text, vec![b]);
    assert!(again.ends_with("| a\\|b | 1 / 1 |\n"), "{again}");
    assert_eq!(merge("notes a person wrote\n", Vec::new()), "");
}

#[test]
fn the_replicas_table_gives_each_count_over_one_replica() {
    let at = |replicas: usize, cached: u64| RunReport {
        replicas,
        ..run(
            WorkloadKind::SharedPrefix,
            "cache_aware",
            cached,
            100.0,
            vec![16, 16],
        )
    };
    let rows = [at(1, 800), at(2, 780), at(4, 400)];
    let b = replicas(&rows, "chat");
    assert_eq!(b.merge, Merge::PerRun { keys: 3 });
    let cells: Vec<(&str, &str)> = b
        .rows
        .iter()
        .map(|r| (r[2].as_str(), r[4].as_str()))
        .collect();
    assert_eq!(cells, [("1", "1.000"), ("2", "0.975"), ("4", "0.500")]);
    assert_eq!(b.rows[1][5], "0.867", "hit ÷ ideal: 0.78 / 0.9");
    // A second seed appends to the same rows.
    let text = merge(&merge("", vec![b.clone()]), vec![b]);
    assert!(text.contains("| 0.975 / 0.975 |"), "{text}");
    // Without a one-replica run there is nothing to divide by.
    let b = replicas(&rows[1..], "chat");
    assert_eq!(b.rows[0][4], NONE);
}
