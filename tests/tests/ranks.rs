//! Data-parallel ranks routed one by one: an SGLang engine with `dp_size > 1` keeps a cache
//! per rank, and left to itself spreads requests round robin over them, so a conversation's
//! next turn lands on a rank that never saw its start. The gateway picks the rank (the
//! prefix index and the load gate work per rank) and names it in the body
//! (`routed_dp_rank`, or `data_parallel_rank` for SGLang 0.5.9 and older). A vLLM server with data-parallel engines behind it (its metrics label
//! each `engine`) is routed the same way, the rank named in `X-data-parallel-rank`.

use kvgate_engine_sim::SimConfig;
use kvgate_policies::PolicyKind;
use kvgate_tests::{Harness, get, post_json};
use serde_json::{Value, json};

fn two_ranks() -> SimConfig {
    SimConfig {
        dp_size: 2,
        max_running_requests: 16,
        enable_cache_report: true,
        ..SimConfig::default()
    }
}

fn first_turn(k: usize) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": format!("You are assistant number {k} of the rank test. ").repeat(12)}),
        json!({"role": "user", "content": format!("opening question {k}")}),
    ]
}

async fn chat(h: &Harness, messages: &[Value]) -> Value {
    let r = post_json(
        &h.url("/v1/chat/completions"),
        &json!({"messages": messages, "max_tokens": 4}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    r.json()
}

#[actix_rt::test]
async fn each_conversation_stays_on_the_rank_that_holds_its_start() {
    conversations_stay_on_their_rank(two_ranks()).await;
}

#[actix_rt::test]
async fn a_vllm_servers_engines_are_routed_one_by_one_through_the_rank_header() {
    let vllm = SimConfig {
        flavor: kvgate_engine_sim::Flavor::Vllm,
        enable_metrics: true,
        ..two_ranks()
    };
    conversations_stay_on_their_rank(vllm).await;
}

#[actix_rt::test]
async fn an_sglang_release_before_the_rename_is_sent_data_parallel_rank() {
    // 0.5.9 reads only `data_parallel_rank`: sent `routed_dp_rank`, it would spread the
    // turns round robin and miss.
    let old = SimConfig {
        version: Some("0.5.9".into()),
        ..two_ranks()
    };
    conversations_stay_on_their_rank(old).await;
}

async fn conversations_stay_on_their_rank(sim: SimConfig) {
    let h = Harness::start(1, sim, |c| {
        c.policy.kind = PolicyKind::CacheAware;
        c.seed = Some(11);
    });
    // Eight conversations start, one after another.
    let mut convs = Vec::new();
    for k in 0..8 {
        let mut m = first_turn(k);
        let a = chat(&h, &m).await;
        m.push(a["choices"][0]["message"].clone());
        m.push(json!({"role": "user", "content": format!("and a follow-up to {k}")}));
        convs.push((m, a["usage"]["prompt_tokens"].as_u64().unwrap_or(0)));
    }
    // Both ranks took some: new prefixes spread over the targets.
    let idx = get(&h.url("/admin/index")).await.json();
    let per = idx["models"][0]["per_worker"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ranks: Vec<u64> = per.iter().filter_map(|w| w["rank"].as_u64()).collect();
    assert!(ranks.contains(&0) && ranks.contains(&1), "{idx}");
    // Every second turn finds its first turn's prompt cached: it went to the same rank.
    // In the reverse order, the engine's own round robin would put every one of them on
    // the other rank.
    for (k, (m, first)) in convs.iter().enumerate().rev() {
        let a = chat(&h, m).await;
        let cached = a["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        assert!(
            cached + 1 >= *first,
            "conversation {k}: {cached} of {first} cached: {a}"
        );
    }
    let ws = get(&h.url("/workers")).await.json();
    let routed = ws["workers"][0]["routed_ranks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(routed.len(), 2, "{ws}");
    h.gw.stop();
}

#[actix_rt::test]
async fn the_count_gate_works_per_rank_so_a_burst_spills_to_the_other_rank() {
    let sim = SimConfig {
        max_running_requests: 4,
        ..two_ranks()
    };
    let h = Harness::start(1, sim, |c| {
        c.policy.kind = PolicyKind::CacheAware;
        c.seed = Some(3);
        // A count gate that trips within this burst: a rank more than 4 requests and half
        // again over the targets' mean takes no more.
        c.policy.balance_abs_threshold = 4;
    });
    h.wait_for_load_reports().await;
    let m = first_turn(1);
    chat(&h, &m).await;
    // Sixteen at once on the cached prefix: the gate counts per rank, so once the holding
    // rank is that far ahead the rest go to the other rank, which computes the prefix
    // itself. Counted per worker, the burst would never leave the holder's rank.
    let reqs = (0..16).map(|i| {
        let mut m = m.clone();
        m.push(json!({"role": "assistant", "content": "ok"}));
        m.push(json!({"role": "user", "content": format!("burst question {i}")}));
        let url = h.url("/v1/chat/completions");
        async move {
            let r = post_json(&url, &json!({"messages": m, "max_tokens": 64})).await;
            assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        }
    });
    futures_util::future::join_all(reqs).await;
    let idx = get(&h.url("/admin/index")).await.json();
    let per = idx["models"][0]["per_worker"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(per.len(), 2, "both ranks now hold the prefix: {idx}");
    h.gw.stop();
}
