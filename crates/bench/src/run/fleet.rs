//! `kvgate-bench decide`: the cost of one routing decision at fleet scale, in process. The
//! selector's work per request, as the gateway does it on its first HTTP thread: the text
//! tree's counted lookup (`observe_for_insert`, the tree at its `--max-tree-size` budget),
//! `kvgate_policies::select` over one view per target (an engine, or each rank of one),
//! then the booking and the record (`insert_observed`). Each part is timed per decision.
//! `polls` and `memory` are the same fleets seen from outside a release `kvgate`.

pub(crate) mod memory;
pub(crate) mod polls;

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use kvgate_kv_index::{PrefixMatch, RadixTree, TreeConfig};
use kvgate_policies::{
    HashRing, MatchSource, PolicyConfig, PolicyKind, PrefixMatches, PrefixTraffic, PromptText,
    RECENT_HALF_LIFE, RankLoad, RequestFacts, RoutingText, SelectInput, WorkerId, WorkerLoad,
    WorkerView, select,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

#[derive(Debug, Clone)]
pub(crate) struct DecideSettings {
    pub engines: usize,
    pub dp_size: usize,
    pub max_tree_size: usize,
    pub decisions: usize,
    pub prompt_bytes: usize,
    pub head_bytes: usize,
    pub groups: usize,
    /// Share of prompts that share nothing (a new conversation): placed by rendezvous.
    pub fresh_share: f64,
    pub seed: u64,
}

/// When every synthetic load report was taken, and the decisions' clock.
const SAMPLED_AT: Duration = Duration::from_secs(1);

/// Percentiles of one part of the decision, in µs.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Micros {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct DecideReport {
    pub engines: usize,
    pub dp_size: usize,
    pub targets: usize,
    pub decisions: usize,
    pub tree_units: usize,
    pub tree_budget: usize,
    pub tree_nodes: usize,
    pub evicted_units: usize,
    pub warmup_decisions: usize,
    /// Mean holders per lookup, share of decisions that matched a holder, and share that
    /// started a new prefix (placed by rendezvous).
    pub mean_holders: f64,
    pub hit_share: f64,
    pub new_prefix_share: f64,
    pub matching: Micros,
    pub selecting: Micros,
    pub match_and_select: Micros,
    pub booking_and_record: Micros,
    pub total: Micros,
}

/// Targets that report a load, each a rank of its engine (or the engine when `dp_size` is 1).
fn views(s: &DecideSettings, rng: &mut SmallRng) -> Vec<WorkerView> {
    let mut out = Vec::with_capacity(s.engines * s.dp_size);
    for e in 0..s.engines {
        let url = format!("http://10.{}.{}.{}:30000", e >> 16, (e >> 8) & 255, e & 255);
        let id = WorkerId::from_url(&url);
        for r in 0..s.dp_size as u32 {
            let target = if s.dp_size > 1 { id.rank(r) } else { id };
            let mut v = WorkerView::new(target, url.as_str());
            let running = rng.gen_range(0..16u64);
            v.load = Some(WorkerLoad {
                ranks: vec![RankLoad {
                    dp_rank: r,
                    num_running_reqs: running,
                    num_waiting_reqs: rng.gen_range(0..3),
                    num_waiting_uncached_tokens: rng.gen_range(0..2048),
                    token_usage: rng.gen_range(0.05..0.6),
                    gen_throughput: 40.0 * running as f64,
                    max_running_requests: 16,
                    max_total_num_tokens: 200_000,
                    ..RankLoad::default()
                }],
                sampled_at: SAMPLED_AT,
                adapters: None,
            });
            out.push(v);
        }
    }
    out
}

/// Text of `n` random symbols: lowercase, digits and punctuation.
fn text(rng: &mut SmallRng, n: usize) -> String {
    const SYMBOLS: &[u8; 48] = b"abcdefghijklmnopqrstuvwxyz0123456789 .,;:!?-'()\n";
    (0..n)
        .map(|_| SYMBOLS[rng.gen_range(0..SYMBOLS.len())] as char)
        .collect()
}

/// The tree's traffic counts as the index actor hands them to the policy.
fn matches_of(pm: PrefixMatch<WorkerId>) -> PrefixMatches {
    PrefixMatches {
        input_len: pm.input_len,
        source: MatchSource::TextTree,
        traffic: Some(PrefixTraffic {
            total: f64::from(pm.traffic_total),
            by_prefix: (pm.traffic.iter())
                .map(|&(end, c)| (end, f64::from(c)))
                .collect(),
        }),
        per_worker: pm.per_tenant,
        session_holder: None,
    }
}

/// Nanoseconds of each part of one decision.
#[derive(Default)]
struct Parts {
    matching: Vec<u64>,
    selecting: Vec<u64>,
    both: Vec<u64>,
    booking: Vec<u64>,
    total: Vec<u64>,
}

fn micros(ns: &mut [u64]) -> Micros {
    ns.sort_unstable();
    let at = |q: f64| {
        let i = ((ns.len() as f64 * q).ceil() as usize).clamp(1, ns.len().max(1)) - 1;
        ns.get(i).map_or(0.0, |&x| x as f64 / 1000.0)
    };
    Micros {
        p50: at(0.50),
        p99: at(0.99),
        p999: at(0.999),
        max: ns.last().map_or(0.0, |&x| x as f64 / 1000.0),
    }
}

/// The selector's new-prefix bookkeeping after a dispatch to `i`: `recent` decays and
/// counts a start, `last_start` takes the fleet's next one.
fn book_start(workers: &mut [WorkerView], i: usize, new_prefix: bool, keep: f64, starts: &mut u64) {
    for v in workers.iter_mut() {
        v.recent *= keep;
    }
    if new_prefix {
        *starts += 1;
        workers[i].recent += 1.0;
        workers[i].last_start = *starts;
    }
}

/// One fleet's run: decisions (untimed) until the tree is at its budget, then `decisions`
/// timed ones.
pub(crate) fn run(s: &DecideSettings) -> DecideReport {
    let mut rng = SmallRng::seed_from_u64(s.seed);
    let mut workers = views(s, &mut rng);
    let ring = HashRing::from_views(&workers);
    // The gateway's default policy: cache_aware in cost mode.
    let cfg = PolicyConfig {
        max_tree_size: s.max_tree_size,
        ..PolicyConfig::with_kind(PolicyKind::CacheAware)
    };
    let mut tree: RadixTree<u8, WorkerId> = RadixTree::new(TreeConfig {
        page_size: NonZeroUsize::MIN,
        max_units: Some(s.max_tree_size),
        max_tenant_units: None,
        evict_on_insert: true,
        ..TreeConfig::default()
    });
    let heads: Vec<String> = (0..s.groups.max(1))
        .map(|_| text(&mut rng, s.head_bytes))
        .collect();
    let keep = 0.5f64.powf(1.0 / RECENT_HALF_LIFE);
    let mut starts = 0u64;
    // Requests in flight: each booking is released this many decisions later.
    let mut in_flight = std::collections::VecDeque::new();
    let depth = workers.len() * 2;
    let epoch = Instant::now();
    let mut parts = Parts::default();
    let (mut holders, mut hits, mut fresh) = (0usize, 0usize, 0usize);
    let (mut warm, mut done) = (0usize, 0usize);
    let mut seq = 0u64;
    // Warm-up ends once the tree has been at its budget for a while, capped in case it cannot
    // fill (a budget above what the prompts reach).
    let warm_cap = 4 * s.max_tree_size / s.prompt_bytes.max(1) + 10_000;
    while done < s.decisions {
        let mut prompt = if rng.gen_bool(s.fresh_share.clamp(0.0, 1.0)) {
            String::new()
        } else {
            heads[rng.gen_range(0..heads.len())].clone()
        };
        prompt.push_str(&text(&mut rng, s.prompt_bytes.saturating_sub(prompt.len())));
        let mut key = PromptText::default();
        key.push_str(&prompt);
        let facts = RequestFacts {
            key: RoutingText::Text(key.seal()),
            ..RequestFacts::default()
        };
        let now = epoch.elapsed();
        seq += 1;
        let t0 = Instant::now();
        let (pm, seen) = tree.observe_for_insert(prompt.as_bytes(), None);
        let m = matches_of(pm);
        let t1 = Instant::now();
        let input = SelectInput {
            workers: &workers,
            request: &facts,
            matches: Some(&m),
            seq,
            // The synthetic reports stay as sampled (the cost mode drains a queue by age).
            now: SAMPLED_AT,
            ring: Some(&ring),
        };
        let d = select(&cfg, &input, &mut rng);
        let t2 = Instant::now();
        let idx = d
            .worker
            .and_then(|w| workers.iter().position(|v| v.id == w));
        if let Some(i) = idx {
            book_start(&mut workers, i, d.new_prefix, keep, &mut starts);
            workers[i].in_flight += 1;
            in_flight.push_back(i);
            if d.record_prefix {
                let stamp = 1 << 40 | now.as_millis() as u64;
                tree.insert_observed(prompt.as_bytes(), workers[i].id, stamp, &seen);
            }
        }
        let t3 = Instant::now();
        if in_flight.len() > depth
            && let Some(j) = in_flight.pop_front()
        {
            workers[j].in_flight = workers[j].in_flight.saturating_sub(1);
        }
        let full = tree.total_units() + s.prompt_bytes >= s.max_tree_size;
        if warm < warm_cap && !(full && tree.evicted_total().units > 0) {
            warm += 1;
            continue;
        }
        let ns = |a: Instant, b: Instant| (b - a).as_nanos() as u64;
        parts.matching.push(ns(t0, t1));
        parts.selecting.push(ns(t1, t2));
        parts.both.push(ns(t0, t2));
        parts.booking.push(ns(t2, t3));
        parts.total.push(ns(t0, t3));
        holders += m.per_worker.len();
        hits += usize::from(!m.per_worker.is_empty());
        fresh += usize::from(d.new_prefix);
        done += 1;
    }
    DecideReport {
        engines: s.engines,
        dp_size: s.dp_size,
        targets: workers.len(),
        decisions: done,
        tree_units: tree.total_units(),
        tree_budget: s.max_tree_size,
        tree_nodes: tree.node_count(),
        evicted_units: tree.evicted_total().units,
        warmup_decisions: warm,
        mean_holders: holders as f64 / done.max(1) as f64,
        hit_share: hits as f64 / done.max(1) as f64,
        new_prefix_share: fresh as f64 / done.max(1) as f64,
        matching: micros(&mut parts.matching),
        selecting: micros(&mut parts.selecting),
        match_and_select: micros(&mut parts.both),
        booking_and_record: micros(&mut parts.booking),
        total: micros(&mut parts.total),
    }
}

/// The reports as a Markdown table: p50 / p99 µs per part.
pub(crate) fn table(rows: &[DecideReport]) -> String {
    let mut t = String::from(
        "| engines × DP | targets | match | select | **match + select** | book + record | holders per lookup | new prefixes |\n|---|---|---|---|---|---|---|---|\n",
    );
    let pp = |m: &Micros| format!("{:.1} / {:.1}", m.p50, m.p99);
    for r in rows {
        t.push_str(&format!(
            "| {} × {} | {} | {} | {} | **{}** | {} | {:.1} | {:.0} % |\n",
            r.engines,
            r.dp_size,
            r.targets,
            pp(&r.matching),
            pp(&r.selecting),
            pp(&r.match_and_select),
            pp(&r.booking_and_record),
            r.mean_holders,
            r.new_prefix_share * 100.0,
        ));
    }
    t
}
