//! The tables of `docs/benchmarks.md`, rendered from a run's figures (`--markdown PATH`),
//! so that the page's tables are pasted from the bench, never typed.
//!
//! A file holds blocks: an HTML comment naming the command and what the table shows, then
//! the table. The next run replaces a block of one run's figures. A block that lists one
//! value per run (the page's seeds and repeated runs, as `a / b / c`) gets the new run's
//! values appended to the row with the same key, a new row for a new key and a new column
//! for a new target.

use std::path::Path;

use anyhow::Context as _;
use kvgate_bench::{RunReport, WorkloadKind};

use crate::run::proxy::ProxyRow;
use crate::run::proxy::curve::{self, CurvePoint};
use crate::run::soak::SoakReport;

/// Between the values of successive runs in one cell.
const RUNS: &str = " / ";
/// A figure the run did not produce.
const NONE: &str = "–";

/// One generated table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Block {
    /// What generated the table and what it shows; a block's identity within a file.
    pub title: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub merge: Merge,
}

/// What a new run does to the block of the same title already in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Merge {
    /// Replaces it.
    Replace,
    /// Appends its values to the cells of the row whose first `keys` cells match.
    PerRun { keys: usize },
}

/// Merges `blocks` into the file at `path` (created when missing).
pub(crate) fn update(path: &Path, blocks: Vec<Block>) -> anyhow::Result<()> {
    let old = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    std::fs::write(path, merge(&old, blocks)).with_context(|| format!("writing {}", path.display()))
}

/// `existing` (a file this module wrote) with `new` merged in, rendered.
pub(crate) fn merge(existing: &str, new: Vec<Block>) -> String {
    let mut blocks = parse(existing);
    for b in new {
        match blocks.iter_mut().find(|old| old.title == b.title) {
            None => blocks.push(b),
            Some(old) => match b.merge {
                Merge::Replace => *old = b,
                Merge::PerRun { keys } => append_run(old, &b, keys),
            },
        }
    }
    render(&blocks)
}

fn append_run(old: &mut Block, new: &Block, keys: usize) {
    old.merge = new.merge;
    for h in new.header.iter().skip(keys) {
        if !old.header.contains(h) {
            old.header.push(h.clone());
            old.rows.iter_mut().for_each(|r| r.push(String::new()));
        }
    }
    for row in &new.rows {
        let key = &row[..keys.min(row.len())];
        let at = match old.rows.iter().position(|r| r.starts_with(key)) {
            Some(i) => i,
            None => {
                let mut fresh = key.to_vec();
                fresh.resize(old.header.len(), String::new());
                old.rows.push(fresh);
                old.rows.len() - 1
            }
        };
        for (h, value) in new.header.iter().zip(row).skip(keys) {
            let Some(c) = old.header.iter().position(|x| x == h) else {
                continue;
            };
            let cell = &mut old.rows[at][c];
            if !cell.is_empty() {
                cell.push_str(RUNS);
            }
            cell.push_str(value);
        }
    }
}

/// The blocks of a file this module wrote; anything else in it is dropped.
fn parse(text: &str) -> Vec<Block> {
    let mut blocks: Vec<Block> = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(title) = line
            .trim()
            .strip_prefix("<!-- ")
            .and_then(|l| l.strip_suffix(" -->"))
        else {
            continue;
        };
        let mut table = Vec::new();
        while let Some(l) = lines.next_if(|l| l.trim_start().starts_with('|')) {
            table.push(cells(l));
        }
        let mut table = table.into_iter();
        let header = table.next().unwrap_or_default();
        let rows = table
            .skip(1)
            .map(|mut r| {
                r.resize(header.len(), String::new());
                r
            })
            .collect();
        blocks.push(Block {
            title: title.to_owned(),
            header,
            rows,
            merge: Merge::Replace,
        });
    }
    blocks
}

/// The cells of one table line, `\|` read as a `|` inside a cell.
fn cells(line: &str) -> Vec<String> {
    let line = line.trim();
    let line = line.strip_prefix('|').unwrap_or(line);
    let line = line.strip_suffix('|').unwrap_or(line);
    let mut out = Vec::new();
    let mut cell = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                chars.next();
                cell.push('|');
            }
            '|' => out.push(std::mem::take(&mut cell)),
            c => cell.push(c),
        }
    }
    out.push(cell);
    out.into_iter().map(|c| c.trim().to_owned()).collect()
}

fn render(blocks: &[Block]) -> String {
    let line = |cells: &[String]| {
        let cells: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
        format!("| {} |\n", cells.join(" | "))
    };
    let mut s = String::new();
    for (i, b) in blocks.iter().enumerate() {
        if i > 0 {
            s.push('\n');
        }
        s.push_str(&format!("<!-- {} -->\n", b.title));
        s.push_str(&line(&b.header));
        s.push_str(&format!("|{}\n", "---|".repeat(b.header.len())));
        for r in &b.rows {
            s.push_str(&line(r));
        }
    }
    s
}

/// `48 012`: a whole number in groups of three, as the page writes them.
pub(crate) fn thousands(v: f64) -> String {
    let n = v.round();
    let digits = format!("{}", n.abs());
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(d);
    }
    if n < 0.0 { format!("-{out}") } else { out }
}

/// Added latency in ms: `+0.021`, or `+44` at 10 ms and more.
fn added(ms: f64) -> String {
    if ms.abs() >= 10.0 {
        format!("{ms:+.0}")
    } else {
        format!("{ms:+.3}")
    }
}

fn split(r: &RunReport) -> String {
    let parts: Vec<String> = r.split.iter().map(u64::to_string).collect();
    parts.join("/")
}

/// `kvgate-bench workload`: per workload, this run's policies as a table; and the
/// tables that list one value per run: hit ÷ ideal (workloads with something to share),
/// the split and TTFT p99, one row per workload and setting, one column per target.
pub(crate) fn workload(rows: &[RunReport], setting: &str) -> Vec<Block> {
    let mut kinds: Vec<WorkloadKind> = Vec::new();
    for r in rows {
        if !kinds.contains(&r.workload) {
            kinds.push(r.workload);
        }
    }
    let mut blocks: Vec<Block> = kinds
        .iter()
        .map(|&kind| policies(kind, rows, setting))
        .collect();
    let all: Vec<&RunReport> = rows.iter().collect();
    // A workload whose prompts share nothing (burst, unique) has no ratio to list.
    let shares = |k: WorkloadKind| rows.iter().any(|r| r.workload == k && r.ratio().is_some());
    let shared: Vec<&RunReport> = rows.iter().filter(|r| shares(r.workload)).collect();
    if !shared.is_empty() {
        blocks.push(per_run("hit ÷ ideal", &shared, setting, |r| {
            r.ratio().map_or(NONE.to_owned(), |v| format!("{v:.3}"))
        }));
    }
    blocks.push(per_run("split", &all, setting, split));
    blocks.push(per_run("TTFT p99 ms", &all, setting, |r| {
        if r.completed > 0 {
            format!("{:.1}", r.ttft_ms.p99)
        } else {
            NONE.to_owned()
        }
    }));
    blocks
}

/// `kvgate-bench workload --gateway-replicas 1,2,4`: one row per workload, target and
/// replica count, with the hit rate over the same target's at one replica in this run.
pub(crate) fn replicas(rows: &[RunReport], setting: &str) -> Block {
    let header = [
        "workload",
        "target",
        "replicas",
        "hit",
        "÷ 1 replica",
        "hit ÷ ideal",
        "split",
        "TTFT p99 ms",
    ];
    let mut order: Vec<(WorkloadKind, &str)> = Vec::new();
    for r in rows {
        if !order.contains(&(r.workload, r.target.as_str())) {
            order.push((r.workload, r.target.as_str()));
        }
    }
    let mut out = Vec::new();
    for (kind, target) in order {
        let mut runs: Vec<&RunReport> = rows
            .iter()
            .filter(|r| r.workload == kind && r.target == target)
            .collect();
        runs.sort_by_key(|r| r.replicas);
        let single = runs.iter().find(|r| r.replicas == 1).map(|r| r.hit_rate());
        for r in runs {
            let over_one = match single {
                Some(one) if one > 0.0 => format!("{:.3}", r.hit_rate() / one),
                _ => NONE.to_owned(),
            };
            out.push(vec![
                kind.to_string(),
                target.to_owned(),
                r.replicas.to_string(),
                format!("{:.3}", r.hit_rate()),
                over_one,
                r.ratio().map_or(NONE.to_owned(), |v| format!("{v:.3}")),
                split(r),
                if r.completed > 0 {
                    format!("{:.1}", r.ttft_ms.p99)
                } else {
                    NONE.to_owned()
                },
            ]);
        }
    }
    Block {
        title: format!(
            "kvgate-bench workload --gateway-replicas --markdown: {setting}, one value per run"
        ),
        header: header.map(String::from).to_vec(),
        rows: out,
        merge: Merge::PerRun { keys: 3 },
    }
}

/// The replicas table as the console shows it.
pub(crate) fn replicas_text(rows: &[RunReport]) -> String {
    render(&[replicas(rows, "this run")])
}

/// One workload's policies, one row each, as the run printed them.
fn policies(kind: WorkloadKind, rows: &[RunReport], setting: &str) -> Block {
    let header = [
        "policy",
        "hit",
        "ideal",
        "ratio",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "req/s",
        "split",
        "max/min",
    ];
    Block {
        title: format!("kvgate-bench workload --markdown: {kind}, {setting}"),
        header: header.map(String::from).to_vec(),
        rows: rows
            .iter()
            .filter(|r| r.workload == kind)
            .map(|r| {
                vec![
                    r.target.clone(),
                    format!("{:.3}", r.hit_rate()),
                    format!("{:.3}", r.ideal.rate()),
                    r.ratio().map_or(NONE.to_owned(), |v| format!("{v:.3}")),
                    format!("{:.1}", r.ttft_ms.p50),
                    format!("{:.1}", r.ttft_ms.p99),
                    format!("{:.1}", r.req_per_sec()),
                    split(r),
                    r.split_max_min()
                        .map_or("inf".to_owned(), |v| format!("{v:.2}")),
                ]
            })
            .collect(),
        merge: Merge::Replace,
    }
}

/// One figure of every target, a row per workload of the run.
fn per_run(
    what: &str,
    rows: &[&RunReport],
    setting: &str,
    cell: impl Fn(&RunReport) -> String,
) -> Block {
    let mut targets: Vec<&str> = Vec::new();
    let mut kinds: Vec<WorkloadKind> = Vec::new();
    for r in rows {
        if !targets.contains(&r.target.as_str()) {
            targets.push(&r.target);
        }
        if !kinds.contains(&r.workload) {
            kinds.push(r.workload);
        }
    }
    let mut header = vec!["workload".to_owned(), "setting".to_owned()];
    header.extend(targets.iter().map(|t| (*t).to_owned()));
    let table = kinds
        .iter()
        .map(|&kind| {
            let mut row = vec![kind.to_string(), setting.to_owned()];
            row.extend(targets.iter().map(|t| {
                rows.iter()
                    .find(|r| r.workload == kind && r.target == *t)
                    .map_or(NONE.to_owned(), |r| cell(r))
            }));
            row
        })
        .collect();
    Block {
        title: format!("kvgate-bench workload --markdown: {what}, one value per run"),
        header,
        rows: table,
        merge: Merge::PerRun { keys: 2 },
    }
}

/// `kvgate-bench proxy` at one body size: each target's req/s and added p50 (`direct`, the
/// zero they are measured from, left out), and kvgate against smg; one value per run.
pub(crate) fn proxy(rows: &[ProxyRow], body: &str) -> Block {
    let mut table: Vec<Vec<String>> = rows
        .iter()
        .filter(|r| r.target != "direct")
        .map(|r| {
            vec![
                r.target.clone(),
                thousands(r.req_per_sec),
                r.added_p50_ms
                    .map_or(NONE.to_owned(), |a| format!("{a:+.3}")),
            ]
        })
        .collect();
    let find = |name: &str| rows.iter().find(|r| r.target == name);
    if let (Some(k), Some(s)) = (find("kvgate"), find("smg"))
        && s.req_per_sec > 0.0
    {
        let p50 = match (k.added_p50_ms, s.added_p50_ms) {
            (Some(k), Some(s)) if s > 0.0 => format!("{:.2}", k / s),
            _ => NONE.to_owned(),
        };
        table.push(vec![
            "kvgate ÷ smg".to_owned(),
            format!("{:.2}×", k.req_per_sec / s.req_per_sec),
            p50,
        ]);
    }
    Block {
        title: format!("kvgate-bench proxy --markdown: {body} body, one value per run"),
        header: ["target", "req/s", "added p50 ms"]
            .map(String::from)
            .to_vec(),
        rows: table,
        merge: Merge::PerRun { keys: 1 },
    }
}

/// `kvgate-bench proxy --sweep-kib`: a row per size, a column per target; each cell its
/// req/s, kvgate's as a fraction of nginx's, the added p50 and CPU time per request.
pub(crate) fn curve(points: &[CurvePoint], unique: bool) -> Block {
    let names = curve::targets(points);
    let mut header = vec!["body".to_owned()];
    header.extend(names.iter().cloned());
    let rows = points
        .iter()
        .map(|p| {
            let nginx = p
                .rows
                .iter()
                .find(|r| r.target == "nginx")
                .map(|r| r.req_per_sec)
                .filter(|v| *v > 0.0);
            let size = if p.kib % 1024 == 0 {
                format!("{} MiB", p.kib / 1024)
            } else {
                format!("{} KiB", p.kib)
            };
            let mut row = vec![size];
            row.extend(names.iter().map(|n| {
                p.rows
                    .iter()
                    .find(|r| &r.target == n)
                    .map_or(NONE.to_owned(), |r| curve_cell(r, nginx))
            }));
            row
        })
        .collect();
    let prompts = if unique { ", unique prompts" } else { "" };
    Block {
        title: format!(
            "kvgate-bench proxy --sweep-kib --markdown: req/s, × nginx, added p50, CPU per request{prompts}"
        ),
        header,
        rows,
        merge: Merge::Replace,
    }
}

fn curve_cell(r: &ProxyRow, nginx: Option<f64>) -> String {
    let mut parts = vec![thousands(r.req_per_sec)];
    if let Some(n) = nginx.filter(|_| r.target.starts_with("kvgate")) {
        parts.push(format!("{:.2}×", r.req_per_sec / n));
    }
    parts.push(
        r.added_p50_ms
            .map_or(NONE.to_owned(), |a| format!("{} ms", added(a))),
    );
    if let Some(cpu) = r.cpu_us_per_req {
        parts.push(format!("{} µs", thousands(cpu)));
    }
    parts.join(", ")
}

/// `kvgate-bench soak`: what was sent, what was lost, and the gateway's memory, in one row.
pub(crate) fn soak(r: &SoakReport) -> Block {
    let rss: Vec<String> = r
        .rss_every_minute_kib
        .iter()
        .map(|k| format!("{:.1}", *k as f64 / 1024.0))
        .collect();
    let count = |n: u64| thousands(n as f64);
    let header = [
        "sent",
        "failed, not streamed",
        "streams failed before their first byte",
        "streams cut after it",
        "hung up on purpose",
        "engine restarts",
        "in flight at the end",
        "gateway RSS once a minute, MiB",
    ];
    Block {
        title: "kvgate-bench soak --markdown".to_owned(),
        header: header.map(String::from).to_vec(),
        rows: vec![vec![
            format!("{} in {:.1} s", count(r.sent), r.seconds),
            count(r.failed_plain),
            count(r.failed_streams_not_started),
            count(r.broken_streams_started),
            count(r.hung_up),
            count(r.engine_restarts),
            count(r.in_flight_end),
            rss.join(", "),
        ]],
        merge: Merge::Replace,
    }
}

#[cfg(test)]
mod tests;
