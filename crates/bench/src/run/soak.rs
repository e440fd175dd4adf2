//! `kvgate-bench soak`: a long run of mixed traffic through the release `kvgate` in front of
//! simulated engines, with one engine killed and started again every period and one
//! streaming client in ten hanging up mid-stream. It counts what was lost and watches the
//! gateway's memory and in-flight counts.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures_util::StreamExt;
use kvgate_engine_sim::{SimConfig, SimFleet};
use serde::Serialize;

use super::child::{ChildServer, rss_kib};

#[derive(Debug, Clone)]
pub(crate) struct SoakSettings {
    pub duration: Duration,
    pub rate: f64,
    pub engines: usize,
    pub restart_every: Duration,
    /// Unique bytes in each user message.
    pub prompt_bytes: usize,
    /// Passed to `kvgate` after the soak's own flags.
    pub kvgate_args: Vec<String>,
    pub kvgate_bin: PathBuf,
    pub out: PathBuf,
}

/// What the run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct SoakReport {
    pub seconds: f64,
    pub sent: u64,
    pub ok: u64,
    /// Non-streaming requests that did not get a 200 with a body.
    pub failed_plain: u64,
    /// Streamed requests that failed before their first byte (status or connection).
    pub failed_streams_not_started: u64,
    /// Streamed requests cut after their first byte (the client sees an error event).
    pub broken_streams_started: u64,
    /// Clients that hung up mid-stream on purpose.
    pub hung_up: u64,
    pub engine_restarts: u64,
    pub rss_start_kib: u64,
    pub rss_end_kib: u64,
    /// The gateway's RSS once a minute, to tell a leak from the index filling up.
    pub rss_every_minute_kib: Vec<u64>,
    /// Units the prefix index held at the end (it grows with every new prompt up to
    /// `--max-tree-size`).
    pub index_units_end: u64,
    /// Summed over workers at the end, once the traffic is over.
    pub in_flight_end: u64,
    /// Every failure by what the client saw (`status 503`, `connect: …`, `body: …`), so a
    /// loss in the gateway can be told from one in the load's own client.
    pub failures: BTreeMap<String, u64>,
    /// Failures counted by the minute their request was sent in.
    pub failed_every_minute: Vec<u64>,
}

impl SoakReport {
    fn fail(&mut self, minute: usize, what: String) {
        *self.failures.entry(what).or_default() += 1;
        if self.failed_every_minute.len() <= minute {
            self.failed_every_minute.resize(minute + 1, 0);
        }
        self.failed_every_minute[minute] += 1;
    }
}

enum Kind {
    Plain,
    Stream,
    HangUp,
}

/// A user message of about `bytes` bytes that no other request shares: words drawn from the
/// request number, so the index sees new text as a chat's new turns bring it.
fn question(i: u64, bytes: usize) -> String {
    let mut s = format!("question {i}");
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while s.len() < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(&format!(" w{}", x % 100_000));
    }
    s
}

async fn one(
    client: &awc::Client,
    url: &str,
    (i, prompt_bytes, minute): (u64, usize, usize),
    kind: Kind,
    r: &RefCell<SoakReport>,
) {
    let stream = !matches!(kind, Kind::Plain);
    let body = serde_json::json!({
        "messages": [
            {"role": "system", "content": format!("Conversation group {}. Be brief.", i % 32)},
            {"role": "user", "content": question(i, prompt_bytes)}
        ],
        "max_tokens": 8,
        "stream": stream,
    });
    let resp = client.post(url).send_json(&body).await;
    let mut resp = match resp {
        Ok(resp) if resp.status().as_u16() == 200 => resp,
        other => {
            let mut r = r.borrow_mut();
            r.fail(
                minute,
                match other {
                    Ok(resp) => format!("status {}", resp.status().as_u16()),
                    Err(e) => format!("send: {e}"),
                },
            );
            if stream {
                r.failed_streams_not_started += 1;
            } else {
                r.failed_plain += 1;
            }
            return;
        }
    };
    match kind {
        Kind::Plain => {
            let body = resp.body().limit(1 << 20).await;
            let mut r = r.borrow_mut();
            match body {
                Ok(b) if !b.is_empty() => r.ok += 1,
                Ok(_) => {
                    r.fail(minute, "empty body".to_owned());
                    r.failed_plain += 1;
                }
                Err(e) => {
                    r.fail(minute, format!("body: {e}"));
                    r.failed_plain += 1;
                }
            }
        }
        Kind::HangUp => {
            let _ = resp.next().await;
            r.borrow_mut().hung_up += 1;
        }
        Kind::Stream => {
            let mut seen = Vec::new();
            let mut first = true;
            while let Some(chunk) = resp.next().await {
                match chunk {
                    Ok(c) => seen.extend_from_slice(&c),
                    Err(_) => break,
                }
                first = false;
            }
            let text = String::from_utf8_lossy(&seen);
            let mut r = r.borrow_mut();
            if text.trim_end().ends_with("data: [DONE]") {
                r.ok += 1;
            } else if first {
                r.fail(minute, "stream: no first byte".to_owned());
                r.failed_streams_not_started += 1;
            } else {
                r.fail(minute, "stream: cut".to_owned());
                r.broken_streams_started += 1;
            }
        }
    }
}

/// The gateway under soak: probes every second, so a killed engine is seen at once.
fn start_gateway(
    s: &SoakSettings,
    workers: &[String],
    data: &std::path::Path,
) -> anyhow::Result<ChildServer> {
    let args: Vec<&str> = [
        "--health-check-interval-secs",
        "1",
        "--health-check-timeout-secs",
        "1",
    ]
    .into_iter()
    .chain(s.kvgate_args.iter().map(String::as_str))
    .collect();
    ChildServer::kvgate(
        &s.kvgate_bin,
        workers,
        data,
        &args,
        &s.out.join("soak-kvgate.log"),
    )
}

/// Runs the soak and writes `soak.json` into the output directory.
pub(crate) fn run(s: &SoakSettings) -> anyhow::Result<SoakReport> {
    if !s.kvgate_bin.is_file() {
        bail!("{} is not a kvgate binary", s.kvgate_bin.display());
    }
    let sim = SimConfig {
        max_running_requests: 32,
        ..SimConfig::default()
    };
    let mut fleet = SimFleet::start(s.engines, sim).context("starting engines")?;
    let data = tempfile::tempdir()?;
    std::fs::create_dir_all(&s.out)?;
    let gw = start_gateway(s, &fleet.urls(), data.path())?;
    let url = format!("{}/v1/chat/completions", gw.url());
    let workers_url = format!("{}/workers", gw.url());
    let index_url = format!("{}/admin/index", gw.url());
    let pid = gw.pid();
    let report = Rc::new(RefCell::new(SoakReport::default()));
    let started = Instant::now();
    actix_rt::System::new().block_on({
        let report = report.clone();
        let s = s.clone();
        async move {
            let client = awc::Client::builder()
                .timeout(Duration::from_secs(120))
                .finish();
            let mut tick = actix_rt::time::interval(Duration::from_secs_f64(1.0 / s.rate));
            let mut next_restart = Instant::now() + s.restart_every;
            let mut next_sample = Instant::now() + Duration::from_secs(60);
            let mut victim = 0;
            let mut i: u64 = 0;
            let mut tasks = Vec::new();
            while started.elapsed() < s.duration {
                tick.tick().await;
                if i == 50 {
                    report.borrow_mut().rss_start_kib = rss_kib(pid).unwrap_or(0);
                }
                if Instant::now() >= next_sample {
                    next_sample += Duration::from_secs(60);
                    report
                        .borrow_mut()
                        .rss_every_minute_kib
                        .push(rss_kib(pid).unwrap_or(0));
                }
                if Instant::now() >= next_restart {
                    next_restart += s.restart_every;
                    fleet.handle(victim).kill().await;
                    // The process is down for a moment before its supervisor restarts it.
                    actix_rt::time::sleep(Duration::from_secs(2)).await;
                    if fleet.revive(victim).is_ok() {
                        report.borrow_mut().engine_restarts += 1;
                    }
                    victim = (victim + 1) % s.engines;
                }
                let kind = match i % 20 {
                    0 => Kind::HangUp,
                    n if n % 2 == 1 => Kind::Stream,
                    _ => Kind::Plain,
                };
                i += 1;
                report.borrow_mut().sent += 1;
                let (client, url, report) = (client.clone(), url.clone(), report.clone());
                let prompt_bytes = s.prompt_bytes;
                let minute = (started.elapsed().as_secs() / 60) as usize;
                #[expect(
                    clippy::disallowed_methods,
                    reason = "the load's clients are joined before the soak reports"
                )]
                let task = actix_rt::spawn(async move {
                    one(&client, &url, (i, prompt_bytes, minute), kind, &report).await;
                });
                tasks.push(task);
                tasks.retain(|t| !t.is_finished());
            }
            for t in tasks {
                let _ = t.await;
            }
            // Releases travel by message: give them a moment before reading the counts.
            actix_rt::time::sleep(Duration::from_millis(500)).await;
            let mut in_flight = 0;
            // awc reads at most 64 KiB of JSON by default; a long run's answers are larger.
            const ANSWER_LIMIT: usize = 64 << 20;
            if let Ok(mut resp) = client.get(&workers_url).send().await
                && let Ok(v) = resp.json::<serde_json::Value>().limit(ANSWER_LIMIT).await
            {
                in_flight = v["workers"]
                    .as_array()
                    .map(|ws| ws.iter().filter_map(|w| w["in_flight"].as_u64()).sum())
                    .unwrap_or(0);
            }
            let mut units = 0;
            if let Ok(mut resp) = client.get(&index_url).send().await
                && let Ok(v) = resp.json::<serde_json::Value>().limit(ANSWER_LIMIT).await
            {
                // Text and token trees alike (a tokenizer turns chats into token prompts).
                let of = |m: &serde_json::Value| {
                    m["text_units"].as_u64().unwrap_or(0) + m["token_units"].as_u64().unwrap_or(0)
                };
                units = v["models"]
                    .as_array()
                    .map(|ms| ms.iter().map(of).sum())
                    .unwrap_or(0);
            }
            let mut r = report.borrow_mut();
            r.index_units_end = units;
            r.rss_end_kib = rss_kib(pid).unwrap_or(0);
            r.seconds = started.elapsed().as_secs_f64();
            r.in_flight_end = in_flight;
        }
    });
    drop(gw);
    let out = report.borrow().clone();
    std::fs::write(s.out.join("soak.json"), serde_json::to_string_pretty(&out)?)?;
    Ok(out)
}
