//! `kvgate-bench proxy`: what one proxy hop adds in front of a fixed-response upstream,
//! measured for every target in one run so ratios share the machine's noise.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kvgate_bench::{RawClient, Summary, WrkReport, parse_wrk, socket_addr};
use kvgate_engine_sim::{SimConfig, SimFleet};
use kvgate_policies::PolicyKind;
use serde::Serialize;

use super::child::{cpu_ns, rss_kib, which};

mod body;
pub mod curve;
mod targets;

pub use body::BodySpec;
use targets::{start_kvgate, start_nginx, start_smg};

const PATH: &str = "/v1/chat/completions";

#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// Saturation load per target, in all.
    pub duration: Duration,
    /// The saturation load comes in this many turns per target, the targets' order reversed
    /// every turn, so a slow stretch of the machine falls on all of them alike.
    pub rounds: usize,
    pub connections: usize,
    pub latency_requests: usize,
    pub warmup: usize,
    pub out: PathBuf,
    /// The release `kvgate` binary to run as a child; `None` runs kvgate in-process.
    pub kvgate_bin: Option<PathBuf>,
    /// Another `kvgate` binary, measured as `kvgate-baseline` beside the first.
    pub baseline_bin: Option<PathBuf>,
    pub use_wrk: bool,
    pub skip_smg: bool,
    pub skip_nginx: bool,
    /// What every request sends.
    pub body: BodySpec,
    /// kvgate's policies, one target each: `kvgate` for round robin, `kvgate-<policy>`
    /// for the others.
    pub policies: Vec<PolicyKind>,
    /// kvgate's `--max-tree-size`, when set.
    pub max_tree_size: Option<u64>,
}

/// One target's figures. Latencies in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct ProxyRow {
    pub target: String,
    pub how: String,
    pub load_tool: String,
    pub req_per_sec: f64,
    pub load_p50_ms: Option<f64>,
    pub load_p99_ms: Option<f64>,
    pub load_errors: u64,
    /// CPU time the target (with its child processes) ran per request of its saturation
    /// load, in microseconds: steadier than req/s on a machine with more busy threads
    /// than cores. Child processes only.
    pub cpu_us_per_req: Option<f64>,
    pub one_conn: Summary,
    /// One-connection p50/p99 minus the direct upstream's.
    pub added_p50_ms: Option<f64>,
    pub added_p99_ms: Option<f64>,
    /// The target's resident memory before and after its saturation run, for the child
    /// processes kvgate-bench started.
    pub rss_before_kib: Option<u64>,
    pub rss_after_kib: Option<u64>,
}

/// A target that is up, with whatever keeps it running.
struct Up {
    name: String,
    how: String,
    url: String,
    pid: Option<u32>,
    _guard: Box<dyn std::any::Any>,
}

/// The target name of kvgate running `policy`.
pub fn kvgate_name(policy: PolicyKind) -> String {
    match policy {
        PolicyKind::RoundRobin => "kvgate".into(),
        p => format!("kvgate-{p}"),
    }
}

/// Runs every available target against one upstream and returns their rows, direct first.
pub fn run(s: &ProxySettings) -> anyhow::Result<Vec<ProxyRow>> {
    let sim = SimConfig {
        fixed_response: true,
        ..SimConfig::default()
    };
    let fleet = SimFleet::start(1, sim).context("starting the upstream")?;
    let upstream = fleet.urls().remove(0);
    let wrk = if s.use_wrk { which("wrk") } else { None };
    if s.use_wrk && wrk.is_none() {
        eprintln!(
            "wrk not found (apt-get install -y wrk): using the built-in closed-loop generator"
        );
    }
    let script = s.out.join("post.lua");
    std::fs::write(&script, s.body.wrk_script()).context("writing post.lua")?;
    let tmp = tempfile::tempdir()?;

    let mut ups = vec![Up {
        name: "direct".into(),
        how: "the simulator itself".into(),
        url: upstream.clone(),
        pid: None,
        _guard: Box::new(()),
    }];
    let policies = if s.policies.is_empty() {
        vec![PolicyKind::RoundRobin]
    } else {
        s.policies.clone()
    };
    for &p in &policies {
        let dir = tmp.path().join(p.to_string());
        ups.push(start_kvgate(
            kvgate_name(p),
            p,
            s.kvgate_bin.as_deref(),
            s,
            &upstream,
            &dir,
        )?);
    }
    if let Some(bin) = &s.baseline_bin {
        let dir = tmp.path().join("baseline");
        ups.push(start_kvgate(
            "kvgate-baseline".into(),
            policies[0],
            Some(bin),
            s,
            &upstream,
            &dir,
        )?);
    }
    match (which("nginx"), s.skip_nginx) {
        (_, true) => {}
        (None, false) => {
            eprintln!("nginx not found (apt-get install -y nginx): skipping the floor")
        }
        (Some(bin), false) => {
            ups.push(start_nginx(s, &bin, &upstream, tmp.path(), true)?);
            ups.push(start_nginx(s, &bin, &upstream, tmp.path(), false)?);
        }
    }
    match (which("smg"), s.skip_smg) {
        (_, true) => {}
        (None, false) => {
            eprintln!("smg not found (pip install smg==1.13.0): skipping the reference")
        }
        (Some(bin), false) => ups.push(start_smg(s, &bin, &upstream)?),
    }

    let one_conn = interleaved_latency(&ups, s.warmup, s.latency_requests, &s.body)?;
    let loads = saturate_in_rounds(&ups, s, wrk.as_deref(), &script)?;
    let mut rows = Vec::new();
    for ((up, one_conn), load) in ups.iter().zip(one_conn).zip(loads) {
        rows.push(ProxyRow {
            rss_before_kib: load.rss_before_kib,
            rss_after_kib: up.pid.and_then(rss_kib),
            target: up.name.clone(),
            how: up.how.clone(),
            load_tool: load.tool,
            req_per_sec: load.requests as f64 / load.secs.max(f64::MIN_POSITIVE),
            load_p50_ms: median(load.p50s),
            load_p99_ms: median(load.p99s),
            load_errors: load.errors,
            cpu_us_per_req: load
                .cpu_ns
                .filter(|_| load.requests > 0)
                .map(|ns| ns as f64 / 1e3 / load.requests as f64),
            one_conn,
            added_p50_ms: None,
            added_p99_ms: None,
        });
    }
    drop(ups);
    fleet.stop();

    let direct = rows[0].one_conn;
    for r in &mut rows[1..] {
        if direct.count > 0 && r.one_conn.count > 0 {
            r.added_p50_ms = Some(r.one_conn.p50 - direct.p50);
            r.added_p99_ms = Some(r.one_conn.p99 - direct.p99);
        }
    }
    Ok(rows)
}

/// One sender's bodies: the same string every time, or a new unique one each request.
struct Sender<'a> {
    spec: &'a BodySpec,
    lane: char,
    n: u64,
    fixed: Option<String>,
}

impl<'a> Sender<'a> {
    fn new(spec: &'a BodySpec, lane: char) -> Self {
        let fixed = (!spec.unique).then(|| spec.make(lane, 0));
        Self {
            spec,
            lane,
            n: 0,
            fixed,
        }
    }

    fn next(&mut self) -> std::borrow::Cow<'_, str> {
        self.n += 1;
        match &self.fixed {
            Some(b) => b.as_str().into(),
            None => self.spec.make(self.lane, self.n).into(),
        }
    }
}

/// Latency at one connection per target, in rounds that visit every target in turn so
/// the machine's noise (other builds on these 2 cores) falls on all of them alike.
fn interleaved_latency(
    ups: &[Up],
    warmup: usize,
    n: usize,
    body: &BodySpec,
) -> anyhow::Result<Vec<Summary>> {
    const ROUND: usize = 250;
    let mut conns = Vec::new();
    for up in ups {
        let addr = socket_addr(&up.url).context("target URL has no socket address")?;
        conns.push(RawClient::connect(addr, Duration::from_secs(5))?);
    }
    let mut sender = Sender::new(body, 'r');
    // Warmed up in rounds too: with large bodies, one target's whole warm-up can outlast
    // another's keep-alive (the simulator's is actix's 5 s), which then closes the
    // connection left idle.
    let mut warm = 0;
    while warm < warmup {
        let k = ROUND.min(warmup - warm);
        for (up, c) in ups.iter().zip(&mut conns) {
            reopen_if_closed(c, up, &sender.next())?;
            for _ in 0..k {
                call(c, up, &sender.next())?;
            }
        }
        warm += k;
    }
    eprintln!("proxy: {n} sequential requests per target on one connection, {ROUND} at a time");
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(n); ups.len()];
    let mut done = 0;
    while done < n {
        let k = ROUND.min(n - done);
        for ((up, c), out) in ups.iter().zip(&mut conns).zip(&mut samples) {
            reopen_if_closed(c, up, &sender.next())?;
            for _ in 0..k {
                let body = sender.next();
                let t = Instant::now();
                call(c, up, &body)?;
                out.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        done += k;
    }
    Ok(samples.iter().map(|v| Summary::of(v)).collect())
}

/// A connection the target closed while the others had their round is opened again,
/// with one untimed request, so no sample includes a connect.
fn reopen_if_closed(c: &mut RawClient, up: &Up, body: &str) -> anyhow::Result<()> {
    if c.closed_while_idle()? {
        eprintln!(
            "proxy: {} closed the idle connection; reconnecting",
            up.name
        );
        call(c, up, body)?;
    }
    Ok(())
}

fn call(c: &mut RawClient, up: &Up, body: &str) -> anyhow::Result<()> {
    let r = c
        .request("POST", PATH, body.as_bytes())
        .with_context(|| format!("{}: single-connection request", up.name))?;
    if r.status != 200 {
        bail!(
            "status {} from {}: {}",
            r.status,
            up.name,
            String::from_utf8_lossy(&r.body)
        );
    }
    Ok(())
}

/// One target's saturation load, summed over its rounds.
#[derive(Default)]
struct Load {
    tool: String,
    requests: u64,
    secs: f64,
    errors: u64,
    p50s: Vec<f64>,
    p99s: Vec<f64>,
    cpu_ns: Option<u64>,
    rss_before_kib: Option<u64>,
}

/// Saturates every target for `s.duration` in all, in `s.rounds` turns: forward, then
/// backward, and so on. One 10-second turn each, in a fixed order, made a comparison of
/// two targets one sample of the machine's drift (+-5 % and more between two copies of one
/// binary on 2 shared cores).
fn saturate_in_rounds(
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
fn median(mut v: Vec<f64>) -> Option<f64> {
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

/// The stdout table for the proxy rows.
pub fn table(rows: &[ProxyRow]) -> String {
    let mut s = String::new();
    let w = rows
        .iter()
        .map(|r| r.target.len())
        .max()
        .unwrap_or(0)
        .max(8);
    let _ = writeln!(
        s,
        "{:<w$} {:>10} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10}  how",
        "target",
        "req/s",
        "cpu us/r",
        "load p50",
        "load p99",
        "1conn p50",
        "1conn p99",
        "added p50",
        "added p99"
    );
    let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.3}"));
    for r in rows {
        let _ = writeln!(
            s,
            "{:<w$} {:>10.0} {:>9} {:>9} {:>9} {:>10.3} {:>10.3} {:>10} {:>10}  {}{}",
            r.target,
            r.req_per_sec,
            r.cpu_us_per_req
                .map_or("-".to_owned(), |v| format!("{v:.2}")),
            opt(r.load_p50_ms),
            opt(r.load_p99_ms),
            r.one_conn.p50,
            r.one_conn.p99,
            opt(r.added_p50_ms),
            opt(r.added_p99_ms),
            r.how,
            if r.load_errors > 0 {
                format!(" ({} load errors)", r.load_errors)
            } else {
                String::new()
            },
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::{ProxyRow, median, table, turn_order};
    use kvgate_bench::Summary;

    fn row(target: &str) -> ProxyRow {
        ProxyRow {
            target: target.into(),
            how: "h".into(),
            load_tool: "wrk".into(),
            req_per_sec: 12345.0,
            load_p50_ms: Some(1.0),
            load_p99_ms: None,
            load_errors: 0,
            cpu_us_per_req: None,
            one_conn: Summary::default(),
            added_p50_ms: Some(0.1),
            added_p99_ms: None,
            rss_before_kib: None,
            rss_after_kib: None,
        }
    }

    #[test]
    fn columns_line_up_whatever_the_target_names() {
        let text = table(&[row("direct"), row("kvgate-baseline"), row("smg")]);
        let ends: Vec<usize> = text
            .lines()
            .map(|l| l.find("12345").map_or(0, |i| i + 5))
            .skip(1)
            .collect();
        assert_eq!(ends.len(), 3);
        assert!(ends.iter().all(|e| *e == ends[0] && *e > 0), "{text}");
        let header_end = text
            .lines()
            .next()
            .and_then(|l| l.find("req/s"))
            .map(|i| i + 5);
        assert_eq!(header_end, Some(ends[0]), "{text}");
    }

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
