//! Each subcommand's side of the binary: its arguments checked and turned into the
//! benchmark's settings, and its outputs written (the stdout table, JSON, SVG, and with
//! `--markdown` the page's tables).

pub(crate) mod fleet;
pub(crate) mod proxy;
pub(crate) mod workload;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use kvgate_bench::{RunReport, WorkloadKind, table, workload_chart};

use crate::args::{ChartArgs, InflightArgs, SoakArgs};
use crate::{markdown, release_kvgate, run, write};

/// The `kvgate` to run as a child: `--kvgate-bin`, else the release one beside this binary.
pub(crate) fn kvgate_bin(given: Option<&PathBuf>) -> anyhow::Result<PathBuf> {
    match given.cloned().or_else(release_kvgate) {
        Some(bin) => Ok(bin),
        None => bail!(
            "no release kvgate beside this binary: build it (cargo build --release -p kvgate) or give --kvgate-bin"
        ),
    }
}

pub(crate) fn soak(a: SoakArgs) -> anyhow::Result<()> {
    if !(a.rate.is_finite() && a.rate > 0.0) || a.engines < 2 || a.restart_every_secs == 0 {
        bail!("--rate must be positive, --engines at least 2, --restart-every-secs at least 1");
    }
    let settings = run::soak::SoakSettings {
        duration: Duration::from_secs(a.duration_secs),
        rate: a.rate,
        engines: a.engines,
        restart_every: Duration::from_secs(a.restart_every_secs),
        kvgate_args: a.kvgate_args.clone(),
        prompt_bytes: a.prompt_bytes,
        kvgate_bin: kvgate_bin(a.kvgate_bin.as_ref())?,
        out: a.out.clone(),
    };
    let r = run::soak::run(&settings)?;
    println!("{}", serde_json::to_string_pretty(&r)?);
    println!("\nwrote {}/soak.json", a.out.display());
    if let Some(path) = &a.markdown {
        markdown::update(path, vec![markdown::soak(&r)])?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

pub(crate) fn inflight(a: InflightArgs) -> anyhow::Result<()> {
    let kvgate_bin = kvgate_bin(a.kvgate_bin.as_ref())?;
    if a.requests == 0 || a.rounds == 0 || a.hold_secs == 0 {
        bail!("--requests, --rounds and --hold-secs must be at least 1");
    }
    let settings = run::inflight::InflightSettings {
        kvgate_bin,
        policy: a.policy,
        // The range on --body-kib keeps this well inside usize.
        kib: a.body_kib as usize,
        requests: a.requests,
        hold: Duration::from_secs(a.hold_secs),
        rounds: a.rounds,
        out: a.out.clone(),
    };
    let r = run::inflight::run(&settings)?;
    println!("{}", serde_json::to_string_pretty(&r)?);
    println!("\nwrote {}/inflight.json", a.out.display());
    Ok(())
}

pub(crate) fn redraw(a: ChartArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.results)
        .with_context(|| format!("reading {}", a.results.display()))?;
    let rows: Vec<RunReport> = serde_json::from_str(&text).context("parsing results")?;
    std::fs::create_dir_all(&a.out)?;
    for kind in WorkloadKind::ALL {
        let of_kind: Vec<RunReport> = rows
            .iter()
            .filter(|r| r.workload == kind)
            .cloned()
            .collect();
        if of_kind.is_empty() {
            continue;
        }
        println!("\n== {kind}");
        print!("{}", table(&of_kind));
        write(
            &a.out.join(format!("{kind}.svg")),
            &workload_chart(&of_kind),
        )?;
    }
    Ok(())
}
