//! `kvgate-bench inflight`: the gateway's resident memory per request in flight, for large
//! prompts. The engine holds every request for a while, so all of them sit in the gateway
//! at once; RSS is read from `/proc` before and while they do.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kvgate_bench::{RawClient, socket_addr};
use kvgate_engine_sim::{Fault, SimConfig, SimFleet};
use kvgate_policies::PolicyKind;
use serde::Serialize;

use super::child::{ChildServer, rss_kib};
use super::proxy::BodySpec;

#[derive(Debug, Clone)]
pub(crate) struct InflightSettings {
    pub kvgate_bin: PathBuf,
    pub policy: PolicyKind,
    pub kib: usize,
    pub requests: usize,
    /// How long the engine holds each request before it answers.
    pub hold: Duration,
    pub rounds: usize,
    pub out: PathBuf,
}

/// One round: `requests` sent at once, all held by the engine.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Round {
    pub rss_idle_kib: u64,
    pub rss_in_flight_kib: u64,
    pub rss_after_kib: u64,
    /// (in flight − idle) / requests, in KiB.
    pub per_request_kib: f64,
    /// `per_request_kib` over the body's size.
    pub per_request_bodies: f64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct InflightReport {
    pub policy: String,
    pub body_bytes: usize,
    pub requests: usize,
    pub rss_start_kib: u64,
    pub rounds: Vec<Round>,
}

/// Runs the rounds against a release kvgate in front of one simulated engine.
pub(crate) fn run(s: &InflightSettings) -> anyhow::Result<InflightReport> {
    let sim = SimConfig {
        fixed_response: true,
        max_running_requests: s.requests.max(1) * 2,
        ..SimConfig::default()
    };
    let fleet = SimFleet::start(1, sim).context("starting the engine")?;
    let data = tempfile::tempdir()?;
    std::fs::create_dir_all(&s.out)?;
    let policy = s.policy.to_string();
    let limit = (s.kib * 1024 + (1 << 20)).to_string();
    let gw = ChildServer::kvgate(
        &s.kvgate_bin,
        &fleet.urls(),
        data.path(),
        &["--policy", &policy, "--max-payload-size", &limit],
        &s.out.join("inflight-kvgate.log"),
    )?;
    let pid = gw.pid();
    let addr = socket_addr(gw.url()).context("gateway address")?;
    let rss = || rss_kib(pid).context("reading the gateway's RSS");
    let rss_start_kib = rss()?;
    let spec = BodySpec {
        kib: Some(s.kib),
        unique: true,
    };
    let body_bytes = spec.len();
    let engine = fleet.engine(0);
    let mut rounds = Vec::new();
    let mut sent = 0u64;
    for round in 0..s.rounds {
        // A few sequential requests first, so the round starts from warm allocators.
        let mut c = RawClient::connect(addr, Duration::from_secs(10))?;
        for _ in 0..4 {
            sent += 1;
            let r = c.request(
                "POST",
                "/v1/chat/completions",
                spec.make('a', sent).as_bytes(),
            )?;
            if r.status != 200 {
                bail!("warm-up answered {}", r.status);
            }
        }
        drop(c);
        std::thread::sleep(Duration::from_millis(300));
        let rss_idle_kib = rss()?;
        engine.set_fault(Fault::Latency(s.hold));
        let before = engine.stats().http_requests;
        let senders: Vec<_> = (0..s.requests)
            .map(|i| {
                let body = spec.make('b', (round * s.requests + i) as u64);
                std::thread::spawn(move || -> anyhow::Result<u16> {
                    let mut c = RawClient::connect(addr, Duration::from_secs(60))?;
                    Ok(c.request("POST", "/v1/chat/completions", body.as_bytes())?
                        .status)
                })
            })
            .collect();
        let deadline = Instant::now() + s.hold;
        while engine.stats().http_requests < before + s.requests as u64 {
            if Instant::now() >= deadline {
                bail!("not every request reached the engine within the hold");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let rss_in_flight_kib = rss()?;
        engine.set_fault(Fault::None);
        for t in senders {
            let status = t.join().map_err(|_| anyhow::anyhow!("sender panicked"))??;
            if status != 200 {
                bail!("a held request answered {status}");
            }
        }
        let rss_after_kib = rss()?;
        let per_request_kib =
            rss_in_flight_kib.saturating_sub(rss_idle_kib) as f64 / s.requests.max(1) as f64;
        rounds.push(Round {
            rss_idle_kib,
            rss_in_flight_kib,
            rss_after_kib,
            per_request_kib,
            per_request_bodies: per_request_kib * 1024.0 / body_bytes as f64,
        });
    }
    fleet.stop();
    let report = InflightReport {
        policy: s.policy.to_string(),
        body_bytes,
        requests: s.requests,
        rss_start_kib,
        rounds,
    };
    std::fs::write(
        s.out.join("inflight.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    Ok(report)
}
