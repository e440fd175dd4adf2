//! Gateway replicas in front of one fleet, sharing nothing but the engines: two real
//! gateways on loopback, simulated engines, real polls.

use kvgate_engine_sim::SimConfig;
use kvgate_gateway::Gateway;
use kvgate_gateway::testing::GetViews;
use kvgate_policies::PolicyKind;
use kvgate_poller::PollNow;
use serde_json::json;

use kvgate_tests::{Harness, post_json, test_config, wait_for_async};

fn sim() -> SimConfig {
    SimConfig {
        max_running_requests: 16,
        initial_gen_throughput: 0.36,
        enable_cache_report: true,
        ..SimConfig::default()
    }
}

/// Polls now and waits until `gw` holds a load report from every engine.
async fn reports(gw: &Gateway) {
    gw.actors().poller.do_send(PollNow);
    let sel = gw.actors().selector.clone();
    wait_for_async(10, "a load report from every engine", || {
        let sel = sel.clone();
        async move {
            sel.send(GetViews)
                .await
                .is_ok_and(|v| !v.is_empty() && v.iter().all(|w| w.load.is_some()))
        }
    })
    .await;
}

#[actix_rt::test]
async fn a_burst_split_over_two_replicas_lands_evenly_on_two_engines() {
    for policy in [PolicyKind::CacheAware, PolicyKind::LeastLoad] {
        // Replica one is the harness's gateway; replica two another in front of its fleet.
        let h = Harness::start(2, sim(), |c| {
            c.policy.kind = policy;
            c.seed = Some(7);
        });
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cfg = test_config(&dir);
        cfg.worker_urls = h.fleet.urls();
        cfg.policy.kind = policy;
        cfg.seed = Some(7);
        let second = Gateway::start(cfg).expect("second replica starts");
        reports(&h.gw).await;
        reports(&second).await;
        let replicas = [h.gw.url(), second.url()];
        // 32 unrelated prompts at once, alternating between the replicas: 16 each.
        let burst = (0..32).map(|i| {
            let url = format!("{}/v1/completions", replicas[i % 2]);
            async move {
                let prompt = format!("unrelated prompt number {i} about topic {}", i * 7919);
                let body = json!({"prompt": prompt, "max_tokens": 8});
                let r = post_json(&url, &body).await;
                assert_eq!(r.status.as_u16(), 200, "{}", r.text());
            }
        });
        futures_util::future::join_all(burst).await;
        let split = h.split();
        assert_eq!(split.iter().sum::<u64>(), 32);
        assert!(
            split.iter().all(|&n| (14..=18).contains(&n)),
            "{policy}: {split:?}"
        );
        second.stop();
    }
}

#[actix_rt::test]
async fn two_replicas_that_never_met_place_a_new_prompt_on_the_same_engine() {
    // Four engines, so a shared choice is not a coin flip between two.
    let h = Harness::start(4, sim(), |c| c.seed = Some(1));
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = h.fleet.urls();
    cfg.seed = Some(2);
    let second = Gateway::start(cfg).expect("second replica starts");
    reports(&h.gw).await;
    reports(&second).await;
    let mut firsts = std::collections::HashSet::new();
    for i in 0..8 {
        let body = json!({
            "model": "kvgate-sim-model",
            "messages": [
                {"role": "system", "content": format!("group {i}: {}", "a long shared system prompt. ".repeat(40))},
                {"role": "user", "content": "hello"},
            ],
        });
        let mut chosen = Vec::new();
        for url in [h.gw.url(), second.url()] {
            let r = post_json(&format!("{url}/admin/explain/v1/chat/completions"), &body).await;
            assert_eq!(r.status.as_u16(), 200, "{}", r.text());
            let v = r.json();
            let pick = v["candidates"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["chosen"] == true))
                .cloned()
                .unwrap_or_default();
            assert_eq!(pick["placement_rank"], 0, "{v}");
            chosen.push(pick["worker"].as_str().unwrap_or_default().to_string());
        }
        assert_eq!(chosen[0], chosen[1], "prompt {i}");
        firsts.insert(chosen[0].clone());
    }
    // The ranking depends on the prompt: eight prompts do not all share one first choice.
    assert!(firsts.len() > 1, "{firsts:?}");
    second.stop();
}
