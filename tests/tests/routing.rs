//! Cache- and load-aware routing end to end: real gateway, simulated engines, real polls.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]
#![expect(
    clippy::disallowed_methods,
    reason = "busy requests beside the routed ones; the test awaits or drops them"
)]

use futures_util::StreamExt;
use kvgate_engine_sim::{SimConfig, Tokenizer};
use kvgate_gateway::testing::GetViews;
use kvgate_policies::{PolicyKind, WorkerView};
use kvgate_poller::PollNow;
use std::time::Duration;

use kvgate_tests::{Harness, complete_on, post_json, sse_events, wait_for, wait_for_async};
use serde_json::json;

fn sim() -> SimConfig {
    SimConfig {
        max_running_requests: 16,
        initial_gen_throughput: 0.36,
        enable_cache_report: true,
        ..SimConfig::default()
    }
}

async fn with_loads(engines: usize, policy: PolicyKind) -> Harness {
    let h = Harness::start(engines, sim(), |c| {
        c.policy.kind = policy;
        c.seed = Some(7);
    });
    // Routing must see real load reports (the idle residual among them) before the burst.
    h.gw.actors().poller.do_send(PollNow);
    wait_for_views(&h, "a load report from every engine", |v| {
        v.iter().all(|w| w.load.is_some())
    })
    .await;
    h
}

/// Waits until the selector's views of the fleet satisfy `ok`.
async fn wait_for_views(h: &Harness, what: &str, ok: fn(&[WorkerView]) -> bool) {
    let sel = h.gw.actors().selector.clone();
    wait_for_async(10, what, || {
        let sel = sel.clone();
        async move { sel.send(GetViews).await.is_ok_and(|v| ok(&v)) }
    })
    .await;
}

#[actix_rt::test]
async fn a_burst_of_unrelated_prompts_splits_evenly_over_two_engines() {
    for policy in [
        PolicyKind::CacheAware,
        PolicyKind::LeastLoad,
        PolicyKind::PowerOfTwo,
    ] {
        let h = with_loads(2, policy).await;
        h.burst(32).await;
        let split = h.split();
        assert_eq!(split.iter().sum::<u64>(), 32);
        assert!(
            split.iter().all(|&n| (14..=18).contains(&n)),
            "{policy}: {split:?}"
        );
    }
}

#[actix_rt::test]
async fn a_burst_over_four_engines_gives_each_six_to_ten() {
    for policy in [
        PolicyKind::CacheAware,
        PolicyKind::LeastLoad,
        PolicyKind::PowerOfTwo,
    ] {
        let h = with_loads(4, policy).await;
        h.burst(32).await;
        let split = h.split();
        assert_eq!(split.iter().sum::<u64>(), 32);
        assert!(
            split.iter().all(|&n| (6..=10).contains(&n)),
            "{policy}: {split:?}"
        );
    }
}

#[actix_rt::test]
async fn an_idle_two_rank_engine_takes_two_thirds_of_a_burst_beside_a_one_rank_engine() {
    // Engine 0 runs two data-parallel ranks of 16 slots, engine 1 one rank of 16, both idle
    // with stale gauges. Priced per rank, engine 0 drains twice as fast, so 48 equal
    // requests fill 32:16, every request in a slot; priced per worker they split 24:24
    // and 8 wait on engine 1 while 8 of engine 0's slots stay free.
    let two_ranks = SimConfig {
        dp_size: 2,
        ..sim()
    };
    let h = Harness::start_each(vec![two_ranks, sim()], |c| {
        c.policy.kind = PolicyKind::LeastLoad;
        c.seed = Some(7);
        // No poll during the burst: the split follows from one report each and the credit.
        c.poller.interval = Duration::from_secs(3600);
    });
    h.gw.actors().poller.do_send(PollNow);
    wait_for_views(&h, "a load report from every engine", |v| {
        v.iter().all(|w| w.load.is_some())
    })
    .await;
    let reqs = (0..48).map(|i| {
        let url = h.url("/v1/completions");
        async move {
            let body = json!({"prompt": format!("an unrelated prompt of one length, {i:04}"), "max_tokens": 4});
            let r = post_json(&url, &body).await;
            assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        }
    });
    futures_util::future::join_all(reqs).await;
    assert_eq!(h.split(), vec![32, 16]);
}

#[actix_rt::test]
async fn a_shared_prefix_stays_with_the_engine_that_holds_it() {
    let h = with_loads(4, PolicyKind::CacheAware).await;
    let system = "You are a careful assistant for the kvgate test suite. ".repeat(40);
    let ask = |q: String| {
        let url = h.url("/v1/chat/completions");
        let system = system.clone();
        async move {
            let body = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}], "max_tokens": 2});
            let r = post_json(&url, &body).await;
            assert_eq!(r.status.as_u16(), 200, "{}", r.text());
            r.json()
        }
    };
    ask("first question".into()).await;
    let holder = h
        .split()
        .iter()
        .position(|&n| n == 1)
        .expect("one engine served it");
    for i in 0..8 {
        let r = ask(format!("follow-up question {i}")).await;
        // The engine reused the shared prefix, so the gateway sent it where it was cached.
        assert!(
            r["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0)
                > 0,
            "{r}"
        );
    }
    let split = h.split();
    assert_eq!(split[holder], 9, "{split:?}");
    // Eight at once still fit in the holder's 16 slots: they all stay there.
    let burst = (0..8).map(|i| ask(format!("concurrent question {i}")));
    futures_util::future::join_all(burst).await;
    let split = h.split();
    assert_eq!(split[holder], 17, "{split:?}");
}

#[actix_rt::test]
async fn explain_is_a_dry_run_with_reasons() {
    use kvgate_gateway::testing::Explain;
    use kvgate_policies::{DecisionPath, RequestFacts, RoutingText};
    let h = with_loads(2, PolicyKind::CacheAware).await;
    let text = "<|user|>\nexplain me\n".to_owned();
    let facts = RequestFacts {
        key: RoutingText::Text(text.into()),
        ..RequestFacts::default()
    };
    let sel = h.gw.actors().selector.clone();
    let d = sel
        .send(Explain {
            facts: std::sync::Arc::new(facts.clone()),
        })
        .await
        .unwrap()
        .unwrap()
        .decision;
    assert_eq!(d.path, DecisionPath::Miss, "{d:?}");
    assert_eq!(d.candidates.len(), 2, "every candidate is scored: {d:?}");
    assert!(d.candidates.iter().all(|c| c.score.is_some()), "{d:?}");
    assert!(d.worker.is_some());
    // Nothing was dispatched, credited or recorded.
    let views = sel.send(GetViews).await.unwrap();
    assert!(
        views
            .iter()
            .all(|v| v.in_flight == 0 && v.credit.requests == 0),
        "{views:?}"
    );
    let again = sel
        .send(Explain {
            facts: std::sync::Arc::new(facts),
        })
        .await
        .unwrap()
        .unwrap()
        .decision;
    assert_eq!(again.path, DecisionPath::Miss);
    assert_eq!(h.split(), vec![0, 0]);
}

#[actix_rt::test]
async fn a_routing_key_sticks_to_one_worker() {
    let h = Harness::start(4, sim(), |c| c.policy.kind = PolicyKind::ConsistentHashing);
    let client = kvgate_tests::client();
    let mut owner_of = Vec::new();
    for key in [
        "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi",
    ] {
        let before = h.split();
        for i in 0..5 {
            let header = if i % 2 == 0 {
                "x-kvgate-routing-key"
            } else {
                "x-smg-routing-key"
            };
            let r = client
                .post(h.url("/v1/completions"))
                .insert_header((header, key))
                .send_json(&json!({"prompt": format!("{key} asks question {i}"), "max_tokens": 1}))
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 200);
        }
        let after = h.split();
        let moved: Vec<usize> = (0..4).filter(|e| after[*e] != before[*e]).collect();
        assert_eq!(
            moved.len(),
            1,
            "{key}: all five on one worker: {before:?} -> {after:?}"
        );
        assert_eq!(after[moved[0]] - before[moved[0]], 5);
        owner_of.push(moved[0]);
    }
    owner_of.sort();
    owner_of.dedup();
    assert!(
        owner_of.len() >= 2,
        "eight keys do not all hash to one worker"
    );
}

/// Two streamed requests sharing a long prefix reach a busy engine together (it is in a
/// 500 ms decode step for an unrelated request). Without a hold both are admitted in the
/// same batch and both prefill the prefix; with one, the second waits for the first's
/// first token and then reuses the prefix.
/// Runs two streamed requests sharing a long system prompt behind an unrelated one on a
/// single slow engine; returns the engine's cached tokens, and the traffic explain then
/// reports for the shared prompt on its holder (engines' worth, see the cost mode).
async fn shared_prefix_pair(hold: Duration) -> (u64, f64) {
    let slow = SimConfig {
        decode_step_base: Duration::from_millis(500),
        // Word pieces would share the template's "<|" between the prompts.
        tokenizer: Tokenizer::FourBytes,
        ..sim()
    };
    let h = Harness::start(1, slow, |c| {
        c.policy.kind = PolicyKind::CacheAware;
        c.prefill_hold = hold;
    });
    let url = h.url("/v1/chat/completions");
    let busy = {
        let url = url.clone();
        actix_rt::spawn(async move {
            let body = json!({"messages": [{"role": "user", "content": "an unrelated long answer"}], "max_tokens": 4, "stream": true});
            post_json(&url, &body).await.status.as_u16()
        })
    };
    // Its first token comes out of its prefill: the engine is then in a decode step.
    wait_for(10, "the engine decoding", || {
        h.fleet.engine(0).stats().generated_tokens >= 1
    })
    .await;
    let system = "You answer questions about the kvgate prefill hold, carefully. ".repeat(30);
    let pair = (0..2).map(|i| {
        let url = url.clone();
        let system = system.clone();
        async move {
            let body = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": format!("question {i}")}], "max_tokens": 1, "stream": true});
            let r = post_json(&url, &body).await;
            assert_eq!(r.status.as_u16(), 200, "{}", r.text());
            let (_, done) = sse_events(&r.text());
            assert!(done, "{}", r.text());
        }
    });
    futures_util::future::join_all(pair).await;
    assert_eq!(busy.await.ok(), Some(200));
    let s = h.fleet.engine(0).stats();
    assert_eq!(s.requests, 3);
    let body = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "question 2"}]});
    let facts = kvgate_gateway::testing::request_facts(
        kvgate_gateway::testing::Endpoint::Chat,
        &bytes::Bytes::from(body.to_string()),
        true,
    )
    .expect("a valid chat body");
    let d =
        h.gw.actors()
            .selector
            .send(kvgate_gateway::testing::Explain {
                facts: std::sync::Arc::new(facts),
            })
            .await
            .expect("the selector answers")
            .expect("a decision")
            .decision;
    let traffic = d.chosen().and_then(|c| c.prefix_traffic);
    (s.cached_tokens, traffic.unwrap_or(f64::NAN))
}

#[actix_rt::test]
async fn a_request_holds_while_its_prefix_is_prefilled_for_another() {
    // Routing lookups count as traffic once per request: the first request of the pair
    // creates the prompt's node, the second's lookup enters it (held or not), and the
    // first request of all found no index yet. 1 lookup through the prefix of 2 counted,
    // on 1 candidate: 1 / (2 + 2 · 1) = 0.25 engines' worth.
    let (cached, traffic) = shared_prefix_pair(Duration::ZERO).await;
    assert_eq!(cached, 0, "without a hold both prefill the prefix");
    assert!((traffic - 0.25).abs() < 1e-3, "{traffic}");
    let (cached, traffic) = shared_prefix_pair(Duration::from_secs(5)).await;
    // The system prompt is about 500 tokens; the second request reuses all of it.
    assert!(
        cached >= 400,
        "the second request reused the prefix: {cached}"
    );
    // The held request asked twice but counts once.
    assert!((traffic - 0.25).abs() < 1e-3, "{traffic}");
}

#[actix_rt::test]
async fn a_streamed_request_gives_back_its_credit_at_its_first_token() {
    let sim = SimConfig {
        default_max_new_tokens: 20_000,
        ..sim()
    };
    let h = Harness::start(1, sim, |c| {
        c.policy.kind = PolicyKind::CacheAware;
        // No report covers these dispatches: only the gateway itself releases credit.
        c.poller.interval = Duration::from_secs(3600);
    });
    let client = kvgate_tests::client();
    let long = |text: &str, stream: bool| json!({"text": text, "stream": stream, "sampling_params": {"max_new_tokens": 20000}});
    // A non-streamed request says nothing until it ends, so it keeps its credit.
    let quiet = client
        .post(h.url("/generate"))
        .send_json(&long("a long answer nobody streams", false));
    let quiet = actix_rt::spawn(async move {
        let _ = quiet.await;
    });
    wait_for_views(&h, "the first request in flight", |v| {
        v[0].in_flight == 1 && v[0].credit.requests == 1
    })
    .await;
    let mut resp = client
        .post(h.url("/generate"))
        .send_json(&long("another long answer, streamed", true))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while !seen.windows(6).any(|w| w == b"data: ") {
        seen.extend_from_slice(&resp.next().await.unwrap().unwrap());
    }
    // Its prefill is over: it is in flight, but no longer queued work.
    wait_for_views(&h, "the streamed request's credit released", |v| {
        v[0].in_flight == 2 && v[0].credit.requests == 1
    })
    .await;
    drop(resp);
    quiet.abort();
}

#[actix_rt::test]
async fn each_worker_counts_the_new_prefixes_it_started() {
    let h = with_loads(2, PolicyKind::CacheAware).await;
    let sel = h.gw.actors().selector.clone();
    let url = h.gw.url();
    let send = |prompt: String| complete_on(&url, prompt);
    let recent = || async {
        let mut r: Vec<f64> = sel
            .send(GetViews)
            .await
            .unwrap()
            .iter()
            .map(|v| v.recent)
            .collect();
        r.sort_by(f64::total_cmp);
        r
    };
    let near = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 0.01);
    let first = "A system prompt long enough to be worth keeping together. ".repeat(12);
    send(format!("{first} Question one?")).await;
    assert!(near(&recent().await, &[0.0, 1.0]), "{:?}", recent().await);
    // A hit starts nothing new.
    send(format!("{first} Question two?")).await;
    assert!(near(&recent().await, &[0.0, 1.0]), "{:?}", recent().await);
    // Another group starts on the worker that started none.
    let second = "An unrelated instruction block for a different prefix group. ".repeat(12);
    send(format!("{second} Question three?")).await;
    assert!(near(&recent().await, &[1.0, 1.0]), "{:?}", recent().await);
    let mut last: Vec<u64> = sel
        .send(GetViews)
        .await
        .unwrap()
        .iter()
        .map(|v| v.last_start)
        .collect();
    last.sort_unstable();
    assert_eq!(
        last,
        [1, 2],
        "each worker's last start, by the fleet's count"
    );
}

#[actix_rt::test]
async fn new_groups_spread_evenly_after_other_traffic() {
    // 13 conversations first leave one engine having started 4 and the others 3; 8
    // groups of 4 after them still land 2 groups, 8 requests, on each engine.
    let h = with_loads(4, PolicyKind::CacheAware).await;
    let url = h.gw.url();
    let send = |prompt: String| complete_on(&url, prompt);
    let head = |kind: &str, i: usize| {
        format!(
            "{kind} {i}: {}",
            "a private block of text for this group. ".repeat(16)
        )
    };
    for c in 0..13 {
        send(format!("{} Hello?", head("conversation", c))).await;
    }
    let before = h.split();
    assert_eq!(before.iter().sum::<u64>(), 13);
    for turn in 0..4 {
        for g in 0..8 {
            send(format!("{} Question {turn}?", head("group", g))).await;
        }
    }
    let during: Vec<u64> = h.split().iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(during, [8, 8, 8, 8], "after {before:?}");
}

#[actix_rt::test]
async fn an_engine_whose_load_routes_hang_delays_no_other_engines_report() {
    let h = Harness::start(2, sim(), |c| {
        c.poller.interval = Duration::from_secs(3600);
        // The hung poll ends only at this timeout, long after the test.
        c.poller.timeout = Duration::from_secs(600);
    });
    h.fleet
        .engine(0)
        .set_fault(kvgate_engine_sim::Fault::LoadsHang);
    let sel = h.gw.actors().selector.clone();
    let before = sel.send(GetViews).await.unwrap();
    let url1 = &h.fleet.urls()[1];
    let load_of = |views: &[WorkerView], url: &str| {
        views
            .iter()
            .find(|v| v.url.as_ref() == url)
            .and_then(|v| v.load.clone())
    };
    let was = load_of(&before, url1);
    h.gw.actors().poller.do_send(PollNow);
    wait_for_async(
        10,
        "engine 1's new report while engine 0's poll hangs",
        || {
            let (sel, was) = (sel.clone(), was.clone());
            async move {
                sel.send(GetViews)
                    .await
                    .is_ok_and(|v| load_of(&v, url1).is_some_and(|l| Some(&l) != was.as_ref()))
            }
        },
    )
    .await;
}

#[actix_rt::test]
async fn the_selector_books_what_it_sent_until_the_first_token() {
    // One engine prefilling at 200 tok/s and decoding a token per 100 ms: the request's
    // prefill and then its decoding each outlast the checks made during them.
    let slow = SimConfig {
        prefill_tokens_per_sec: 200.0,
        decode_step_base: Duration::from_millis(100),
        ..sim()
    };
    let h = Harness::start(1, slow, |c| c.policy.kind = PolicyKind::CacheAware);
    let sel = h.gw.actors().selector.clone();
    let view = || async { sel.send(GetViews).await.expect("selector")[0].clone() };
    let own = |v: &WorkerView| v.own.unwrap_or_default();
    assert!(
        view().await.own.is_some(),
        "the gateway keeps its own count"
    );
    let url = h.url("/v1/completions");
    let prompt = "A prompt long enough to take a while to prefill. ".repeat(20);
    let body = json!({"prompt": prompt, "max_tokens": 30, "stream": true});
    let sent = actix_rt::spawn(async move { post_json(&url, &body).await });
    let until = |what: &'static str, ok: fn(&WorkerView) -> bool| {
        let sel = sel.clone();
        wait_for_async(20, what, move || {
            let sel = sel.clone();
            async move { sel.send(GetViews).await.is_ok_and(|v| ok(&v[0])) }
        })
    };
    until("the request in flight", |v| v.in_flight == 1).await;
    let booked = own(&view().await).unprefilled_tokens;
    assert!(booked > 100, "booked {booked} uncached tokens");
    // A report taken now counts this gateway's one request there.
    h.gw.actors().poller.do_send(PollNow);
    until("a report with the request in flight", |v| {
        v.own.is_some_and(|o| o.requests_at_sample == 1)
    })
    .await;
    // Its first token takes the booking back while it still decodes.
    until("the first token", |v| {
        v.in_flight == 1 && v.own.is_some_and(|o| o.unprefilled_tokens == 0)
    })
    .await;
    let r = sent.await.expect("the request");
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    until("the request ended", |v| v.in_flight == 0).await;
    assert_eq!(own(&view().await).unprefilled_tokens, 0);
}
