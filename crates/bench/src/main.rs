//! `kvgate-bench`: the routing benchmark (`workload`), the proxy-overhead benchmark
//! (`proxy`) and the resilience soak (`soak`). Everything runs on loopback and stops by
//! itself.

mod run;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand};
use kvgate_bench::{
    EngineTokens, Plan, RunReport, WorkloadKind, WorkloadSpec, table, workload_chart,
};
use kvgate_engine_sim::SimConfig;
use kvgate_policies::PolicyKind;

use run::driver::{Arrival, PromptForm};
use run::workload::{PolicyChoice, Settings, Target, run_target};

/// Workload and proxy-overhead benchmarks for kvgate.
#[derive(Debug, Parser)]
#[command(name = "kvgate-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Each policy on a fresh simulated fleet and gateway, on the same seeded workload.
    Workload(WorkloadArgs),
    /// Requests/s and added latency of a proxy hop to a fixed-response upstream.
    Proxy(ProxyArgs),
    /// Redraws the per-workload SVGs (and tables) from a `results.json`.
    Chart(ChartArgs),
    /// A long run of mixed traffic with engines killed and restarted: what is lost, and
    /// whether memory and in-flight counts stay flat.
    Soak(SoakArgs),
    /// The gateway's resident memory per request in flight, for large prompts held by a
    /// slow engine.
    Inflight(InflightArgs),
}

#[derive(Debug, Args)]
struct InflightArgs {
    /// Each request's user message, in KiB.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=65536))]
    body_kib: u64,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 32)]
    requests: usize,
    /// Seconds the engine holds each request.
    #[arg(long, default_value_t = 5)]
    hold_secs: u64,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    #[arg(long, default_value = "cache_aware")]
    policy: PolicyKind,
    /// The `kvgate` binary (default: the release one beside this binary).
    #[arg(long)]
    kvgate_bin: Option<PathBuf>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(Debug, Args)]
struct SoakArgs {
    /// Length of the run, in seconds.
    #[arg(long, default_value_t = 600)]
    duration_secs: u64,
    /// Requests per second, half streamed (one client in ten hangs up mid-stream).
    #[arg(long, default_value_t = 40.0)]
    rate: f64,
    #[arg(long, default_value_t = 4)]
    engines: usize,
    /// One engine is killed and started again this often, in seconds.
    #[arg(long, default_value_t = 60)]
    restart_every_secs: u64,
    /// The `kvgate` binary (default: the release one beside this binary).
    #[arg(long)]
    kvgate_bin: Option<PathBuf>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(Debug, Args)]
struct ChartArgs {
    #[arg(long, default_value = "bench-out/results.json")]
    results: PathBuf,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(Debug, Args)]
struct WorkloadArgs {
    /// shared-prefix, multi-turn, burst, unique, or all.
    #[arg(long, default_value = "all")]
    workload: String,
    #[arg(long, default_value_t = 4)]
    engines: usize,
    /// Engines for the burst workload (the reference setting: 32 prompts onto 2 engines).
    #[arg(long, default_value_t = 2)]
    burst_engines: usize,
    /// Comma-separated; `cache_aware:threshold` / `cache_aware:cost` pick the mode.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "cache_aware,cache_aware:threshold,least_load,power_of_two,round_robin,prefix_hash"
    )]
    policies: Vec<PolicyChoice>,
    #[arg(long, default_value_t = 8)]
    groups: usize,
    #[arg(long, default_value_t = 16)]
    prompts_per_group: usize,
    #[arg(long, default_value_t = 1000)]
    system_tokens: usize,
    #[arg(long, default_value_t = 50)]
    question_tokens: usize,
    #[arg(long, default_value_t = 16)]
    conversations: usize,
    #[arg(long, default_value_t = 4)]
    turns: usize,
    #[arg(long, default_value_t = 32)]
    burst_size: usize,
    /// Completion tokens per request.
    #[arg(long, default_value_t = 16)]
    max_tokens: usize,
    /// Closed loop: requests in flight (burst sends all at once regardless).
    #[arg(long, default_value_t = 32, conflicts_with = "rate")]
    concurrency: usize,
    /// Open loop: Poisson session arrivals per second (seeded).
    #[arg(long)]
    rate: Option<f64>,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// `smg`: also run the reference gateway (cache_aware) on a fresh fleet.
    #[arg(long)]
    reference: Option<String>,
    #[arg(long, default_value_t = 16)]
    max_running_requests: usize,
    #[arg(long, default_value_t = 20_000.0)]
    prefill_tokens_per_sec: f64,
    #[arg(long, default_value_t = 10.0)]
    decode_step_base_ms: f64,
    #[arg(long, default_value_t = 0.5)]
    decode_step_per_req_ms: f64,
    /// Tokens per KV page on the engines (SGLang's default is 1).
    #[arg(long, default_value_t = 1)]
    page_size: usize,
    /// Multi-turn: each conversation has its own system prompt (nothing shared between
    /// conversations).
    #[arg(long)]
    private_system: bool,
    /// Start the traffic this many ms after the gateway answers, whatever it has learned by
    /// then (a fresh start); by default kvgate first waits for a load report from every
    /// engine and smg gets 1 s.
    #[arg(long)]
    start_after_ms: Option<u64>,
    /// The `gen_throughput` each idle engine shows at start (a stale value left by earlier
    /// probes or traffic), comma-separated, repeated over the engines in order.
    #[arg(long, value_delimiter = ',', default_value = "0.36")]
    idle_gauges: Vec<f64>,
    /// Also run each kvgate policy in front of engines that publish KV events (rows
    /// `<policy>+events`: the exact index); the plain rows' engines publish none. smg's
    /// engines publish them too.
    #[arg(long)]
    kv_events: bool,
    /// chat: `/v1/chat/completions`; tokens: `/generate` with `input_ids`, the same chats
    /// rendered and encoded with the engines' tokenizer.
    #[arg(long, value_enum, default_value = "chat")]
    prompt_form: PromptForm,
    /// The engines tokenize with this model tokenizer (a directory with `tokenizer.json`,
    /// e.g. tests/fixtures/tokenizer) and render chats with its template; kvgate loads it
    /// from the path they advertise.
    #[arg(long)]
    tokenizer_path: Option<PathBuf>,
    /// Each engine's KV pool in tokens (SGLang's `max_total_num_tokens`), shared by running
    /// requests and the prefix cache, which evicts LRU to admit requests.
    #[arg(long, default_value_t = 200_000)]
    pool_tokens: usize,
    /// Gateway instances in front of each fleet (kvgate and smg alike); request i of the
    /// plan goes to instance i mod N, as behind a balancer without session affinity.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=8))]
    gateway_replicas: u64,
    /// Before each gateway starts, each prompt group (conversation) has already been served
    /// once by an engine, group g by engine g mod N, with a question the plan never asks:
    /// a gateway restarted or added in front of a busy fleet.
    #[arg(long)]
    warm_engines: bool,
    /// Cap on requests per run.
    #[arg(long, default_value_t = 10_000)]
    max_requests: usize,
    /// Cap on one run's wall-clock time, in seconds.
    #[arg(long, default_value_t = 300)]
    max_run_secs: u64,
}

#[derive(Debug, Args)]
struct ProxyArgs {
    /// Seconds of saturation load per target, in all.
    #[arg(long, default_value_t = 10)]
    duration_secs: u64,
    /// The saturation load in this many turns per target, the order of the targets
    /// reversed every turn (one turn each made an A/B one sample of the machine's drift).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    rounds: u64,
    /// Connections of the saturation load.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Sequential requests on one connection, after the warm-up.
    #[arg(long, default_value_t = 5000)]
    latency_requests: usize,
    #[arg(long, default_value_t = 500)]
    warmup: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// The `kvgate` binary to run as a child (default: `kvgate` beside this binary when
    /// this is a release build; otherwise kvgate runs in-process).
    #[arg(long)]
    kvgate_bin: Option<PathBuf>,
    /// A second `kvgate` binary (an older build, say) measured as `kvgate-baseline` in
    /// the same interleaved rounds, for an A/B that shares the machine's noise.
    #[arg(long)]
    baseline_bin: Option<PathBuf>,
    /// Use the built-in closed-loop generator even when wrk is installed.
    #[arg(long)]
    no_wrk: bool,
    #[arg(long)]
    no_smg: bool,
    #[arg(long)]
    no_nginx: bool,
    /// Send a chat completion whose user message is N KiB of text, instead of the default
    /// small one ("Hello!", 91 bytes in all), to measure the cost of larger prompt bodies.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=32768))]
    body_kib: Option<u64>,
    /// With --body-kib or --sweep-kib: a different prompt on every request (each starts
    /// with its own tag), so every request inserts into kvgate's prefix tree.
    #[arg(long)]
    unique: bool,
    /// kvgate's policies, comma-separated, one target each (`kvgate` for round_robin,
    /// `kvgate-<policy>` for the others).
    #[arg(long, value_delimiter = ',', default_value = "round_robin")]
    policies: Vec<PolicyKind>,
    /// kvgate's --max-tree-size (units per model and tree).
    #[arg(long)]
    max_tree_size: Option<u64>,
    /// Run the whole comparison at each of these body sizes (KiB, comma-separated) and
    /// draw the cost curve: `proxy-curve.json` and `proxy-curve.svg`.
    #[arg(long, value_delimiter = ',', conflicts_with = "body_kib",
          value_parser = clap::value_parser!(u64).range(1..=32768))]
    sweep_kib: Vec<u64>,
}

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
        Cmd::Workload(a) => workload(a),
        Cmd::Proxy(a) => proxy(a),
        Cmd::Chart(a) => redraw(a),
        Cmd::Soak(a) => soak(a),
        Cmd::Inflight(a) => inflight(a),
    }
}

fn soak(a: SoakArgs) -> anyhow::Result<()> {
    if !(a.rate.is_finite() && a.rate > 0.0) || a.engines < 2 || a.restart_every_secs == 0 {
        bail!("--rate must be positive, --engines at least 2, --restart-every-secs at least 1");
    }
    let Some(kvgate_bin) = a.kvgate_bin.clone().or_else(release_kvgate) else {
        bail!(
            "no release kvgate beside this binary: build it (cargo build --release -p kvgate-gateway --bin kvgate) or give --kvgate-bin"
        );
    };
    let settings = run::soak::SoakSettings {
        duration: Duration::from_secs(a.duration_secs),
        rate: a.rate,
        engines: a.engines,
        restart_every: Duration::from_secs(a.restart_every_secs),
        kvgate_bin,
        out: a.out.clone(),
    };
    let r = run::soak::run(&settings)?;
    println!("{}", serde_json::to_string_pretty(&r)?);
    println!("\nwrote {}/soak.json", a.out.display());
    Ok(())
}

fn inflight(a: InflightArgs) -> anyhow::Result<()> {
    let Some(kvgate_bin) = a.kvgate_bin.clone().or_else(release_kvgate) else {
        bail!(
            "no release kvgate beside this binary: build it (cargo build --release -p kvgate-gateway --bin kvgate) or give --kvgate-bin"
        );
    };
    if a.requests == 0 || a.rounds == 0 || a.hold_secs == 0 {
        bail!("--requests, --rounds and --hold-secs must be at least 1");
    }
    let settings = run::inflight::InflightSettings {
        kvgate_bin,
        policy: a.policy,
        // The range above keeps this well inside usize.
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

fn redraw(a: ChartArgs) -> anyhow::Result<()> {
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

fn workload(a: WorkloadArgs) -> anyhow::Result<()> {
    let kinds: Vec<WorkloadKind> = match a.workload.as_str() {
        "all" => WorkloadKind::ALL.to_vec(),
        w => vec![w.parse()?],
    };
    if a.engines == 0 || a.burst_engines == 0 {
        bail!("--engines and --burst-engines must be at least 1");
    }
    if a.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        bail!("--rate must be a positive number");
    }
    let smg = match a.reference.as_deref() {
        None => None,
        Some("smg") => match run::child::which("smg") {
            Some(bin) => Some(bin),
            None => {
                eprintln!(
                    "smg not found: install the reference with `pip install smg==1.13.0`; skipping it"
                );
                None
            }
        },
        Some(other) => bail!("unknown --reference '{other}' (expected smg)"),
    };
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    if a.idle_gauges.is_empty() || a.idle_gauges.iter().any(|g| !(g.is_finite() && *g >= 0.0)) {
        bail!("--idle-gauges takes non-negative numbers");
    }
    let sim = SimConfig {
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
    };
    let sims = |n: usize| -> Vec<SimConfig> {
        (0..n)
            .map(|i| SimConfig {
                initial_gen_throughput: a.idle_gauges[i % a.idle_gauges.len()],
                ..sim.clone()
            })
            .collect()
    };
    if a.kv_events && a.prompt_form == PromptForm::Chat && a.tokenizer_path.is_none() {
        bail!(
            "--kv-events with chat prompts needs --tokenizer-path: kvgate matches text on the events through the model's tokenizer"
        );
    }
    let tokens = EngineTokens::load(sim.tokenizer, a.tokenizer_path.as_deref())
        .context("loading the engines' tokenizer")?;
    let tokens = std::sync::Arc::new(tokens);
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
    if let Some(bin) = smg {
        targets.push(Target::Smg(bin));
    }

    let sys = actix_rt::System::new();
    println!("before: {}", machine());
    let mut all: Vec<RunReport> = Vec::new();
    for kind in kinds {
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
        let load = match arrival {
            Arrival::Closed(c) => format!("closed loop, {c} in flight"),
            Arrival::Poisson(r) => format!("Poisson {r}/s"),
        };
        let start = match a.start_after_ms {
            Some(ms) => format!(", traffic {ms} ms after the gateway starts"),
            None => String::new(),
        };
        let replicas = match a.gateway_replicas {
            1 => String::new(),
            n => format!(", {n} gateway replicas"),
        };
        let warm = if a.warm_engines { ", engines warm" } else { "" };
        let form = match a.prompt_form {
            PromptForm::Chat => "chat",
            PromptForm::Tokens => "token prompts",
        };
        let subtitle = format!(
            "{} requests ({form}), {engines} engines x {} slots, pool {} tokens, {load}{start}{replicas}{warm}, seed {}",
            plan.len(),
            a.max_running_requests,
            a.pool_tokens,
            a.seed
        );
        let settings = Settings {
            sims: sims(engines),
            start_after: a.start_after_ms.map(Duration::from_millis),
            arrival,
            seed: a.seed,
            max_wall: Duration::from_secs(a.max_run_secs),
            request_timeout: Duration::from_secs(a.max_run_secs),
            log_dir: a.out.clone(),
            setting: subtitle.clone(),
            // The range above keeps this small.
            replicas: a.gateway_replicas as usize,
            form: a.prompt_form,
            tokens: std::sync::Arc::clone(&tokens),
            kv_events: a.kv_events,
            warm_engines: a.warm_engines,
        };
        println!("\n== {kind}: {subtitle}");
        let mut rows = Vec::new();
        for t in &targets {
            eprintln!("  running {} ...", t.label());
            match run_target(&sys, t, &plan, &settings) {
                Ok(r) => {
                    for e in &r.errors {
                        eprintln!("    {}: {e}", r.target);
                    }
                    rows.push(r);
                }
                Err(e) => eprintln!("  {}: {e:#}", t.label()),
            }
        }
        print!("{}", table(&rows));
        let svg = a.out.join(format!("{kind}.svg"));
        write(&svg, &workload_chart(&rows))?;
        all.extend(rows);
    }
    println!("\nafter: {}", machine());
    let json = serde_json::to_string_pretty(&all)?;
    write(&a.out.join("results.json"), &json)?;
    println!(
        "\nwrote {}/results.json and one SVG per workload",
        a.out.display()
    );
    Ok(())
}

fn proxy(a: ProxyArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let kvgate_bin = a.kvgate_bin.clone().or_else(release_kvgate);
    // The ranges above keep the sizes well inside usize.
    let settings = |kib: Option<u64>| run::proxy::ProxySettings {
        duration: Duration::from_secs(a.duration_secs),
        rounds: a.rounds as usize,
        connections: a.connections,
        latency_requests: a.latency_requests,
        warmup: a.warmup,
        out: a.out.clone(),
        kvgate_bin: kvgate_bin.clone(),
        baseline_bin: a.baseline_bin.clone(),
        use_wrk: !a.no_wrk,
        skip_smg: a.no_smg,
        skip_nginx: a.no_nginx,
        body: run::proxy::BodySpec {
            kib: kib.map(|k| k as usize),
            unique: a.unique,
        },
        policies: a.policies.clone(),
        max_tree_size: a.max_tree_size,
    };
    let before = machine();
    if a.sweep_kib.is_empty() {
        let rows = run::proxy::run(&settings(a.body_kib))?;
        let after = machine();
        print!("{}", run::proxy::table(&rows));
        println!("before: {before}\nafter:  {after}");
        let json =
            serde_json::json!({"machine_before": before, "machine_after": after, "rows": rows});
        write(
            &a.out.join("proxy.json"),
            &serde_json::to_string_pretty(&json)?,
        )?;
        println!("\nwrote {}/proxy.json", a.out.display());
        return Ok(());
    }
    let mut points = Vec::new();
    for &kib in &a.sweep_kib {
        let s = settings(Some(kib));
        eprintln!("proxy: sweep at {}", s.body.describe());
        let rows = run::proxy::run(&s)?;
        print!("{} KiB\n{}", kib, run::proxy::table(&rows));
        points.push(run::proxy::curve::CurvePoint {
            kib: kib as usize,
            body_bytes: s.body.len(),
            rows,
        });
    }
    let after = machine();
    print!("\n{}", run::proxy::curve::table(&points));
    println!("before: {before}\nafter:  {after}");
    let subtitle = format!(
        "{} connections for req/s, {} sequential requests for p50{}; {after}",
        a.connections,
        a.latency_requests,
        if a.unique { "; unique prompts" } else { "" }
    );
    write(
        &a.out.join("proxy-curve.svg"),
        &run::proxy::curve::chart(&points, &subtitle),
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
    Ok(())
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
