//! `kvgate-bench workload`: the arguments checked and turned into a fleet, targets and a
//! plan per workload; each workload's runs printed, charted and saved.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use kvgate_bench::{
    EngineTokens, Plan, RunReport, WorkloadKind, WorkloadSpec, table, workload_chart,
};
use kvgate_engine_sim::SimConfig;

use crate::args::WorkloadArgs;
use crate::run::driver::{Arrival, PromptForm};
use crate::run::workload::{Settings, Target, run_target};
use crate::{machine, markdown, run as runner, write};

pub(crate) fn run(a: WorkloadArgs) -> anyhow::Result<()> {
    let kinds: Vec<WorkloadKind> = match a.workload.as_str() {
        "all" => WorkloadKind::ALL.to_vec(),
        w => vec![w.parse()?],
    };
    check(&a)?;
    let smg = reference(a.reference.as_deref())?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let sim = sim_config(&a)?;
    let tokens = EngineTokens::load(sim.tokenizer, a.tokenizer_path.as_deref())
        .context("loading the engines' tokenizer")?;
    let tokens = Arc::new(tokens);
    let targets = targets(&a, smg);

    let sys = actix_rt::System::new();
    println!("before: {}", machine());
    let mut all: Vec<RunReport> = Vec::new();
    let counts = replica_counts(&a);
    for kind in kinds {
        let plan = plan(&a, kind);
        for &replicas in &counts {
            let settings = settings(&a, kind, &plan, &sim, &tokens, replicas);
            println!("\n== {kind}: {}", settings.setting);
            let rows = run_each(&sys, &targets, &plan, &settings);
            print!("{}", table(&rows));
            let name = match counts.len() {
                1 => format!("{kind}.svg"),
                _ => format!("{kind}-{replicas}-replicas.svg"),
            };
            write(&a.out.join(name), &workload_chart(&rows))?;
            all.extend(rows);
        }
    }
    if counts.len() > 1 {
        print!("\n{}", markdown::replicas_text(&all));
    }
    println!("\nafter: {}", machine());
    write(
        &a.out.join("results.json"),
        &serde_json::to_string_pretty(&all)?,
    )?;
    println!(
        "\nwrote {}/results.json and one SVG per workload",
        a.out.display()
    );
    if let Some(path) = &a.markdown {
        let blocks = match counts.len() {
            1 => markdown::workload(&all, &label(&a, counts[0])),
            _ => vec![markdown::replicas(&all, &label(&a, 1))],
        };
        markdown::update(path, blocks)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The replica counts to run, each once, in the order given.
fn replica_counts(a: &WorkloadArgs) -> Vec<usize> {
    let mut counts: Vec<usize> = Vec::new();
    for &n in &a.gateway_replicas {
        // clap's range keeps each count within 1..=8.
        let n = n as usize;
        if !counts.contains(&n) {
            counts.push(n);
        }
    }
    if counts.is_empty() {
        counts.push(1);
    }
    counts
}

/// What clap's types cannot say about the arguments.
fn check(a: &WorkloadArgs) -> anyhow::Result<()> {
    if a.engines == 0 || a.burst_engines == 0 {
        bail!("--engines and --burst-engines must be at least 1");
    }
    if a.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        bail!("--rate must be a positive number");
    }
    if a.idle_gauges.is_empty() || a.idle_gauges.iter().any(|g| !(g.is_finite() && *g >= 0.0)) {
        bail!("--idle-gauges takes non-negative numbers");
    }
    if a.kv_events && a.prompt_form == PromptForm::Chat && a.tokenizer_path.is_none() {
        bail!(
            "--kv-events with chat prompts needs --tokenizer-path: kvgate matches text on the events through the model's tokenizer"
        );
    }
    Ok(())
}

/// The reference gateway's binary, when asked for and installed.
fn reference(name: Option<&str>) -> anyhow::Result<Option<PathBuf>> {
    match name {
        None => Ok(None),
        Some("smg") => {
            let bin = runner::child::which("smg");
            if bin.is_none() {
                eprintln!(
                    "smg not found: install the reference with `pip install smg==1.13.0`; skipping it"
                );
            }
            Ok(bin)
        }
        Some(other) => bail!("unknown --reference '{other}' (expected smg)"),
    }
}

/// One engine's configuration; each engine then gets its own idle gauge.
fn sim_config(a: &WorkloadArgs) -> anyhow::Result<SimConfig> {
    Ok(SimConfig {
        max_running_requests: a.max_running_requests,
        prefill_tokens_per_sec: a.prefill_tokens_per_sec,
        decode_step_base: Duration::try_from_secs_f64(a.decode_step_base_ms / 1e3)
            .context("--decode-step-base-ms")?,
        decode_step_per_req: Duration::try_from_secs_f64(a.decode_step_per_req_ms / 1e3)
            .context("--decode-step-per-req-ms")?,
        page_size: a.page_size,
        cache_capacity_tokens: a.pool_tokens,
        tokenizer_path: a.tokenizer_path.clone(),
        // The hit rate is read from the answers, as from a real engine with its cache report on.
        enable_cache_report: true,
        ..SimConfig::default()
    })
}

/// Each kvgate policy (and its event-fed twin with `--kv-events`), then the reference.
fn targets(a: &WorkloadArgs, smg: Option<PathBuf>) -> Vec<Target> {
    let mut targets: Vec<Target> = Vec::new();
    for policy in &a.policies {
        targets.push(Target::Kvgate {
            policy: policy.clone(),
            events: false,
        });
        if a.kv_events {
            targets.push(Target::Kvgate {
                policy: policy.clone(),
                events: true,
            });
        }
    }
    targets.extend(smg.map(Target::Smg));
    targets
}

fn plan(a: &WorkloadArgs, kind: WorkloadKind) -> Plan {
    let spec = WorkloadSpec {
        kind,
        groups: a.groups,
        prompts_per_group: a.prompts_per_group,
        system_tokens: a.system_tokens,
        question_tokens: a.question_tokens,
        conversations: a.conversations,
        turns: a.turns,
        burst_size: a.burst_size,
        max_tokens: a.max_tokens,
        private_system: a.private_system,
        seed: a.seed,
    };
    let mut plan = Plan::build(&spec);
    plan.truncate(a.max_requests);
    plan
}

/// The settings of every run of one workload.
fn settings(
    a: &WorkloadArgs,
    kind: WorkloadKind,
    plan: &Plan,
    sim: &SimConfig,
    tokens: &Arc<EngineTokens>,
    replicas: usize,
) -> Settings {
    let engines = if kind == WorkloadKind::Burst {
        a.burst_engines
    } else {
        a.engines
    };
    let arrival = match (kind, a.rate) {
        (WorkloadKind::Burst, _) => Arrival::Closed(plan.len()),
        (_, Some(rate)) => Arrival::Poisson(rate),
        (_, None) => Arrival::Closed(a.concurrency),
    };
    Settings {
        sims: (0..engines)
            .map(|i| SimConfig {
                initial_gen_throughput: a.idle_gauges[i % a.idle_gauges.len()],
                ..sim.clone()
            })
            .collect(),
        start_after: a.start_after_ms.map(Duration::from_millis),
        arrival,
        seed: a.seed,
        max_wall: Duration::from_secs(a.max_run_secs),
        request_timeout: Duration::from_secs(a.max_run_secs),
        log_dir: a.out.clone(),
        setting: describe(a, plan, engines, arrival, replicas),
        replicas,
        form: a.prompt_form,
        tokens: Arc::clone(tokens),
        kv_events: a.kv_events,
        warm_engines: a.warm_engines,
        prelude: prelude(a),
    }
}

/// The uncounted traffic before the plan (`--prelude-conversations`), if any.
fn prelude(a: &WorkloadArgs) -> Option<Plan> {
    (a.prelude_conversations > 0).then(|| {
        Plan::build(&WorkloadSpec {
            conversations: a.prelude_conversations,
            turns: a.turns,
            system_tokens: a.system_tokens,
            question_tokens: a.question_tokens,
            max_tokens: a.max_tokens,
            private_system: true,
            // Other prompts than the plan's.
            seed: a.seed ^ 0x7e1d_e000,
            ..WorkloadSpec::new(WorkloadKind::MultiTurn)
        })
    })
}

/// The run's setting in words, for the table's heading and the chart's subtitle.
fn describe(
    a: &WorkloadArgs,
    plan: &Plan,
    engines: usize,
    arrival: Arrival,
    replicas: usize,
) -> String {
    let load = match arrival {
        Arrival::Closed(c) => format!("closed loop, {c} in flight"),
        Arrival::Poisson(r) => format!("Poisson {r}/s"),
    };
    let start = match a.start_after_ms {
        Some(ms) => format!(", traffic {ms} ms after the gateway starts"),
        None => String::new(),
    };
    let replicas = match replicas {
        1 => String::new(),
        n => format!(", {n} gateway replicas"),
    };
    let warm = if a.warm_engines { ", engines warm" } else { "" };
    let prelude = match a.prelude_conversations {
        0 => String::new(),
        n => format!(", after {n} other conversations"),
    };
    let form = match a.prompt_form {
        PromptForm::Chat => "chat",
        PromptForm::Tokens => "token prompts",
    };
    format!(
        "{} requests ({form}), {engines} engines x {} slots, pool {} tokens, {load}{start}{replicas}{warm}{prelude}, seed {}",
        plan.len(),
        a.max_running_requests,
        a.pool_tokens,
        a.seed
    )
}

/// The setting in a few words, the key of a row in the markdown tables: the prompts' form
/// and what differs from a fresh fleet behind one gateway that waits for its first reports.
fn label(a: &WorkloadArgs, replicas: usize) -> String {
    let mut parts = vec![match a.prompt_form {
        PromptForm::Chat => "chat".to_owned(),
        PromptForm::Tokens => "tokens".to_owned(),
    }];
    if a.warm_engines {
        parts.push("warm engines".to_owned());
    }
    if a.prelude_conversations > 0 {
        parts.push(format!("after {} conversations", a.prelude_conversations));
    }
    if replicas > 1 {
        parts.push(format!("{replicas} replicas"));
    }
    if a.pool_tokens != 200_000 {
        parts.push(format!("pools of {} tokens", a.pool_tokens));
    }
    if let Some(ms) = a.start_after_ms {
        parts.push(format!("traffic after {ms} ms"));
    }
    parts.join(", ")
}

/// Every target on `plan`, each on a fresh fleet; a target that fails is reported and left
/// out of the rows.
fn run_each(
    sys: &actix_rt::SystemRunner,
    targets: &[Target],
    plan: &Plan,
    settings: &Settings,
) -> Vec<RunReport> {
    let mut rows = Vec::new();
    for t in targets {
        eprintln!("  running {} ...", t.label());
        match run_target(sys, t, plan, settings) {
            Ok(r) => {
                for e in &r.errors {
                    eprintln!("    {}: {e}", r.target);
                }
                rows.push(r);
            }
            Err(e) => eprintln!("  {}: {e:#}", t.label()),
        }
    }
    rows
}
