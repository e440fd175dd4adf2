//! `kvgate-bench polls`: a release `kvgate` in front of many engines on loopback, each a
//! minimal SGLang-shaped HTTP server that records when every request arrives. What comes
//! out is the poller's traffic as the engines see it: `/v1/loads` per engine per interval,
//! and the most polls any window of the interval takes (a synchronised poller puts the
//! whole fleet in one window).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::run::child::ChildServer;

#[derive(Debug, Clone)]
pub(crate) struct PollSettings {
    pub kvgate_bin: PathBuf,
    pub engines: usize,
    pub interval: Duration,
    /// Measured after the first `warmup`: startup's probes and first polls are left out.
    pub warmup: Duration,
    pub duration: Duration,
    pub window: Duration,
    pub out: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct PollReport {
    pub engines: usize,
    pub interval_ms: u64,
    pub measured_ms: u64,
    pub window_ms: u64,
    /// Requests to the engines in the measured span, by path.
    pub by_path: BTreeMap<String, usize>,
    /// `/v1/loads` per engine per interval over the span.
    pub loads_per_engine_per_interval: f64,
    pub loads_per_second: f64,
    /// Fewest and most `/v1/loads` one engine got in the span.
    pub loads_per_engine_min: usize,
    pub loads_per_engine_max: usize,
    /// The most `/v1/loads` in any sliding window of `window_ms`, and what an even spread
    /// gives (engines × window ÷ interval).
    pub max_in_window: usize,
    pub even_in_window: f64,
    /// Gaps between one engine's successive polls, ms: least and most over the fleet.
    pub gap_min_ms: f64,
    pub gap_max_ms: f64,
}

/// (engine, path, arrival since the run's start)
type Log = Arc<Mutex<Vec<(usize, String, Duration)>>>;

/// Answers what the registry's probe, the health check and the poller ask.
fn answer(path: &str) -> (u16, &'static str) {
    match path {
        "/v1/models" => (
            200,
            r#"{"object":"list","data":[{"id":"fleet-model","object":"model","owned_by":"sglang"}]}"#,
        ),
        "/server_info" => (200, r#"{"dp_size":1,"page_size":1,"startup_time":1.0}"#),
        "/v1/loads" => (
            200,
            r#"{"loads":[{"dp_rank":0,"num_running_reqs":0,"num_waiting_reqs":0,"token_usage":0.0,"max_running_requests":16}]}"#,
        ),
        "/health" | "/health_generate" | "/ready" => (200, "{}"),
        _ => (404, r#"{"error":"not found"}"#),
    }
}

/// One keep-alive connection: each request head recorded, answered, its body skipped.
async fn serve(mut s: tokio::net::TcpStream, engine: usize, log: Log, epoch: Instant) {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let path = head.split_whitespace().nth(1).unwrap_or("/");
        let path = path.split('?').next().unwrap_or(path).to_owned();
        let body_len: usize = (head.lines())
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0);
        if let Ok(mut l) = log.lock() {
            l.push((engine, path.clone(), epoch.elapsed()));
        }
        while buf.len() < end + 4 + body_len {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..end + 4 + body_len);
        let (status, body) = answer(&path);
        let reason = if status == 200 { "OK" } else { "Not Found" };
        let resp = format!(
            "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// The recording engines, on their own thread; dropped, they stop.
struct Engines {
    urls: Vec<String>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Engines {
    fn start(n: usize, log: Log, epoch: Instant) -> anyhow::Result<Engines> {
        let mut listeners = Vec::with_capacity(n);
        for _ in 0..n {
            let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding an engine")?;
            l.set_nonblocking(true)?;
            listeners.push(l);
        }
        let urls = (listeners.iter())
            .map(|l| Ok(format!("http://{}", l.local_addr()?)))
            .collect::<std::io::Result<Vec<_>>>()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::spawn(move || {
            rt.block_on(async move {
                // Owned sets: dropped at the stop, every engine and connection ends with them.
                let mut engines = tokio::task::JoinSet::new();
                for (engine, l) in listeners.into_iter().enumerate() {
                    let Ok(l) = tokio::net::TcpListener::from_std(l) else {
                        continue;
                    };
                    let log = log.clone();
                    engines.spawn(async move {
                        let mut conns = tokio::task::JoinSet::new();
                        while let Ok((s, _)) = l.accept().await {
                            let _ = s.set_nodelay(true);
                            conns.spawn(serve(s, engine, log.clone(), epoch));
                            while conns.try_join_next().is_some() {}
                        }
                    });
                }
                let _ = stopped.await;
            });
        });
        Ok(Engines {
            urls,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Engines {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The most of `times` (sorted) inside any span of `window`.
fn max_in_window(times: &[Duration], window: Duration) -> usize {
    let (mut best, mut lo) = (0, 0);
    for hi in 0..times.len() {
        while times[hi] - times[lo] >= window {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

pub(crate) fn run(s: &PollSettings) -> anyhow::Result<PollReport> {
    let epoch = Instant::now();
    let log: Log = Arc::default();
    let engines = Engines::start(s.engines, log.clone(), epoch)?;
    std::fs::create_dir_all(&s.out)?;
    let data = tempfile::tempdir()?;
    let interval = format!("{}", s.interval.as_secs_f64());
    let gw = ChildServer::kvgate(
        &s.kvgate_bin,
        &engines.urls,
        data.path(),
        &["--load-monitor-interval", &interval],
        &s.out.join("polls-kvgate.log"),
    )?;
    let from = epoch.elapsed() + s.warmup;
    let to = from + s.duration;
    std::thread::sleep(to.saturating_sub(epoch.elapsed()));
    drop(gw);
    drop(engines);
    let log = log
        .lock()
        .map_err(|_| anyhow::anyhow!("a recording engine panicked"))?
        .clone();
    let span: Vec<&(usize, String, Duration)> = log
        .iter()
        .filter(|(_, _, t)| *t >= from && *t < to)
        .collect();
    let mut by_path = BTreeMap::new();
    for (_, p, _) in &span {
        *by_path.entry(p.clone()).or_insert(0) += 1;
    }
    let mut per_engine: Vec<Vec<Duration>> = vec![Vec::new(); s.engines];
    for (e, _, t) in span.iter().filter(|(_, p, _)| p == "/v1/loads") {
        per_engine[*e].push(*t);
    }
    let mut times: Vec<Duration> = per_engine.iter().flatten().copied().collect();
    times.sort_unstable();
    let gaps: Vec<f64> = (per_engine.iter())
        .flat_map(|ts| ts.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3))
        .collect();
    let intervals = s.duration.as_secs_f64() / s.interval.as_secs_f64();
    Ok(PollReport {
        engines: s.engines,
        interval_ms: s.interval.as_millis() as u64,
        measured_ms: s.duration.as_millis() as u64,
        window_ms: s.window.as_millis() as u64,
        by_path,
        loads_per_engine_per_interval: times.len() as f64 / s.engines.max(1) as f64 / intervals,
        loads_per_second: times.len() as f64 / s.duration.as_secs_f64(),
        loads_per_engine_min: per_engine.iter().map(Vec::len).min().unwrap_or(0),
        loads_per_engine_max: per_engine.iter().map(Vec::len).max().unwrap_or(0),
        max_in_window: max_in_window(&times, s.window),
        even_in_window: s.engines as f64 * s.window.as_secs_f64() / s.interval.as_secs_f64(),
        gap_min_ms: gaps.iter().copied().fold(f64::INFINITY, f64::min),
        gap_max_ms: gaps.iter().copied().fold(0.0, f64::max),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_count_is_the_densest_span() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&x| Duration::from_millis(x))
                .collect::<Vec<_>>()
        };
        let w = Duration::from_millis(100);
        assert_eq!(max_in_window(&ms(&[0, 50, 99, 100, 150, 199, 200]), w), 3);
        assert_eq!(max_in_window(&ms(&[0, 500, 1000]), w), 1);
        assert_eq!(max_in_window(&[], w), 0);
    }
}
