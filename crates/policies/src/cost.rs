//! cache_aware cost mode (the default): the least marginal cost in seconds of prefill,
//! with no threshold.
//!
//! For each candidate w (the eligible workers the count gate leaves):
//!
//! ```text
//! P(w)       = w's prefill rate per rank: total_prefill_uncached_tokens / total_prefill_busy
//!              (SGLang's cumulative counters, mean over ranks that report them); a worker
//!              without counters is priced at the candidates' mean P̄, or at
//!              default_prefill_throughput when nobody reports one (SGLang 0.5.23 leaves
//!              the counters at 0 and vLLM has none, so that is the common case); each
//!              candidate's `prefill_rate` says which, and the decision carries the note
//!              `prefill_rate_configured` when the default was used
//! wait(w)    = (q(w) + D(w)) / (n_ranks(w) · P(w)) + λ · k / (1 − k)         w has a report
//!            = B + D(w) / P̄                                                   no report
//!            = D(w) / P̄                                                       nobody reports
//! q(w)       = max(0, queued(w) − age(w) · n_ranks(w) · P(w)): the reported queue less
//!              what w prefilled since the sample, age(w) seconds ago; q(w) + D(w) is
//!              capped at this gateway's own unprefilled bookings on w
//!              (`WorkerView::own`) when the report counted no more requests than this
//!              gateway had there at the sample
//! prefill(w) = m(w) · uncached(w) / P(w),  uncached(w) = prompt tokens − tokens w holds
//!              (holdings under min_match_tokens, default 64, count as none)
//! choice     = the lowest cost, except:
//!              1. private_prefix: the cheapest holder whose prefix carries at most one
//!                 worker's worth of recent traffic, worth(w) ≤ 1, wins when its cost is
//!                 within affinity_margin (default 0.5) of the lowest, even against an
//!                 idle worker;
//!              2. affinity: otherwise the cheapest holder within that margin wins, unless
//!                 the lowest is an idle worker (nothing in flight);
//!              3. spread: when the choice holds nothing useful, the worker whose last
//!                 new prefix is the oldest (`WorkerView::last_start`, a rotation) among
//!                 those within PLACEMENT_REACH (3) margins of the lowest; among those
//!                 that never started one, the best ranked by rendezvous hashing of the
//!                 prompt's head over the workers' URLs (`placement` module: every
//!                 replica ranks alike)
//! worth(w)   = traffic(w's prefix) / (traffic total + 2n) · n, n = |candidates|, from the index's
//!              decayed lookup counts (`PrefixMatches::traffic`); unknown → rule 1 skipped
//! m(w)       = 1 + waiting_reqs(w) + dispatched_since_sample(w) + cache_hit_rate(w)
//!            = 1 + dispatched_since_sample(w)                                 no report
//! cost(w)    = wait(w) + prefill(w)
//! ```
//!
//! with queued, D, k and λ as in the expected wait (`wait` module) and B the least
//! wait among reporting candidates. Without a report, D(w) (the uncached tokens of
//! requests dispatched and not yet at their first token, or not finished when they do not
//! stream) is still known, and it is the only part of w's traffic that delays a new
//! prefill: an engine schedules prefills ahead of decode steps. Pricing every request in
//! flight as a queued prefill of p̄ tokens would make a holder whose conversations are
//! still decoding look about 0.1 s slower per conversation, and send second turns away
//! from their holders until the first report arrives. The lowest cost wins; ties (within
//! 1e-6 s) are drawn uniformly. `CandidateScore::score` is `cost(w)`,
//! `CandidateScore::prefill` is `prefill(w)`.
//!
//! `wait(w) + uncached(w) / P(w)` is the request's expected time to first token on w. The
//! multiplier m(w) turns it into a marginal cost: a prefill added to w is paid once by
//! this request, once by every request that queues behind it (about as many as wait
//! there now, by Little's law), and once more with the probability that the cached tokens
//! it evicts would have been reused (the engine's reported hit rate). On an idle worker
//! m = 1 + hit rate, so at light load the choice is close to the plain fastest first
//! token; on a worker with a queue a spill or a miss grows expensive, because in
//! saturation extra prefill is what keeps the queue from draining. Without m (plain time
//! to first token), `benches/modes.rs` spilled 9–17% of chat requests off their holders,
//! and saturated chat averaged 32 s to first token against the threshold mode's 4.6 s.
//!
//! Why it is the default (figures in docs/benchmarks.md, from
//! `cargo bench -p kvgate-policies --bench modes`): on the same simulated arrivals it
//! matched or beat the threshold mode's mean time to first token in 10 of 11 workloads
//! (shared system prompts, hot prefixes, a fleet of fast and slow GPUs, multi-turn chat, a
//! shared template with long unique prompts; from light load to saturation), its p99 in
//! 10 and its mean end-to-end latency in 9. It lost mean TTFT only on light-load chat
//! (0.109 s vs 0.103 s), where it moves a few sessions to idle workers. These are one
//! simulator's figures; an end-to-end run against real engines should confirm them.
//! The design reasons:
//! - **No cliff.** Affinity is worth exactly the prefill it saves, so a 40% match on an
//!   idle worker can beat a 90% match on a backlogged one, and a short template shared by
//!   every worker no longer decides anything.
//! - **Backlog priced at the prefill rate.** A queued prompt delays a newcomer by its
//!   prefill time: SGLang schedules waiting prefills ahead of decode steps. The expected
//!   wait divides queued tokens by the decode throughput instead (the reference's proxy),
//!   which overprices a queue several-fold against the prefill a hit saves.
//! - **Measured prefill rate** where the engine reports one, so a slower GPU's misses cost
//!   what they really cost; otherwise the configured one, said in the decision.
//! - **Credit is the uncached part**: the chosen worker is credited `uncached(w)` tokens,
//!   the work it will report as `num_waiting_uncached_tokens`, not the whole prompt.
//! - The count gate still applies, as a bound on in-flight skew (time to first token does
//!   not see how large a decode batch grows), and KV pressure still triggers the ungated
//!   expected-wait fallback when configured.
//!
//! - **A group's prefix stays whole, a shared one spreads.** The margin alone cannot tell a
//!   prefix group (a few requests sharing a long head) from a system prompt that every
//!   conversation in the fleet shares: at the instant of a decision both look the same. The
//!   index's traffic counts can: a prefix that carries at most one engine's worth of the
//!   fleet's requests belongs on one engine (breaking it over an idle worker duplicated its
//!   prefill and split its group for good: 0.95–0.975 of the ideal at lower load), while a busier one must spread (kept on its first holder, every new
//!   conversation followed it: splits of 0/0/23/41). New prefixes then start in rotation
//!   (the worker whose last start is the oldest), so groups spread evenly from their first
//!   request whatever the gateway served before.
//!
//! Paths: `hit` (or `hash` on the hash index) when the chosen worker holds part of the
//! prompt (at least `min_match_tokens` of it, a hash boundary included), `spill` when it holds none
//! although an eligible worker does, `miss` when nobody holds any, `fallback` when no
//! matches were passed (the cost then has no affinity, and nothing is recorded).

use rand::RngCore;

use crate::affinity::Ctx;
use crate::decision::{CostRule, Decision, DecisionNote, DecisionPath, PrefillRate, RateSource};
use crate::estimate;
use crate::placement;
use crate::snapshot::MatchSource;
use crate::wait::{Few, Pick, argmin_uniform, mean_positive};

/// Pseudo-requests per candidate added to the traffic total before a share is taken: a
/// prefix must have drawn more than this many recent requests before it can read as more
/// than one worker's worth, so the first few requests of a fresh index (or a group's
/// first wave) do not make every repeated prefix look like the fleet's whole traffic.
const TRAFFIC_PRIOR_PER_CANDIDATE: f64 = 2.0;

/// How many affinity margins a new prefix may reach past the cheapest worker to land on
/// the worker whose turn it is to start one: where a group starts is where its later
/// requests go, so an uneven start costs for as long as the group lives.
const PLACEMENT_REACH: f64 = 3.0;

/// The cost-mode decision for a cache_aware context (KV pressure already ruled out).
pub(crate) fn select(ctx: &Ctx<'_>, rng: &mut dyn RngCore) -> Decision {
    let set = ctx.ungated_eligible();
    let rates = prefill_rates(ctx, &set);
    let costs = ttft(ctx, &set, &rates);
    let totals: Few<f64> = costs.iter().map(|c| c.0).collect();
    let Some(cheapest) = argmin_uniform(&totals, rng) else {
        return Decision::none();
    };
    let useful: Few<usize> = set
        .iter()
        .map(|&w| useful_match(ctx, ctx.matched[w]))
        .collect();
    let holds = |i: usize| useful[i] > 0;
    // Engines' worth of recent traffic through the prefix each candidate holds.
    let worth: Few<Option<f64>> = (0..set.len())
        .map(|i| {
            let t = ctx.matches()?.traffic.as_ref()?;
            let n = set.len() as f64;
            holds(i).then(|| t.at(useful[i]) / (t.total + TRAFFIC_PRIOR_PER_CANDIDATE * n) * n)
        })
        .collect();
    let idle = |w: usize| {
        ctx.fleet.in_flight(w) == 0
            && ctx
                .fleet
                .load(w)
                .is_none_or(|l| l.live_rate == 0.0 && l.waiting_reqs == 0.0)
    };
    // Within the affinity margin of the cheapest: the costs rest on polls seconds old and
    // on an engine model, so they cannot tell these apart.
    let bound = totals[cheapest] * (1.0 + ctx.cfg.affinity_margin.max(0.0));
    let cheapest_of = |keep: &dyn Fn(usize) -> bool, bound: f64, rng: &mut dyn RngCore| {
        let masked: Few<f64> = (0..set.len())
            .map(|i| {
                if keep(i) && totals[i] <= bound {
                    totals[i]
                } else {
                    f64::INFINITY
                }
            })
            .collect();
        masked
            .iter()
            .any(|c| c.is_finite())
            .then(|| argmin_uniform(&masked, rng))
            .flatten()
    };
    let (mut at, mut rule) = (cheapest, CostRule::Cheapest);
    if !holds(cheapest) {
        // A prefix that carries at most one engine's worth of traffic belongs on one
        // engine: breaking it over a near-tie duplicates its prefill and splits its group
        // for good. Only a busier prefix (a system prompt every conversation shares) is
        // worth spreading, and then an idle worker is never passed over for it.
        let private = |i: usize| worth[i].is_some_and(|x| x <= 1.0);
        if let Some(h) = cheapest_of(&private, bound, rng) {
            (at, rule) = (h, CostRule::PrivatePrefix);
        } else if !idle(set[cheapest])
            && let Some(h) = cheapest_of(&holds, bound, rng)
        {
            (at, rule) = (h, CostRule::Affinity);
        }
    }
    // Each candidate's rendezvous rank, when the spread below placed the request.
    let mut placed: Option<Vec<u32>> = None;
    if let Some(s) = session_choice(ctx, &set, &totals, cheapest, &useful, at) {
        (at, rule) = (s, CostRule::Session);
    }
    if !holds(at) && rule != CostRule::Session {
        let (chosen, ranks) = place_new_prefix(ctx, &set, &totals, cheapest, &useful, rng);
        placed = ranks;
        if let Some(s) = chosen
            && s != at
        {
            (at, rule) = (s, CostRule::Spread);
        }
    }
    let chosen = set[at];
    // A holding under min_match_tokens is priced as none, so it is no hit either (a few
    // shared bytes of a chat template, or a hash boundary below the floor).
    let held = |w: usize| useful_match(ctx, ctx.matched[w]) > 0;
    let path = match ctx.matches() {
        None => DecisionPath::Fallback,
        Some(m) if held(chosen) => match m.source {
            MatchSource::Hash { .. } => DecisionPath::Hash,
            MatchSource::TextTree | MatchSource::TokenTree => DecisionPath::Hit,
        },
        Some(_) if ctx.holders().into_iter().any(held) => DecisionPath::Spill,
        Some(_) => DecisionPath::Miss,
    };
    let uncached = estimate::uncached_tokens(
        ctx.input.request,
        ctx.matches(),
        ctx.matched[chosen],
        ctx.cfg,
    );
    let pick = Pick {
        worker: chosen,
        scored: set.iter().copied().zip(totals).collect(),
    };
    let mut d = ctx.decide(&pick, path, estimate::to_credit(uncached), ctx.recordable());
    d.rule = Some(rule);
    d.new_prefix = !holds(at);
    annotate(
        &mut d,
        ctx,
        &set,
        &costs,
        &worth,
        &rates,
        placed.as_deref(),
        at,
    );
    if rates.iter().any(|r| r.source == RateSource::Configured) {
        d.notes.push(DecisionNote::PrefillRateConfigured);
    }
    d
}

/// What the decision shows of each candidate: its prefill, its prefix's traffic, the new
/// prefixes it started lately and when it last did, its rate and, when the spread ranked them, its rendezvous
/// rank (with the chosen one's as a note).
#[expect(
    clippy::too_many_arguments,
    reason = "the parts of one decision, computed apart in `select`"
)]
fn annotate(
    d: &mut Decision,
    ctx: &Ctx<'_>,
    set: &[usize],
    costs: &[(f64, f64)],
    worth: &[Option<f64>],
    rates: &[PrefillRate],
    placed: Option<&[u32]>,
    at: usize,
) {
    let slot = ctx.candidate_slots();
    for (k, (&i, &(_, prefill))) in set.iter().zip(costs).enumerate() {
        let w = &ctx.fleet.workers[i];
        if let Some(c) = slot.get(i).and_then(|&at| d.candidates.get_mut(at)) {
            c.prefill = Some(prefill);
            c.prefix_traffic = worth[k];
            c.recent = Some(w.recent);
            c.last_start = Some(w.last_start);
            c.prefill_rate = Some(rates[k]);
        }
    }
    if let Some(ranks) = placed {
        for (&i, &rank) in set.iter().zip(ranks) {
            if let Some(c) = slot.get(i).and_then(|&at| d.candidates.get_mut(at)) {
                c.placement_rank = Some(rank);
            }
        }
        d.notes.push(DecisionNote::Rendezvous { rank: ranks[at] });
    }
}

/// The session's worker, as an index into `set`, when it takes the request: where
/// nobody's prefix decided (`at` holds nothing useful), within the spread's reach of the
/// lowest cost; where `at` holds a prefix, if it holds as much, within the affinity margin.
fn session_choice(
    ctx: &Ctx<'_>,
    set: &[usize],
    totals: &[f64],
    cheapest: usize,
    useful: &[usize],
    at: usize,
) -> Option<usize> {
    let h = ctx.matches()?.session_holder?;
    let s = set.iter().position(|&w| ctx.fleet.workers[w].id == h)?;
    let margin = ctx.cfg.affinity_margin.max(0.0);
    let ok = if useful[at] == 0 {
        totals[s] <= totals[cheapest] * (1.0 + PLACEMENT_REACH * margin)
    } else {
        s != at && useful[s] == useful[at] && totals[s] <= totals[cheapest] * (1.0 + margin)
    };
    ok.then_some(s)
}

/// Where a request that starts a prefix group goes (nobody's prefix decided), as an index
/// into `set`, and each candidate's rendezvous rank when one was taken. It goes to the
/// worker whose last new prefix is the oldest ([`WorkerView::last_start`]), within
/// [`PLACEMENT_REACH`] margins of the cheapest, instead of wherever an instant's costs
/// point. A rotation, not a count: a count carries an old imbalance forward, and a run of
/// 8 groups on 4 engines after one uneven start lands 3:2:2:1; the rotation lands any run
/// of k·n starts k to each. Among workers that never started one (a fresh gateway), the
/// rendezvous ranking of the prompt's head decides, so that other replicas, which have
/// not seen this prefix either, choose the same engine. A holder is not a place to start
/// a prefix: it would be a hit the affinity rules already declined.
///
/// [`WorkerView::last_start`]: crate::WorkerView::last_start
fn place_new_prefix(
    ctx: &Ctx<'_>,
    set: &[usize],
    totals: &[f64],
    cheapest: usize,
    useful: &[usize],
    rng: &mut dyn RngCore,
) -> (Option<usize>, Option<Vec<u32>>) {
    let wide = totals[cheapest] * (1.0 + PLACEMENT_REACH * ctx.cfg.affinity_margin.max(0.0));
    let within = |i: usize| useful[i] == 0 && totals[i] <= wide;
    let last = |i: usize| ctx.fleet.workers[set[i]].last_start;
    let oldest = (0..set.len()).filter(|&i| within(i)).map(last).min();
    let open = |i: usize| within(i) && Some(last(i)) == oldest;
    let deepest = set.iter().map(|&w| ctx.matched[w]).max().unwrap_or(0);
    match placement::key(ctx.input.request, deepest, ctx.cfg) {
        Some(key) => {
            let weights = placement::weights(key, ctx.fleet.workers);
            let ranks = placement::ranks(&weights, set);
            let best = (0..set.len())
                .filter(|&i| open(i))
                .min_by_key(|&i| ranks[i]);
            (best, Some(ranks))
        }
        None => {
            let masked: Few<f64> = (0..set.len())
                .map(|i| if open(i) { totals[i] } else { f64::INFINITY })
                .collect();
            let best = masked
                .iter()
                .any(|c| c.is_finite())
                .then(|| argmin_uniform(&masked, rng))
                .flatten();
            (best, None)
        }
    }
}

/// The prefill rate each member of `set` is priced at: its own counters' rate, else the
/// mean of the candidates that report one, else the configured default.
fn prefill_rates(ctx: &Ctx<'_>, set: &[usize]) -> Few<PrefillRate> {
    let fleet = &ctx.fleet;
    let mean = mean_positive(
        set.iter()
            .filter_map(|&i| fleet.load(i).map(|l| l.prefill_rate)),
    );
    set.iter()
        .map(|&i| match (fleet.load(i), mean) {
            (Some(l), _) if l.prefill_rate > 0.0 => PrefillRate {
                tokens_per_sec: l.prefill_rate,
                source: RateSource::Reported,
            },
            (_, Some(m)) => PrefillRate {
                tokens_per_sec: m,
                source: RateSource::FleetMean,
            },
            (_, None) => PrefillRate {
                tokens_per_sec: fleet.params.default_prefill_rate,
                source: RateSource::Configured,
            },
        })
        .collect()
}

/// (cost, weighted prefill part) for each member of `set`, priced at `rates`.
fn ttft(ctx: &Ctx<'_>, set: &[usize], rates: &[PrefillRate]) -> Few<(f64, f64)> {
    let fleet = &ctx.fleet;
    let p = &fleet.params;
    let nominal = mean_positive(
        set.iter()
            .filter_map(|&i| fleet.load(i).map(|l| l.prefill_rate)),
    )
    .unwrap_or(p.default_prefill_rate);
    // `rates` follows `set`: read by position, so the pricing stays linear in the fleet
    // (a search per candidate cost 30 µs a decision at 256 engines).
    let mut waits: Few<Option<f64>> = set
        .iter()
        .zip(rates)
        .map(|(&i, r)| {
            fleet.load(i).map(|l| {
                let rate = l.ranks * r.tokens_per_sec;
                // The reported queue has been prefilling since the sample: a poll taken
                // while a group's first prefill ran counts its followers as uncached,
                // and read as is for a whole interval it drove them off their holder.
                let since = fleet.workers[i].load.as_ref().map_or(0.0, |s| {
                    ctx.input.now.saturating_sub(s.sampled_at).as_secs_f64()
                });
                let queued = (l.queued - since * rate).max(0.0);
                let mut backlog = queued + fleet.workers[i].credit.tokens as f64;
                // Every request the engine had was this gateway's: what it booked them at
                // is the better count (followers of a prefix still prefilling are hits).
                if let Some(own) = fleet.workers[i].own
                    && l.requests <= own.requests_at_sample as f64
                {
                    backlog = backlog.min(own.unprefilled_tokens as f64);
                }
                backlog / rate + l.kv_term(p.lambda)
            })
        })
        .collect();
    let baseline = waits
        .iter()
        .flatten()
        .copied()
        .reduce(f64::min)
        .unwrap_or(0.0);
    for (w, &i) in waits.iter_mut().zip(set) {
        if w.is_none() {
            *w = Some(baseline + fleet.workers[i].credit.tokens as f64 / nominal);
        }
    }
    set.iter()
        .zip(waits)
        .zip(rates)
        .map(|((&i, w), r)| {
            let uncached = estimate::uncached_tokens(
                ctx.input.request,
                ctx.matches(),
                useful_match(ctx, ctx.matched[i]),
                ctx.cfg,
            );
            let prefill = weight(ctx, i) * uncached / r.tokens_per_sec;
            (w.unwrap_or(f64::MAX) + prefill, prefill)
        })
        .collect()
}

/// `matched` index units, or 0 when they are fewer than `min_match_tokens` tokens.
fn useful_match(ctx: &Ctx<'_>, matched: usize) -> usize {
    if estimate::useful(ctx.input.request, matched, ctx.cfg) {
        matched
    } else {
        0
    }
}

/// How many times a prefill on worker index `i` is paid: once by this request, once by
/// each request that will queue behind it, and once more with the probability that the
/// cached tokens it evicts would have been reused.
fn weight(ctx: &Ctx<'_>, i: usize) -> f64 {
    let w = &ctx.fleet.workers[i];
    match ctx.fleet.load(i) {
        Some(l) => 1.0 + l.waiting_reqs + w.credit.requests as f64 + l.hit_rate,
        None => 1.0 + w.credit.requests as f64,
    }
}

#[cfg(test)]
mod tests;
