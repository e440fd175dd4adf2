//! What one workload run measured, the targets it is held to, and how it is printed.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::ideal::Tokens;
use crate::stats::{Summary, split_ratio};
use crate::svg::{Bar, Panel, chart};
use crate::workload::WorkloadKind;

/// One policy (or the reference gateway) on one workload, on a fresh fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    pub workload: WorkloadKind,
    /// `cache_aware`, `cache_aware:threshold`, ... or `smg:cache_aware`.
    pub target: String,
    /// Whether this row is the reference gateway (the TTFT bar to beat).
    pub reference: bool,
    pub planned: usize,
    pub completed: usize,
    pub failed: usize,
    /// Σ cached / Σ prompt tokens as the engines answered them (`usage`).
    pub hits: Tokens,
    /// The same from the simulator's own counters (`/sim/stats`), as a cross-check.
    pub engine_counters: Tokens,
    /// The most any routing could have hit on this run (`ideal::upper_bound`).
    pub ideal: Tokens,
    pub ttft_ms: Summary,
    pub latency_ms: Summary,
    pub wall_secs: f64,
    pub output_tokens: u64,
    /// Requests each engine accepted, in fleet order.
    pub split: Vec<u64>,
    /// The wall-clock cap stopped the run before every request finished.
    pub capped: bool,
    /// The first few errors, for the reader.
    pub errors: Vec<String>,
    /// Fleet and load in words (engines, slots, arrivals, seed), for the chart's subtitle.
    #[serde(default)]
    pub setting: String,
    /// Gateway replicas in front of the fleet, the requests alternating between them.
    #[serde(default = "one")]
    pub replicas: usize,
}

fn one() -> usize {
    1
}

impl RunReport {
    pub fn hit_rate(&self) -> f64 {
        self.hits.rate()
    }

    /// Hit rate over the ideal; `None` when the run could hit nothing.
    pub fn ratio(&self) -> Option<f64> {
        let ideal = self.ideal.rate();
        (ideal > 0.0).then(|| self.hit_rate() / ideal)
    }

    pub fn req_per_sec(&self) -> f64 {
        per_sec(self.completed as f64, self.wall_secs)
    }

    pub fn output_tokens_per_sec(&self) -> f64 {
        per_sec(self.output_tokens as f64, self.wall_secs)
    }

    pub fn split_max_min(&self) -> Option<f64> {
        split_ratio(&self.split)
    }
}

fn per_sec(n: f64, secs: f64) -> f64 {
    if secs > 0.0 { n / secs } else { 0.0 }
}

/// The targets of the routing issue for one workload, on a fleet of `engines`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Targets {
    pub min_ratio: Option<f64>,
    pub max_split: Option<f64>,
    /// Burst: every engine within this many requests of the even share.
    pub burst_spread: Option<u64>,
}

impl Targets {
    pub fn for_workload(kind: WorkloadKind) -> Targets {
        let none = Targets {
            min_ratio: None,
            max_split: None,
            burst_spread: None,
        };
        match kind {
            WorkloadKind::SharedPrefix => Targets {
                min_ratio: Some(0.97),
                max_split: Some(1.3),
                ..none
            },
            WorkloadKind::MultiTurn => Targets {
                min_ratio: Some(0.98),
                max_split: Some(1.5),
                ..none
            },
            // The end-to-end tests: 32 over 2 engines gives 14..=18 each, over 4 gives 6..=10.
            WorkloadKind::Burst => Targets {
                burst_spread: Some(2),
                ..none
            },
            WorkloadKind::Unique => none,
        }
    }

    /// The targets `r` misses (empty: all met). `reference_p99` is the reference gateway's
    /// TTFT p99 on the same run, when it ran.
    pub fn misses(&self, r: &RunReport, reference_p99: Option<f64>) -> Vec<String> {
        let mut out = Vec::new();
        let missing = r.planned.saturating_sub(r.completed);
        if missing > 0 {
            out.push(format!("{missing} not completed"));
        }
        if let (Some(min), Some(ratio)) = (self.min_ratio, r.ratio())
            && ratio < min
        {
            out.push(format!("ratio<{min}"));
        }
        if let Some(max) = self.max_split {
            match r.split_max_min() {
                Some(s) if s <= max => {}
                _ => out.push(format!("split>{max}")),
            }
        }
        if let Some(spread) = self.burst_spread {
            let total: u64 = r.split.iter().sum();
            let n = r.split.len().max(1) as u64;
            let even = total / n;
            if r.split.iter().any(|&c| c.abs_diff(even) > spread) {
                out.push(format!("burst not within {even}±{spread}"));
            }
        }
        if let Some(p99) = reference_p99
            && !r.reference
            && r.ttft_ms.p99 > p99
        {
            out.push("ttft p99>ref".to_owned());
        }
        out
    }
}

/// The reference gateway's TTFT p99 among `rows`, if it ran.
pub fn reference_p99(rows: &[RunReport]) -> Option<f64> {
    rows.iter()
        .find(|r| r.reference && r.completed > 0)
        .map(|r| r.ttft_ms.p99)
}

/// The stdout table for one workload's rows.
pub fn table(rows: &[RunReport]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<24} {:>6} {:>6} {:>6} {:>9} {:>9} {:>7} {:>8} {:<20} {:>7}  targets",
        "policy",
        "hit",
        "ideal",
        "ratio",
        "ttft p50",
        "ttft p99",
        "req/s",
        "tok/s",
        "split",
        "max/min"
    );
    let Some(kind) = rows.first().map(|r| r.workload) else {
        return s;
    };
    let targets = Targets::for_workload(kind);
    let ref_p99 = reference_p99(rows);
    for r in rows {
        let misses = targets.misses(r, ref_p99);
        let split = r
            .split
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join("/");
        let _ = writeln!(
            s,
            "{:<24} {:>6.3} {:>6.3} {:>6} {:>9.1} {:>9.1} {:>7.1} {:>8.0} {:<20} {:>7}  {}",
            r.target,
            r.hit_rate(),
            r.ideal.rate(),
            r.ratio().map_or("-".to_owned(), |v| format!("{v:.3}")),
            r.ttft_ms.p50,
            r.ttft_ms.p99,
            r.req_per_sec(),
            r.output_tokens_per_sec(),
            split,
            r.split_max_min()
                .map_or("inf".to_owned(), |v| format!("{v:.2}")),
            if misses.is_empty() {
                "ok".to_owned()
            } else {
                misses.join(", ")
            },
        );
    }
    s
}

/// The SVG comparing the policies of one workload: hit rate over ideal (or the hit rate
/// when nothing is shared), TTFT p99 and the max/min split.
pub fn workload_chart(rows: &[RunReport]) -> String {
    let Some(kind) = rows.first().map(|r| r.workload) else {
        return chart("no runs", "", &[]);
    };
    let targets = Targets::for_workload(kind);
    let bars = |f: &dyn Fn(&RunReport) -> Option<f64>| -> Vec<Bar> {
        rows.iter()
            .map(|r| Bar {
                label: r.target.clone(),
                value: f(r),
            })
            .collect()
    };
    let shares = rows.iter().any(|r| r.ideal.rate() > 0.0);
    let hit_panel = if shares {
        Panel {
            title: "fleet hit rate / ideal".into(),
            bars: bars(&|r| r.ratio()),
            target: targets.min_ratio.map(|t| (t, format!("target {t}"))),
        }
    } else {
        Panel {
            title: "fleet hit rate".into(),
            bars: bars(&|r| Some(r.hit_rate())),
            target: None,
        }
    };
    let ttft = Panel {
        title: "TTFT p99 (ms)".into(),
        bars: bars(&|r| (r.completed > 0).then_some(r.ttft_ms.p99)),
        target: reference_p99(rows).map(|p| (p, "reference".to_owned())),
    };
    let split = Panel {
        title: "request split max/min".into(),
        bars: bars(&|r| r.split_max_min()),
        target: targets.max_split.map(|t| (t, format!("target {t}"))),
    };
    let subtitle = rows.first().map_or("", |r| r.setting.as_str());
    chart(
        &format!("kvgate-bench: {kind}"),
        subtitle,
        &[hit_panel, ttft, split],
    )
}
