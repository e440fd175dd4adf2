//! `kvgate-bench workload`: every policy on a fresh fleet and a fresh gateway, the same plan.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kvgate_bench::{EngineShape, Plan, RunReport, Sent, Summary, Tokens, upper_bound};
use kvgate_engine_sim::{SimConfig, SimFleet, Tokenizer};
use kvgate_gateway::testing::GetViews;
use kvgate_gateway::{Gateway, GatewayConfig};
use kvgate_policies::{CacheMode, PolicyConfig, PolicyKind};
use kvgate_poller::PollNow;

use super::child::{ChildServer, free_port};
use super::driver::{Arrival, replay};

/// A kvgate policy as named on the command line: `cache_aware`, `cache_aware:threshold`...
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyChoice {
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
pub struct Settings {
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
}

/// Who routes the run.
#[derive(Debug, Clone)]
pub enum Target {
    Kvgate(PolicyChoice),
    /// The reference gateway's `smg` command, with its cache_aware policy.
    Smg(PathBuf),
}

impl Target {
    pub fn label(&self) -> String {
        match self {
            Target::Kvgate(p) => p.label.clone(),
            Target::Smg(_) => "smg:cache_aware".to_owned(),
        }
    }
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

/// Runs `plan` through `target` on a fresh fleet; the fleet's counters give the hit rate.
pub fn run_target(
    sys: &actix_rt::SystemRunner,
    target: &Target,
    plan: &Plan,
    s: &Settings,
) -> anyhow::Result<RunReport> {
    let fleet = SimFleet::start_each("127.0.0.1", 0, s.sims.clone())
        .context("starting the simulated fleet")?;
    let model = s.sims.first().map(|c| c.model.clone()).unwrap_or_default();
    let front = match target {
        Target::Kvgate(p) => start_kvgate(sys, p, &fleet, s)?,
        Target::Smg(bin) => start_smg(bin, &fleet, s, plan)?,
    };
    let url = front.url();
    let run = sys.block_on(replay(
        &url,
        &model,
        plan,
        s.arrival,
        s.seed,
        s.max_wall,
        s.request_timeout,
    ));
    front.stop();

    let stats: Vec<_> = (0..fleet.len()).map(|i| fleet.engine(i).stats()).collect();
    fleet.stop();
    let ttft: Vec<f64> = run
        .records
        .iter()
        .filter(|r| r.ok)
        .filter_map(|r| r.ttft_ms)
        .collect();
    let latency: Vec<f64> = run
        .records
        .iter()
        .filter(|r| r.ok)
        .map(|r| r.total_ms)
        .collect();
    let completed = run.records.iter().filter(|r| r.ok).count();
    let mut sent: Vec<_> = run.records.iter().collect();
    sent.sort_by_key(|r| r.sent_at);
    let sent: Vec<Sent> = sent
        .into_iter()
        .map(|r| Sent {
            prompt: r.prompt.clone(),
            answer: r.answer.clone(),
        })
        .collect();
    let shape = s.sims.first().map_or(
        EngineShape {
            page_size: 1,
            pool_tokens: usize::MAX,
        },
        |c| EngineShape {
            page_size: c.page_size,
            pool_tokens: c.cache_capacity_tokens,
        },
    );
    let tokenizer = s.sims.first().map_or(Tokenizer::default(), |c| c.tokenizer);
    let hits = run
        .records
        .iter()
        .filter_map(|r| r.usage)
        .fold(Tokens::default(), |t, u| {
            t + Tokens {
                prompt: u.prompt_tokens,
                cached: u.cached_tokens.unwrap_or(0),
            }
        });
    // SGLang leaves `prompt_tokens_details` out when nothing was cached, so only a run
    // where no answer reported it says the report is off.
    if run.records.iter().any(|r| r.usage.is_some())
        && !run
            .records
            .iter()
            .any(|r| r.usage.is_some_and(|u| u.cached_tokens.is_some()))
    {
        eprintln!(
            "    warning: {}: the engines did not report cached tokens",
            target.label()
        );
    }
    let engine_counters = Tokens {
        prompt: stats.iter().map(|e| e.prompt_tokens).sum(),
        cached: stats.iter().map(|e| e.cached_tokens).sum(),
    };
    if engine_counters != hits {
        eprintln!(
            "    note: {}: usage says {}/{} cached/prompt tokens, the engines' counters {}/{}",
            target.label(),
            hits.cached,
            hits.prompt,
            engine_counters.cached,
            engine_counters.prompt
        );
    }
    Ok(RunReport {
        workload: plan.kind,
        target: target.label(),
        reference: matches!(target, Target::Smg(_)),
        planned: plan.len(),
        completed,
        failed: run.records.len() - completed,
        hits,
        engine_counters,
        ideal: upper_bound(&sent, shape, &|text| tokenizer.encode(text)),
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
    })
}

fn start_kvgate(
    sys: &actix_rt::SystemRunner,
    p: &PolicyChoice,
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
    } else if p.kind.needs_loads() {
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
    Ok(Front::Kvgate(gw, dir))
}

fn start_smg(bin: &Path, fleet: &SimFleet, s: &Settings, plan: &Plan) -> anyhow::Result<Front> {
    let port = free_port()?;
    let mut args: Vec<String> = ["launch", "--host", "127.0.0.1", "--port"]
        .map(String::from)
        .to_vec();
    args.push(port.to_string());
    args.push("--worker-urls".into());
    args.extend(fleet.urls());
    args.extend(["--policy", "cache_aware", "--log-level", "warn"].map(String::from));
    let log = s.log_dir.join(format!("smg-{}.log", plan.kind));
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
