//! The saturation load: every target loaded by wrk (or a built-in closed loop) in turns,
//! the targets' order reversed every turn, with the target's CPU time counted across it.

use std::io::Write as _;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kvgate_bench::{RawClient, Summary, WrkReport, parse_wrk, socket_addr};

use super::body::{BodySpec, Sender};
use super::{PATH, ProxySettings, Up};
use crate::run::child::{cpu_ns, rss_kib};

/// One target's saturation load, summed over its rounds.
#[derive(Default)]
pub(super) struct Load {
    pub tool: String,
    pub requests: u64,
    pub secs: f64,
    pub errors: u64,
    pub p50s: Vec<f64>,
    pub p99s: Vec<f64>,
    pub cpu_ns: Option<u64>,
    pub rss_before_kib: Option<u64>,
}

/// Saturates every target for `s.duration` in all, in `s.rounds` turns: forward, then
/// backward, and so on. One 10-second turn each, in a fixed order, made a comparison of
/// two targets one sample of the machine's drift (+-5 % and more between two copies of one
/// binary on 2 shared cores).
pub(super) fn saturate_in_rounds(
    ups: &[Up],
    s: &ProxySettings,
    wrk: Option<&Path>,
    script: &Path,
) -> anyhow::Result<Vec<Load>> {
    let rounds = s.rounds.max(1);
    for up in ups {
        let _ = std::fs::remove_file(s.out.join(format!("wrk-{}.txt", up.name)));
    }
    let turn = Duration::from_secs((s.duration.as_secs() / rounds as u64).max(1));
    let mut loads: Vec<Load> = ups
        .iter()
        .map(|up| Load {
            rss_before_kib: up.pid.and_then(rss_kib),
            cpu_ns: up.pid.map(|_| 0),
            ..Load::default()
        })
        .collect();
    for round in 0..rounds {
        for i in turn_order(ups.len(), round) {
            let up = &ups[i];
            eprintln!(
                "proxy: saturating {} at {} ({}/{rounds})",
                up.name,
                up.url,
                round + 1
            );
            let cpu_before = up.pid.and_then(cpu_ns);
            let (tool, report) = saturate(up, s, turn, wrk, script)?;
            let cpu_after = up.pid.and_then(cpu_ns);
            let l = &mut loads[i];
            l.tool = tool;
            l.requests += report.requests;
            if report.requests_per_sec > 0.0 {
                l.secs += report.requests as f64 / report.requests_per_sec;
            }
            l.errors += report.non_2xx + report.socket_errors;
            l.p50s.extend(report.latency_p50_ms);
            l.p99s.extend(report.latency_p99_ms);
            l.cpu_ns = match (l.cpu_ns, cpu_before, cpu_after) {
                (Some(sum), Some(a), Some(b)) => Some(sum + b.saturating_sub(a)),
                _ => None,
            };
        }
    }
    Ok(loads)
}

/// The targets' order in turn `round`: forward, then backward, and so on.
fn turn_order(targets: usize, round: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..targets).collect();
    if round % 2 == 1 {
        order.reverse();
    }
    order
}

/// The median of the rounds' figures (a percentile of a whole load is not the sum of its
/// parts').
pub(super) fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

fn saturate(
    up: &Up,
    s: &ProxySettings,
    d: Duration,
    wrk: Option<&Path>,
    script: &Path,
) -> anyhow::Result<(String, WrkReport)> {
    match wrk {
        Some(bin) => {
            let out = Command::new(bin)
                .args([
                    "-t1",
                    &format!("-c{}", s.connections),
                    &format!("-d{}s", d.as_secs().max(1)),
                ])
                .args(["--latency", "-s"])
                .arg(script)
                .arg(format!("{}{PATH}", up.url))
                .output()
                .context("running wrk")?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            // Every round's output, one after another.
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(s.out.join(format!("wrk-{}.txt", up.name)))?
                .write_all(text.as_bytes())?;
            let report =
                parse_wrk(&text).with_context(|| format!("{}: wrk said: {text}", up.name))?;
            Ok((
                format!(
                    "wrk -t1 -c{} -d{}s --latency, {} rounds",
                    s.connections,
                    d.as_secs(),
                    s.rounds.max(1)
                ),
                report,
            ))
        }
        None => Ok((
            format!("built-in closed loop, {} rounds", s.rounds.max(1)),
            closed_loop(&up.url, s.connections, d, &s.body)?,
        )),
    }
}

/// `connections` threads, each a keep-alive connection sending back to back for `d`.
fn closed_loop(
    url: &str,
    connections: usize,
    d: Duration,
    body: &BodySpec,
) -> anyhow::Result<WrkReport> {
    let addr = socket_addr(url).context("target URL has no socket address")?;
    let stop = Arc::new(AtomicBool::new(false));
    let begun = Instant::now();
    let workers: Vec<_> = (0..connections.max(1))
        .map(|i| {
            let stop = Arc::clone(&stop);
            let body = body.clone();
            // Lanes 'A'.. and 'a'..: unique bodies of two threads never coincide.
            let lane = char::from(if i < 26 {
                b'A' + i as u8
            } else {
                b'a' + (i % 26) as u8
            });
            std::thread::spawn(move || {
                let mut sender = Sender::new(&body, lane);
                let mut lat = Vec::new();
                let mut errors = 0u64;
                let Ok(mut c) = RawClient::connect(addr, Duration::from_secs(5)) else {
                    return (lat, 1);
                };
                while !stop.load(Ordering::Relaxed) {
                    let body = sender.next();
                    let t = Instant::now();
                    match c.request("POST", PATH, body.as_bytes()) {
                        Ok(r) if r.status == 200 => lat.push(t.elapsed().as_secs_f64() * 1e3),
                        Ok(_) => errors += 1,
                        Err(_) => {
                            errors += 1;
                            match RawClient::connect(addr, Duration::from_secs(5)) {
                                Ok(n) => c = n,
                                Err(_) => break,
                            }
                        }
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    std::thread::sleep(d);
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut errors = 0;
    for w in workers {
        if let Ok((lat, e)) = w.join() {
            all.extend(lat);
            errors += e;
        }
    }
    let wall = begun.elapsed().as_secs_f64();
    let sum = Summary::of(&all);
    Ok(WrkReport {
        requests_per_sec: all.len() as f64 / wall,
        requests: all.len() as u64,
        latency_avg_ms: Some(sum.mean),
        latency_p50_ms: Some(sum.p50),
        latency_p99_ms: Some(sum.p99),
        non_2xx: 0,
        socket_errors: errors,
    })
}

#[cfg(test)]
mod tests {
    use super::{median, turn_order};

    #[test]
    fn turns_alternate_the_targets_order_and_figures_take_the_median() {
        assert_eq!(turn_order(3, 0), vec![0, 1, 2]);
        assert_eq!(turn_order(3, 1), vec![2, 1, 0]);
        assert_eq!(turn_order(3, 4), vec![0, 1, 2]);
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }
}
