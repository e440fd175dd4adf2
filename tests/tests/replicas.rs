//! Gateway replicas in front of one fleet, sharing nothing but the engines: two real
//! gateways on loopback, simulated engines, real polls.

use kvgate_engine_sim::SimConfig;
use kvgate_gateway::Gateway;
use kvgate_gateway::testing::GetViews;
use kvgate_policies::PolicyKind;
use kvgate_poller::PollNow;
use serde_json::json;

use kvgate_tests::{Harness, post_json, test_config, until_workers, wait_for_async};

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
async fn another_gateways_requests_in_an_engines_report_keep_this_one_off_it() {
    // What the burst above cannot show, since a replica alone splits its half evenly too:
    // one engine is busy with 16 requests another gateway sent (sent here straight to the
    // engine, which sees no difference), and only the engine's report shows them. With a
    // gate that holds a worker above the mean, this gateway sends its 16 to the other
    // engine; counting its own dispatches alone it would put 8 on the busy one.
    let slow = SimConfig {
        decode_step_base: std::time::Duration::from_millis(10),
        ..sim()
    };
    // The count gate is cache_aware's; least_load prices queued prefill, not requests.
    let h = Harness::start(2, slow, |c| {
        c.policy.kind = PolicyKind::CacheAware;
        c.policy.balance_rel_threshold = 1.0;
        c.policy.balance_abs_threshold = 0;
        c.seed = Some(7);
        c.poller.interval = std::time::Duration::from_millis(100);
    });
    reports(&h.gw).await;
    let urls = h.fleet.urls();
    let head = "a system prompt every client of the fleet sends first. ".repeat(20);
    let ask = |url: String, tail: String, max_tokens: u32| {
        let body = json!({"prompt": format!("{head}{tail}"), "max_tokens": max_tokens});
        async move {
            let r = post_json(&format!("{url}/v1/completions"), &body).await;
            assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        }
    };
    // One request through this gateway: cache_aware's index now places `head` there.
    ask(h.gw.url(), "first".into(), 1).await;
    let held = h
        .split()
        .iter()
        .position(|&n| n == 1)
        .expect("one engine served it");
    // The other gateway's 16 requests, answers of about 3 s.
    let foreign = (0..16).map(|i| ask(urls[held].clone(), format!("other {i}"), 300));
    let ours = async {
        until_workers(&h.gw, "the engine's report of 16 running", |ws| {
            ws.iter()
                .any(|w| w["url"] == urls[held].as_str() && w["load"]["running"] == 16)
        })
        .await;
        let before = h.split();
        let burst = (0..16).map(|i| ask(h.gw.url(), format!("mine {i}"), 1));
        futures_util::future::join_all(burst).await;
        let after = h.split();
        (
            after[held] - before[held],
            after[1 - held] - before[1 - held],
        )
    };
    let (_, (on_full, on_free)) =
        futures_util::future::join(futures_util::future::join_all(foreign), ours).await;
    assert_eq!(
        (on_full, on_free),
        (0, 16),
        "this gateway's 16 onto the busy engine and the idle one"
    );
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
