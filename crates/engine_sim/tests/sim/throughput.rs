//! The `gen_throughput` gauge over HTTP: windows of decode batches over wall time, kept while
//! idle, zeroed by a prefill once stale, advanced by health probes. Assertions use bounds
//! that hold however slowly the machine runs; each gap is waited for from an instant the
//! window provably began before.

use std::time::{Duration, Instant};

use kvgate_engine_sim::{SimConfig, SimFleet};
use serde_json::json;

use crate::support::{fast, get, get_json, one, post_json, wait_past};

async fn gauge(url: &str) -> f64 {
    get_json(&format!("{url}/v1/loads")).await["loads"][0]["gen_throughput"]
        .as_f64()
        .unwrap()
}

/// A request whose `n` tokens take `n - 1` decode batches (the first comes from prefill).
async fn generate(url: &str, n: u64) {
    let body = json!({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": n}});
    post_json(&format!("{url}/generate"), &body).await;
}

fn windows_of_four() -> SimConfig {
    SimConfig {
        decode_log_interval: 4,
        ..fast()
    }
}

#[actix_rt::test]
async fn a_window_closes_after_its_decode_batches_at_tokens_over_wall_time() {
    let started = Instant::now();
    let (_fleet, url) = one(windows_of_four());
    generate(&url, 4).await; // three decode batches
    assert_eq!(gauge(&url).await, 0.0, "the window is still open");
    let open = Instant::now(); // the window began before this, at rank start
    let idle = Duration::from_millis(300);
    wait_past(open + idle).await;
    generate(&url, 2).await; // the fourth
    let rate = gauge(&url).await;
    let window = started.elapsed();
    // Four tokens over a window that began at rank start and spans the idle gap.
    assert!(
        rate >= 4.0 / window.as_secs_f64(),
        "{rate} over at most {window:?}"
    );
    assert!(
        rate <= 4.0 / idle.as_secs_f64(),
        "{rate}: the idle gap is inside the window"
    );
}

#[actix_rt::test]
async fn idle_time_inside_a_window_reads_lower_and_an_idle_rank_keeps_its_value() {
    let (_fleet, url) = one(windows_of_four());
    // Eight decode batches: the second window is busy from end to end.
    let sent = Instant::now();
    generate(&url, 9).await;
    let busy = gauge(&url).await;
    // The second window lies inside this, and the third began before its end.
    let busy_for = sent.elapsed();
    assert!(
        busy >= 4.0 / busy_for.as_secs_f64(),
        "{busy} over {busy_for:?}"
    );
    // Longer than the busy window took, however slowly it ran, so the idle one reads lower.
    let idle = Duration::from_millis(500).max(busy_for * 2);
    wait_past(sent + busy_for + idle).await;
    assert_eq!(
        gauge(&url).await,
        busy,
        "not cleared when the rank goes idle"
    );
    generate(&url, 5).await; // a window holding the idle gap
    let stretched = gauge(&url).await;
    assert!(stretched <= 4.0 / idle.as_secs_f64(), "{stretched}");
    assert!(stretched < busy, "{stretched} vs {busy}");
}

#[actix_rt::test]
async fn a_prefill_zeroes_the_gauge_once_it_is_stale() {
    let staleness = Duration::from_millis(200);
    let (_fleet, url) = one(SimConfig {
        gen_throughput_staleness: staleness,
        initial_gen_throughput: 800.0,
        ..windows_of_four()
    });
    let up = Instant::now(); // the rank's first window began before this
    assert_eq!(gauge(&url).await, 800.0);
    wait_past(up + staleness).await;
    assert_eq!(gauge(&url).await, 800.0, "idling alone zeroes nothing");
    generate(&url, 1).await; // a prefill, no decode batch
    assert_eq!(gauge(&url).await, 0.0);

    // A fresh window is not stale: a prefill right after it keeps the value.
    let (_fleet, url) = one(SimConfig {
        gen_throughput_staleness: Duration::from_secs(30),
        ..windows_of_four()
    });
    generate(&url, 5).await;
    let rate = gauge(&url).await;
    assert!(rate > 0.0);
    generate(&url, 1).await;
    assert_eq!(gauge(&url).await, rate);
}

#[actix_rt::test]
async fn initial_values_differ_per_engine_and_a_restart_starts_at_zero() {
    let cfg = |initial| SimConfig {
        initial_gen_throughput: initial,
        ..fast()
    };
    let fleet =
        SimFleet::start_each("127.0.0.1", 0, vec![cfg(0.35), cfg(800.0), cfg(0.0)]).unwrap();
    let urls = fleet.urls();
    let mut read = Vec::new();
    for url in &urls {
        read.push(gauge(url).await);
    }
    assert_eq!(read, vec![0.35, 800.0, 0.0]);
    post_json(&format!("{}/sim/restart", urls[1]), &json!({})).await;
    assert_eq!(gauge(&urls[1]).await, 0.0);
    assert_eq!(gauge(&urls[0]).await, 0.35);
}

#[actix_rt::test]
async fn health_probes_advance_the_window_and_leave_a_small_residual() {
    let first = Instant::now(); // before the rank starts, so its window is inside this
    let (fleet, url) = one(windows_of_four());
    let up = Instant::now(); // the rank's window began before this
    let gap = Duration::from_millis(50);
    for i in 0..4 {
        // Probe `i` no earlier than `i` gaps into the window.
        wait_past(up + gap * i).await;
        assert_eq!(gauge(&url).await, 0.0, "window still open before probe {i}");
        assert_eq!(get(&format!("{url}/health_generate")).await.0, 200);
    }
    let spanned = first.elapsed();
    let residual = gauge(&url).await;
    // Four one-token batches over a window at least as long as the three gaps.
    assert!(residual > 0.0);
    assert!(residual <= 4.0 / (3.0 * gap.as_secs_f64()), "{residual}");
    assert!(residual >= 4.0 / spanned.as_secs_f64(), "{residual}");
    let s = fleet.engine(0).stats();
    assert_eq!(
        (s.requests, s.generated_tokens),
        (0, 0),
        "probes are not counted"
    );
}
