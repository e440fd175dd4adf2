use std::path::PathBuf;

use kvgate_policies::RankLoad;
use proptest::prelude::*;

use super::parse_v1_loads;
use crate::error::ParseError;

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/sglang-0.5.23")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn fixture_two_ranks() {
    let ranks = parse_v1_loads(&fixture("v1_loads_two_ranks.json")).unwrap();
    assert_eq!(
        ranks,
        vec![
            RankLoad {
                dp_rank: 0,
                num_running_reqs: 3,
                num_waiting_reqs: 2,
                num_waiting_uncached_tokens: 4096,
                num_used_tokens: 12000,
                max_total_num_tokens: 200000,
                max_running_requests: 16,
                token_usage: 0.06,
                gen_throughput: 812.5,
                cache_hit_rate: 0.42,
                total_prefill_uncached_tokens: 0,
                total_prefill_busy_us: 0,
            },
            RankLoad {
                dp_rank: 1,
                max_total_num_tokens: 200000,
                max_running_requests: 16,
                gen_throughput: 0.35,
                ..RankLoad::default()
            },
        ]
    );
}

fn check(body: &str, want: Result<Vec<RankLoad>, ()>) {
    let got = parse_v1_loads(body.as_bytes());
    match (got, want) {
        (Ok(g), Ok(w)) => assert_eq!(g, w, "{body}"),
        (Err(_), Err(())) => {}
        (g, w) => panic!("{body}: got {g:?}, want {w:?}"),
    }
}

#[test]
fn missing_null_and_unknown_fields() {
    check(
        r#"{"loads":[{"dp_rank":2,"num_running_reqs":5,"token_usage":null,"new_field":{"x":1}}],"extra":1}"#,
        Ok(vec![RankLoad {
            dp_rank: 2,
            num_running_reqs: 5,
            ..RankLoad::default()
        }]),
    );
    check(r#"{"loads":[{}]}"#, Ok(vec![RankLoad::default()]));
    // Float counts round; negatives and huge values saturate instead of failing.
    check(
        r#"{"loads":[{"num_running_reqs":2.6,"num_waiting_reqs":-3,"num_used_tokens":1e30}]}"#,
        Ok(vec![RankLoad {
            num_running_reqs: 3,
            num_used_tokens: u64::MAX,
            ..RankLoad::default()
        }]),
    );
}

#[test]
fn rejects_non_load_bodies() {
    check("", Err(()));
    check("<html>not found</html>", Err(()));
    check(r#"{"status":"ok"}"#, Err(()));
    check(r#"{"loads":{"dp_rank":0}}"#, Err(()));
    check(r#"{"loads":[{"num_running_reqs":"3"}]}"#, Err(()));
    assert_eq!(parse_v1_loads(br#"{"loads":[]}"#), Err(ParseError::NoRanks));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = parse_v1_loads(&body);
    }
}

#[test]
fn more_ranks_than_any_engine_runs_are_refused_while_read() {
    let body = |n: usize| format!("{{\"loads\":[{}]}}", vec!["{}"; n].join(","));
    assert_eq!(
        parse_v1_loads(body(super::MAX_RANKS).as_bytes())
            .unwrap()
            .len(),
        1024
    );
    let e = parse_v1_loads(body(super::MAX_RANKS + 1).as_bytes()).unwrap_err();
    assert!(e.to_string().contains("more than 1024 ranks"), "{e}");
}

proptest! {
    /// Load bodies with any number in any field: never a panic, never a negative count.
    #[test]
    fn any_numbers_in_load_fields_are_read_without_panic(
        field in prop::sample::select(vec![
            "dp_rank", "num_running_reqs", "num_waiting_reqs", "num_waiting_uncached_tokens",
            "num_used_tokens", "max_total_num_tokens", "max_running_requests", "token_usage",
            "gen_throughput", "cache_hit_rate", "total_prefill_uncached_tokens",
            "total_prefill_busy_us",
        ]),
        value in prop_oneof![
            any::<i64>().prop_map(|v| v.to_string()),
            any::<u64>().prop_map(|v| v.to_string()),
            any::<f64>().prop_filter("JSON has no NaN or infinity", |v| v.is_finite()).prop_map(|v| format!("{v:e}")),
            Just("1e400".to_string()),
            Just("-1e400".to_string()),
        ],
    ) {
        let body = format!("{{\"loads\":[{{\"{field}\":{value}}}]}}");
        if let Ok(ranks) = parse_v1_loads(body.as_bytes()) {
            let r = &ranks[0];
            prop_assert!(r.token_usage.is_finite() && r.gen_throughput.is_finite());
            prop_assert!(r.token_usage >= 0.0 && r.cache_hit_rate >= 0.0);
        }
    }
}
