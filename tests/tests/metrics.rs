//! `GET /metrics` read by a Prometheus text parser after real traffic: request counts by
//! route, status class and model, decisions by path, streamed-token histograms, the
//! poller's view per worker and rank, the index, and predicted against reported cached
//! tokens. And `--prometheus-port`, a keyless listener beside a keyed gateway.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use kvgate_engine_sim::SimConfig;
use kvgate_gateway::Secret;
use kvgate_tests::{Harness, client, get, post_json};
use prometheus_parse::{Scrape, Value};
use serde_json::json;

fn parse(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("Prometheus text format")
}

/// The value of the series `name` whose labels include `labels`.
fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let base = name.trim_end_matches("_count");
    s.samples
        .iter()
        .filter(|x| labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .find_map(|x| match &x.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) if x.metric == name => Some(*v),
            Value::Histogram(buckets) if x.metric == base && name.ends_with("_count") => {
                buckets.last().map(|b| b.count)
            }
            _ => None,
        })
}

async fn scrape(url: &str) -> Scrape {
    let r = get(url).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("application/openmetrics-text")),
        "{:?}",
        r.header("content-type")
    );
    parse(&r.text())
}

#[actix_rt::test]
async fn metrics_count_requests_decisions_tokens_and_what_the_fleet_reports() {
    let h = Harness::start(
        2,
        SimConfig {
            enable_cache_report: true,
            ..SimConfig::default()
        },
        |c| c.seed = Some(9),
    );
    h.wait_for_load_reports().await;
    let chat = h.url("/v1/chat/completions");
    let system = "You are the metrics test's assistant. ".repeat(30);
    let ask = |q: &str, stream: bool| {
        json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
               "max_tokens": 4, "stream": stream, "stream_options": {"include_usage": true}})
    };
    assert_eq!(
        post_json(&chat, &ask("one", false)).await.status.as_u16(),
        200
    );
    assert_eq!(
        post_json(&chat, &ask("two", true)).await.status.as_u16(),
        200
    );
    let mut unknown = ask("three", false);
    unknown["model"] = json!("no-such-model");
    assert_eq!(post_json(&chat, &unknown).await.status.as_u16(), 404);

    let url = h.url("/metrics");
    let route = ("route", "/v1/chat/completions");
    let mut s = scrape(&url).await;
    // The streamed answer's end is recorded as its relay ends, just after the client's.
    for _ in 0..250 {
        if value(&s, "kvgate_request_duration_seconds_count", &[route]) == Some(3.0) {
            break;
        }
        actix_rt::time::sleep(std::time::Duration::from_millis(20)).await;
        s = scrape(&url).await;
    }
    assert_eq!(
        value(
            &s,
            "kvgate_requests_total",
            &[route, ("status", "2xx"), ("model", "")]
        ),
        Some(2.0)
    );
    // The unknown model is a 4xx without a model label of its own: labels stay bounded.
    assert_eq!(
        value(
            &s,
            "kvgate_requests_total",
            &[route, ("status", "4xx"), ("model", "")]
        ),
        Some(1.0)
    );
    assert!(
        !s.samples
            .iter()
            .any(|x| x.labels.get("model") == Some("no-such-model"))
    );
    let decisions = |path| {
        value(
            &s,
            "kvgate_routing_decisions_total",
            &[("policy", "cache_aware"), ("path", path)],
        )
    };
    assert_eq!(
        (decisions("miss"), decisions("hit")),
        (Some(1.0), Some(1.0))
    );
    assert_eq!(
        value(&s, "kvgate_time_to_first_token_seconds_count", &[route]),
        Some(1.0)
    );
    assert_eq!(
        value(&s, "kvgate_request_duration_seconds_count", &[route]),
        Some(3.0)
    );
    assert!(value(&s, "kvgate_time_between_tokens_seconds_count", &[route]).unwrap_or(0.0) >= 3.0);
    assert!(value(&s, "kvgate_selector_mailbox_wait_seconds_count", &[]).unwrap_or(0.0) >= 2.0);
    // The second request hit the first's system prompt: both sides count it.
    let reported = value(&s, "kvgate_reported_cached_tokens_total", &[]).unwrap_or(0.0);
    let predicted = value(&s, "kvgate_predicted_cached_tokens_total", &[]).unwrap_or(0.0);
    assert!(
        reported > 200.0 && predicted > 200.0,
        "{reported} {predicted}"
    );
    assert_eq!(
        value(&s, "kvgate_cache_reports_total", &[("reported", "yes")]),
        Some(1.0)
    );
    assert_eq!(
        value(&s, "kvgate_cache_reports_total", &[("reported", "no")]),
        Some(1.0)
    );
    for w in h.fleet.urls() {
        let worker = ("worker", w.as_str());
        assert_eq!(
            value(&s, "kvgate_worker_healthy", &[worker]),
            Some(1.0),
            "{w}"
        );
        assert_eq!(
            value(&s, "kvgate_worker_in_flight", &[worker]),
            Some(0.0),
            "{w}"
        );
        assert_eq!(
            value(&s, "kvgate_worker_circuit_state", &[worker]),
            Some(0.0),
            "{w}"
        );
        assert_eq!(
            value(
                &s,
                "kvgate_worker_health_transitions_total",
                &[worker, ("to", "healthy")]
            ),
            Some(1.0),
            "{w}"
        );
        assert!(
            value(&s, "kvgate_worker_kv_usage_ratio", &[worker, ("rank", "0")]).is_some(),
            "{w}"
        );
    }
    let held: f64 = s
        .samples
        .iter()
        .filter(|x| x.metric == "kvgate_index_units")
        // Text requests: the text tree's unit, bytes.
        .filter(|x| x.labels.get("unit").is_some_and(|u| u == "bytes"))
        .filter_map(|x| match x.value {
            Value::Gauge(v) | Value::Untyped(v) => Some(v),
            _ => None,
        })
        .sum();
    assert!(held > 1000.0, "{held}");
    assert!(value(&s, "kvgate_snapshot_duration_seconds_count", &[]).is_some());
    // Nothing names a request or its text.
    assert!(!s.samples.iter().any(|x| {
        x.labels
            .values()
            .any(|v| v.contains("req-") || v.contains("assistant"))
    }));
}

#[actix_rt::test]
async fn the_prometheus_port_needs_no_key_where_the_gateway_port_does() {
    let h = Harness::start(1, SimConfig::default(), |c| {
        c.access.control_plane_api_keys = vec![Secret::new("sk-admin")];
        c.prometheus_port = Some(0);
    });
    get(&h.url("/metrics"))
        .await
        .assert_error(401, "invalid_api_key");
    let keyed = client()
        .get(h.url("/metrics"))
        .bearer_auth("sk-admin")
        .send()
        .await
        .expect("sent");
    assert_eq!(keyed.status().as_u16(), 200);
    let open = h.gw.metrics_url().expect("a metrics listener");
    let s = scrape(&format!("{open}/metrics")).await;
    assert_eq!(
        value(
            &s,
            "kvgate_worker_healthy",
            &[("worker", h.fleet.urls()[0].as_str())]
        ),
        Some(1.0)
    );
    // That listener serves nothing else.
    assert_eq!(get(&format!("{open}/workers")).await.status.as_u16(), 404);
}

/// The cached-token counters, once the decision log holds `n` answered requests.
async fn cached_counts(h: &Harness, n: usize) -> (f64, f64, Option<f64>) {
    kvgate_tests::wait_for_async(10, "every answer logged", || async {
        let d = get(&h.url("/admin/decisions")).await.json();
        let answered = d["decisions"]
            .as_array()
            .map_or(0, |ds| ds.iter().filter(|x| !x["answer"].is_null()).count());
        answered >= n
    })
    .await;
    let s = scrape(&h.url("/metrics")).await;
    (
        value(&s, "kvgate_predicted_cached_tokens_total", &[]).unwrap_or(0.0),
        value(&s, "kvgate_reported_cached_tokens_total", &[]).unwrap_or(0.0),
        value(&s, "kvgate_cache_reports_total", &[("reported", "no")]),
    )
}

#[actix_rt::test]
async fn a_predicted_hit_the_engine_reports_nothing_for_counts_against_zero() {
    let sim = SimConfig {
        enable_cache_report: true,
        ..SimConfig::default()
    };
    let h = Harness::start(1, sim, |_| {});
    let system = "Answer as a ship's navigator would, in one line. ".repeat(12);
    let chat = |q: &str| json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}], "max_tokens": 2});
    for q in ["first", "second"] {
        let r = post_json(&h.url("/v1/chat/completions"), &chat(q)).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    let (predicted, reported, _) = cached_counts(&h, 2).await;
    assert!(reported > 0.0 && predicted > 0.0, "{predicted} {reported}");
    // The engine forgets; the index does not know yet, so the next request predicts a hit
    // and the engine, having nothing cached, leaves the figure out.
    let flushed = post_json(&format!("{}/flush_cache", h.fleet.urls()[0]), &json!({})).await;
    assert_eq!(flushed.status.as_u16(), 200, "{}", flushed.text());
    let r = post_json(&h.url("/v1/chat/completions"), &chat("third")).await;
    assert_eq!(r.status.as_u16(), 200);
    assert!(
        r.json()["usage"]["prompt_tokens_details"].is_null(),
        "{}",
        r.text()
    );
    let d = get(&h.url("/admin/decisions?limit=1")).await.json();
    let third = d["decisions"][0]["predicted_cached_tokens"]
        .as_f64()
        .unwrap_or(0.0);
    assert!(third > 0.0, "{d}");
    let (p, rep, no) = cached_counts(&h, 3).await;
    assert_eq!((p - predicted, rep - reported), (third, 0.0));
    assert!(no >= Some(1.0), "{no:?}");
}

/// The metric names the dashboard's queries use.
fn dashboard_metrics() -> Vec<String> {
    let dash: serde_json::Value =
        serde_json::from_str(include_str!("../../deploy/grafana/kvgate.json")).expect("JSON");
    let mut names = Vec::new();
    for panel in dash["panels"].as_array().into_iter().flatten() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_default();
            let mut rest = expr;
            while let Some(at) = rest.find(|c: char| c.is_ascii_lowercase()) {
                rest = &rest[at..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit()))
                    .unwrap_or(rest.len());
                let word = &rest[..end];
                if word.starts_with("kvgate_") || word.starts_with("process_") {
                    names.push(word.to_owned());
                }
                rest = &rest[end..];
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

#[actix_rt::test]
async fn every_metric_the_grafana_dashboard_queries_is_emitted() {
    let sim = SimConfig {
        enable_cache_report: true,
        ..SimConfig::default()
    };
    let h = Harness::start(2, sim, |_| {});
    h.wait_for_load_reports().await;
    for stream in [false, true] {
        let body = json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "stream": stream});
        let r = post_json(&h.url("/v1/chat/completions"), &body).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    let names = dashboard_metrics();
    assert!(names.len() >= 15, "{names:?}");
    let text = get(&h.url("/metrics")).await.text();
    for name in &names {
        let emitted = text.lines().any(|l| {
            l.strip_prefix(name.as_str())
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        });
        assert!(
            emitted,
            "the dashboard queries {name}, which /metrics does not emit"
        );
    }
}

#[actix_rt::test]
async fn index_units_are_kept_apart_by_their_unit() {
    let h = Harness::start(1, SimConfig::default(), |_| {});
    // Text (a chat: the text tree, bytes) and token ids (the token tree, tokens).
    let chat = json!({"messages": [{"role": "user", "content": "a text prompt ".repeat(20)}], "max_tokens": 1});
    assert_eq!(
        post_json(&h.url("/v1/chat/completions"), &chat)
            .await
            .status
            .as_u16(),
        200
    );
    let ids: Vec<u32> = (1000..1096).collect();
    let token_req = json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}});
    assert_eq!(
        post_json(&h.url("/generate"), &token_req)
            .await
            .status
            .as_u16(),
        200
    );
    let s = scrape(&h.url("/metrics")).await;
    let unit = |u: &str| {
        s.samples
            .iter()
            .filter(|x| x.metric == "kvgate_index_units")
            .filter(|x| x.labels.get("unit").is_some_and(|v| v == u))
            .filter_map(|x| match x.value {
                Value::Gauge(v) | Value::Untyped(v) => Some(v),
                _ => None,
            })
            .sum::<f64>()
    };
    assert!(unit("bytes") >= 280.0, "{}", unit("bytes"));
    assert_eq!(unit("tokens"), 96.0);
}
