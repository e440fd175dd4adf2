use std::time::Duration;

use kvgate_policies::RankLoad;

use super::metrics_to_ranks;
use crate::counters::CounterState;
use crate::error::ParseError;
use crate::prometheus::parse_prometheus;

fn ranks(
    text: &str,
    at_secs: u64,
    counters: &mut CounterState,
) -> Result<Vec<RankLoad>, ParseError> {
    let samples = parse_prometheus(text).unwrap();
    metrics_to_ranks(&samples, Duration::from_secs(at_secs), counters)
}

fn check(text: &str, want: &[RankLoad]) {
    let got = ranks(text, 1, &mut CounterState::new()).unwrap();
    assert_eq!(got, want, "{text}");
}

const SGLANG_LEGACY: &str = "\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank=\"0\",model_name=\"m\",tp_rank=\"0\"} 3.0
sglang:num_running_reqs{dp_rank=\"0\",model_name=\"m\",tp_rank=\"1\"} 3.0
sglang:num_running_reqs{dp_rank=\"1\",model_name=\"m\",tp_rank=\"0\"} 1.0
sglang:num_queue_reqs{dp_rank=\"0\",model_name=\"m\"} 2.0
sglang:num_queue_reqs{dp_rank=\"1\",model_name=\"m\"} 0.0
sglang:token_usage{dp_rank=\"0\",model_name=\"m\"} 0.5
sglang:token_usage{dp_rank=\"1\",model_name=\"m\"} 0.25
sglang:gen_throughput{dp_rank=\"0\",model_name=\"m\"} 800.0
sglang:gen_throughput{dp_rank=\"1\",model_name=\"m\"} 0.35
sglang:cache_hit_rate{dp_rank=\"0\",model_name=\"m\"} 0.4
sglang:utilization{dp_rank=\"0\",model_name=\"m\"} 0.9
sglang:e2e_request_latency_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 12
";

#[test]
fn sglang_legacy_keeps_each_rank() {
    // Two TP schedulers reporting the same batch count once; throughput stays per rank
    // (800 and 0.35), never averaged into one number.
    check(
        SGLANG_LEGACY,
        &[
            RankLoad {
                dp_rank: 0,
                num_running_reqs: 3,
                num_waiting_reqs: 2,
                token_usage: 0.5,
                gen_throughput: 800.0,
                cache_hit_rate: 0.4,
                ..RankLoad::default()
            },
            RankLoad {
                dp_rank: 1,
                num_running_reqs: 1,
                token_usage: 0.25,
                gen_throughput: 0.35,
                ..RankLoad::default()
            },
        ],
    );
}

#[test]
fn sglang_new_prefix_and_loads_prometheus_format() {
    check(
        "sglang_num_running_reqs{model_name=\"m\"} 4\nsglang_num_queue_reqs 1\nsglang_token_usage NaN\n",
        &[RankLoad {
            num_running_reqs: 4,
            num_waiting_reqs: 1,
            ..RankLoad::default()
        }],
    );
    check(
        "sglang_num_waiting_reqs{dp_rank=\"2\"} 5\n\
         sglang_num_waiting_uncached_tokens{dp_rank=\"2\"} 900\n\
         sglang_num_used_tokens{dp_rank=\"2\"} 100\n\
         sglang_max_total_num_tokens{dp_rank=\"2\"} 1000\n\
         sglang_max_running_requests{dp_rank=\"2\"} 8\n\
         sglang_total_prefill_uncached_tokens{dp_rank=\"2\"} 77\n\
         sglang_total_prefill_busy_us{dp_rank=\"2\"} 66\n",
        &[RankLoad {
            dp_rank: 2,
            num_waiting_reqs: 5,
            num_waiting_uncached_tokens: 900,
            num_used_tokens: 100,
            max_total_num_tokens: 1000,
            max_running_requests: 8,
            total_prefill_uncached_tokens: 77,
            total_prefill_busy_us: 66,
            ..RankLoad::default()
        }],
    );
}

fn vllm_body(gen_tokens: [f64; 2], hits: f64, queries: f64) -> String {
    format!(
        "# TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} 2.0\n\
         vllm:num_requests_running{{engine=\"1\",model_name=\"m\"}} 0.0\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} 1.0\n\
         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} 0.3\n\
         vllm:kv_cache_usage_perc{{engine=\"1\",model_name=\"m\"}} 0.0\n\
         vllm:generation_tokens_total{{engine=\"0\",model_name=\"m\"}} {}\n\
         vllm:generation_tokens_total{{engine=\"1\",model_name=\"m\"}} {}\n\
         vllm:prefix_cache_hits_total{{engine=\"0\",model_name=\"m\"}} {hits}\n\
         vllm:prefix_cache_queries_total{{engine=\"0\",model_name=\"m\"}} {queries}\n\
         vllm:prompt_tokens_total{{engine=\"0\",model_name=\"m\"}} 5000\n",
        gen_tokens[0], gen_tokens[1],
    )
}

#[test]
fn vllm_throughput_from_two_scrapes() {
    let mut counters = CounterState::new();
    let first = ranks(&vllm_body([100.0, 7.0], 10.0, 100.0), 10, &mut counters).unwrap();
    let rank0 = RankLoad {
        dp_rank: 0,
        num_running_reqs: 2,
        num_waiting_reqs: 1,
        token_usage: 0.3,
        ..RankLoad::default()
    };
    assert_eq!(
        first,
        vec![
            rank0.clone(),
            RankLoad {
                dp_rank: 1,
                ..RankLoad::default()
            }
        ]
    );
    // 2 s later: engine 0 made 600 tokens (300 tok/s), engine 1 none; 30 of 40 queried
    // prefix tokens hit.
    let second = ranks(&vllm_body([700.0, 7.0], 40.0, 140.0), 12, &mut counters).unwrap();
    assert_eq!(
        second,
        vec![
            RankLoad {
                gen_throughput: 300.0,
                cache_hit_rate: 0.75,
                ..rank0
            },
            RankLoad {
                dp_rank: 1,
                ..RankLoad::default()
            },
        ]
    );
}

#[test]
fn vllm_v0_names() {
    check(
        "vllm:num_requests_running{model_name=\"m\"} 1\n\
         vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.8\n\
         vllm:gpu_prefix_cache_hit_rate{model_name=\"m\"} 0.5\n",
        &[RankLoad {
            num_running_reqs: 1,
            token_usage: 0.8,
            cache_hit_rate: 0.5,
            ..RankLoad::default()
        }],
    );
}

#[test]
fn unknown_bodies_and_bad_ranks() {
    let mut c = CounterState::new();
    assert_eq!(ranks("", 1, &mut c), Err(ParseError::NoLoadMetrics));
    assert_eq!(
        ranks("process_cpu_seconds_total 3\nvllm_unrelated 1\n", 1, &mut c),
        Err(ParseError::NoLoadMetrics)
    );
    assert_eq!(
        ranks("sglang:num_running_reqs{dp_rank=\"x\"} 1\n", 1, &mut c),
        Err(ParseError::BadRank {
            label: "dp_rank",
            value: "x".into()
        })
    );
    assert!(matches!(
        ranks("vllm:num_requests_running{engine=\"-1\"} 1\n", 1, &mut c),
        Err(ParseError::BadRank {
            label: "engine",
            ..
        })
    ));
}

#[test]
fn the_latest_lora_info_of_each_engine_is_the_adapters_at_work() {
    // A labelled gauge keeps every label set it had: only the latest is the present.
    let text = r#"# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql,chat",waiting_lora_adapters="math"} 1.8e9
vllm:lora_requests_info{engine="1",max_lora="2",running_lora_adapters="",waiting_lora_adapters="sql"} 1.75e9
vllm:num_requests_running{engine="0"} 3
"#;
    let samples = crate::parse_prometheus_where(text, super::is_load_metric).expect("parse");
    let a = super::adapters_at_work(&samples).expect("lora info");
    assert_eq!(a.active, ["sql", "chat", "math"]);
    assert_eq!(a.max_loras, 2);
    let none = crate::parse_prometheus("vllm:num_requests_running 1\n").expect("parse");
    assert_eq!(super::adapters_at_work(&none), None);
}
