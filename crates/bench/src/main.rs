//! `kvgate-bench`: the routing benchmark (`workload`), the proxy-overhead benchmark
//! (`proxy`), the resilience soak (`soak`), memory in flight (`inflight`), and fleets of
//! hundreds of engines (`decide`, `polls`, `memory`). Everything runs on loopback and stops
//! by itself.

mod args;
mod cmd;
mod markdown;
mod run;

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Parser as _;

use args::{Cli, Cmd};

fn main() -> anyhow::Result<()> {
    // The in-process engines and gateways get the allocator settings kvgate runs with.
    kvgate_gateway::keep_freed_memory();
    // The in-process gateways log only when asked, e.g.
    // KVGATE_BENCH_LOG=kvgate_gateway::actors::selector=debug for every routing decision.
    if let Ok(filter) = std::env::var("KVGATE_BENCH_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    match Cli::parse().cmd {
        Cmd::Workload(a) => cmd::workload::run(a),
        Cmd::Proxy(a) => cmd::proxy::run(a),
        Cmd::Chart(a) => cmd::redraw(a),
        Cmd::Soak(a) => cmd::soak(a),
        Cmd::Inflight(a) => cmd::inflight(a),
        Cmd::Decide(a) => cmd::fleet::decide(a),
        Cmd::Polls(a) => cmd::fleet::polls(a),
        Cmd::Memory(a) => cmd::fleet::memory(a),
    }
}

/// `kvgate` beside this binary, when this binary is a release build.
fn release_kvgate() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let bin = dir.join("kvgate");
    (dir.file_name()? == "release" && bin.is_file()).then_some(bin)
}

/// Cores and load average, so a figure says how busy the machine was.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!("{cores} cores, load average {}", load.join(" "))
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
