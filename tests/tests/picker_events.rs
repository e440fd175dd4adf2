//! The picker on engine KV events: prefixes cached on chosen engines directly (never
//! routed by kvgate) are known only from the engines' events, and token requests asked
//! through the ext_proc door are picked on the engine whose events hold their blocks.

use kvgate_engine_sim::{SimConfig, SimFleet};
use kvgate_gateway::Gateway;
use kvgate_tests::envoy::Envoy;
use kvgate_tests::{post_json, publishing_engine, test_config, unique_tokens, until_workers};
use serde_json::json;

fn engine() -> SimConfig {
    publishing_engine()
}

fn prefix(k: u32, n: u32) -> Vec<u32> {
    unique_tokens(k, n)
}

#[actix_rt::test]
async fn the_pick_follows_the_engines_events() {
    let fleet = SimFleet::start_each("127.0.0.1", 0, vec![engine(), engine()]).expect("fleet");
    let urls = fleet.urls();
    for k in 0..8u32 {
        let at = &urls[(k % 2) as usize];
        let body = json!({"input_ids": prefix(k, 192), "sampling_params": {"max_new_tokens": 1}});
        let r = post_json(&format!("{at}/generate"), &body).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = urls.clone();
    cfg.seed = Some(5);
    cfg.picker.ext_proc_port = Some(0);
    let gw = Gateway::start(cfg).expect("gateway");
    until_workers(&gw, "live events with the replayed blocks", |ws| {
        ws.len() == 2
            && ws
                .iter()
                .all(|w| w["events"]["state"] == "live" && w["events"]["blocks"].as_u64() > Some(0))
    })
    .await;
    let e = Envoy::connect(gw.ext_proc_addr().expect("the picker listens")).await;
    let endpoint = |u: &str| {
        u.trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned()
    };
    let mut followed = 0;
    for k in 0..8u32 {
        let mut ids = prefix(k, 192);
        ids.extend(prefix(100 + k, 16));
        let body = json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}});
        let (mut ex, answer) = e
            .route("/generate", body.to_string().as_bytes(), 3, None)
            .await;
        let picked = answer.endpoints()[0].clone();
        followed += usize::from(picked == endpoint(&urls[(k % 2) as usize]));
        ex.respond(200, Some(&picked), b"{}", 1).await;
    }
    assert_eq!(followed, 8, "picks on the engine holding the prefix");
    gw.stop();
}
