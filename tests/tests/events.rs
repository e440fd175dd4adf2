//! KV events end to end: simulated SGLang (and, where said, vLLM) engines publish their
//! cache changes over ZMQ, the gateway subscribes (replay included), and token requests go
//! to the engine whose events say it holds their blocks, including prefixes cached before
//! the gateway started and never routed by it.
#![expect(
    clippy::disallowed_methods,
    reason = "a long request in flight while the events change; the test awaits it"
)]

use kvgate_engine_sim::{SimConfig, SimFleet, engine_of};
use kvgate_gateway::Gateway;
use kvgate_tests::{
    complete_on, generate_on, get, post_json, publishing_engine, test_config, unique_tokens,
    until_workers, vllm_events_config, vllm_publisher, workers,
};
use serde_json::{Value, json};

fn engine() -> SimConfig {
    publishing_engine()
}

fn prefix(k: u32, n: u32) -> Vec<u32> {
    unique_tokens(k, n)
}

fn blocks_of(ws: &[Value], url: &str) -> u64 {
    ws.iter()
        .find(|w| w["url"] == url)
        .and_then(|w| w["events"]["blocks"].as_u64())
        .unwrap_or(0)
}

#[actix_rt::test]
async fn token_requests_go_where_the_engines_events_say_their_blocks_are() {
    let fleet = SimFleet::start_each("127.0.0.1", 0, vec![engine(), engine()]).expect("fleet");
    let urls = fleet.urls();
    // Before any gateway: twenty fresh prefixes, each cached on a chosen engine directly.
    for k in 0..20u32 {
        let at = &urls[(k % 2) as usize];
        let r = post_json(
            &format!("{at}/generate"),
            &json!({"input_ids": prefix(k, 192), "sampling_params": {"max_new_tokens": 1}}),
        )
        .await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = urls.clone();
    cfg.seed = Some(3);
    let gw = Gateway::start(cfg).expect("gateway");
    // The replay brings what was stored before the subscription.
    let ws = until_workers(&gw, "live events with the replayed blocks", |ws| {
        ws.len() == 2
            && ws.iter().all(|w| w["events"]["state"] == "live")
            && urls.iter().all(|u| blocks_of(ws, u) > 0)
    })
    .await;
    assert!(
        ws.iter()
            .all(|w| w["events"]["replays"].as_u64() >= Some(1)),
        "{ws:?}"
    );
    let metrics = get(&format!("{}/metrics", gw.url())).await.text();
    for u in &urls {
        let line = format!("kvgate_worker_kv_events_state{{worker=\"{u}\"}} 2");
        assert!(metrics.contains(&line), "{line} not in {metrics}");
    }

    // Each prefix plus a new tail goes to the engine holding the prefix: 20 of 20, where
    // the approximate index alone knows none of them.
    for k in 0..20u32 {
        let mut ids = prefix(k, 192);
        ids.extend(prefix(100 + k, 16));
        let r = post_json(
            &format!("{}/generate", gw.url()),
            &json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}),
        )
        .await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        let j = r.json();
        let served = engine_of(j["meta_info"]["id"].as_str().unwrap_or("")).expect("an engine id");
        assert_eq!(served, (k % 2) as usize, "prefix {k}: {j}");
        assert!(
            j["meta_info"]["cached_tokens"].as_u64() >= Some(192 - 16),
            "{j}"
        );
    }

    // Explain says which index matched each candidate.
    let e = post_json(
        &format!("{}/admin/explain/generate", gw.url()),
        &json!({"input_ids": prefix(3, 192)}),
    )
    .await
    .json();
    assert_eq!(e["worker"], *urls[1].as_str(), "{e}");
    let holder = e["candidates"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["worker"] == *urls[1].as_str()))
        .cloned()
        .unwrap_or_default();
    assert_eq!(holder["matched_by"], "kv_events", "{e}");
    assert_eq!(holder["events"], "live", "{e}");
    assert!(holder["matched"].as_u64() >= Some(191), "{e}");

    // An engine's flush clears only its own holdings.
    let before = workers(&gw).await;
    let r = post_json(&format!("{}/flush_cache", urls[0]), &json!({})).await;
    assert!(r.status.is_success(), "{}", r.text());
    let after = until_workers(&gw, "the flush", |ws| blocks_of(ws, &urls[0]) == 0).await;
    assert_eq!(blocks_of(&after, &urls[1]), blocks_of(&before, &urls[1]));
    // The flushed engine's prefixes, cached again on the other engine by other clients:
    // they follow their new holder, not the engine that announced them first.
    for k in (0..20u32).step_by(2) {
        let r = post_json(
            &format!("{}/generate", urls[1]),
            &json!({"input_ids": prefix(k, 192), "sampling_params": {"max_new_tokens": 1}}),
        )
        .await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    until_workers(&gw, "the new holder's stores", |ws| {
        blocks_of(ws, &urls[1]) >= blocks_of(&before, &urls[1]) + 10 * 192
    })
    .await;
    for k in (0..20u32).step_by(2) {
        let e = post_json(
            &format!("{}/admin/explain/generate", gw.url()),
            &json!({"input_ids": prefix(k, 192)}),
        )
        .await
        .json();
        assert_eq!(e["worker"], *urls[1].as_str(), "prefix {k}: {e}");
    }
    gw.stop();
}

#[actix_rt::test]
async fn a_worker_whose_publisher_is_unreachable_is_stalled_and_served_by_the_approximate_index() {
    // Its engine publishes nothing, but the gateway is told where it would: nothing answers
    // there. The worker is still served; its requests are matched by the approximate index,
    // and it says so.
    let fleet = SimFleet::start(1, SimConfig::default()).expect("fleet");
    let dead = free_port_on(&["127.0.0.1"]);
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = fleet.urls();
    cfg.events.kv_events_config = Some(format!(
        r#"{{"publisher": "zmq", "endpoint": "tcp://*:{dead}", "topic": "kv", "block_size": 1}}"#
    ));
    let gw = Gateway::start(cfg).expect("gateway");
    let ws = until_workers(&gw, "a stalled publisher", |ws| {
        ws.first()
            .is_some_and(|w| w["events"]["state"] == "stalled")
    })
    .await;
    assert!(ws[0]["events"]["reason"].is_string(), "{ws:?}");
    let ask = json!({"input_ids": prefix(3, 64), "sampling_params": {"max_new_tokens": 1}});
    for _ in 0..2 {
        let r = post_json(&format!("{}/generate", gw.url()), &ask).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    // The approximate index recorded the prompt it routed: that is what matches it now.
    let e = post_json(&format!("{}/admin/explain/generate", gw.url()), &ask)
        .await
        .json();
    let c = &e["candidates"][0];
    assert_eq!(c["matched_by"], "index", "{e}");
    assert_eq!(c["events"], "stalled", "{e}");
    assert!(c["matched"].as_u64() >= Some(63), "{e}");
    gw.stop();
}

#[actix_rt::test]
async fn a_worker_without_events_says_so_and_is_routed_by_the_approximate_index() {
    let fleet = SimFleet::start(1, SimConfig::default()).expect("fleet");
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = fleet.urls();
    let gw = Gateway::start(cfg).expect("gateway");
    let ws = workers(&gw).await;
    assert_eq!(ws[0]["events"]["state"], "off", "{ws:?}");
    assert!(ws[0]["events"]["reason"].is_string(), "{ws:?}");
    let r = post_json(
        &format!("{}/generate", gw.url()),
        &json!({"input_ids": prefix(1, 64), "sampling_params": {"max_new_tokens": 1}}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    gw.stop();
}

#[actix_rt::test]
async fn a_restarted_engine_is_subscribed_afresh_and_its_old_blocks_are_gone() {
    let mut fleet = SimFleet::start_each("127.0.0.1", 0, vec![engine()]).expect("fleet");
    let url = fleet.urls()[0].clone();
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = vec![url.clone()];
    // Re-detection (every few health ticks) is what notices the new startup_time.
    cfg.health.interval = std::time::Duration::from_millis(100);
    let gw = Gateway::start(cfg).expect("gateway");
    let send = |k: u32| {
        let url = url.clone();
        async move {
            let r = post_json(
                &format!("{url}/generate"),
                &json!({"input_ids": prefix(k, 64), "sampling_params": {"max_new_tokens": 1}}),
            )
            .await;
            assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        }
    };
    until_workers(&gw, "live events", |ws| {
        ws.first().is_some_and(|w| w["events"]["state"] == "live")
    })
    .await;
    send(1).await;
    until_workers(&gw, "the first blocks", |ws| blocks_of(ws, &url) > 0).await;
    // A new process on the same ports: its batches number from 0 again, its cache is empty.
    fleet.revive(0).expect("revive");
    until_workers(&gw, "the restart noticed", |ws| {
        blocks_of(ws, &url) == 0 && ws[0]["events"]["state"] == "live"
    })
    .await;
    send(2).await;
    until_workers(&gw, "blocks from the new process", |ws| {
        blocks_of(ws, &url) > 0
    })
    .await;
    gw.stop();
}

#[actix_rt::test]
async fn a_vllm_engine_cleared_or_restarted_loses_its_blocks() {
    // The same as above in vLLM's form: no /server_info, so the events endpoint comes
    // from --kv-events-config; a cleared cache is `AllBlocksCleared`, a restart a
    // publisher numbering from 0 again.
    let hosts = ["127.0.0.1"];
    let (pub_port, replay_port) = (free_port_on(&hosts), free_port_on(&hosts));
    let vllm = vllm_publisher(pub_port, replay_port, false);
    let mut fleet = SimFleet::start_each(hosts[0], 0, vec![vllm]).expect("fleet");
    let url = fleet.urls()[0].clone();
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = vec![url.clone()];
    // A silent publisher is probed after this long: how a restart that publishes nothing
    // yet is found.
    cfg.events.kv_events_silence = std::time::Duration::from_millis(300);
    cfg.poller.interval = std::time::Duration::from_millis(100);
    cfg.health.interval = std::time::Duration::from_millis(100);
    cfg.events.kv_events_config = Some(vllm_events_config(pub_port, replay_port));
    let gw = Gateway::start(cfg).expect("gateway");
    let send = |k: u32| complete_on(&url, prefix(k, 64));
    until_workers(&gw, "live events", |ws| {
        ws.first().is_some_and(|w| w["events"]["state"] == "live")
    })
    .await;
    send(1).await;
    until_workers(&gw, "the first blocks", |ws| blocks_of(ws, &url) > 0).await;
    let r = post_json(&format!("{url}/reset_prefix_cache"), &json!({})).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    until_workers(&gw, "the cleared cache", |ws| blocks_of(ws, &url) == 0).await;
    send(2).await;
    until_workers(&gw, "blocks after the clear", |ws| blocks_of(ws, &url) > 0).await;
    let before = blocks_of(&workers(&gw).await, &url);
    // vLLM has no startup_time: a restart is seen as the health checks failing while the
    // process is down, which ends the subscription; the new process is subscribed afresh.
    fleet
        .engine(0)
        .set_fault(kvgate_engine_sim::Fault::HealthDown);
    until_workers(&gw, "the engine down", |ws| ws[0]["healthy"] == false).await;
    fleet.revive(0).expect("revive");
    until_workers(&gw, "the new process live", |ws| {
        ws[0]["healthy"] == true && ws[0]["events"]["state"] == "live"
    })
    .await;
    send(3).await;
    until_workers(&gw, "only the new process's blocks", |ws| {
        blocks_of(ws, &url) == before
    })
    .await;
    gw.stop();
}

#[actix_rt::test]
async fn pushed_load_refreshes_the_running_count_between_polls() {
    let sim = SimConfig {
        load_publish_port: Some(0),
        load_heartbeat: std::time::Duration::from_millis(50),
        ..engine()
    };
    let fleet = SimFleet::start_each("127.0.0.1", 0, vec![sim]).expect("fleet");
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = fleet.urls();
    // One poll at the start and none after: only pushes can move the counts.
    cfg.poller.interval = std::time::Duration::from_secs(3600);
    let gw = Gateway::start(cfg).expect("gateway");
    let sel = gw.actors().selector.clone();
    let running = || {
        let sel = sel.clone();
        async move {
            sel.send(kvgate_gateway::testing::GetViews)
                .await
                .ok()
                .and_then(|v| v.first().and_then(|w| w.load.clone()))
                .map(|l| l.ranks.iter().map(|r| r.num_running_reqs).sum::<u64>())
        }
    };
    for _ in 0..500 {
        if running().await == Some(0) {
            break;
        }
        actix_rt::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(running().await, Some(0));
    // A long answer: while it decodes, the pushed count says 1.
    let url = format!("{}/v1/completions", gw.url());
    let long = actix_rt::spawn(async move {
        post_json(&url, &json!({"prompt": "a long answer", "max_tokens": 400})).await
    });
    let mut seen = None;
    for _ in 0..500 {
        seen = running().await;
        if seen == Some(1) {
            break;
        }
        actix_rt::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(seen, Some(1), "no pushed load showed the running request");
    let r = long.await.expect("the request");
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    for _ in 0..500 {
        seen = running().await;
        if seen == Some(0) {
            break;
        }
        actix_rt::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(seen, Some(0), "the pushed count did not come back to 0");
    gw.stop();
}

/// A port free on every address given, at the time of asking.
fn free_port_on(hosts: &[&str]) -> u16 {
    for _ in 0..100 {
        let Ok(l) = std::net::TcpListener::bind((hosts[0], 0)) else {
            continue;
        };
        let Ok(port) = l.local_addr().map(|a| a.port()) else {
            continue;
        };
        if hosts[1..]
            .iter()
            .all(|h| std::net::TcpListener::bind((*h, port)).is_ok())
        {
            return port;
        }
    }
    panic!("no port free on {hosts:?}");
}

#[actix_rt::test]
async fn engines_that_advertise_nothing_are_subscribed_from_kv_events_config() {
    // vLLM has no /server_info: two engines on two hosts (127.0.0.1 and 127.0.0.2, both
    // loopback) publish on the same ports, as a fleet started with one --kv-events-config.
    let hosts = ["127.0.0.1", "127.0.0.2"];
    let (pub_port, replay_port) = (free_port_on(&hosts), free_port_on(&hosts));
    let vllm = vllm_publisher(pub_port, replay_port, false);
    let a = SimFleet::start_each(hosts[0], 0, vec![vllm.clone()]).expect("engine a");
    let b = SimFleet::start_each(hosts[1], 0, vec![vllm]).expect("engine b");
    let urls = vec![a.urls()[0].clone(), b.urls()[0].clone()];
    // Stored before the gateway starts, each on a chosen engine: replay must bring them.
    let holders = [1, 0, 0, 1];
    for (k, &h) in holders.iter().enumerate() {
        let r = post_json(
            &format!("{}/v1/completions", urls[h]),
            &json!({"prompt": prefix(k as u32, 192), "max_tokens": 1}),
        )
        .await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = urls.clone();
    // vLLM's own form of the flag, block size not given: the stored blocks tell it.
    cfg.events.kv_events_config = Some(vllm_events_config(pub_port, replay_port));
    let gw = Gateway::start(cfg).expect("gateway");
    let ws = until_workers(&gw, "live events from config", |ws| {
        ws.len() == 2
            && ws.iter().all(|w| w["events"]["state"] == "live")
            && urls.iter().all(|u| blocks_of(ws, u) > 0)
    })
    .await;
    assert!(
        ws.iter().all(|w| w["kv_events"]["source"] == "config"),
        "{ws:?}"
    );
    assert!(ws.iter().any(|w| w["events"]["block_size"] == 16), "{ws:?}");
    // Each prefix goes to its holder, which the approximate index knows nothing of.
    for (k, &h) in holders.iter().enumerate() {
        let mut ids = prefix(k as u32, 192);
        ids.extend(prefix(200, 8));
        let e = post_json(
            &format!("{}/admin/explain/v1/completions", gw.url()),
            &json!({"prompt": ids}),
        )
        .await
        .json();
        assert_eq!(e["worker"], *urls[h].as_str(), "prefix {k}: {e}");
    }
    // A bad config is refused at load, with the key named.
    let mut bad = test_config(&dir);
    bad.events.kv_events_config = Some(r#"{"endpoint": "ipc:///tmp/kv"}"#.into());
    let e = bad
        .validate()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("kv_events_config") && e.contains("tcp://"),
        "{e}"
    );
    gw.stop();
}

#[actix_rt::test]
async fn a_burst_on_a_prefix_the_events_place_spills_past_its_gated_holder() {
    // Exactness must not bring back hot spots: the events say engine 0 holds the prefix,
    // and the same count gate as with the approximate index moves the excess elsewhere.
    let fleet = SimFleet::start_each("127.0.0.1", 0, vec![engine(), engine()]).expect("fleet");
    let urls = fleet.urls();
    let r = post_json(
        &format!("{}/generate", urls[0]),
        &json!({"input_ids": prefix(7, 256), "sampling_params": {"max_new_tokens": 1}}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = urls.clone();
    cfg.seed = Some(9);
    cfg.policy.balance_abs_threshold = 4;
    let gw = Gateway::start(cfg).expect("gateway");
    until_workers(&gw, "the holder's blocks", |ws| {
        ws.len() == 2
            && ws.iter().all(|w| w["events"]["state"] == "live")
            && blocks_of(ws, &urls[0]) >= 256
    })
    .await;
    let g = &gw;
    let reqs = (0..16u32).map(|i| async move {
        let mut ids = prefix(7, 256);
        ids.extend(prefix(300 + i, 8));
        generate_on(g, ids, 64).await
    });
    let served = futures_util::future::join_all(reqs).await;
    let on_holder = served.iter().filter(|&&e| e == 0).count();
    assert!(
        (9..16).contains(&on_holder),
        "the holder took {on_holder} of 16: {served:?}"
    );
    gw.stop();
}

#[actix_rt::test]
async fn new_prefix_groups_stay_together_before_their_engines_publish_them() {
    // An engine publishes a prompt's blocks when its prefill ends: until then only the
    // gateway's own routing says where a new prefix went, and the rest of its group must
    // follow that rather than start the prefix again on another engine.
    let fleet = SimFleet::start_each("127.0.0.1", 0, vec![engine(), engine(), engine(), engine()])
        .expect("fleet");
    let urls = fleet.urls();
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = urls.clone();
    cfg.seed = Some(4);
    let gw = Gateway::start(cfg).expect("gateway");
    until_workers(&gw, "live events", |ws| {
        ws.len() == 4 && ws.iter().all(|w| w["events"]["state"] == "live")
    })
    .await;
    // Eight groups of three, all at once, interleaved: each group's prefix is new.
    let g = &gw;
    let reqs = (0..24u32).map(|i| async move {
        let group = i % 8;
        let mut ids = prefix(20 + group, 512);
        ids.extend(prefix(400 + i, 8));
        (group, generate_on(g, ids, 1).await)
    });
    let served = futures_util::future::join_all(reqs).await;
    for g in 0..8 {
        let engines: Vec<usize> = served.iter().filter(|s| s.0 == g).map(|s| s.1).collect();
        assert!(
            engines.iter().all(|&e| e == engines[0]),
            "group {g} was split: {engines:?} (all: {served:?})"
        );
    }
    gw.stop();
}

#[actix_rt::test]
async fn explain_says_the_hash_index_matched_when_the_events_overlay_is_not_used() {
    // With the hash index the events overlay is skipped: live events or not, every
    // candidate was matched by the index, and explain says so.
    let fleet = SimFleet::start_each("127.0.0.1", 0, vec![engine(), engine()]).expect("fleet");
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = fleet.urls();
    cfg.policy.cache_index = kvgate_policies::CacheIndex::Hash;
    let gw = Gateway::start(cfg).expect("gateway");
    until_workers(&gw, "live events", |ws| {
        ws.len() == 2 && ws.iter().all(|w| w["events"]["state"] == "live")
    })
    .await;
    let ask = json!({"input_ids": prefix(5, 192), "sampling_params": {"max_new_tokens": 1}});
    let r = post_json(&format!("{}/generate", gw.url()), &ask).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let e = post_json(&format!("{}/admin/explain/generate", gw.url()), &ask)
        .await
        .json();
    let cands = e["candidates"].as_array().cloned().unwrap_or_default();
    assert_eq!(cands.len(), 2, "{e}");
    for c in &cands {
        assert_eq!(c["events"], "live", "{e}");
        assert_eq!(c["matched_by"], "index", "{e}");
    }
    gw.stop();
}
