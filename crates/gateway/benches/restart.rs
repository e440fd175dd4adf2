//! The restart scenario end to end: four simulated engines holding 64 prefix groups, a
//! gateway restart, then the fleet hit rate of the first request per group after it.
//!
//! Runs: kvgate restarted on the same data dir (the index is restored), kvgate restarted
//! on an empty data dir (cold), kvgate restarted on an empty data dir in front of engines
//! that publish KV events and tokenize with a model tokenizer (the fixture's, which the
//! gateway loads too: its events tell it what the engines hold), and, when `smg` is on
//! `PATH`, the reference gateway killed and relaunched (it never persists). Each run gets its own fresh fleet and the same
//! phase 1. Requests go one at a time over HTTP, so which engine served each one is read
//! from the engines' counters; phase 2 sends the groups in another order than phase 1.
//!
//! `cargo bench -p kvgate-gateway --bench restart`; `NO_SMG=1` skips the reference.

use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use kvgate_engine_sim::tokenizer::{encode, render_chat};
use kvgate_engine_sim::{EngineStats, SimConfig, SimFleet};
use kvgate_gateway::testing::GetViews;
use kvgate_gateway::{Gateway, GatewayConfig};
use kvgate_tokenize::ModelTokenizer;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom as _;
use rand::{Rng, SeedableRng};
use serde_json::json;

const ENGINES: usize = 4;
const GROUPS: usize = 64;
/// Phase-1 requests per group.
const WARM: usize = 4;
/// About 4 bytes per token of the simulator's tokenizer, for the sizes printed.
const BYTES_PER_TOKEN: usize = 4;
const SYSTEM_BYTES: usize = 4000;
const QUESTION_BYTES: usize = 80;
const MODEL: &str = "kvgate-sim-model";

const WORDS: [&str; 32] = [
    "policy", "ledger", "invoice", "refund", "region", "quota", "tenant", "audit", "report",
    "shipment", "warranty", "contract", "balance", "payment", "account", "schedule", "review",
    "summary", "request", "status", "detail", "format", "answer", "brief", "always", "never",
    "escalate", "verify", "customer", "product", "support", "order",
];

/// A group's system prompt (~1000 tokens), distinct from its first words.
fn system_prompt(group: usize, rng: &mut SmallRng) -> String {
    let mut s = format!("You are assistant {group} of team {}.", group * 7919 % 1000);
    while s.len() < SYSTEM_BYTES {
        s.push(' ');
        s.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
    }
    s
}

/// The `n`th question of a group (~20 tokens), distinct from its first bytes.
fn question(group: usize, n: usize, rng: &mut SmallRng) -> String {
    let mut s = format!("Q{n}-{group}: ");
    while s.len() < QUESTION_BYTES {
        s.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
        s.push(' ');
    }
    s
}

struct Workload {
    systems: Vec<String>,
    /// `questions[g][n]`: phase 1 uses `0..WARM`, phase 2 uses `WARM`.
    questions: Vec<Vec<String>>,
}

impl Workload {
    fn new() -> Workload {
        let mut rng = SmallRng::seed_from_u64(42);
        let systems = (0..GROUPS).map(|g| system_prompt(g, &mut rng)).collect();
        let questions = (0..GROUPS)
            .map(|g| (0..=WARM).map(|n| question(g, n, &mut rng)).collect())
            .collect();
        Workload { systems, questions }
    }

    fn body(&self, g: usize, n: usize) -> serde_json::Value {
        json!({
            "model": MODEL,
            "messages": [
                {"role": "system", "content": self.systems[g]},
                {"role": "user", "content": self.questions[g][n]},
            ],
            "max_tokens": 1,
            "stream": false,
        })
    }

    /// The prompt as the simulator renders it (its chat template).
    fn rendered(&self, g: usize, n: usize) -> String {
        render_chat([
            ("system", self.systems[g].as_str()),
            ("user", self.questions[g][n].as_str()),
        ])
    }

    /// (cached, prompt) tokens of the phase-2 requests if each landed on an engine holding
    /// its group's phase-1 prompts and answers, in the engines' tokens: the longest shared
    /// token prefix, at most the prompt less the one token an engine always recomputes,
    /// rounded down to whole pages.
    fn ideal(&self, sim: &SimConfig) -> anyhow::Result<(u64, u64)> {
        let page = sim.page_size.max(1);
        let model = match &sim.tokenizer_path {
            Some(p) => Some(ModelTokenizer::from_path(p)?),
            None => None,
        };
        let tokens = |g: usize, n: usize| -> anyhow::Result<Vec<u32>> {
            Ok(match &model {
                Some(t) => t.chat_ids(&serde_json::to_vec(&self.body(g, n))?)?,
                None => encode(sim.tokenizer, &self.rendered(g, n)),
            })
        };
        let (mut cached, mut prompt) = (0, 0);
        for g in 0..GROUPS {
            let p = tokens(g, WARM)?;
            let mut shared = 0;
            for n in 0..WARM {
                shared = shared.max(common_prefix(&p, &tokens(g, n)?));
            }
            let shared = shared.min(p.len().saturating_sub(1));
            cached += (shared / page * page) as u64;
            prompt += p.len() as u64;
        }
        Ok((cached, prompt))
    }
}

fn sim_config(run: Run) -> SimConfig {
    let plain = SimConfig {
        // Every group's prefix fits on any one engine: misses after the restart are routing's.
        cache_capacity_tokens: 2_000_000,
        ..SimConfig::default()
    };
    if run != Run::KvgateEvents {
        return plain;
    }
    SimConfig {
        kv_events_port: Some(0),
        kv_events_replay_port: Some(0),
        tokenizer_path: Some(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer"),
        ),
        ..plain
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// What a phase did to the fleet.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    requests: u64,
    prompt: u64,
    cached: u64,
}

impl Tally {
    fn add(&mut self, before: &EngineStats, after: &EngineStats) {
        self.requests += after.requests - before.requests;
        self.prompt += after.prompt_tokens - before.prompt_tokens;
        self.cached += after.cached_tokens - before.cached_tokens;
    }

    fn hit(&self) -> f64 {
        if self.prompt == 0 {
            0.0
        } else {
            self.cached as f64 / self.prompt as f64
        }
    }
}

fn snapshot(fleet: &SimFleet) -> Vec<EngineStats> {
    (0..fleet.len()).map(|i| fleet.engine(i).stats()).collect()
}

/// Sends one request and returns the engine that served it.
async fn send(
    client: &awc::Client,
    front: &str,
    fleet: &SimFleet,
    body: &serde_json::Value,
    tally: &mut Tally,
) -> anyhow::Result<usize> {
    let before = snapshot(fleet);
    let mut resp = client
        .post(format!("{front}/v1/chat/completions"))
        .send_json(body)
        .await
        .map_err(|e| anyhow!("request to {front}: {e}"))?;
    let payload = resp
        .body()
        .limit(1 << 20)
        .await
        .map_err(|e| anyhow!("response from {front}: {e}"))?;
    if !resp.status().is_success() {
        bail!(
            "{front} answered {}: {}",
            resp.status(),
            String::from_utf8_lossy(&payload)
        );
    }
    let after = snapshot(fleet);
    let mut served = None;
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        if a.requests > b.requests {
            served = Some(i);
        }
        tally.add(b, a);
    }
    served.context("no engine counted the request")
}

/// Something that routes to the fleet and can be restarted.
enum Front {
    Kvgate(Gateway),
    Smg(SmgChild),
}

impl Front {
    fn url(&self) -> String {
        match self {
            Front::Kvgate(gw) => gw.url(),
            Front::Smg(c) => c.url.clone(),
        }
    }

    fn stop(self) {
        match self {
            Front::Kvgate(gw) => gw.stop(),
            Front::Smg(c) => drop(c),
        }
    }
}

/// Waits until every engine's events are live and its model's tokenizer is loaded.
async fn until_events_live(client: &awc::Client, url: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut resp = client
            .get(format!("{url}/workers"))
            .send()
            .await
            .map_err(|e| anyhow!("GET /workers: {e}"))?;
        let v: serde_json::Value = resp.json().limit(1 << 20).await?;
        let ws = v["workers"].as_array().cloned().unwrap_or_default();
        if !ws.is_empty()
            && ws
                .iter()
                .all(|w| w["events"]["state"] == "live" && w["tokenizer"]["state"] == "ready")
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("events not live after 30 s: {v}");
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start_kvgate(fleet: &SimFleet, data_dir: &Path) -> anyhow::Result<Front> {
    let cfg = GatewayConfig {
        port: 0,
        worker_urls: fleet.urls(),
        data_dir: data_dir.to_path_buf(),
        http_workers: Some(1),
        seed: Some(1),
        ..GatewayConfig::default()
    };
    let gw = Gateway::start(cfg).context("starting kvgate")?;
    // Route only once every engine has reported its load, as in production steady state.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let views = gw.actors().selector.send(GetViews).await?;
        if views.len() == fleet.len() && views.iter().all(|v| v.eligible && v.load.is_some()) {
            break;
        }
        if Instant::now() > deadline {
            eprintln!("warning: kvgate: not every engine reported a load after 15 s");
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(Front::Kvgate(gw))
}

/// The reference gateway as a child process in its own process group.
struct SmgChild {
    child: Child,
    url: String,
}

impl SmgChild {
    fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([sig, "--", &format!("-{}", self.child.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for SmgChild {
    fn drop(&mut self) {
        self.signal("-TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.signal("-KILL");
        let _ = self.child.wait();
    }
}

fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

async fn start_smg(
    client: &awc::Client,
    bin: &Path,
    fleet: &SimFleet,
    log: &Path,
) -> anyhow::Result<Front> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = Command::new(bin);
    cmd.args(["launch", "--host", "127.0.0.1", "--port", &port.to_string()])
        .arg("--worker-urls")
        .args(fleet.urls())
        .args(["--policy", "cache_aware", "--log-level", "warn"])
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0);
    let mut c = SmgChild {
        child: cmd.spawn().context("starting smg")?,
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(status) = c.child.try_wait()? {
            bail!(
                "smg exited during startup ({status}); see {}",
                log.display()
            );
        }
        let ready = client
            .get(format!("{}/readiness", c.url))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            break;
        }
        if Instant::now() > deadline {
            bail!("smg not ready after 90 s; see {}", log.display());
        }
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
    // Its first health check and load poll land right after startup.
    actix_rt::time::sleep(Duration::from_secs(1)).await;
    // A failed start above drops `c`, which stops the child.
    Ok(Front::Smg(c))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Run {
    KvgatePersisted,
    KvgateEmpty,
    KvgateEvents,
    Smg,
}

impl Run {
    fn label(self) -> &'static str {
        match self {
            Run::KvgatePersisted => "kvgate, same data dir",
            Run::KvgateEmpty => "kvgate, empty data dir",
            Run::KvgateEvents => "kvgate, empty data dir, engines' KV events",
            Run::Smg => "smg 1.13.0 (no persistence)",
        }
    }
}

struct Outcome {
    run: Run,
    warm: Tally,
    after: Tally,
    /// Phase-2 requests that landed on an engine that served their group in phase 1.
    on_holder: usize,
    phase1_engines: Vec<usize>,
}

async fn scenario(
    run: Run,
    work: &Workload,
    client: &awc::Client,
    smg: Option<&Path>,
    scratch: &Path,
) -> anyhow::Result<Outcome> {
    let sim = sim_config(run);
    let fleet = SimFleet::start(ENGINES, sim).context("starting the fleet")?;
    let first_dir = scratch.join(format!("{run:?}-1"));
    let second_dir = match run {
        Run::KvgatePersisted => first_dir.clone(),
        _ => scratch.join(format!("{run:?}-2")),
    };
    let start = async |dir: &Path, n: u32| match (run, smg) {
        (Run::Smg, Some(bin)) => {
            start_smg(client, bin, &fleet, &scratch.join(format!("smg-{n}.log"))).await
        }
        (Run::Smg, None) => bail!("smg not installed"),
        _ => {
            let front = start_kvgate(&fleet, dir).await?;
            if run == Run::KvgateEvents {
                until_events_live(client, &front.url()).await?;
            }
            Ok(front)
        }
    };
    let front = start(&first_dir, 1).await?;
    let url = front.url();
    let mut warm = Tally::default();
    let mut holders = vec![Vec::new(); GROUPS];
    for n in 0..WARM {
        for (g, h) in holders.iter_mut().enumerate() {
            let e = send(client, &url, &fleet, &work.body(g, n), &mut warm).await?;
            if !h.contains(&e) {
                h.push(e);
            }
        }
    }
    let mut phase1_engines = vec![0; ENGINES];
    for h in &holders {
        for &e in h {
            phase1_engines[e] += 1;
        }
    }
    front.stop();

    let front = start(&second_dir, 2).await?;
    let url = front.url();
    let mut after = Tally::default();
    let mut on_holder = 0;
    // Traffic after a restart comes in its own order: in phase 1's, a cold gateway would
    // replay phase 1's placements and look warm.
    let mut order: Vec<usize> = (0..GROUPS).collect();
    order.shuffle(&mut SmallRng::seed_from_u64(7));
    for g in order {
        let e = send(client, &url, &fleet, &work.body(g, WARM), &mut after).await?;
        on_holder += usize::from(holders[g].contains(&e));
    }
    front.stop();
    fleet.stop();
    Ok(Outcome {
        run,
        warm,
        after,
        on_holder,
        phase1_engines,
    })
}

fn main() -> anyhow::Result<()> {
    let work = Workload::new();
    let smg = if std::env::var_os("NO_SMG").is_some() {
        None
    } else {
        which("smg")
    };
    let scratch = tempfile::tempdir().context("temp dir")?;
    let mut runs = vec![Run::KvgatePersisted, Run::KvgateEmpty, Run::KvgateEvents];
    if smg.is_some() {
        runs.push(Run::Smg);
    } else {
        println!("smg not on PATH (or NO_SMG set): the reference gateway is not run");
    }
    let sys = actix_rt::System::new();
    let outcomes = sys.block_on(async {
        let client = awc::Client::builder()
            .timeout(Duration::from_secs(120))
            .finish();
        let mut out = Vec::new();
        for run in runs {
            let t = Instant::now();
            let o = scenario(run, &work, &client, smg.as_deref(), scratch.path()).await?;
            println!(
                "{}: done in {:.1} s; groups per engine after phase 1 {:?}",
                run.label(),
                t.elapsed().as_secs_f64(),
                o.phase1_engines
            );
            out.push(o);
        }
        anyhow::Ok(out)
    })?;

    let (ideal_cached, ideal_prompt) = work.ideal(&sim_config(Run::KvgateEmpty))?;
    let (events_cached, events_prompt) = work.ideal(&sim_config(Run::KvgateEvents))?;
    println!();
    println!(
        "{ENGINES} engines, {GROUPS} groups (system ~{} tokens, question ~{} tokens), phase 1 = {WARM} requests per group, phase 2 = 1 new request per group after the restart",
        SYSTEM_BYTES / BYTES_PER_TOKEN,
        QUESTION_BYTES / BYTES_PER_TOKEN
    );
    println!();
    println!(
        "| run | phase-1 hit rate | hit rate after restart | on a holder | cached / prompt tokens |"
    );
    println!("|---|---|---|---|---|");
    for o in &outcomes {
        println!(
            "| {} | {:.3} | {:.3} | {}/{GROUPS} | {} / {} |",
            o.run.label(),
            o.warm.hit(),
            o.after.hit(),
            o.on_holder,
            o.after.cached,
            o.after.prompt
        );
        if o.after.requests != GROUPS as u64 {
            println!(
                "(warning: {} engine requests counted in phase 2)",
                o.after.requests
            );
        }
    }
    println!(
        "| ideal (each on its group's holder, whole pages) | | {:.3} | {GROUPS}/{GROUPS} | {ideal_cached} / {ideal_prompt} |",
        ideal_cached as f64 / ideal_prompt as f64
    );
    println!(
        "| ideal with the model tokenizer (the KV-events run's tokens) | | {:.3} | {GROUPS}/{GROUPS} | {events_cached} / {events_prompt} |",
        events_cached as f64 / events_prompt as f64
    );
    Ok(())
}
