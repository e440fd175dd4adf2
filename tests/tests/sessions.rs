//! Sessions: requests that say they belong together (OpenAI's `prompt_cache_key`, a
//! session header) land together even when their prompts share nothing, and sessions
//! spread over the fleet.

use kvgate_engine_sim::{SimConfig, engine_of};
use kvgate_tests::{Harness, Reply, client, finish_reply};
use serde_json::{Value, json};

/// A prompt no other request shares a byte of at its start.
fn unrelated(key: usize, turn: usize) -> String {
    let seed = (key * 7919 + turn * 104_729) as u64;
    (0..60)
        .map(|i| {
            format!(
                "w{:x}",
                seed.wrapping_mul(2_654_435_761).wrapping_add(i) % 1_000_003
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

async fn send(h: &Harness, body: &Value, header: Option<(&str, String)>) -> Reply {
    let mut req = client()
        .post(h.url("/v1/chat/completions"))
        .insert_header(("content-type", "application/json"));
    if let Some(hv) = header {
        req = req.insert_header(hv);
    }
    let resp = req
        .send_body(serde_json::to_vec(body).unwrap_or_default())
        .await;
    finish_reply(resp.unwrap_or_else(|e| panic!("sent: {e}"))).await
}

#[actix_rt::test]
async fn a_sessions_requests_land_together_and_sessions_spread() {
    let sim = SimConfig {
        max_running_requests: 16,
        ..SimConfig::default()
    };
    let h = Harness::start(4, sim, |c| c.seed = Some(5));
    h.wait_for_load_reports().await;
    let mut engines: Vec<Vec<usize>> = vec![Vec::new(); 10];
    for turn in 0..4 {
        for (key, seen) in engines.iter_mut().enumerate() {
            let mut body = json!({"messages": [{"role": "user", "content": unrelated(key, turn)}],
                "max_tokens": 2});
            // Half say it in the body, half in a header.
            let header = if key % 2 == 0 {
                body["prompt_cache_key"] = json!(format!("agent-{key}"));
                None
            } else {
                Some(("x-session-id", format!("agent-{key}")))
            };
            let r = send(&h, &body, header).await;
            assert_eq!(r.status.as_u16(), 200, "{}", r.text());
            let id = r.json()["id"].as_str().unwrap_or("").to_owned();
            seen.push(engine_of(&id).unwrap_or(usize::MAX));
        }
    }
    for (key, e) in engines.iter().enumerate() {
        assert!(e.iter().all(|x| *x == e[0]), "session {key} moved: {e:?}");
    }
    let used: std::collections::BTreeSet<usize> = engines.iter().map(|e| e[0]).collect();
    assert!(used.len() >= 3, "10 sessions on {used:?}: {engines:?}");
}

#[actix_rt::test]
async fn without_a_session_unrelated_prompts_spread() {
    // The control: the same prompts with no session are new prefixes, spread by load.
    let sim = SimConfig {
        max_running_requests: 16,
        ..SimConfig::default()
    };
    let h = Harness::start(4, sim, |c| c.seed = Some(5));
    h.wait_for_load_reports().await;
    let mut engines = Vec::new();
    for turn in 0..4 {
        let body = json!({"messages": [{"role": "user", "content": unrelated(0, turn)}],
            "max_tokens": 2});
        let r = send(&h, &body, None).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        engines.push(engine_of(r.json()["id"].as_str().unwrap_or("")).unwrap_or(usize::MAX));
    }
    assert!(engines.iter().any(|x| *x != engines[0]), "{engines:?}");
}
