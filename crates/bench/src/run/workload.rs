//! `kvgate-bench workload`: every policy on a fresh fleet and a fresh gateway, the same plan.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use kvgate_bench::{
    EngineShape, EngineTokens, Plan, RunReport, Sent, Summary, Tokens, upper_bound_after,
};
use kvgate_engine_sim::{EngineStats, SimConfig, SimFleet};
use kvgate_gateway::testing::GetViews;
use kvgate_gateway::{Gateway, GatewayConfig};
use kvgate_policies::{CacheMode, PolicyConfig, PolicyKind};
use kvgate_poller::PollNow;

use super::child::{ChildServer, free_port};
use super::driver::{Arrival, PromptForm, Record, Replay, Wire, replay};

/// A kvgate policy as named on the command line: `cache_aware`, `cache_aware:threshold`...
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PolicyChoice {
    pub label: String,
    pub kind: PolicyKind,
    pub mode: Option<CacheMode>,
}

impl std::str::FromStr for PolicyChoice {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<PolicyChoice> {
        let (name, mode) = match s.split_once(':') {
            Some((n, m)) => (n, Some(m)),
            None => (s, None),
        };
        let kind: PolicyKind = name.parse()?;
        let mode = match mode {
            None => None,
            Some("threshold") => Some(CacheMode::Threshold),
            Some("cost") => Some(CacheMode::Cost),
            Some(m) => bail!("unknown cache_aware mode '{m}' (expected threshold or cost)"),
        };
        if mode.is_some() && kind != PolicyKind::CacheAware {
            bail!(
                "a ':{}' mode applies to cache_aware only",
                s.split_once(':').map_or("", |p| p.1)
            );
        }
        Ok(PolicyChoice {
            label: s.to_owned(),
            kind,
            mode,
        })
    }
}

/// What each run is started with.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// One per engine.
    pub sims: Vec<SimConfig>,
    /// Traffic starts this long after the gateway answers, whatever it knows by then; `None`:
    /// once kvgate holds a load report from every engine (smg: 1 s after readiness).
    pub start_after: Option<Duration>,
    pub arrival: Arrival,
    pub seed: u64,
    pub max_wall: Duration,
    pub request_timeout: Duration,
    pub log_dir: PathBuf,
    /// The run's setting in words, kept in each report.
    pub setting: String,
    /// Gateway instances in front of the fleet; requests go to them in turn.
    pub replicas: usize,
    pub form: PromptForm,
    /// The engines' tokenizer (that of `sims`).
    pub tokens: Arc<EngineTokens>,
    /// The run has event-fed rows: smg's fleet publishes KV events too, so it could use
    /// them.
    pub kv_events: bool,
    /// Before the gateway starts, each group's warm-up request ([`Plan::warm_up`]) goes
    /// straight to an engine, group g to engine g mod N: traffic of an earlier gateway.
    pub warm_engines: bool,
    /// Sent through the gateway before the plan at the same arrival, uncounted: traffic
    /// the gateway served before.
    pub prelude: Option<Plan>,
}

/// Who routes the run.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// kvgate with a policy; `events`: in front of engines that publish KV events, so its
    /// exact index is fed (otherwise only its approximate index).
    Kvgate { policy: PolicyChoice, events: bool },
    /// The reference gateway's `smg` command, with its cache_aware policy.
    Smg(PathBuf),
}

impl Target {
    pub(crate) fn label(&self) -> String {
        match self {
            Target::Kvgate { policy, events } if *events => format!("{}+events", policy.label),
            Target::Kvgate { policy, .. } => policy.label.clone(),
            Target::Smg(_) => "smg:cache_aware".to_owned(),
        }
    }

    /// Whether its engines publish KV events.
    fn events(&self, s: &Settings) -> bool {
        match self {
            Target::Kvgate { events, .. } => *events,
            Target::Smg(_) => s.kv_events,
        }
    }
}

/// `sims` publishing KV events (with replay) on free ports.
fn publishing(sims: &[SimConfig]) -> Vec<SimConfig> {
    sims.iter()
        .map(|c| SimConfig {
            kv_events_port: Some(0),
            kv_events_replay_port: Some(0),
            ..c.clone()
        })
        .collect()
}

/// The gateway in front of a fleet, whichever it is.
enum Front {
    Kvgate(Gateway, tempfile::TempDir),
    Smg(ChildServer),
}

impl Front {
    fn url(&self) -> String {
        match self {
            Front::Kvgate(gw, _) => gw.url(),
            Front::Smg(c) => c.url().to_owned(),
        }
    }

    fn stop(self) {
        match self {
            Front::Kvgate(gw, _dir) => gw.stop(),
            Front::Smg(child) => drop(child),
        }
    }
}

/// Runs `plan` through `target` on a fresh fleet; the answers' `usage` gives the hit rate.
pub(crate) fn run_target(
    sys: &actix_rt::SystemRunner,
    target: &Target,
    plan: &Plan,
    s: &Settings,
) -> anyhow::Result<RunReport> {
    let sims = if target.events(s) {
        publishing(&s.sims)
    } else {
        s.sims.clone()
    };
    let fleet =
        SimFleet::start_each("127.0.0.1", 0, sims).context("starting the simulated fleet")?;
    let model = s.sims.first().map(|c| c.model.clone()).unwrap_or_default();
    let mut warm = if s.warm_engines {
        warm_up(sys, &fleet, &model, plan, s)
    } else {
        Vec::new()
    };
    let fronts = match start_fronts(sys, target, &fleet, s, plan) {
        Ok(fronts) => fronts,
        Err(e) => {
            fleet.stop();
            return Err(e);
        }
    };
    let urls: Vec<String> = fronts.iter().map(Front::url).collect();
    let wire = Wire {
        urls: &urls,
        model: &model,
        form: s.form,
        tokens: &s.tokens,
    };
    if let Some(prelude) = &s.prelude {
        let before = sys.block_on(replay(
            &wire,
            prelude,
            s.arrival,
            s.seed ^ 1,
            s.max_wall,
            s.request_timeout,
        ));
        let failed = before.records.iter().filter(|r| !r.ok).count();
        if failed > 0 {
            eprintln!("    warning: {failed} prelude requests failed");
        }
        warm.extend(before.records);
    }
    let warm_stats = snapshot(&fleet);
    let run = sys.block_on(replay(
        &wire,
        plan,
        s.arrival,
        s.seed,
        s.max_wall,
        s.request_timeout,
    ));
    fronts.into_iter().for_each(Front::stop);
    let stats = since(&snapshot(&fleet), &warm_stats);
    fleet.stop();
    Ok(report(target, plan, s, &run, &stats, &warm))
}

/// `s.replicas` gateways of `target` in front of `fleet`; if one fails, those already up
/// are stopped.
fn start_fronts(
    sys: &actix_rt::SystemRunner,
    target: &Target,
    fleet: &SimFleet,
    s: &Settings,
    plan: &Plan,
) -> anyhow::Result<Vec<Front>> {
    let mut fronts = Vec::with_capacity(s.replicas);
    for replica in 0..s.replicas.max(1) {
        let front = match target {
            Target::Kvgate { policy, events } => start_kvgate(sys, policy, *events, fleet, s),
            Target::Smg(bin) => start_smg(bin, fleet, s, plan, replica),
        };
        match front {
            Ok(f) => fronts.push(f),
            Err(e) => {
                fronts.into_iter().for_each(Front::stop);
                return Err(e);
            }
        }
    }
    Ok(fronts)
}

/// The measured run's own share of the engines' counters: `after` less the warm-up's.
fn since(after: &[EngineStats], before: &[EngineStats]) -> Vec<EngineStats> {
    after
        .iter()
        .zip(before)
        .map(|(after, before)| EngineStats {
            requests: after.requests - before.requests,
            prompt_tokens: after.prompt_tokens - before.prompt_tokens,
            cached_tokens: after.cached_tokens - before.cached_tokens,
            ..after.clone()
        })
        .collect()
}

/// The run's figures: hits from the answers, the ideal from what was sent, the split from
/// the engines' counters.
fn report(
    target: &Target,
    plan: &Plan,
    s: &Settings,
    run: &Replay,
    stats: &[EngineStats],
    warm: &[Record],
) -> RunReport {
    let label = target.label();
    let ok = || run.records.iter().filter(|r| r.ok);
    let ttft: Vec<f64> = ok().filter_map(|r| r.ttft_ms).collect();
    let latency: Vec<f64> = ok().map(|r| r.total_ms).collect();
    let completed = ok().count();
    let hits = usage_totals(&run.records);
    let engine_counters = Tokens {
        prompt: stats.iter().map(|e| e.prompt_tokens).sum(),
        cached: stats.iter().map(|e| e.cached_tokens).sum(),
    };
    warn_on_counts(&label, &run.records, hits, engine_counters);
    RunReport {
        workload: plan.kind,
        target: label,
        reference: matches!(target, Target::Smg(_)),
        planned: plan.len(),
        completed,
        failed: run.records.len() - completed,
        hits,
        engine_counters,
        ideal: upper_bound_after(&in_order(warm), &in_order(&run.records), engine_shape(s)),
        ttft_ms: Summary::of(&ttft),
        latency_ms: Summary::of(&latency),
        wall_secs: run.wall.as_secs_f64(),
        output_tokens: run.records.iter().map(|r| r.output_tokens).sum(),
        split: stats.iter().map(|e| e.requests).collect(),
        capped: run.capped,
        errors: run
            .records
            .iter()
            .filter_map(|r| r.error.clone())
            .take(5)
            .collect(),
        setting: s.setting.clone(),
        replicas: s.replicas.max(1),
    }
}

/// Σ prompt and Σ cached tokens as the engines answered them.
fn usage_totals(records: &[Record]) -> Tokens {
    records
        .iter()
        .filter_map(|r| r.usage)
        .fold(Tokens::default(), |t, u| {
            t + Tokens {
                prompt: u.prompt_tokens,
                cached: u.cached_tokens.unwrap_or(0),
            }
        })
}

/// Says when the figures cannot be taken at their word: prompts the bench counted
/// differently from the engines (the ideal is an upper bound only in the engines' tokens),
/// no cache report, or answers that disagree with the engines' own counters.
fn warn_on_counts(label: &str, records: &[Record], hits: Tokens, engine_counters: Tokens) {
    let miscounted = records
        .iter()
        .filter(|r| {
            r.usage
                .is_some_and(|u| u.prompt_tokens != r.prompt.len() as u64)
        })
        .count();
    if miscounted > 0 {
        eprintln!(
            "    warning: {label}: {miscounted} prompts counted differently by the engines than by the bench"
        );
    }
    // SGLang leaves `prompt_tokens_details` out when nothing was cached, so only a run
    // where no answer reported it says the report is off.
    if records.iter().any(|r| r.usage.is_some())
        && !records
            .iter()
            .any(|r| r.usage.is_some_and(|u| u.cached_tokens.is_some()))
    {
        eprintln!("    warning: {label}: the engines did not report cached tokens");
    }
    if engine_counters != hits {
        eprintln!(
            "    note: {label}: usage says {}/{} cached/prompt tokens, the engines' counters {}/{}",
            hits.cached, hits.prompt, engine_counters.cached, engine_counters.prompt
        );
    }
}

/// The engines' page size and pool, which bound what any routing could hit.
fn engine_shape(s: &Settings) -> EngineShape {
    s.sims.first().map_or(
        EngineShape {
            page_size: 1,
            pool_tokens: usize::MAX,
        },
        |c| EngineShape {
            page_size: c.page_size,
            pool_tokens: c.cache_capacity_tokens,
        },
    )
}

/// What each engine has counted so far.
fn snapshot(fleet: &SimFleet) -> Vec<EngineStats> {
    (0..fleet.len()).map(|i| fleet.engine(i).stats()).collect()
}

/// The records as the ideal takes them: in the order they were sent.
fn in_order(records: &[Record]) -> Vec<Sent> {
    let mut sent: Vec<&Record> = records.iter().collect();
    sent.sort_by_key(|r| r.sent_at);
    sent.into_iter()
        .map(|r| Sent {
            prompt: r.prompt.clone(),
            answer: r.answer_ids.clone(),
        })
        .collect()
}

/// Sends `plan`'s warm-up straight to the engines, one request per engine at a time;
/// returns what was sent.
fn warm_up(
    sys: &actix_rt::SystemRunner,
    fleet: &SimFleet,
    model: &str,
    plan: &Plan,
    s: &Settings,
) -> Vec<Record> {
    let urls = fleet.urls();
    let wire = Wire {
        urls: &urls,
        model,
        form: s.form,
        tokens: &s.tokens,
    };
    let warm = plan.warm_up(s.seed);
    let run = sys.block_on(replay(
        &wire,
        &warm,
        Arrival::Closed(urls.len()),
        s.seed,
        s.max_wall,
        s.request_timeout,
    ));
    let failed = run.records.iter().filter(|r| !r.ok).count();
    if failed > 0 || run.records.len() < warm.len() {
        eprintln!(
            "    warning: {failed} of {} warm-up requests failed",
            warm.len()
        );
    }
    run.records
}

fn start_kvgate(
    sys: &actix_rt::SystemRunner,
    p: &PolicyChoice,
    events: bool,
    fleet: &SimFleet,
    s: &Settings,
) -> anyhow::Result<Front> {
    let dir = tempfile::tempdir().context("temp data dir")?;
    let mut policy = PolicyConfig::with_kind(p.kind);
    if let Some(mode) = p.mode {
        policy.cache_mode = mode;
    }
    let cfg = GatewayConfig {
        port: 0,
        worker_urls: fleet.urls(),
        data_dir: dir.path().join("data"),
        policy,
        seed: Some(s.seed),
        ..GatewayConfig::default()
    };
    let gw = Gateway::start(cfg).context("starting the gateway")?;
    if let Some(after) = s.start_after {
        // A fresh start: the traffic finds whatever the gateway has learned by then.
        std::thread::sleep(after);
        return Ok(Front::Kvgate(gw, dir));
    }
    if p.kind.needs_loads() {
        // Route with real load reports (the idle residual among them) from the first request.
        let actors = gw.actors().clone();
        actors.poller.do_send(PollNow);
        let ready = sys.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                let views = actors.selector.send(GetViews).await;
                if views.is_ok_and(|v| !v.is_empty() && v.iter().all(|w| w.load.is_some())) {
                    return true;
                }
                actix_rt::time::sleep(Duration::from_millis(20)).await;
            }
            false
        });
        if !ready {
            eprintln!(
                "warning: {}: no load report from every engine after 15 s",
                p.label
            );
        }
    }
    if events {
        let tokenizer = s.form == PromptForm::Chat;
        if let Err(e) = sys.block_on(until_events_live(&gw.url(), tokenizer)) {
            eprintln!("warning: {}+events: {e:#}", p.label);
        }
    }
    Ok(Front::Kvgate(gw, dir))
}

/// Waits until every engine's events are live on the gateway at `url` and, for chats, its
/// model's tokenizer is loaded.
async fn until_events_live(url: &str, tokenizer: bool) -> anyhow::Result<()> {
    let client = awc::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut resp = client
            .get(format!("{url}/workers"))
            .send()
            .await
            .map_err(|e| anyhow!("GET /workers: {e}"))?;
        let v: serde_json::Value = resp
            .json()
            .limit(1 << 20)
            .await
            .map_err(|e| anyhow!("GET /workers: {e}"))?;
        let workers = v["workers"].as_array().cloned().unwrap_or_default();
        let ready = |w: &serde_json::Value| {
            w["events"]["state"] == "live" && (!tokenizer || w["tokenizer"]["state"] == "ready")
        };
        if !workers.is_empty() && workers.iter().all(ready) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("events not live after 30 s: {v}");
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
}

fn start_smg(
    bin: &Path,
    fleet: &SimFleet,
    s: &Settings,
    plan: &Plan,
    replica: usize,
) -> anyhow::Result<Front> {
    let port = free_port()?;
    let mut args: Vec<String> = ["launch", "--host", "127.0.0.1", "--port"]
        .map(String::from)
        .to_vec();
    args.push(port.to_string());
    args.push("--worker-urls".into());
    args.extend(fleet.urls());
    args.extend(["--policy", "cache_aware", "--log-level", "warn"].map(String::from));
    // Replicas cannot share the default metrics port; loopback only, as everything here.
    args.extend(["--prometheus-host".to_owned(), "127.0.0.1".to_owned()]);
    args.extend(["--prometheus-port".to_owned(), free_port()?.to_string()]);
    let name = if replica == 0 {
        format!("smg-{}.log", plan.kind)
    } else {
        format!("smg-{}-{replica}.log", plan.kind)
    };
    let log = s.log_dir.join(name);
    let mut child =
        ChildServer::spawn("smg", bin, &args, &log, format!("http://127.0.0.1:{port}"))?;
    child
        .wait_ready(&["/readiness", "/health"], Duration::from_secs(60))
        .with_context(|| format!("smg did not come up; see {}", log.display()))?;
    // Its first load poll happens right after startup; give it a moment to land.
    std::thread::sleep(s.start_after.unwrap_or(Duration::from_secs(1)));
    Ok(Front::Smg(child))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_take_an_optional_cache_mode() {
        let p: PolicyChoice = "cache_aware:threshold".parse().unwrap();
        assert_eq!(
            (p.kind, p.mode),
            (PolicyKind::CacheAware, Some(CacheMode::Threshold))
        );
        let p: PolicyChoice = "least_load".parse().unwrap();
        assert_eq!(
            (p.kind, p.mode, p.label.as_str()),
            (PolicyKind::LeastLoad, None, "least_load")
        );
        assert!("cache_aware:fast".parse::<PolicyChoice>().is_err());
        assert!("round_robin:cost".parse::<PolicyChoice>().is_err());
        assert!("nope".parse::<PolicyChoice>().is_err());
    }
}
