//! Snapshot cost of the prefix index at scale: the index actor of a running gateway (on its
//! first HTTP thread, with its writer thread and sled store in a temporary data dir) filled
//! with 1M text prompts across 16 workers.
//!
//! Rounds alternate routing lookups (`MatchPrefix` round trips from the bench's own thread)
//! with no write, and the same lookups while the gateway's snapshot timer writes the index;
//! the store is then reopened, loaded and restored into a fresh actor, each step timed.
//!
//! The write is the periodic one, as in a running gateway: every `PERIOD` the actor snapshots if the index changed. Lookups never
//! record, so nothing is written unless the bench dirties the index with one `RecordPrefix`;
//! the write then starts at the next tick, whose time is known from when the actor started.
//! The workers are simulated engines, since the index records only registered workers.
//! A third set of lookups per round runs beside a busy thread and no write: the writer
//! thread keeps a core busy, and on this VM that alone changes wake-up latency.
//!
//! `cargo bench -p kvgate --bench snapshot`. Knobs (environment): `PROMPTS`
//! (1000000), `PREFIX_GROUPS` (4096), `WORKERS` (16), `LOOKUPS` (20000), `ROUNDS` (5);
//! `KEEP_STORE=1` keeps the data dir and prints where it is.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use actix::Addr;
use anyhow::{Context as _, bail};
use kvgate_core::WorkerUrl;
use kvgate_engine_sim::{SimConfig, SimFleet};
use kvgate_gateway::testing::{
    GetIndexStats, GetViews, IndexActor, IndexConfig, MatchPrefix, RecordPrefix,
};
use kvgate_gateway::{Gateway, GatewayConfig, SnapshotConfig};
use kvgate_policies::{PolicyConfig, PolicyKind, RequestFacts, RoutingText, WorkerId};
use kvgate_store::{Chunk, Store};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The snapshot timer's period.
const PERIOD: Duration = Duration::from_secs(2);
/// The bench stops early rather than fill a disk shared with others.
const MAX_STORE_BYTES: u64 = 20 << 30;
const MODEL: &str = "bench-model";
/// What prompts are made of, so edges look like text rather than noise.
const WORDS: &str = "the assistant answers questions about billing accounts orders shipping \
    returns policy customer always never politely briefly explain steps when asked refund \
    invoice support ticket status product warranty region language format markdown json \
    table list escalate human agent verify identity email phone address delivery tracking \
    number date time zone";

struct Knobs {
    prompts: usize,
    groups: usize,
    workers: usize,
    lookups: usize,
    rounds: usize,
}

fn knob(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v} is not a count")),
        Err(_) => Ok(default),
    }
}

impl Knobs {
    fn from_env() -> anyhow::Result<Knobs> {
        // Not `GROUPS`: bash keeps that name for itself.
        let k = Knobs {
            prompts: knob("PROMPTS", 1_000_000)?,
            groups: knob("PREFIX_GROUPS", 4096)?,
            workers: knob("WORKERS", 16)?,
            lookups: knob("LOOKUPS", 20_000)?,
            rounds: knob("ROUNDS", 5)?,
        };
        if k.groups == 0 || k.workers == 0 || k.lookups == 0 || k.rounds == 0 {
            bail!("PREFIX_GROUPS, WORKERS, LOOKUPS and ROUNDS must be at least 1");
        }
        Ok(k)
    }
}

/// Prompt text: a ~1 KiB head shared by the group, then a ~200-byte tail unique to `serial`.
struct Prompts {
    heads: Vec<String>,
    words: Vec<&'static str>,
    rng: SmallRng,
}

impl Prompts {
    fn new(groups: usize) -> Prompts {
        let words: Vec<&'static str> = WORDS.split_whitespace().collect();
        let mut rng = SmallRng::seed_from_u64(7);
        let heads = (0..groups)
            .map(|g| {
                let mut s = format!("system: you are support assistant {g}.");
                while s.len() < 1024 {
                    s.push(' ');
                    s.push_str(words[rng.gen_range(0..words.len())]);
                }
                s.push_str("\nuser: ");
                s
            })
            .collect();
        Prompts { heads, words, rng }
    }

    fn prompt(&mut self, group: usize, serial: usize) -> String {
        let head = &self.heads[group];
        let mut s = String::with_capacity(head.len() + 240);
        s.push_str(head);
        // The serial first, so tails fork right after the head as distinct questions do.
        s.push_str(&format!("question {serial}:"));
        while s.len() < head.len() + 200 {
            s.push(' ');
            s.push_str(self.words[self.rng.gen_range(0..self.words.len())]);
        }
        s
    }
}

/// The registered workers, and where each prompt was routed: a group's prompts to one
/// worker, every 8th of them spilled to the next.
struct Workers(Vec<WorkerId>);

impl Workers {
    fn holder(&self, group: usize, serial: usize, k: &Knobs) -> WorkerId {
        let w = if (serial / k.groups) % 8 == 7 {
            group + 1
        } else {
            group
        };
        self.0[w % self.0.len()]
    }
}

fn facts(text: String) -> Arc<RequestFacts> {
    Arc::new(RequestFacts {
        model: Some(MODEL.into()),
        key: RoutingText::Text(text.into()),
        routing_key: None,
        stream: false,
        pinned: None,
        session: None,
        adapter: None,
        cache_salt: None,
    })
}

/// Resident set size in bytes.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn entry_size(e: &std::fs::DirEntry) -> u64 {
    match e.metadata() {
        Ok(m) if m.is_dir() => dir_size(&e.path()),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

fn dir_size(p: &Path) -> u64 {
    std::fs::read_dir(p).map_or(0, |rd| rd.flatten().map(|e| entry_size(&e)).sum())
}

/// Sizes of the entries directly under `dir`, largest first.
fn breakdown(dir: &Path) -> String {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return String::new();
    };
    let mut v: Vec<(u64, String)> = rd
        .flatten()
        .map(|e| (entry_size(&e), e.file_name().to_string_lossy().into_owned()))
        .collect();
    v.sort_by(|a, b| b.cmp(a));
    v.iter()
        .map(|(size, name)| format!("{name} {:.0} MiB", mib(*size)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Latency summary in microseconds.
#[derive(Debug, Clone, Copy, Default)]
struct Lat {
    n: usize,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

fn summarize(mut v: Vec<Duration>) -> Lat {
    if v.is_empty() {
        return Lat::default();
    }
    v.sort();
    let at = |q: f64| {
        let i = ((v.len() as f64 * q) as usize).min(v.len() - 1);
        v[i].as_secs_f64() * 1e6
    };
    Lat {
        n: v.len(),
        p50: at(0.50),
        p99: at(0.99),
        p999: at(0.999),
        max: at(1.0),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One routing lookup's round trip, for a prompt not seen before.
async fn lookup(
    index: &Addr<IndexActor>,
    prompts: &mut Prompts,
    k: &Knobs,
    serial: &mut usize,
) -> anyhow::Result<Duration> {
    let text = prompts.prompt(*serial % k.groups, *serial);
    *serial += 1;
    let t = Instant::now();
    index
        .send(MatchPrefix {
            model: MODEL.into(),
            facts: facts(text),
            count: true,
            recent: None,
        })
        .await
        .context("index actor gone")?;
    Ok(t.elapsed())
}

/// Waits until everything sent before it has been handled (the mailbox is FIFO).
async fn barrier(index: &Addr<IndexActor>) -> anyhow::Result<()> {
    index
        .send(MatchPrefix {
            model: MODEL.into(),
            facts: Arc::default(),
            count: false,
            recent: None,
        })
        .await
        .context("index actor gone")?;
    Ok(())
}

/// Where persistence stands.
struct Persisted {
    /// Changes not in a committed snapshot yet.
    pending: bool,
    generation: u64,
    /// Times a snapshot paused because the writer was behind.
    deferred: u64,
}

async fn persisted(index: &Addr<IndexActor>) -> anyhow::Result<Persisted> {
    let (_, p) = index.send(GetIndexStats).await?;
    if !p.enabled {
        bail!("the gateway runs without persistence");
    }
    Ok(Persisted {
        pending: p.pending,
        generation: p.committed_generation,
        deferred: p.deferred,
    })
}

/// Waits until every change is in a committed snapshot; returns how long that took and
/// how often the snapshot paused for the writer meanwhile.
async fn settle(index: &Addr<IndexActor>, store_dir: &Path) -> anyhow::Result<(Duration, u64)> {
    let t = Instant::now();
    let before = persisted(index).await?;
    loop {
        let now = persisted(index).await?;
        if !now.pending {
            return Ok((t.elapsed(), now.deferred - before.deferred));
        }
        let bytes = dir_size(store_dir);
        if bytes > MAX_STORE_BYTES || t.elapsed() > Duration::from_secs(600) {
            bail!(
                "index not persisted after {:?}; store at {:.0} MiB",
                t.elapsed(),
                mib(bytes)
            );
        }
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The gateway's snapshot timer, whose ticks fall at `origin + n * PERIOD`.
struct Timer {
    /// When the actor's interval started (the gateway's start returned just after).
    origin: Instant,
}

impl Timer {
    /// The first tick after `t + margin`.
    fn next_tick(&self, t: Instant, margin: Duration) -> Instant {
        let since = t.duration_since(self.origin) + margin;
        let n = since.as_nanos() / PERIOD.as_nanos() + 1;
        self.origin + PERIOD * n as u32
    }
}

/// Routes `k.lookups` prompts with no write running (checked) and the same polling as
/// during a write, so only the write differs.
async fn idle_round(
    index: &Addr<IndexActor>,
    prompts: &mut Prompts,
    k: &Knobs,
    serial: &mut usize,
) -> anyhow::Result<Lat> {
    let before = persisted(index).await?;
    let mut lat = Vec::with_capacity(k.lookups);
    let mut polled = Instant::now();
    for _ in 0..k.lookups {
        lat.push(lookup(index, prompts, k, serial).await?);
        if polled.elapsed() >= Duration::from_millis(5) {
            polled = Instant::now();
            persisted(index).await?;
        }
    }
    let after = persisted(index).await?;
    if before.pending || after.pending || after.generation != before.generation {
        bail!("a snapshot ran during the no-write lookups");
    }
    Ok(summarize(lat))
}

/// A thread that keeps one core busy with arithmetic, as the writer thread does during a
/// write: a control for how much of a difference is only a busy neighbour (on a VM an
/// idle core also makes cross-thread wake-ups slower).
struct BusyNeighbour {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl BusyNeighbour {
    fn start() -> anyhow::Result<BusyNeighbour> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("busy-neighbour".into())
            .spawn(move || {
                let mut x: u64 = 1;
                while !flag.load(Ordering::Relaxed) {
                    for _ in 0..1000 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    }
                }
                x
            })?;
        Ok(BusyNeighbour { stop, thread })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

struct WriteRound {
    during: Lat,
    /// From the tick that started the snapshot to its commit.
    wall: Duration,
    deferred: u64,
    store_bytes: u64,
}

/// Dirties the index once, then routes until the snapshot the next tick starts is
/// committed; lookups sent from that tick on count as "during the write".
async fn write_round(
    index: &Addr<IndexActor>,
    workers: &Workers,
    timer: &Timer,
    prompts: &mut Prompts,
    k: &Knobs,
    serial: &mut usize,
) -> anyhow::Result<WriteRound> {
    let before = persisted(index).await?;
    if before.pending {
        bail!("a write is already pending");
    }
    let group = *serial % k.groups;
    index.do_send(RecordPrefix {
        model: MODEL.into(),
        facts: facts(prompts.prompt(group, *serial)),
        worker: workers.holder(group, *serial, k),
        ticket: None,
    });
    *serial += 1;
    // The margin covers the origin's uncertainty and the record's trip to the actor.
    let tick = timer.next_tick(Instant::now(), Duration::from_millis(20));
    let mut lat = Vec::new();
    let mut polled = Instant::now();
    let (wall, deferred) = loop {
        let sent = Instant::now();
        let took = lookup(index, prompts, k, serial).await?;
        if sent >= tick {
            lat.push(took);
        }
        if polled.elapsed() < Duration::from_millis(5) {
            continue;
        }
        polled = Instant::now();
        let now = persisted(index).await?;
        if !now.pending && now.generation > before.generation {
            break (tick.elapsed(), now.deferred - before.deferred);
        }
        if sent > tick + Duration::from_secs(300) {
            bail!("snapshot not committed 300 s after it started");
        }
    };
    Ok(WriteRound {
        during: summarize(lat),
        wall,
        deferred,
        store_bytes: 0,
    })
}

/// Waits until a stopped gateway's writer thread has let go of the store.
fn wait_released(dir: &Path) -> anyhow::Result<()> {
    let t = Instant::now();
    loop {
        match Store::open(dir) {
            Ok(_) => return Ok(()),
            Err(e) if t.elapsed() > Duration::from_secs(30) => {
                return Err(e).context("reopening the store");
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// A real restart: the `kvgate` binary started on the store, timed from spawn until it
/// answers `/health` (it restores before it serves). No engine runs, so the only work
/// besides the restore is the failed probe of each stored worker.
fn binary_restart(dir: &Path, policy: &PolicyConfig) -> anyhow::Result<Duration> {
    use std::io::{Read, Write};
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let t = Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--log-level",
            "warn",
        ])
        .arg("--data-dir")
        .arg(dir)
        .args(["--max-tree-size", &policy.max_tree_size.to_string()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("starting kvgate")?;
    let ready = loop {
        if t.elapsed() > Duration::from_secs(60) {
            break None;
        }
        let answer = std::net::TcpStream::connect(("127.0.0.1", port)).and_then(|mut c| {
            c.write_all(b"GET /health HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")?;
            let mut buf = Vec::new();
            c.read_to_end(&mut buf)?;
            Ok(buf)
        });
        match answer {
            Ok(b) if b.starts_with(b"HTTP/1.1 200") => break Some(t.elapsed()),
            _ => std::thread::sleep(Duration::from_millis(2)),
        }
    };
    // SIGKILL: a graceful stop would write another generation into the store.
    let _ = child.kill();
    let _ = child.wait();
    ready.context("kvgate did not answer /health within 60 s")
}

/// Starts the gateway on `fleet` and waits until every worker is registered.
fn start_gateway(
    fleet: &SimFleet,
    data_dir: &Path,
    policy: &PolicyConfig,
) -> anyhow::Result<(Gateway, Timer, Duration)> {
    let cfg = GatewayConfig {
        port: 0,
        worker_urls: fleet.urls(),
        data_dir: data_dir.to_path_buf(),
        // Every round's write starts at the tick after it dirties the index.
        snapshot: SnapshotConfig {
            interval: PERIOD,
            backoff: 0.0,
        },
        http_workers: Some(1),
        policy: policy.clone(),
        ..GatewayConfig::default()
    };
    let called = Instant::now();
    let gw = Gateway::start(cfg).context("starting the gateway")?;
    let origin = Instant::now();
    Ok((gw, Timer { origin }, origin.duration_since(called)))
}

async fn wait_registered(gw: &Gateway, n: usize) -> anyhow::Result<()> {
    let t = Instant::now();
    loop {
        let views = gw.actors().selector.send(GetViews).await?;
        if views.len() == n && views.iter().all(|v| v.eligible) {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(30) {
            bail!("{} of {n} workers registered after 30 s", views.len());
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
}

fn main() -> anyhow::Result<()> {
    let k = Knobs::from_env()?;
    println!(
        "snapshot bench: {} prompts, {} groups, {} workers, {} lookups x {} rounds, timer every {:?}",
        k.prompts, k.groups, k.workers, k.lookups, k.rounds, PERIOD
    );
    let fleet = SimFleet::start(k.workers, SimConfig::default()).context("starting engines")?;
    let workers = Workers(
        fleet
            .urls()
            .iter()
            .map(|u| WorkerUrl::parse(u).map(|n| WorkerId::from_url(n.as_str())))
            .collect::<Result<_, _>>()?,
    );
    let dir = tempfile::tempdir().context("temp dir")?;
    let store_dir = dir.path().join("store");
    let policy = PolicyConfig {
        // Room for every prompt: the bench measures a full index, not eviction.
        max_tree_size: 1 << 31,
        ..PolicyConfig::with_kind(PolicyKind::CacheAware)
    };
    let rss0 = rss();
    let (gw, timer, start_window) = start_gateway(&fleet, dir.path(), &policy)?;
    let index = gw.actors().index.clone();
    let mut idle_rows = Vec::new();
    let mut busy_rows = Vec::new();
    let mut write_rows = Vec::new();
    let mut fill_time = Duration::ZERO;
    let mut rss_filled = 0;
    let mut rss_settled = 0;

    let sys = actix_rt::System::new();
    sys.block_on(async {
        wait_registered(&gw, k.workers).await?;
        let mut prompts = Prompts::new(k.groups);
        let t = Instant::now();
        for i in 0..k.prompts {
            let group = i % k.groups;
            index.do_send(RecordPrefix {
                model: MODEL.into(),
                facts: facts(prompts.prompt(group, i)),
                worker: workers.holder(group, i, &k),
                ticket: None,
            });
            // Bounds what waits in the mailbox.
            if i % 1024 == 1023 {
                barrier(&index).await?;
            }
        }
        barrier(&index).await?;
        fill_time = t.elapsed();
        rss_filled = rss();
        let (st, _) = index.send(GetIndexStats).await?;
        let held = st.iter().map(|s| s.per_worker.len()).max().unwrap_or(0);
        let units: usize = st.iter().map(|s| s.text_units).sum();
        println!(
            "filled in {:.1} s (timer snapshots ran meanwhile): {units} text units on {held} workers, rss +{:.0} MiB",
            fill_time.as_secs_f64(),
            mib(rss_filled.saturating_sub(rss0))
        );
        if held != k.workers {
            bail!("the index holds {held} workers, expected {}", k.workers);
        }
        let (took, deferred) = settle(&index, &store_dir).await?;
        rss_settled = rss();
        println!(
            "fill persisted {:.1} s after it ended ({deferred} pauses for the writer); store {:.0} MiB, rss +{:.0} MiB",
            took.as_secs_f64(),
            mib(dir_size(&store_dir)),
            mib(rss_settled.saturating_sub(rss0))
        );
        let mut serial = k.prompts;
        for round in 0..k.rounds {
            // Lets the store's background work after the last commit finish first.
            actix_rt::time::sleep(Duration::from_secs(1)).await;
            let idle = idle_round(&index, &mut prompts, &k, &mut serial).await?;
            let neighbour = BusyNeighbour::start()?;
            let busy = idle_round(&index, &mut prompts, &k, &mut serial).await;
            neighbour.stop();
            let busy = busy?;
            let mut w =
                write_round(&index, &workers, &timer, &mut prompts, &k, &mut serial).await?;
            w.store_bytes = dir_size(&store_dir);
            println!(
                "round {round}: no write p50 {:.1} p99 {:.1} p99.9 {:.1} max {:.0} us | no write, busy neighbour p50 {:.1} p99 {:.1} p99.9 {:.1} max {:.0} us | during write p50 {:.1} p99 {:.1} p99.9 {:.1} max {:.0} us ({} lookups) | write {:.2} s, {} pauses, store {:.0} MiB",
                idle.p50,
                idle.p99,
                idle.p999,
                idle.max,
                busy.p50,
                busy.p99,
                busy.p999,
                busy.max,
                w.during.p50,
                w.during.p99,
                w.during.p999,
                w.during.max,
                w.during.n,
                w.wall.as_secs_f64(),
                w.deferred,
                mib(w.store_bytes)
            );
            let too_big = w.store_bytes > MAX_STORE_BYTES;
            idle_rows.push(idle);
            busy_rows.push(busy);
            write_rows.push(w);
            if too_big {
                println!("store over {} GiB: no more rounds", MAX_STORE_BYTES >> 30);
                break;
            }
        }
        anyhow::Ok(())
    })?;
    let rss_after_writes = rss();
    // A graceful stop writes a final snapshot; the restore below reads that one.
    gw.stop();
    drop(index);
    fleet.stop();
    wait_released(dir.path())?;
    let files = dir_size(&store_dir);
    let parts = breakdown(&store_dir);
    let rss_closed = rss();

    let t = Instant::now();
    let store = Store::open(dir.path()).context("reopening the store")?;
    let open_time = t.elapsed();
    let sled_size = store.size_on_disk();
    let t = Instant::now();
    let image = store
        .load()
        .context("loading the snapshot")?
        .context("no snapshot in the store")?;
    let load_time = t.elapsed();
    let chunks = image.chunks.len();
    // What one generation holds, against what the store occupies.
    let generation_bytes: usize = image
        .chunks
        .iter()
        .map(|c| kvgate_kv_index::encode(c).map_or(0, |b| b.len()))
        .sum();
    let records: usize = image
        .chunks
        .iter()
        .map(|c| match c {
            Chunk::Text { records, .. } => records.len(),
            Chunk::Tokens { records, .. } => records.len(),
            Chunk::Hash { .. } => 0,
        })
        .sum();
    let rss_loaded = rss();
    let t = Instant::now();
    let mut restored = IndexActor::new(
        IndexConfig::from_policy(
            &policy,
            &SnapshotConfig {
                interval: PERIOD,
                backoff: 0.0,
            },
        ),
        Instant::now(),
        None,
    );
    restored.restore(image);
    let restore_time = t.elapsed();
    let rss_restored = rss();
    drop(restored);
    drop(store);
    // A real restart, three times (each SIGKILLed, so the store stays as it is).
    let mut spawns = Vec::new();
    for _ in 0..3 {
        spawns.push(binary_restart(dir.path(), &policy)?.as_secs_f64());
    }
    println!("kvgate binary restarts: {spawns:.3?} s");
    let binary_time = median(spawns);

    let med = |f: &dyn Fn(&Lat) -> f64, rows: &[Lat]| median(rows.iter().map(f).collect());
    let during: Vec<Lat> = write_rows.iter().map(|w| w.during).collect();
    let (i50, i99, i999, imax) = (
        med(&|l| l.p50, &idle_rows),
        med(&|l| l.p99, &idle_rows),
        med(&|l| l.p999, &idle_rows),
        med(&|l| l.max, &idle_rows),
    );
    let (b50, b99, b999, bmax) = (
        med(&|l| l.p50, &busy_rows),
        med(&|l| l.p99, &busy_rows),
        med(&|l| l.p999, &busy_rows),
        med(&|l| l.max, &busy_rows),
    );
    let (w50, w99, w999, wmax) = (
        med(&|l| l.p50, &during),
        med(&|l| l.p99, &during),
        med(&|l| l.p999, &during),
        med(&|l| l.max, &during),
    );
    let wall = median(write_rows.iter().map(|w| w.wall.as_secs_f64()).collect());
    let disk = median(write_rows.iter().map(|w| w.store_bytes as f64).collect());
    let deferred: u64 = write_rows.iter().map(|w| w.deferred).sum();
    let total = (open_time + load_time + restore_time).as_secs_f64();
    let grown = |b: u64| mib(b.saturating_sub(rss0));

    println!();
    println!("| figure (median of {} rounds) | value |", write_rows.len());
    println!("|---|---|");
    println!(
        "| fill ({} RecordPrefix) | {:.1} s |",
        k.prompts,
        fill_time.as_secs_f64()
    );
    println!(
        "| routing p50 / p99 / p99.9 / max, no write | {i50:.1} / {i99:.1} / {i999:.1} / {imax:.0} us |"
    );
    println!(
        "| routing p50 / p99 / p99.9 / max, no write, busy neighbour thread | {b50:.1} / {b99:.1} / {b999:.1} / {bmax:.0} us |"
    );
    println!(
        "| routing p50 / p99 / p99.9 / max, during write | {w50:.1} / {w99:.1} / {w999:.1} / {wmax:.0} us |"
    );
    println!(
        "| p99 moved by the write, against no write; against the busy-neighbour control | {:+.1} %; {:+.1} % (target <= +10 %) |",
        (w99 / i99 - 1.0) * 100.0,
        (w99 / b99 - 1.0) * 100.0
    );
    println!(
        "| snapshot write, tick to commit (tick known to {:.1} ms) | {wall:.2} s ({deferred} pauses for the writer over all rounds) |",
        start_window.as_secs_f64() * 1e3
    );
    println!(
        "| store directory after a write | {:.0} MiB |",
        mib(disk as u64)
    );
    println!(
        "| one generation, encoded ({records} records, {chunks} chunks) | {:.0} MiB |",
        mib(generation_bytes as u64)
    );
    println!(
        "| store after stop: files; sled size_on_disk | {:.0} MiB ({parts}); {:.0} MiB |",
        mib(files),
        mib(sled_size)
    );
    println!("| Store::open | {:.3} s |", open_time.as_secs_f64());
    println!("| Store::load | {:.3} s |", load_time.as_secs_f64());
    println!(
        "| IndexActor::restore | {:.3} s |",
        restore_time.as_secs_f64()
    );
    println!("| restore total in this process (open + load + restore) | {total:.3} s |");
    println!(
        "| restart of the `kvgate` binary on the store, spawn to first `/health` (median of 3) | {:.3} s (target < 2 s) |",
        binary_time
    );
    println!(
        "| RSS over start: filled / persisted / after writes / after stop / loaded / restored | +{:.0} / +{:.0} / +{:.0} / +{:.0} / +{:.0} / +{:.0} MiB |",
        grown(rss_filled),
        grown(rss_settled),
        grown(rss_after_writes),
        grown(rss_closed),
        grown(rss_loaded),
        grown(rss_restored),
    );
    if std::env::var_os("KEEP_STORE").is_some() {
        // For a look with `kvgatectl snapshot inspect` or a restart by hand.
        println!("store kept in {}", dir.keep().display());
    }
    Ok(())
}
