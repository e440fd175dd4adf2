//! The registry actor: owns the worker records and their lifecycle, and settles health
//! with hysteresis. Every change is pushed whole to the subscribers. What a worker is
//! (its models, engine kind and `/server_info`) is asked in `detect`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use actix::prelude::*;
use kvgate_core::{UrlError, WorkerUrl};
use kvgate_policies::WorkerId;
use kvgate_poller::{PollNow, PollTarget, SetTargets};
use kvgate_store::{Persister, RegistryImage};

use kvgate_core::Secret;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tracing::info;

use crate::config::{EventsConfig, HealthConfig};
use crate::metrics::Metrics;

mod admin;
mod allow;
pub(crate) use admin::{AddWorker, DrainWorker, ListWorkers, RemoveWorker, WorkerFailed};
pub(crate) use allow::AllowList;
mod detect;
mod discovered;
pub use discovered::{AddDiscovered, PodRef};
pub(crate) use discovered::{DropDiscovered, Exclusions, RetireDiscovered};

pub(crate) use detect::ProbeError;
use detect::{Detected, Probe, detect};

/// What kind of engine answered at registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Runtime {
    Sglang,
    Vllm,
    Unknown,
}

/// A worker's lifecycle state. Only `Ready` is routable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerStatus {
    /// Registered, not yet detected (its `/v1/models` did not answer yet).
    Pending,
    Ready,
    /// Failed its health checks (or refused a connection); probed until it passes again.
    Unhealthy,
    /// Being removed: no new requests, the ones in flight finish.
    Draining,
}

/// Where a worker came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerSource {
    Config,
    Api,
    /// A pod found by `--service-discovery` (never persisted: the API says it again).
    Kubernetes,
}

/// Everything kvgate knows about one worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub id: WorkerId,
    pub url: WorkerUrl,
    pub models: Vec<String>,
    /// The LoRA adapters among `models`, each with its base model (the `parent` of its
    /// `/v1/models` card).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub adapters: BTreeMap<String, String>,
    pub status: WorkerStatus,
    pub runtime: Runtime,
    pub source: WorkerSource,
    pub max_running_requests: Option<u64>,
    pub dp_size: Option<u64>,
    pub page_size: Option<u64>,
    /// From `/server_info`; a change means the engine restarted with an empty cache.
    pub startup_time: Option<f64>,
    /// The `kv_events` block of `/server_info`, kept for event subscription.
    pub kv_events: Option<serde_json::Value>,
    /// This worker's own `--kv-events-config` JSON (from `POST /workers`, the config file
    /// or its pod's annotation), used when the engine advertises none; before the shared
    /// `--kv-events-config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_events_config: Option<String>,
    /// The engine's release (`version` of `/server_info`): which field names a rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Where the engine loaded its tokenizer from (`tokenizer_path` of `/server_info` or
    /// `/model_info`): a local path or a hub name.
    #[serde(default)]
    pub tokenizer_path: Option<String>,
    /// Seconds since the Unix epoch when it was registered.
    pub added_at: f64,
    pub consecutive_failures: u32,
    pub consecutive_successes: u32,
    pub last_error: Option<String>,
    /// Out because it refused a connection (a request's or a probe's), not merely slow or
    /// failing its checks: only then do requests waiting on it go elsewhere.
    #[serde(skip)]
    pub refused: bool,
    /// Which registration this is: a worker removed and added again gets a new one.
    pub incarnation: u64,
    /// The key the engine expects (`Authorization: Bearer`); never shown.
    #[serde(skip)]
    pub api_key: Option<Secret>,
    /// The pod of a discovered worker (`pod`, `namespace`, `pod_uid` in its JSON).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<PodRef>,
}

/// Where a dispatch to one data-parallel rank names the rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankVia {
    /// The `X-data-parallel-rank` header (vLLM).
    Header,
    /// This member of the JSON body (SGLang).
    Body(&'static str),
}

/// `major.minor.patch` of a version string (`0.5.9`, `0.5.10rc1`, `v0.5.9.post2`).
fn release(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.trim_start_matches('v').split('.').map(|p| {
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().ok()
    });
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

/// Most data-parallel ranks a worker is routed over one by one; past it, by the worker.
const MAX_ROUTED_RANKS: u64 = 256;

impl WorkerRecord {
    /// A worker just added: pending detection, nothing known of it yet.
    pub(crate) fn pending(
        url: WorkerUrl,
        source: WorkerSource,
        incarnation: u64,
        api_key: Option<Secret>,
    ) -> WorkerRecord {
        WorkerRecord {
            id: WorkerId::from_url(url.as_str()),
            url,
            models: Vec::new(),
            adapters: BTreeMap::new(),
            version: None,
            status: WorkerStatus::Pending,
            runtime: Runtime::Unknown,
            source,
            max_running_requests: None,
            dp_size: None,
            page_size: None,
            startup_time: None,
            kv_events: None,
            kv_events_config: None,
            tokenizer_path: None,
            added_at: kvgate_core::clock::unix_now(),
            consecutive_failures: 0,
            consecutive_successes: 0,
            last_error: None,
            refused: false,
            incarnation,
            api_key,
            kubernetes: None,
        }
    }

    pub fn healthy(&self) -> bool {
        self.status == WorkerStatus::Ready
    }

    /// The ranks the gateway routes to one by one: an SGLang engine with `dp_size > 1`
    /// takes the rank in the body (`routed_dp_rank`), a vLLM server with several
    /// data-parallel engines in a header ([`WorkerRecord::rank_in_header`]); any other
    /// worker is one target.
    pub fn routed_ranks(&self) -> Option<u32> {
        match (self.runtime, self.dp_size) {
            (Runtime::Sglang | Runtime::Vllm, Some(n)) if (2..=MAX_ROUTED_RANKS).contains(&n) => {
                u32::try_from(n).ok()
            }
            _ => None,
        }
    }

    /// Where a request names its data-parallel rank: vLLM's `X-data-parallel-rank` header,
    /// SGLang's `routed_dp_rank`, or `data_parallel_rank` for SGLang 0.5.9 and older (by
    /// `/server_info` `version`): the rename came after 0.5.9 (sgl-project/sglang#19268),
    /// and those releases do not read the new name.
    pub fn rank_via(&self) -> RankVia {
        if self.runtime == Runtime::Vllm {
            return RankVia::Header;
        }
        let old = self
            .version
            .as_deref()
            .and_then(release)
            .is_some_and(|v| v < (0, 5, 10));
        RankVia::Body(if old {
            "data_parallel_rank"
        } else {
            "routed_dp_rank"
        })
    }

    /// Its routing targets: each with its id and rank (`None`: the worker as a whole).
    pub fn targets(&self) -> Vec<(WorkerId, Option<u32>)> {
        match self.routed_ranks() {
            Some(n) => (0..n).map(|r| (self.id.rank(r), Some(r))).collect(),
            None => vec![(self.id, None)],
        }
    }
}

/// The registry's whole state as subscribers see it.
pub type Fleet = Arc<Vec<WorkerRecord>>;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum RegistryError {
    #[error(transparent)]
    InvalidUrl(#[from] UrlError),
    #[error("worker already registered: {0}")]
    Exists(String),
    #[error("worker not found: {0}")]
    NotFound(String),
    #[error("kv_events_config: {0}")]
    EventsConfig(#[from] crate::config::EventsConfigError),
}

/// Settings the registry needs.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    pub health: HealthConfig,
    /// The key of workers registered without one of their own.
    pub worker_key: Option<Secret>,
    /// `--kv-events-config`: the event sockets of workers that advertise none.
    pub kv_events: Option<EventsConfig>,
}

/// Pushed to every subscriber after each change.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct FleetChanged(pub Fleet);

/// Where the registry sends the workers to poll.
#[derive(Debug, Clone)]
pub struct PollerLink {
    pub targets: Recipient<SetTargets>,
    /// Asked when a worker joins the polled set, so its first report comes now and not an
    /// interval later: a gateway started just before traffic would otherwise route its
    /// first seconds blind.
    pub now: Recipient<PollNow>,
}
/// The registry's mailbox. Its messages, by response type:
/// - `AddWorker`, `DrainWorker`, `RemoveWorker`, `ListWorkers` (`send`, awaited): the
///   admin API, `/workers`, readiness and startup; small traffic, so a full mailbox only
///   makes an admin call wait.
/// - `WorkerFailed` (`do_send` from the selector): a refused connection takes its worker
///   out at once and is never dropped.
const MAILBOX: usize = 256;

pub struct RegistryActor {
    cfg: RegistryConfig,
    workers: BTreeMap<WorkerId, WorkerRecord>,
    subscribers: Vec<Recipient<FleetChanged>>,
    poller: Option<PollerLink>,
    /// The workers ready at the last publish (the ones the poller was given).
    ready: BTreeSet<WorkerId>,
    metrics: Option<Arc<Metrics>>,
    client: awc::Client,
    checking: bool,
    /// What the admin API changed, kept across restarts.
    image: RegistryImage,
    incarnations: u64,
    ticks: u64,
    persist: Option<Persister>,
    /// Discovered workers the admin API removed, kept out until their pod changes.
    excluded: Exclusions,
}

impl std::fmt::Debug for RegistryActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryActor")
            .field("workers", &self.workers.len())
            .finish()
    }
}

impl RegistryActor {
    pub fn new(
        cfg: RegistryConfig,
        subscribers: Vec<Recipient<FleetChanged>>,
        poller: Option<PollerLink>,
        persist: Option<Persister>,
        image: RegistryImage,
    ) -> Self {
        let client = detect::client(cfg.health.timeout);
        RegistryActor {
            cfg,
            workers: BTreeMap::new(),
            subscribers,
            poller,
            ready: BTreeSet::new(),
            metrics: None,
            client,
            checking: false,
            image,
            persist,
            incarnations: 0,
            ticks: 0,
            excluded: Exclusions::default(),
        }
    }

    /// Checks workers through `guard`: a watched name is connected to only at the
    /// addresses its rule allows, as the pool's connections are.
    pub(crate) fn with_guard(mut self, guard: &crate::upstream::ConnectGuard) -> Self {
        self.client = guard.awc_client(self.cfg.health.timeout);
        self
    }

    /// Records an admin change and hands it to the writer.
    /// Keeps an API worker's addition (with its own events config) or removal across a
    /// restart.
    fn remember(&mut self, url: &str, added: Option<Option<String>>) {
        self.image.added.retain(|u| u != url);
        self.image.removed.retain(|u| u != url);
        self.image.kv_events.remove(url);
        if let Some(events) = added {
            self.image.added.push(url.to_owned());
            if let Some(e) = events {
                self.image.kv_events.insert(url.to_owned(), e);
            }
        } else {
            self.image.removed.push(url.to_owned());
        }
        if let Some(p) = &self.persist {
            p.registry(self.image.clone());
        }
    }

    fn fleet(&self) -> Fleet {
        Arc::new(self.workers.values().cloned().collect())
    }

    /// Counts each worker's health transitions into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn publish(&mut self) {
        let fleet = self.fleet();
        // The routable workers: the ones polled, and the health transitions' reference.
        let ready: BTreeSet<WorkerId> =
            fleet.iter().filter(|w| w.healthy()).map(|w| w.id).collect();
        if let Some(m) = &self.metrics {
            for w in fleet.iter() {
                let (was, is) = (self.ready.contains(&w.id), ready.contains(&w.id));
                if was != is {
                    m.health_transition(w.url.as_str(), is);
                }
            }
        }
        let joined = ready.iter().any(|w| !self.ready.contains(w));
        self.ready = ready;
        for s in &self.subscribers {
            // do_send: a fleet change must never be dropped, and subscribers drain fast.
            s.do_send(FleetChanged(fleet.clone()));
        }
        if let Some(p) = &self.poller {
            // Only routable workers are polled; the others have nothing to report.
            let targets: Vec<PollTarget> = fleet
                .iter()
                .filter(|w| w.healthy())
                .map(|w| PollTarget {
                    worker: w.id,
                    url: w.url.clone(),
                    api_key: w.api_key.as_ref().map(|k| k.expose().to_owned()),
                })
                .collect();
            p.targets.do_send(SetTargets(targets));
            if joined {
                // Same mailbox, so the poll sees the new set.
                p.now.do_send(PollNow);
            }
        }
    }

    fn find(&self, key: &str) -> Option<WorkerId> {
        if let Ok(id) = key.parse::<WorkerId>()
            && self.workers.contains_key(&id)
        {
            return Some(id);
        }
        let url = WorkerUrl::parse(key).ok()?;
        let id = WorkerId::from_url(url.as_str());
        self.workers.contains_key(&id).then_some(id)
    }

    fn apply_detected(rec: &mut WorkerRecord, d: Detected, cfg: &RegistryConfig) {
        rec.models = d.models;
        rec.adapters = d.adapters;
        rec.runtime = d.runtime.unwrap_or(Runtime::Unknown);
        // A server_info that failed this once leaves what an earlier one said.
        if !d.server_info && rec.startup_time.is_some() {
            return;
        }
        rec.version = d.version;
        rec.max_running_requests = d.max_running_requests;
        rec.dp_size = d.dp_size;
        rec.page_size = d.page_size;
        rec.startup_time = d.startup_time;
        rec.kv_events = d.kv_events;
        rec.tokenizer_path = d.tokenizer_path;
        // Checked when it was given.
        let own = (rec.kv_events_config.as_deref()).and_then(|j| EventsConfig::parse(j).ok());
        if rec.kv_events.is_none()
            && let Some(c) = own.as_ref().or(cfg.kv_events.as_ref())
        {
            rec.kv_events = Some(c.descriptor(rec.page_size, rec.dp_size));
        }
    }

    fn health_tick(&mut self, ctx: &mut Context<Self>) {
        if self.checking || self.workers.is_empty() {
            return;
        }
        self.checking = true;
        self.ticks = self.ticks.wrapping_add(1);
        // Every few ticks a ready worker is detected again, so an engine that restarted
        // between two health checks (a new `startup_time`, an empty cache) is noticed.
        let full_round = self.ticks.is_multiple_of(REDETECT_EVERY);
        let client = self.client.clone();
        let timeout = self.cfg.health.timeout;
        let endpoint = self.cfg.health.endpoint.clone();
        let targets: Vec<(WorkerId, u64, WorkerUrl, bool, Option<Secret>)> = self
            .workers
            .values()
            // A draining worker is on its way out: nothing to check.
            .filter(|w| w.status != WorkerStatus::Draining)
            .map(|w| {
                (
                    w.id,
                    w.incarnation,
                    w.url.clone(),
                    full_round || !w.healthy(),
                    w.api_key.clone(),
                )
            })
            .collect();
        let fut = async move {
            let checks = targets.into_iter().map(|(id, inc, url, redetect, key)| {
                let client = client.clone();
                let endpoint = endpoint.clone();
                async move {
                    let probe = Probe {
                        client: &client,
                        timeout,
                        key: key.as_ref(),
                    };
                    let outcome = if redetect {
                        detect(probe, &url).await.map(Some)
                    } else {
                        detect::health(probe, &url, &endpoint).await.map(|()| None)
                    };
                    (id, inc, outcome)
                }
            });
            futures_util::future::join_all(checks).await
        };
        ctx.spawn(fut.into_actor(self).map(|results, act, _| {
            act.checking = false;
            let mut changed = false;
            for (id, inc, outcome) in results {
                // A result for an earlier registration of the same URL is stale.
                if let Some(rec) = act.workers.get_mut(&id).filter(|r| r.incarnation == inc) {
                    changed |= settle(rec, outcome, &act.cfg);
                }
            }
            if changed {
                act.publish();
            }
        }));
    }
}

/// Applies one check's outcome with hysteresis; returns whether the status changed.
fn settle(
    rec: &mut WorkerRecord,
    outcome: Result<Option<Detected>, ProbeError>,
    cfg: &RegistryConfig,
) -> bool {
    let before = rec.status;
    let (models, startup) = (rec.models.clone(), rec.startup_time);
    let adapters = rec.adapters.clone();
    match outcome {
        Ok(detected) => {
            rec.consecutive_failures = 0;
            rec.consecutive_successes = rec.consecutive_successes.saturating_add(1);
            rec.last_error = None;
            rec.refused = false;
            if let Some(d) = detected {
                RegistryActor::apply_detected(rec, d, cfg);
            }
            let back = rec.status == WorkerStatus::Unhealthy
                && rec.consecutive_successes >= cfg.health.success_threshold;
            // A pending worker is ready once detected; an unhealthy one after M passes.
            if (rec.status == WorkerStatus::Pending && !rec.models.is_empty()) || back {
                rec.status = WorkerStatus::Ready;
            }
        }
        Err(e) => {
            rec.consecutive_successes = 0;
            rec.consecutive_failures = rec.consecutive_failures.saturating_add(1);
            rec.last_error = Some(e.to_string());
            if rec.status == WorkerStatus::Ready
                && rec.consecutive_failures >= cfg.health.failure_threshold
            {
                rec.status = WorkerStatus::Unhealthy;
            }
            // Nobody listening: the requests waiting on it will not be answered.
            if rec.status == WorkerStatus::Unhealthy && e.refused() && !rec.refused {
                rec.refused = true;
                return true;
            }
        }
    }
    if rec.status != before {
        info!(worker = %rec.url, from = ?before, to = ?rec.status, "worker status changed");
    }
    if rec.startup_time != startup && startup.is_some() && rec.startup_time.is_some() {
        info!(worker = %rec.url, "engine restarted: new startup_time");
    }
    rec.status != before
        || rec.startup_time != startup
        || rec.models != models
        || rec.adapters != adapters
}

/// A ready worker is detected again (models, `/server_info`) every this many health ticks.
const REDETECT_EVERY: u64 = 6;

impl Actor for RegistryActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(MAILBOX);
        ctx.run_interval(self.cfg.health.interval, |act, ctx| act.health_tick(ctx));
    }
}

/// After a panic the workers stay as they were; the health round that was running went
/// with the old context, and everyone is told the fleet again in case the panic came
/// between a change and its publish.
impl Supervised for RegistryActor {
    fn restarting(&mut self, _: &mut Context<Self>) {
        self.checking = false;
        self.publish();
    }
}

#[cfg(test)]
mod tests;
