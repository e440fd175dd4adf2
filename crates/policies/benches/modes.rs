//! Routing quality of cache_aware's two modes, on a simulated SGLang-like fleet.
//!
//! A deterministic discrete-event simulation, in simulated time: Poisson arrivals, each
//! routed by `kvgate_policies::select` from what a gateway would see (its own in-flight
//! counts, load reports polled every `poll` seconds, the credit ledger, and an approximate
//! prefix index recording its own decisions), served by engines that run prefill ahead of
//! decode with a prefix cache (LRU by token budget), continuous batching and a decode step
//! whose time grows with the batch. It prints time-to-first-token and end-to-end figures
//! per policy, so the modes are compared on the same arrivals.
//!
//! Run with `cargo bench -p kvgate-policies --bench modes`.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use kvgate_policies::{
    CacheMode, CreditLedger, Decision, DecisionPath, MatchSource, PolicyConfig, PolicyKind,
    PrefixMatches, RankLoad, RequestFacts, RoutingText, SelectInput, WorkerId, WorkerLoad,
    WorkerView, select,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// One engine's speed.
#[derive(Clone, Copy)]
struct Gpu {
    prefill_rate: f64,
    decode_base: f64,
    decode_per_req: f64,
}

const FAST: Gpu = Gpu {
    prefill_rate: 12_000.0,
    decode_base: 0.012,
    decode_per_req: 0.000_25,
};
const SLOW: Gpu = Gpu {
    prefill_rate: 6_000.0,
    decode_base: 0.020,
    decode_per_req: 0.000_5,
};

const MAX_RUNNING: usize = 64;
const PREFILL_BUDGET: f64 = 8192.0;
/// KV pool for running requests, in tokens (the prefix cache is evictable, not counted).
const KV_CAPACITY: f64 = 300_000.0;
const STEP_OVERHEAD: f64 = 0.002;

#[derive(Clone, Debug)]
struct Req {
    arrival: f64,
    group: u64,
    /// Tokens that a cache may hold from earlier requests of the group.
    reusable: u32,
    input: u32,
    output: u32,
    /// Tokens of the group the engine caches after prefilling this request.
    stores: u32,
}

struct Running {
    req: Req,
    generated: u32,
    first_token: f64,
}

/// An LRU map group → cached tokens with a token budget.
#[derive(Default)]
struct Lru {
    map: HashMap<u64, (u32, u64)>,
    tokens: u64,
    budget: u64,
    clock: u64,
}

impl Lru {
    fn new(budget: u64) -> Lru {
        Lru {
            budget,
            ..Lru::default()
        }
    }
    fn get(&mut self, g: u64) -> u32 {
        self.clock += 1;
        let c = self.clock;
        self.map.get_mut(&g).map_or(0, |e| {
            e.1 = c;
            e.0
        })
    }
    fn peek(&self, g: u64) -> u32 {
        self.map.get(&g).map_or(0, |e| e.0)
    }
    fn put(&mut self, g: u64, len: u32) {
        self.clock += 1;
        let old = self.map.insert(g, (len, self.clock)).map_or(0, |e| e.0);
        self.tokens = self.tokens + len as u64 - old as u64;
        while self.tokens > self.budget {
            let Some((&victim, _)) = self.map.iter().min_by_key(|(_, e)| e.1) else {
                break;
            };
            if let Some((l, _)) = self.map.remove(&victim) {
                self.tokens -= l as u64;
            }
        }
    }
}

enum Step {
    Prefill(Vec<Req>),
    Decode,
}

struct Engine {
    gpu: Gpu,
    cache: Lru,
    waiting: VecDeque<Req>,
    running: Vec<Running>,
    step: Option<(f64, Step)>,
    kv_capacity: f64,
    prefill_tokens: u64,
    prefill_busy_us: u64,
    hit_tokens: u64,
    input_tokens: u64,
    gen_since_poll: u64,
    hits_since_poll: (u64, u64),
    cache_hit_rate: f64,
    last_poll: f64,
    gen_throughput: f64,
}

impl Engine {
    fn new(gpu: Gpu, cache_budget: u64) -> Engine {
        Engine {
            gpu,
            cache: Lru::new(cache_budget),
            waiting: VecDeque::new(),
            running: Vec::new(),
            step: None,
            kv_capacity: KV_CAPACITY,
            prefill_tokens: 0,
            prefill_busy_us: 0,
            hit_tokens: 0,
            input_tokens: 0,
            gen_since_poll: 0,
            hits_since_poll: (0, 0),
            cache_hit_rate: 0.0,
            last_poll: 0.0,
            gen_throughput: 0.0,
        }
    }

    fn kv_used(&self) -> f64 {
        self.running
            .iter()
            .map(|r| (r.req.input + r.generated) as f64)
            .sum()
    }

    /// Starts the next step at `now` if idle.
    fn start(&mut self, now: f64) {
        if self.step.is_some() {
            return;
        }
        let fits = |e: &Engine| {
            e.waiting
                .front()
                .is_some_and(|r| e.kv_used() + (r.input + r.output) as f64 <= e.kv_capacity)
        };
        if fits(self) && self.running.len() < MAX_RUNNING {
            let mut kv = self.kv_used();
            let mut batch = Vec::new();
            let mut tokens = 0.0;
            while let Some(r) = self.waiting.front() {
                let hit = self.cache.peek(r.group).min(r.reusable);
                let unc = (r.input - hit) as f64;
                let need = (r.input + r.output) as f64;
                if !batch.is_empty()
                    && (tokens + unc > PREFILL_BUDGET
                        || self.running.len() + batch.len() >= MAX_RUNNING
                        || kv + need > self.kv_capacity)
                {
                    break;
                }
                let Some(r) = self.waiting.pop_front() else {
                    break;
                };
                kv += (r.input + r.output) as f64;
                let hit = self.cache.get(r.group).min(r.reusable);
                tokens += (r.input - hit) as f64;
                self.hit_tokens += hit as u64;
                self.input_tokens += r.input as u64;
                self.hits_since_poll.0 += hit as u64;
                self.hits_since_poll.1 += r.input as u64;
                let len = r.stores.max(self.cache.peek(r.group));
                self.cache.put(r.group, len);
                batch.push(r);
            }
            let dur = STEP_OVERHEAD + tokens / self.gpu.prefill_rate;
            self.prefill_tokens += tokens as u64;
            self.prefill_busy_us += (dur * 1e6) as u64;
            self.step = Some((now + dur, Step::Prefill(batch)));
        } else if !self.running.is_empty() {
            let dur = self.gpu.decode_base + self.gpu.decode_per_req * self.running.len() as f64;
            self.step = Some((now + dur, Step::Decode));
        }
    }

    /// Finishes the current step; returns requests completed (with first-token time).
    fn finish(&mut self, now: f64) -> Vec<(Req, f64)> {
        let mut done = Vec::new();
        match self.step.take() {
            Some((_, Step::Prefill(batch))) => {
                for r in batch {
                    self.running.push(Running {
                        req: r,
                        generated: 1,
                        first_token: now,
                    });
                }
            }
            Some((_, Step::Decode)) => {
                self.gen_since_poll += self.running.len() as u64;
                for r in &mut self.running {
                    r.generated += 1;
                }
                let (fin, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.running)
                    .into_iter()
                    .partition(|r| r.generated >= r.req.output);
                self.running = keep;
                done = fin.into_iter().map(|r| (r.req, r.first_token)).collect();
            }
            None => {}
        }
        done
    }

    fn report(&mut self, now: f64) -> WorkerLoad {
        let elapsed = now - self.last_poll;
        if self.gen_since_poll > 0 && elapsed > 0.0 {
            self.gen_throughput = self.gen_since_poll as f64 / elapsed;
        }
        self.gen_since_poll = 0;
        if self.hits_since_poll.1 > 0 {
            self.cache_hit_rate = self.hits_since_poll.0 as f64 / self.hits_since_poll.1 as f64;
        }
        self.hits_since_poll = (0, 0);
        self.last_poll = now;
        let prefilling = match &self.step {
            Some((_, Step::Prefill(b))) => b.len(),
            _ => 0,
        };
        let uncached: u64 = self
            .waiting
            .iter()
            .map(|r| (r.input - self.cache.peek(r.group).min(r.reusable)) as u64)
            .sum();
        let used = self.kv_used();
        WorkerLoad {
            ranks: vec![RankLoad {
                num_running_reqs: (self.running.len() + prefilling) as u64,
                num_waiting_reqs: self.waiting.len() as u64,
                num_waiting_uncached_tokens: uncached,
                max_running_requests: MAX_RUNNING as u64,
                token_usage: (used / self.kv_capacity).min(1.0),
                gen_throughput: self.gen_throughput,
                cache_hit_rate: self.cache_hit_rate,
                total_prefill_uncached_tokens: self.prefill_tokens,
                total_prefill_busy_us: self.prefill_busy_us,
                ..RankLoad::default()
            }],
            sampled_at: secs(now),
            adapters: None,
        }
    }
}

fn secs(t: f64) -> Duration {
    Duration::from_secs_f64(t.max(0.0))
}

/// A workload: how requests are drawn.
#[derive(Clone, Copy)]
enum Workload {
    /// `groups` shared prefixes (system prompts, few-shot) with Zipf(`zipf`) popularity,
    /// each request adding a unique suffix drawn from `suffix`.
    SharedPrefix {
        groups: u64,
        prefix: u32,
        zipf: f64,
        suffix: (u32, u32),
    },
    /// Multi-turn chats: each turn resends the whole history.
    Chat { sessions: u64, turns: u32 },
}

fn requests(w: Workload, rate: f64, duration: f64, seed: u64) -> Vec<Req> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut t = 0.0;
    match w {
        Workload::SharedPrefix {
            groups,
            prefix,
            zipf,
            suffix,
        } => {
            let weights: Vec<f64> = (0..groups)
                .map(|k| 1.0 / (k as f64 + 1.0).powf(zipf))
                .collect();
            let total: f64 = weights.iter().sum();
            loop {
                t += -rng.r#gen::<f64>().max(1e-12).ln() / rate;
                if t > duration {
                    break;
                }
                let mut x = rng.r#gen::<f64>() * total;
                let mut g = 0;
                while g + 1 < groups as usize && x > weights[g] {
                    x -= weights[g];
                    g += 1;
                }
                let suffix = rng.gen_range(suffix.0..suffix.1);
                out.push(Req {
                    arrival: t,
                    group: g as u64,
                    reusable: prefix,
                    input: prefix + suffix,
                    output: rng.gen_range(50..250),
                    stores: prefix,
                });
            }
        }
        Workload::Chat { sessions, turns } => {
            // Per session: (id, turn, history tokens).
            let mut state: Vec<(u64, u32, u32)> = (0..sessions).map(|s| (s, 0, 0)).collect();
            let mut next_id = sessions;
            loop {
                t += -rng.r#gen::<f64>().max(1e-12).ln() / rate;
                if t > duration {
                    break;
                }
                let s = rng.gen_range(0..sessions as usize);
                let (id, turn, history) = state[s];
                let user = rng.gen_range(100..400);
                let output = rng.gen_range(100..300);
                let input = if turn == 0 {
                    600 + user
                } else {
                    history + user
                };
                out.push(Req {
                    arrival: t,
                    group: id,
                    reusable: history,
                    input,
                    output,
                    stores: input + output,
                });
                state[s] = if turn + 1 >= turns {
                    next_id += 1;
                    (next_id, 0, 0)
                } else {
                    (id, turn + 1, input + output)
                };
            }
        }
    }
    out
}

struct Outcome {
    ttft: Vec<f64>,
    e2e: Vec<f64>,
    hit_tokens: f64,
    input_tokens: f64,
    paths: HashMap<DecisionPath, usize>,
}

struct Fleet {
    gpus: Vec<Gpu>,
    cache_budget: u64,
    poll: f64,
}

fn simulate(fleet: &Fleet, cfg: &PolicyConfig, reqs: &[Req], seed: u64) -> Outcome {
    let n = fleet.gpus.len();
    let mut engines: Vec<Engine> = fleet
        .gpus
        .iter()
        .map(|&g| Engine::new(g, fleet.cache_budget))
        .collect();
    let mut views: Vec<WorkerView> = (0..n)
        .map(|i| {
            let url = format!("http://sim-{i}:8000");
            WorkerView::new(WorkerId::from_url(&url), url)
        })
        .collect();
    let ids: Vec<WorkerId> = views.iter().map(|v| v.id).collect();
    let mut index: Vec<Lru> = (0..n).map(|_| Lru::new(fleet.cache_budget)).collect();
    let mut ledger = CreditLedger::new();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = Outcome {
        ttft: Vec::new(),
        e2e: Vec::new(),
        hit_tokens: 0.0,
        input_tokens: 0.0,
        paths: HashMap::new(),
    };
    let mut next_req = 0;
    let mut next_poll = fleet.poll;
    let mut seq = 0;
    loop {
        let step_end = engines
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.step.as_ref().map(|(t, _)| (*t, i)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let arrival = reqs.get(next_req).map(|r| r.arrival);
        let now = match (step_end, arrival) {
            (None, None) => break,
            (Some((t, _)), Some(a)) => t.min(a).min(next_poll),
            (Some((t, _)), None) => t.min(next_poll),
            (None, Some(a)) => a.min(next_poll),
        };
        if now == next_poll {
            for (i, e) in engines.iter_mut().enumerate() {
                views[i].load = Some(e.report(now));
                ledger.on_report(ids[i], Some(secs(now)));
            }
            next_poll += fleet.poll;
            continue;
        }
        if let Some((t, i)) = step_end
            && t == now
        {
            for (r, first) in engines[i].finish(now) {
                out.ttft.push(first - r.arrival);
                out.e2e.push(now - r.arrival);
                views[i].in_flight -= 1;
            }
            engines[i].start(now);
            continue;
        }
        let r = reqs[next_req].clone();
        next_req += 1;
        for (v, id) in views.iter_mut().zip(&ids) {
            v.credit = ledger.credit(*id);
        }
        let matches = PrefixMatches {
            input_len: r.input as usize,
            per_worker: (0..n)
                .filter_map(|i| {
                    let m = index[i].peek(r.group).min(r.reusable);
                    (m > 0).then_some((ids[i], m as usize))
                })
                .collect(),
            source: MatchSource::TokenTree,
            traffic: None,
            session_holder: None,
        };
        // The policies read only the token count of a prompt.
        let facts = RequestFacts {
            key: RoutingText::Tokens(vec![0; r.input as usize]),
            ..RequestFacts::default()
        };
        let input = SelectInput {
            matches: Some(&matches),
            seq,
            now: secs(now),
            ..SelectInput::new(&views, &facts)
        };
        seq += 1;
        let d: Decision = select(cfg, &input, &mut rng);
        *out.paths.entry(d.path).or_default() += 1;
        let Some(chosen) = d.worker else { continue };
        let Some(i) = ids.iter().position(|id| *id == chosen) else {
            continue;
        };
        ledger.apply(&d, secs(now));
        if d.record_prefix {
            let len = r.input.max(index[i].peek(r.group));
            index[i].put(r.group, len);
        } else {
            index[i].get(r.group);
        }
        views[i].in_flight += 1;
        engines[i].waiting.push_back(r);
        engines[i].start(now);
    }
    out.hit_tokens = engines.iter().map(|e| e.hit_tokens as f64).sum();
    out.input_tokens = engines.iter().map(|e| e.input_tokens as f64).sum();
    out
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn policies() -> Vec<(&'static str, PolicyConfig)> {
    let ca = PolicyConfig::with_kind(PolicyKind::CacheAware);
    vec![
        (
            "round_robin",
            PolicyConfig::with_kind(PolicyKind::RoundRobin),
        ),
        ("least_load", PolicyConfig::with_kind(PolicyKind::LeastLoad)),
        (
            "cache_aware threshold",
            PolicyConfig {
                cache_mode: CacheMode::Threshold,
                ..ca.clone()
            },
        ),
        (
            "cache_aware cost",
            PolicyConfig {
                cache_mode: CacheMode::Cost,
                ..ca
            },
        ),
    ]
}

fn main() {
    let duration = 300.0;
    let eight_fast = vec![FAST; 8];
    let mixed: Vec<Gpu> = (0..8)
        .map(|i| if i % 2 == 0 { FAST } else { SLOW })
        .collect();
    let shared = Workload::SharedPrefix {
        groups: 64,
        prefix: 3000,
        zipf: 0.9,
        suffix: (50, 300),
    };
    let hot = Workload::SharedPrefix {
        groups: 64,
        prefix: 3000,
        zipf: 1.5,
        suffix: (50, 300),
    };
    let template = Workload::SharedPrefix {
        groups: 4,
        prefix: 300,
        zipf: 0.0,
        suffix: (800, 2000),
    };
    let chat = Workload::Chat {
        sessions: 256,
        turns: 8,
    };
    let cases: Vec<(&str, Workload, Vec<Gpu>, f64, f64)> = vec![
        (
            "shared-prefix 8 GPUs",
            shared,
            eight_fast.clone(),
            1.0,
            30.0,
        ),
        (
            "shared-prefix 8 GPUs",
            shared,
            eight_fast.clone(),
            1.0,
            45.0,
        ),
        (
            "shared-prefix 8 GPUs",
            shared,
            eight_fast.clone(),
            1.0,
            60.0,
        ),
        (
            "shared-prefix 8 GPUs, poll 5 s",
            shared,
            eight_fast.clone(),
            5.0,
            45.0,
        ),
        (
            "shared-prefix 4 fast + 4 slow",
            shared,
            mixed.clone(),
            1.0,
            35.0,
        ),
        (
            "hot prefixes (Zipf 1.5) 8 GPUs",
            hot,
            eight_fast.clone(),
            1.0,
            45.0,
        ),
        (
            "shared template + long unique 8 GPUs",
            template,
            eight_fast.clone(),
            1.0,
            25.0,
        ),
        ("chat 8 GPUs", chat, eight_fast.clone(), 1.0, 15.0),
        ("chat 8 GPUs", chat, eight_fast.clone(), 1.0, 30.0),
        ("chat 8 GPUs", chat, eight_fast, 1.0, 45.0),
        ("chat 4 fast + 4 slow", chat, mixed, 1.0, 30.0),
    ];
    println!(
        "| workload | req/s | policy | TTFT mean (s) | p50 | p90 | p99 | e2e mean (s) | hit tokens | paths |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (name, workload, gpus, poll, rate) in cases {
        let reqs = requests(workload, rate, duration, 42);
        let fleet = Fleet {
            gpus,
            cache_budget: 60_000,
            poll,
        };
        for (label, cfg) in policies() {
            let mut o = simulate(&fleet, &cfg, &reqs, 7);
            let mut paths: Vec<String> = o
                .paths
                .iter()
                .map(|(p, n)| format!("{p} {:.0}%", 100.0 * *n as f64 / reqs.len() as f64))
                .collect();
            paths.sort();
            println!(
                "| {name} | {rate} | {label} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} | {:.0}% | {} |",
                mean(&o.ttft),
                pct(&mut o.ttft, 0.5),
                pct(&mut o.ttft, 0.9),
                pct(&mut o.ttft, 0.99),
                mean(&o.e2e),
                100.0 * o.hit_tokens / o.input_tokens.max(1.0),
                paths.join(", ")
            );
        }
    }
}
