//! `kvgate-bench memory`: a release `kvgate`'s resident memory in front of many simulated
//! engines (all in this process), with and without one KV-event subscription per rank.
//! Four gateways in turn, each read once every engine is healthy (and, with events, every
//! worker's events are live) and its memory settled, idle: one engine (the floor), the
//! fleet without data parallelism, the fleet with `dp_size` ranks routed rank by rank,
//! and the same with each rank publishing KV events.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kvgate_bench::{RawClient, socket_addr};
use kvgate_engine_sim::{SimConfig, SimFleet};
use serde::Serialize;

use crate::run::child::{ChildServer, rss_kib};

#[derive(Debug, Clone)]
pub(crate) struct MemorySettings {
    pub kvgate_bin: PathBuf,
    pub engines: usize,
    pub dp_size: usize,
    /// Once ready, the gateway runs this long before its memory is read.
    pub settle: Duration,
    pub out: PathBuf,
}

/// One gateway's setting and its resident memory.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Sample {
    pub engines: usize,
    pub dp_size: usize,
    pub events: bool,
    /// Seconds from start until every worker was ready (and its events live).
    pub ready_secs: f64,
    /// VmRSS read once a second over the last part of the settle time: least and most.
    pub rss_min_kib: u64,
    pub rss_max_kib: u64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct MemoryReport {
    pub samples: Vec<Sample>,
    /// (fleet − one engine) ÷ (engines − 1), no events, KiB.
    pub per_engine_kib: f64,
    /// (fleet with ranks − fleet) ÷ (ranks − engines), no events, KiB.
    pub per_routed_rank_kib: f64,
    /// (with events − without) × 1000 ÷ ranks, MiB: the subscriptions alone.
    pub per_1000_subscribed_ranks_mib: f64,
    /// (with events − one engine) × 1000 ÷ ranks, MiB: everything a rank brings.
    pub per_1000_ranks_all_in_mib: f64,
}

/// Whether every worker `GET /workers` lists is healthy and, with `events`, has live events.
fn all_ready(addr: std::net::SocketAddr, engines: usize, events: bool) -> bool {
    let Ok(r) = RawClient::connect(addr, Duration::from_secs(5))
        .and_then(|mut c| c.request("GET", "/workers", b""))
    else {
        return false;
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&r.body) else {
        return false;
    };
    let workers = v["workers"].as_array().map_or(&[][..], Vec::as_slice);
    let ready =
        |w: &serde_json::Value| w["healthy"] == true && (!events || w["events"]["state"] == "live");
    workers.len() == engines && workers.iter().all(ready)
}

fn sample(
    s: &MemorySettings,
    engines: usize,
    dp_size: usize,
    events: bool,
) -> anyhow::Result<Sample> {
    let sim = SimConfig {
        dp_size,
        fixed_response: true,
        kv_events_port: events.then_some(0),
        ..SimConfig::default()
    };
    let fleet = SimFleet::start(engines, sim).context("starting the engines")?;
    let data = tempfile::tempdir()?;
    let started = Instant::now();
    let log = s
        .out
        .join(format!("memory-kvgate-{engines}x{dp_size}-{events}.log"));
    let gw = ChildServer::kvgate(&s.kvgate_bin, &fleet.urls(), data.path(), &[], &log)?;
    let addr = socket_addr(gw.url()).context("gateway address")?;
    let deadline = started + Duration::from_secs(180);
    while !all_ready(addr, engines, events) {
        if Instant::now() >= deadline {
            bail!("{engines} × {dp_size} (events {events}): not every worker ready in 180 s");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let ready_secs = started.elapsed().as_secs_f64();
    // The last third of the settle time, once a second.
    let reads = (s.settle.as_secs() / 3).max(1);
    std::thread::sleep(s.settle.saturating_sub(Duration::from_secs(reads)));
    let mut rss = Vec::new();
    for _ in 0..reads {
        std::thread::sleep(Duration::from_secs(1));
        rss.push(rss_kib(gw.pid()).context("reading the gateway's RSS")?);
    }
    drop(gw);
    fleet.stop();
    Ok(Sample {
        engines,
        dp_size,
        events,
        ready_secs,
        rss_min_kib: rss.iter().copied().min().unwrap_or(0),
        rss_max_kib: rss.iter().copied().max().unwrap_or(0),
    })
}

pub(crate) fn run(s: &MemorySettings) -> anyhow::Result<MemoryReport> {
    if s.engines < 2 || s.dp_size < 2 {
        bail!("--engines and --dp-size must be at least 2");
    }
    std::fs::create_dir_all(&s.out)?;
    let mut samples = Vec::new();
    for (engines, dp, events) in [
        (1, 1, false),
        (s.engines, 1, false),
        (s.engines, s.dp_size, false),
        (s.engines, s.dp_size, true),
    ] {
        let x = sample(s, engines, dp, events)?;
        eprintln!(
            "{engines} × {dp}, events {events}: RSS {}–{} KiB (ready in {:.1} s)",
            x.rss_min_kib, x.rss_max_kib, x.ready_secs
        );
        samples.push(x);
    }
    // The mean of each gateway's readings.
    let kib = |i: usize| (samples[i].rss_min_kib + samples[i].rss_max_kib) as f64 / 2.0;
    let ranks = (s.engines * s.dp_size) as f64;
    Ok(MemoryReport {
        per_engine_kib: (kib(1) - kib(0)) / (s.engines - 1) as f64,
        per_routed_rank_kib: (kib(2) - kib(1)) / (ranks - s.engines as f64),
        per_1000_subscribed_ranks_mib: (kib(3) - kib(2)) * 1000.0 / ranks / 1024.0,
        per_1000_ranks_all_in_mib: (kib(3) - kib(0)) * 1000.0 / ranks / 1024.0,
        samples,
    })
}
