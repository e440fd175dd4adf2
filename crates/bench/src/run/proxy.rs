//! `kvgate-bench proxy`: what one proxy hop adds in front of a fixed-response upstream,
//! measured for every target in one run so ratios share the machine's noise.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kvgate_bench::{RawClient, Summary, WrkReport, parse_wrk, post_script, socket_addr};
use kvgate_engine_sim::{SimConfig, SimFleet};
use kvgate_gateway::{Gateway, GatewayConfig};
use kvgate_policies::{PolicyConfig, PolicyKind};
use serde::Serialize;

use super::child::{ChildServer, free_port, which};

/// The request every target proxies by default: a small non-streaming chat completion.
pub const BODY: &str = r#"{"model":"kvgate-sim-model","messages":[{"role":"user","content":"Hello!"}],"max_tokens":1}"#;

/// The request body: [`BODY`] without `kib`, else the same chat completion whose user
/// message is `kib` KiB of plain text (the JSON around it adds about 90 bytes).
pub fn request_body(kib: Option<usize>) -> String {
    let Some(kib) = kib else {
        return BODY.to_owned();
    };
    const WORDS: &str = "the quick brown fox jumps over the lazy dog ";
    let text: String = WORDS.chars().cycle().take(kib * 1024).collect();
    serde_json::json!({
        "model": "kvgate-sim-model",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 1,
    })
    .to_string()
}
const PATH: &str = "/v1/chat/completions";

#[derive(Debug, Clone)]
pub struct ProxySettings {
    pub duration: Duration,
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
    /// What every request sends (see [`request_body`]).
    pub body: Arc<str>,
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
    pub one_conn: Summary,
    /// One-connection p50/p99 minus the direct upstream's.
    pub added_p50_ms: Option<f64>,
    pub added_p99_ms: Option<f64>,
}

/// A target that is up, with whatever keeps it running.
struct Up {
    name: &'static str,
    how: String,
    url: String,
    _guard: Box<dyn std::any::Any>,
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
    std::fs::write(&script, post_script(&s.body)).context("writing post.lua")?;
    let tmp = tempfile::tempdir()?;

    let mut ups = vec![Up {
        name: "direct",
        how: "the simulator itself".into(),
        url: upstream.clone(),
        _guard: Box::new(()),
    }];
    ups.push(start_kvgate(
        "kvgate",
        s.kvgate_bin.as_deref(),
        s,
        &upstream,
        tmp.path(),
    )?);
    if let Some(bin) = &s.baseline_bin {
        let dir = tmp.path().join("baseline");
        ups.push(start_kvgate(
            "kvgate-baseline",
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
        (Some(bin), false) => ups.push(start_nginx(s, &bin, &upstream, tmp.path())?),
    }
    match (which("smg"), s.skip_smg) {
        (_, true) => {}
        (None, false) => {
            eprintln!("smg not found (pip install smg==1.13.0): skipping the reference")
        }
        (Some(bin), false) => ups.push(start_smg(s, &bin, &upstream)?),
    }

    let one_conn = interleaved_latency(&ups, s.warmup, s.latency_requests, &s.body)?;
    let mut rows = Vec::new();
    for (up, one_conn) in ups.iter().zip(one_conn) {
        eprintln!("proxy: saturating {} at {}", up.name, up.url);
        let (load_tool, load) = saturate(up, s, wrk.as_deref(), &script)?;
        rows.push(ProxyRow {
            target: up.name.to_owned(),
            how: up.how.clone(),
            load_tool,
            req_per_sec: load.requests_per_sec,
            load_p50_ms: load.latency_p50_ms,
            load_p99_ms: load.latency_p99_ms,
            load_errors: load.non_2xx + load.socket_errors,
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

/// kvgate: the release binary as a child when there is one, else in-process.
fn start_kvgate(
    name: &'static str,
    bin: Option<&Path>,
    s: &ProxySettings,
    upstream: &str,
    tmp: &Path,
) -> anyhow::Result<Up> {
    let data = tmp.join("kvgate-data");
    match bin {
        Some(bin) => {
            let port = free_port()?;
            let args: Vec<String> = [
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--worker-urls",
                upstream,
                "--policy",
                "round_robin",
                "--data-dir",
                &data.display().to_string(),
                "--log-level",
                "warn",
            ]
            .map(String::from)
            .to_vec();
            let log = s.out.join(format!("{name}-proxy.log"));
            let mut c =
                ChildServer::spawn(name, bin, &args, &log, format!("http://127.0.0.1:{port}"))?;
            c.wait_ready(&["/readiness", "/health"], Duration::from_secs(30))?;
            Ok(Up {
                name,
                how: format!("child process {}", bin.display()),
                url: c.url().to_owned(),
                _guard: Box::new(c),
            })
        }
        None => {
            let cfg = GatewayConfig {
                port: 0,
                worker_urls: vec![upstream.to_owned()],
                data_dir: data,
                policy: PolicyConfig::with_kind(PolicyKind::RoundRobin),
                ..GatewayConfig::default()
            };
            let gw = Gateway::start(cfg).context("starting kvgate in-process")?;
            Ok(Up {
                name: "kvgate",
                how: "in-process (no release binary found)".into(),
                url: gw.url(),
                _guard: Box::new(gw),
            })
        }
    }
}

fn start_nginx(s: &ProxySettings, bin: &Path, upstream: &str, tmp: &Path) -> anyhow::Result<Up> {
    let dir = tmp.join("nginx");
    std::fs::create_dir_all(&dir)?;
    let port = free_port()?;
    let conf = nginx_conf(&dir, port, upstream)?;
    let args = [
        "-p".into(),
        dir.display().to_string(),
        "-c".into(),
        conf.display().to_string(),
    ];
    let log = s.out.join("nginx.log");
    let mut c = ChildServer::spawn(
        "nginx",
        bin,
        &args,
        &log,
        format!("http://127.0.0.1:{port}"),
    )?;
    c.wait_ready(&["/health"], Duration::from_secs(10))?;
    Ok(Up {
        name: "nginx",
        how: "worker_processes auto, upstream keepalive 64".into(),
        url: c.url().to_owned(),
        _guard: Box::new(c),
    })
}

fn start_smg(s: &ProxySettings, bin: &Path, upstream: &str) -> anyhow::Result<Up> {
    let port = free_port()?;
    let args: Vec<String> = [
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--worker-urls",
        upstream,
        "--policy",
        "round_robin",
        "--log-level",
        "warn",
    ]
    .map(String::from)
    .to_vec();
    let log = s.out.join("smg-proxy.log");
    let mut c = ChildServer::spawn("smg", bin, &args, &log, format!("http://127.0.0.1:{port}"))?;
    c.wait_ready(&["/readiness", "/health"], Duration::from_secs(60))?;
    Ok(Up {
        name: "smg",
        how: "smg 1.13.0 launch --policy round_robin".into(),
        url: c.url().to_owned(),
        _guard: Box::new(c),
    })
}

/// Latency at one connection per target, in rounds that visit every target in turn so
/// the machine's noise (other builds on these 2 cores) falls on all of them alike.
fn interleaved_latency(
    ups: &[Up],
    warmup: usize,
    n: usize,
    body: &str,
) -> anyhow::Result<Vec<Summary>> {
    const ROUND: usize = 250;
    let mut conns = Vec::new();
    for up in ups {
        let addr = socket_addr(&up.url).context("target URL has no socket address")?;
        conns.push(RawClient::connect(addr, Duration::from_secs(5))?);
    }
    // Warmed up in rounds too: with large bodies, one target's whole warm-up can outlast
    // another's keep-alive (the simulator's is actix's 5 s), which then closes the
    // connection left idle.
    let mut warm = 0;
    while warm < warmup {
        let k = ROUND.min(warmup - warm);
        for (up, c) in ups.iter().zip(&mut conns) {
            reopen_if_closed(c, up, body)?;
            for _ in 0..k {
                call(c, up, body)?;
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
            reopen_if_closed(c, up, body)?;
            for _ in 0..k {
                let t = Instant::now();
                call(c, up, body)?;
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

fn saturate(
    up: &Up,
    s: &ProxySettings,
    wrk: Option<&Path>,
    script: &Path,
) -> anyhow::Result<(String, WrkReport)> {
    match wrk {
        Some(bin) => {
            let out = Command::new(bin)
                .args([
                    "-t1",
                    &format!("-c{}", s.connections),
                    &format!("-d{}s", s.duration.as_secs().max(1)),
                ])
                .args(["--latency", "-s"])
                .arg(script)
                .arg(format!("{}{PATH}", up.url))
                .output()
                .context("running wrk")?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            std::fs::write(s.out.join(format!("wrk-{}.txt", up.name)), &text)?;
            let report =
                parse_wrk(&text).with_context(|| format!("{}: wrk said: {text}", up.name))?;
            Ok((
                format!(
                    "wrk -t1 -c{} -d{}s --latency",
                    s.connections,
                    s.duration.as_secs()
                ),
                report,
            ))
        }
        None => Ok((
            "built-in closed loop".to_owned(),
            closed_loop(&up.url, s.connections, s.duration, &s.body)?,
        )),
    }
}

/// `connections` threads, each a keep-alive connection sending back to back for `d`.
fn closed_loop(
    url: &str,
    connections: usize,
    d: Duration,
    body: &Arc<str>,
) -> anyhow::Result<WrkReport> {
    let addr = socket_addr(url).context("target URL has no socket address")?;
    let stop = Arc::new(AtomicBool::new(false));
    let begun = Instant::now();
    let workers: Vec<_> = (0..connections.max(1))
        .map(|_| {
            let stop = Arc::clone(&stop);
            let body = Arc::clone(body);
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                let mut errors = 0u64;
                let Ok(mut c) = RawClient::connect(addr, Duration::from_secs(5)) else {
                    return (lat, 1);
                };
                while !stop.load(Ordering::Relaxed) {
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

/// A foreground nginx that reverse-proxies to `upstream` with keep-alive connections.
fn nginx_conf(dir: &Path, port: u16, upstream: &str) -> anyhow::Result<PathBuf> {
    let up = upstream.trim_start_matches("http://");
    let d = dir.display();
    let conf = format!(
        "worker_processes auto;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 100000000;\n  keepalive_timeout 300s;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         upstream sim {{ server {up}; keepalive 64; keepalive_requests 100000000; }}\n\
         server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://sim;\n\
         proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n  }}\n}}\n"
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).context("writing nginx.conf")?;
    Ok(path)
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
        "{:<w$} {:>10} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10}  how",
        "target",
        "req/s",
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
            "{:<w$} {:>10.0} {:>9} {:>9} {:>10.3} {:>10.3} {:>10} {:>10}  {}{}",
            r.target,
            r.req_per_sec,
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
    use super::{BODY, ProxyRow, request_body, table};
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
            one_conn: Summary::default(),
            added_p50_ms: Some(0.1),
            added_p99_ms: None,
        }
    }

    #[test]
    fn the_default_body_is_unchanged_and_a_sized_one_is_a_chat_completion() {
        assert_eq!(request_body(None), BODY);
        let body = request_body(Some(256));
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        let text = v["messages"][0]["content"].as_str().expect("content");
        assert_eq!(text.len(), 256 * 1024);
        assert_eq!(v["model"], "kvgate-sim-model");
        assert_eq!(v["max_tokens"], 1);
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
}
