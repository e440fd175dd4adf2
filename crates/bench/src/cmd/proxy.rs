//! `kvgate-bench proxy`: one comparison at one body size, or a sweep over sizes drawn as
//! the cost curve.

use std::time::Duration;

use anyhow::Context as _;

use crate::args::ProxyArgs;
use crate::run::proxy::curve::{self, CurvePoint};
use crate::run::proxy::{self, BodySpec, ProxySettings};
use crate::{machine, markdown, release_kvgate, write};

pub(crate) fn run(a: ProxyArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    if a.sweep_kib.is_empty() {
        one_size(&a)
    } else {
        sweep(&a)
    }
}

/// The settings of one comparison with each request's user message `kib` KiB long
/// (`None`: the small default body).
fn settings(a: &ProxyArgs, kib: Option<u64>) -> ProxySettings {
    // The ranges on the arguments keep the sizes well inside usize.
    ProxySettings {
        duration: Duration::from_secs(a.duration_secs),
        rounds: a.rounds as usize,
        connections: a.connections,
        latency_requests: a.latency_requests,
        warmup: a.warmup,
        out: a.out.clone(),
        kvgate_bin: a.kvgate_bin.clone().or_else(release_kvgate),
        baseline_bin: a.baseline_bin.clone(),
        use_wrk: !a.no_wrk,
        skip_smg: a.no_smg,
        skip_nginx: a.no_nginx,
        body: BodySpec {
            kib: kib.map(|k| k as usize),
            unique: a.unique,
        },
        policies: a.policies.clone(),
        max_tree_size: a.max_tree_size,
    }
}

fn one_size(a: &ProxyArgs) -> anyhow::Result<()> {
    let before = machine();
    let rows = proxy::run(&settings(a, a.body_kib))?;
    let after = machine();
    print!("{}", proxy::table(&rows));
    println!("before: {before}\nafter:  {after}");
    let json = serde_json::json!({"machine_before": before, "machine_after": after, "rows": rows});
    write(
        &a.out.join("proxy.json"),
        &serde_json::to_string_pretty(&json)?,
    )?;
    println!("\nwrote {}/proxy.json", a.out.display());
    if let Some(path) = &a.markdown {
        let body = settings(a, a.body_kib).body.describe();
        markdown::update(path, vec![markdown::proxy(&rows, &body)])?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn sweep(a: &ProxyArgs) -> anyhow::Result<()> {
    let before = machine();
    let mut points = Vec::new();
    for &kib in &a.sweep_kib {
        let s = settings(a, Some(kib));
        eprintln!("proxy: sweep at {}", s.body.describe());
        let rows = proxy::run(&s)?;
        print!("{} KiB\n{}", kib, proxy::table(&rows));
        points.push(CurvePoint {
            kib: kib as usize,
            body_bytes: s.body.len(),
            rows,
        });
    }
    let after = machine();
    print!("\n{}", curve::table(&points));
    println!("before: {before}\nafter:  {after}");
    let subtitle = format!(
        "{} connections for req/s, {} sequential requests for p50{}; {after}",
        a.connections,
        a.latency_requests,
        if a.unique { "; unique prompts" } else { "" }
    );
    write(
        &a.out.join("proxy-curve.svg"),
        &curve::chart(&points, &subtitle),
    )?;
    let json =
        serde_json::json!({"machine_before": before, "machine_after": after, "points": points});
    write(
        &a.out.join("proxy-curve.json"),
        &serde_json::to_string_pretty(&json)?,
    )?;
    println!(
        "\nwrote {0}/proxy-curve.json and {0}/proxy-curve.svg",
        a.out.display()
    );
    if let Some(path) = &a.markdown {
        markdown::update(path, vec![markdown::curve(&points, a.unique)])?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
