//! `decide`, `polls` and `memory`: fleets of hundreds of engines, their arguments checked
//! and their reports written (stdout, JSON under `--out`).

use std::time::Duration;

use anyhow::bail;

use super::kvgate_bin;
use crate::args::{DecideArgs, MemoryArgs, PollsArgs};
use crate::run::fleet::{self, DecideSettings, memory, polls};
use crate::write;

pub(crate) fn decide(a: DecideArgs) -> anyhow::Result<()> {
    if a.engines.contains(&0) || a.dp_size.contains(&0) || a.decisions == 0 {
        bail!("--engines, --dp-size and --decisions must be at least 1");
    }
    if !(0.0..=1.0).contains(&a.fresh_share) {
        bail!("--fresh-share must be within 0 and 1");
    }
    if a.head_bytes > a.prompt_bytes || a.max_tree_size < a.prompt_bytes {
        bail!("--head-bytes must fit in --prompt-bytes, and a prompt in --max-tree-size");
    }
    let mut rows = Vec::new();
    for &dp_size in &a.dp_size {
        for &engines in &a.engines {
            let s = DecideSettings {
                engines,
                dp_size,
                max_tree_size: a.max_tree_size,
                decisions: a.decisions,
                prompt_bytes: a.prompt_bytes,
                head_bytes: a.head_bytes,
                groups: a.groups,
                fresh_share: a.fresh_share,
                seed: a.seed,
            };
            let r = fleet::run(&s);
            eprintln!(
                "{engines} × {dp_size}: match + select p50 {:.1} µs, p99 {:.1} µs ({} warm-up decisions, tree {} of {} units)",
                r.match_and_select.p50,
                r.match_and_select.p99,
                r.warmup_decisions,
                r.tree_units,
                r.tree_budget
            );
            rows.push(r);
        }
    }
    println!("{}", serde_json::to_string_pretty(&rows)?);
    println!("\n{}", fleet::table(&rows));
    println!("{}", crate::machine());
    std::fs::create_dir_all(&a.out)?;
    write(
        &a.out.join("decide.json"),
        &serde_json::to_string_pretty(&rows)?,
    )?;
    println!("wrote {}/decide.json", a.out.display());
    Ok(())
}

pub(crate) fn polls(a: PollsArgs) -> anyhow::Result<()> {
    if a.engines == 0 || !(a.interval_secs.is_finite() && a.interval_secs > 0.0) {
        bail!("--engines must be at least 1 and --interval-secs positive");
    }
    if a.duration_secs == 0 || a.window_ms == 0 {
        bail!("--duration-secs and --window-ms must be at least 1");
    }
    let s = polls::PollSettings {
        kvgate_bin: kvgate_bin(a.kvgate_bin.as_ref())?,
        engines: a.engines,
        interval: Duration::from_secs_f64(a.interval_secs),
        warmup: Duration::from_secs(a.warmup_secs),
        duration: Duration::from_secs(a.duration_secs),
        window: Duration::from_millis(a.window_ms),
        out: a.out.clone(),
    };
    let r = polls::run(&s)?;
    let json = serde_json::to_string_pretty(&r)?;
    println!("{json}");
    write(&a.out.join("polls.json"), &json)?;
    println!("\nwrote {}/polls.json", a.out.display());
    Ok(())
}

pub(crate) fn memory(a: MemoryArgs) -> anyhow::Result<()> {
    let s = memory::MemorySettings {
        kvgate_bin: kvgate_bin(a.kvgate_bin.as_ref())?,
        engines: a.engines,
        dp_size: a.dp_size,
        settle: Duration::from_secs(a.settle_secs.max(3)),
        out: a.out.clone(),
    };
    let r = memory::run(&s)?;
    let json = serde_json::to_string_pretty(&r)?;
    println!("{json}");
    write(&a.out.join("memory.json"), &json)?;
    println!("\nwrote {}/memory.json", a.out.display());
    Ok(())
}
