//! The command line: one argument type per subcommand. Only this module knows clap's
//! derive; `main` turns the parsed arguments into each benchmark's settings.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use kvgate_policies::PolicyKind;

use crate::run::driver::PromptForm;
use crate::run::workload::PolicyChoice;

/// Workload and proxy-overhead benchmarks for kvgate.
#[derive(Debug, Parser)]
#[command(name = "kvgate-bench", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Cmd {
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
    /// The cost of one routing decision (match plus select) over fleets of many engines,
    /// the prefix tree at its budget; in process.
    Decide(DecideArgs),
    /// When a release `kvgate` polls the loads of many engines on loopback: requests per
    /// engine per interval, and the most in any window of it.
    Polls(PollsArgs),
    /// A release `kvgate`'s resident memory per engine and per KV-event subscription.
    Memory(MemoryArgs),
}

#[derive(Debug, Args)]
pub(crate) struct DecideArgs {
    /// Fleet sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "64,128,256")]
    pub engines: Vec<usize>,
    /// Data-parallel ranks per engine, each its own routing target; comma-separated, each
    /// size run with each.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub dp_size: Vec<usize>,
    /// The tree's budget in text bytes (the gateway's `--max-tree-size` default).
    #[arg(long, default_value_t = 1 << 24)]
    pub max_tree_size: usize,
    /// Timed decisions per fleet, after the tree has reached its budget.
    #[arg(long, default_value_t = 20_000)]
    pub decisions: usize,
    #[arg(long, default_value_t = 4096)]
    pub prompt_bytes: usize,
    /// Each prompt starts with one of `--groups` shared heads of this many bytes.
    #[arg(long, default_value_t = 2048)]
    pub head_bytes: usize,
    #[arg(long, default_value_t = 512)]
    pub groups: usize,
    /// Share of prompts with no shared head (a new conversation, placed by rendezvous).
    #[arg(long, default_value_t = 0.1)]
    pub fresh_share: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct PollsArgs {
    #[arg(long, default_value_t = 256)]
    pub engines: usize,
    /// The gateway's `--load-monitor-interval`, in seconds.
    #[arg(long, default_value_t = 2.0)]
    pub interval_secs: f64,
    /// Left out at the start: the probes and first polls of startup.
    #[arg(long, default_value_t = 4)]
    pub warmup_secs: u64,
    /// The measured span, in seconds.
    #[arg(long, default_value_t = 20)]
    pub duration_secs: u64,
    /// The window the most polls are counted in, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub window_ms: u64,
    /// The `kvgate` binary (default: the release one beside this binary).
    #[arg(long)]
    pub kvgate_bin: Option<PathBuf>,
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct MemoryArgs {
    #[arg(long, default_value_t = 128)]
    pub engines: usize,
    /// Ranks per engine in the fleets with data parallelism, each publishing KV events in
    /// the last one.
    #[arg(long, default_value_t = 8)]
    pub dp_size: usize,
    /// Seconds each gateway runs, once ready, before its memory is read.
    #[arg(long, default_value_t = 15)]
    pub settle_secs: u64,
    /// The `kvgate` binary (default: the release one beside this binary).
    #[arg(long)]
    pub kvgate_bin: Option<PathBuf>,
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct InflightArgs {
    /// Each request's user message, in KiB.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub body_kib: u64,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 32)]
    pub requests: usize,
    /// Seconds the engine holds each request.
    #[arg(long, default_value_t = 5)]
    pub hold_secs: u64,
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    #[arg(long, default_value = "cache_aware")]
    pub policy: PolicyKind,
    /// The `kvgate` binary (default: the release one beside this binary).
    #[arg(long)]
    pub kvgate_bin: Option<PathBuf>,
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct SoakArgs {
    /// Length of the run, in seconds.
    #[arg(long, default_value_t = 600)]
    pub duration_secs: u64,
    /// Requests per second, half streamed (one client in ten hangs up mid-stream).
    #[arg(long, default_value_t = 40.0)]
    pub rate: f64,
    #[arg(long, default_value_t = 4)]
    pub engines: usize,
    /// One engine is killed and started again this often, in seconds.
    #[arg(long, default_value_t = 60)]
    pub restart_every_secs: u64,
    /// Bytes of unique text in each request's user message, so the prefix index fills up to
    /// its budget as real chat traffic fills it (the system prompts are shared by groups).
    #[arg(long, default_value_t = 0)]
    pub prompt_bytes: usize,
    /// One more argument for `kvgate` (repeat it: `--kvgate-arg=--max-tree-size
    /// --kvgate-arg=4194304`).
    #[arg(long = "kvgate-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub kvgate_args: Vec<String>,
    /// The `kvgate` binary (default: the release one beside this binary).
    #[arg(long)]
    pub kvgate_bin: Option<PathBuf>,
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Also write this run's tables, as docs/benchmarks.md shows them, to this file. A
    /// table that lists one value per run gets this run's values appended to those already
    /// in the file (delete it to start afresh); the others are replaced.
    #[arg(long, value_name = "PATH")]
    pub markdown: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct ChartArgs {
    #[arg(long, default_value = "bench-out/results.json")]
    pub results: PathBuf,
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct WorkloadArgs {
    /// shared-prefix, multi-turn, burst, unique, or all.
    #[arg(long, default_value = "all")]
    pub workload: String,
    #[arg(long, default_value_t = 4)]
    pub engines: usize,
    /// Engines for the burst workload (the reference setting: 32 prompts onto 2 engines).
    #[arg(long, default_value_t = 2)]
    pub burst_engines: usize,
    /// Comma-separated; `cache_aware:threshold` / `cache_aware:cost` pick the mode.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "cache_aware,cache_aware:threshold,least_load,power_of_two,round_robin,prefix_hash"
    )]
    pub policies: Vec<PolicyChoice>,
    #[arg(long, default_value_t = 8)]
    pub groups: usize,
    #[arg(long, default_value_t = 16)]
    pub prompts_per_group: usize,
    #[arg(long, default_value_t = 1000)]
    pub system_tokens: usize,
    #[arg(long, default_value_t = 50)]
    pub question_tokens: usize,
    #[arg(long, default_value_t = 16)]
    pub conversations: usize,
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    #[arg(long, default_value_t = 32)]
    pub burst_size: usize,
    /// Completion tokens per request.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: usize,
    /// Closed loop: requests in flight (burst sends all at once regardless).
    #[arg(long, default_value_t = 32, conflicts_with = "rate")]
    pub concurrency: usize,
    /// Open loop: Poisson session arrivals per second (seeded).
    #[arg(long)]
    pub rate: Option<f64>,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// `smg`: also run the reference gateway (cache_aware) on a fresh fleet.
    #[arg(long)]
    pub reference: Option<String>,
    #[arg(long, default_value_t = 16)]
    pub max_running_requests: usize,
    #[arg(long, default_value_t = 20_000.0)]
    pub prefill_tokens_per_sec: f64,
    #[arg(long, default_value_t = 10.0)]
    pub decode_step_base_ms: f64,
    #[arg(long, default_value_t = 0.5)]
    pub decode_step_per_req_ms: f64,
    /// Tokens per KV page on the engines (SGLang's default is 1).
    #[arg(long, default_value_t = 1)]
    pub page_size: usize,
    /// Multi-turn: each conversation has its own system prompt (nothing shared between
    /// conversations).
    #[arg(long)]
    pub private_system: bool,
    /// Start the traffic this many ms after the gateway answers, whatever it has learned by
    /// then (a fresh start); by default kvgate first waits for a load report from every
    /// engine and smg gets 1 s.
    #[arg(long)]
    pub start_after_ms: Option<u64>,
    /// The `gen_throughput` each idle engine shows at start (a stale value left by earlier
    /// probes or traffic), comma-separated, repeated over the engines in order.
    #[arg(long, value_delimiter = ',', default_value = "0.36")]
    pub idle_gauges: Vec<f64>,
    /// Also run each kvgate policy in front of engines that publish KV events (rows
    /// `<policy>+events`: the exact index); the plain rows' engines publish none. smg's
    /// engines publish them too.
    #[arg(long)]
    pub kv_events: bool,
    /// chat: `/v1/chat/completions`; tokens: `/generate` with `input_ids`, the same chats
    /// rendered and encoded with the engines' tokenizer.
    #[arg(long, value_enum, default_value = "chat")]
    pub prompt_form: PromptForm,
    /// The engines tokenize with this model tokenizer (a directory with `tokenizer.json`,
    /// e.g. tests/fixtures/tokenizer) and render chats with its template; kvgate loads it
    /// from the path they advertise.
    #[arg(long)]
    pub tokenizer_path: Option<PathBuf>,
    /// Each engine's KV pool in tokens (SGLang's `max_total_num_tokens`), shared by running
    /// requests and the prefix cache, which evicts LRU to admit requests.
    #[arg(long, default_value_t = 200_000)]
    pub pool_tokens: usize,
    /// Gateway instances in front of each fleet (kvgate and smg alike); request i of the
    /// plan goes to instance i mod N, as behind a balancer without session affinity.
    /// Several counts (`1,2,4`) run every target at each, on fresh fleets, and add the
    /// replicas table: each count's hit rate over one replica's in the same run.
    #[arg(long, value_delimiter = ',', default_value = "1",
          value_parser = clap::value_parser!(u64).range(1..=8))]
    pub gateway_replicas: Vec<u64>,
    /// Before each gateway starts, each prompt group (conversation) has already been served
    /// once by an engine, group g by engine g mod N, with a question the plan never asks:
    /// a gateway restarted or added in front of a busy fleet.
    #[arg(long)]
    pub warm_engines: bool,
    /// Before the measured plan, this many conversations (`--turns` turns each, private
    /// system prompts of `--system-tokens`) go through the same gateway at the same load,
    /// uncounted: a gateway that has served other traffic first.
    #[arg(long, default_value_t = 0)]
    pub prelude_conversations: usize,
    /// Cap on requests per run.
    #[arg(long, default_value_t = 10_000)]
    pub max_requests: usize,
    /// Cap on one run's wall-clock time, in seconds.
    #[arg(long, default_value_t = 300)]
    pub max_run_secs: u64,
    /// Also write this run's tables, as docs/benchmarks.md shows them, to this file. A
    /// table that lists one value per run gets this run's values appended to those already
    /// in the file (delete it to start afresh); the others are replaced.
    #[arg(long, value_name = "PATH")]
    pub markdown: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct ProxyArgs {
    /// Seconds of saturation load per target, in all.
    #[arg(long, default_value_t = 10)]
    pub duration_secs: u64,
    /// The saturation load in this many turns per target, the order of the targets
    /// reversed every turn (one turn each made an A/B one sample of the machine's drift).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub rounds: u64,
    /// Connections of the saturation load.
    #[arg(long, default_value_t = 64)]
    pub connections: usize,
    /// Sequential requests on one connection, after the warm-up.
    #[arg(long, default_value_t = 5000)]
    pub latency_requests: usize,
    #[arg(long, default_value_t = 500)]
    pub warmup: usize,
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// The `kvgate` binary to run as a child (default: `kvgate` beside this binary when
    /// this is a release build; otherwise kvgate runs in-process).
    #[arg(long)]
    pub kvgate_bin: Option<PathBuf>,
    /// A second `kvgate` binary (an older build, say) measured as `kvgate-baseline` in
    /// the same interleaved rounds, for an A/B that shares the machine's noise.
    #[arg(long)]
    pub baseline_bin: Option<PathBuf>,
    /// Use the built-in closed-loop generator even when wrk is installed.
    #[arg(long)]
    pub no_wrk: bool,
    #[arg(long)]
    pub no_smg: bool,
    #[arg(long)]
    pub no_nginx: bool,
    /// Send a chat completion whose user message is N KiB of text, instead of the default
    /// small one ("Hello!", 91 bytes in all), to measure the cost of larger prompt bodies.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=32768))]
    pub body_kib: Option<u64>,
    /// With --body-kib or --sweep-kib: a different prompt on every request (each starts
    /// with its own tag), so every request inserts into kvgate's prefix tree.
    #[arg(long)]
    pub unique: bool,
    /// kvgate's policies, comma-separated, one target each (`kvgate` for round_robin,
    /// `kvgate-<policy>` for the others).
    #[arg(long, value_delimiter = ',', default_value = "round_robin")]
    pub policies: Vec<PolicyKind>,
    /// kvgate's --max-tree-size (units per model and tree).
    #[arg(long)]
    pub max_tree_size: Option<u64>,
    /// Run the whole comparison at each of these body sizes (KiB, comma-separated) and
    /// draw the cost curve: `proxy-curve.json` and `proxy-curve.svg`.
    #[arg(long, value_delimiter = ',', conflicts_with = "body_kib",
          value_parser = clap::value_parser!(u64).range(1..=32768))]
    pub sweep_kib: Vec<u64>,
    /// Also write this run's tables, as docs/benchmarks.md shows them, to this file. A
    /// table that lists one value per run gets this run's values appended to those already
    /// in the file (delete it to start afresh); the others are replaced.
    #[arg(long, value_name = "PATH")]
    pub markdown: Option<PathBuf>,
}
