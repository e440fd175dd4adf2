//! `kvgate-bench proxy`: what one proxy hop adds in front of a fixed-response upstream,
//! measured for every target in one run so ratios share the machine's noise.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use kvgate_bench::Summary;
use kvgate_engine_sim::{SimConfig, SimFleet};
use kvgate_policies::PolicyKind;
use serde::Serialize;

use super::child::{rss_kib, which};

mod body;
pub(crate) mod curve;
mod latency;
mod load;
mod targets;

pub(crate) use body::BodySpec;
use latency::interleaved_latency;
use load::{median, saturate_in_rounds};
use targets::{start_kvgate, start_nginx, start_smg};

const PATH: &str = "/v1/chat/completions";

#[derive(Debug, Clone)]
pub(crate) struct ProxySettings {
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
#[derive(Debug, Clone, Serialize, Default)]
pub(crate) struct ProxyRow {
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
pub(crate) fn kvgate_name(policy: PolicyKind) -> String {
    match policy {
        PolicyKind::RoundRobin => "kvgate".into(),
        p => format!("kvgate-{p}"),
    }
}

/// Runs every available target against one upstream and returns their rows, direct first.
pub(crate) fn run(s: &ProxySettings) -> anyhow::Result<Vec<ProxyRow>> {
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

/// The stdout table for the proxy rows.
pub(crate) fn table(rows: &[ProxyRow]) -> String {
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
    use super::{ProxyRow, table};
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
}
