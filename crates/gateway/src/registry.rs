//! The registry actor: owns the worker records, detects what each worker is, and settles
//! health with hysteresis. Every change is pushed whole to the subscribers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use kvgate_policies::WorkerId;
use kvgate_poller::{PollTarget, SetTargets};

use crate::persist::Persister;
use crate::store::RegistryImage;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tracing::{info, warn};

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
    /// Failed its health checks; probed until it passes again.
    Unhealthy,
}

/// Where a worker came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerSource {
    Config,
    Api,
}

/// Everything kvgate knows about one worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub id: WorkerId,
    pub url: String,
    pub models: Vec<String>,
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
    /// Seconds since the Unix epoch when it was registered.
    pub added_at: f64,
    pub consecutive_failures: u32,
    pub consecutive_successes: u32,
    pub last_error: Option<String>,
    /// Which registration this is: a worker removed and added again gets a new one.
    pub incarnation: u64,
}

impl WorkerRecord {
    pub fn healthy(&self) -> bool {
        self.status == WorkerStatus::Ready
    }
}

/// The registry's whole state as subscribers see it.
pub type Fleet = Arc<Vec<WorkerRecord>>;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum RegistryError {
    #[error("invalid worker url '{url}': {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("worker already registered: {0}")]
    Exists(String),
    #[error("worker not found: {0}")]
    NotFound(String),
}

/// Canonical form of a worker URL: scheme and host lowercased, no trailing slash.
pub fn normalize_url(url: &str) -> Result<String, RegistryError> {
    let bad = |reason: &str| RegistryError::InvalidUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let trimmed = url.trim().trim_end_matches('/');
    let (scheme, rest) = trimmed
        .split_once("://")
        .ok_or_else(|| bad("expected http://host:port"))?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" {
        return Err(bad("only http:// workers are supported"));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains(['@', '?', '#', ' ']) {
        return Err(bad("missing or malformed host"));
    }
    if let Some((_, port)) = authority.rsplit_once(':')
        && !authority.ends_with(']')
        && port.parse::<u16>().is_err()
    {
        return Err(bad("port must be a number from 0 to 65535"));
    }
    if path.contains(['?', '#']) {
        return Err(bad("must not carry a query or fragment"));
    }
    Ok(format!(
        "{scheme}://{}{path}",
        authority.to_ascii_lowercase()
    ))
}

/// What registration learned from the worker's own routes.
#[derive(Debug, Clone, Default)]
pub struct Detected {
    pub models: Vec<String>,
    pub runtime: Option<Runtime>,
    pub max_running_requests: Option<u64>,
    pub dp_size: Option<u64>,
    pub page_size: Option<u64>,
    pub startup_time: Option<f64>,
    pub kv_events: Option<serde_json::Value>,
    /// Whether `/server_info` (or `/get_server_info`) answered; when it did not, the
    /// fields above from it are unknown, not absent.
    pub server_info: bool,
}

#[derive(Deserialize)]
struct ModelList {
    data: Vec<ModelCard>,
}

#[derive(Deserialize)]
struct ModelCard {
    id: String,
    #[serde(default)]
    owned_by: Option<String>,
}

/// Takes the fields kept from a `/server_info` answer into `d`. Read one by one, so a
/// field of an unexpected type (a newer engine, say) costs only that field.
fn read_server_info(d: &mut Detected, url: &str, v: &serde_json::Value) {
    let field = |key: &str, read: fn(&serde_json::Value) -> bool| {
        let x = v.get(key).filter(|x| !x.is_null())?;
        if read(x) {
            Some(x.clone())
        } else {
            warn!(worker = url, field = key, value = %x, "server_info field of an unexpected type, ignored");
            None
        }
    };
    let count = |key| field(key, |x| x.is_u64()).and_then(|x| x.as_u64());
    d.server_info = true;
    d.max_running_requests = count("max_running_requests");
    d.dp_size = count("dp_size");
    d.page_size = count("page_size");
    d.startup_time = field("startup_time", |x| x.is_number()).and_then(|x| x.as_f64());
    d.kv_events = field("kv_events", |_| true);
}

async fn get_json<T: serde::de::DeserializeOwned>(
    client: &awc::Client,
    url: &str,
    timeout: Duration,
) -> Result<T, String> {
    let mut resp = client
        .get(url)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("GET {url}: status {}", resp.status().as_u16()));
    }
    let body = resp
        .body()
        .limit(4 * 1024 * 1024)
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    serde_json::from_slice(&body).map_err(|e| format!("GET {url}: {e}"))
}

/// Probes `/v1/models`, then `/server_info` (falling back to `/get_server_info`).
pub async fn detect(
    client: &awc::Client,
    url: &str,
    timeout: Duration,
) -> Result<Detected, String> {
    let models: ModelList = get_json(client, &format!("{url}/v1/models"), timeout).await?;
    let runtime = models
        .data
        .iter()
        .find_map(|m| match m.owned_by.as_deref() {
            Some("sglang") | Some("nvidia") => Some(Runtime::Sglang),
            Some("vllm") => Some(Runtime::Vllm),
            _ => None,
        });
    let mut d = Detected {
        models: models.data.into_iter().map(|m| m.id).collect(),
        runtime,
        ..Detected::default()
    };
    // vLLM has no server_info: that is not a failure.
    let info = match get_json::<serde_json::Value>(client, &format!("{url}/server_info"), timeout)
        .await
    {
        Ok(i) => Some(i),
        Err(_) => get_json::<serde_json::Value>(client, &format!("{url}/get_server_info"), timeout)
            .await
            .ok(),
    };
    if let Some(v) = info {
        read_server_info(&mut d, url, &v);
    }
    Ok(d)
}

/// Settings the registry needs.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    pub health_check_interval: Duration,
    pub health_check_timeout: Duration,
    pub failure_threshold: u32,
    pub success_threshold: u32,
}

/// Pushed to every subscriber after each change.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct FleetChanged(pub Fleet);

pub struct RegistryActor {
    cfg: RegistryConfig,
    workers: BTreeMap<WorkerId, WorkerRecord>,
    subscribers: Vec<Recipient<FleetChanged>>,
    poller: Option<Recipient<SetTargets>>,
    client: awc::Client,
    checking: bool,
    /// What the admin API changed, kept across restarts.
    image: RegistryImage,
    incarnations: u64,
    ticks: u64,
    persist: Option<Persister>,
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
        poller: Option<Recipient<SetTargets>>,
        persist: Option<Persister>,
        image: RegistryImage,
    ) -> Self {
        let client = awc::Client::builder()
            .timeout(cfg.health_check_timeout)
            .finish();
        RegistryActor {
            cfg,
            workers: BTreeMap::new(),
            subscribers,
            poller,
            client,
            checking: false,
            image,
            persist,
            incarnations: 0,
            ticks: 0,
        }
    }

    /// Records an admin change and hands it to the writer.
    fn remember(&mut self, url: &str, added: bool) {
        self.image.added.retain(|u| u != url);
        self.image.removed.retain(|u| u != url);
        if added {
            self.image.added.push(url.to_owned());
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

    fn publish(&self) {
        let fleet = self.fleet();
        for s in &self.subscribers {
            // do_send: a fleet change must never be dropped, and subscribers drain fast.
            s.do_send(FleetChanged(fleet.clone()));
        }
        if let Some(p) = &self.poller {
            // Only routable workers are polled; the others have nothing to report.
            let targets = fleet
                .iter()
                .filter(|w| w.healthy())
                .map(|w| PollTarget {
                    worker: w.id,
                    url: w.url.clone(),
                })
                .collect();
            p.do_send(SetTargets(targets));
        }
    }

    fn find(&self, key: &str) -> Option<WorkerId> {
        if let Ok(id) = key.parse::<WorkerId>()
            && self.workers.contains_key(&id)
        {
            return Some(id);
        }
        let url = normalize_url(key).ok()?;
        let id = WorkerId::from_url(&url);
        self.workers.contains_key(&id).then_some(id)
    }

    fn apply_detected(rec: &mut WorkerRecord, d: Detected) {
        rec.models = d.models;
        rec.runtime = d.runtime.unwrap_or(Runtime::Unknown);
        // A server_info that failed this once leaves what an earlier one said.
        if !d.server_info && rec.startup_time.is_some() {
            return;
        }
        rec.max_running_requests = d.max_running_requests;
        rec.dp_size = d.dp_size;
        rec.page_size = d.page_size;
        rec.startup_time = d.startup_time;
        rec.kv_events = d.kv_events;
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
        let timeout = self.cfg.health_check_timeout;
        let targets: Vec<(WorkerId, u64, String, bool)> = self
            .workers
            .values()
            .map(|w| {
                (
                    w.id,
                    w.incarnation,
                    w.url.clone(),
                    full_round || !w.healthy(),
                )
            })
            .collect();
        let fut = async move {
            let checks = targets.into_iter().map(|(id, inc, url, redetect)| {
                let client = client.clone();
                async move {
                    let outcome = if redetect {
                        detect(&client, &url, timeout).await.map(Some)
                    } else {
                        match client
                            .get(format!("{url}/health"))
                            .timeout(timeout)
                            .send()
                            .await
                        {
                            Ok(r) if r.status().is_success() => Ok(None),
                            Ok(r) => {
                                Err(format!("GET {url}/health: status {}", r.status().as_u16()))
                            }
                            Err(e) => Err(format!("GET {url}/health: {e}")),
                        }
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
    outcome: Result<Option<Detected>, String>,
    cfg: &RegistryConfig,
) -> bool {
    let before = rec.status;
    let (models, startup) = (rec.models.clone(), rec.startup_time);
    match outcome {
        Ok(detected) => {
            rec.consecutive_failures = 0;
            rec.consecutive_successes = rec.consecutive_successes.saturating_add(1);
            rec.last_error = None;
            if let Some(d) = detected {
                RegistryActor::apply_detected(rec, d);
            }
            let back = rec.status == WorkerStatus::Unhealthy
                && rec.consecutive_successes >= cfg.success_threshold;
            // A pending worker is ready once detected; an unhealthy one after M passes.
            if (rec.status == WorkerStatus::Pending && !rec.models.is_empty()) || back {
                rec.status = WorkerStatus::Ready;
            }
        }
        Err(e) => {
            rec.consecutive_successes = 0;
            rec.consecutive_failures = rec.consecutive_failures.saturating_add(1);
            rec.last_error = Some(e);
            if rec.status == WorkerStatus::Ready
                && rec.consecutive_failures >= cfg.failure_threshold
            {
                rec.status = WorkerStatus::Unhealthy;
            }
        }
    }
    if rec.status != before {
        info!(worker = %rec.url, from = ?before, to = ?rec.status, "worker status changed");
    }
    if rec.startup_time != startup && startup.is_some() && rec.startup_time.is_some() {
        info!(worker = %rec.url, "engine restarted: new startup_time");
    }
    rec.status != before || rec.startup_time != startup || rec.models != models
}

/// A ready worker is detected again (models, `/server_info`) every this many health ticks.
const REDETECT_EVERY: u64 = 6;

impl Actor for RegistryActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // The mailbox is bounded for send(); admin traffic is small.
        ctx.set_mailbox_capacity(256);
        ctx.run_interval(self.cfg.health_check_interval, |act, ctx| {
            act.health_tick(ctx)
        });
    }
}

/// Registers a worker: detection runs before the reply, so the answer says what it is.
#[derive(Message, Debug)]
#[rtype(result = "Result<WorkerRecord, RegistryError>")]
pub struct AddWorker {
    pub url: String,
    pub source: WorkerSource,
}

impl Handler<AddWorker> for RegistryActor {
    type Result = ResponseActFuture<Self, Result<WorkerRecord, RegistryError>>;

    fn handle(&mut self, msg: AddWorker, _: &mut Context<Self>) -> Self::Result {
        let url = match normalize_url(&msg.url) {
            Ok(u) => u,
            Err(e) => return Box::pin(fut::ready(Err(e))),
        };
        let id = WorkerId::from_url(&url);
        if self.workers.contains_key(&id) {
            return Box::pin(fut::ready(Err(RegistryError::Exists(url))));
        }
        let added_at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        // Reserve the id now so a concurrent add of the same URL is refused.
        self.workers.insert(
            id,
            WorkerRecord {
                id,
                url: url.clone(),
                models: Vec::new(),
                status: WorkerStatus::Pending,
                runtime: Runtime::Unknown,
                source: msg.source,
                max_running_requests: None,
                dp_size: None,
                page_size: None,
                startup_time: None,
                kv_events: None,
                added_at,
                consecutive_failures: 0,
                consecutive_successes: 0,
                last_error: None,
                incarnation: {
                    self.incarnations += 1;
                    self.incarnations
                },
            },
        );
        if msg.source == WorkerSource::Api {
            self.remember(&url, true);
        }
        let client = self.client.clone();
        let timeout = self.cfg.health_check_timeout;
        let probe_url = url.clone();
        Box::pin(
            async move { detect(&client, &probe_url, timeout).await }
                .into_actor(self)
                .map(move |detected, act, _| {
                    let rec = act
                        .workers
                        .get_mut(&id)
                        .ok_or_else(|| RegistryError::NotFound(url.clone()))?;
                    match detected {
                        // As in the health loop: ready once it serves a model.
                        Ok(d) if d.models.is_empty() => {
                            RegistryActor::apply_detected(rec, d);
                            let e = "/v1/models lists no model yet".to_string();
                            warn!(worker = %rec.url, error = %e, "worker registered but not ready yet");
                            rec.last_error = Some(e);
                        }
                        Ok(d) => {
                            RegistryActor::apply_detected(rec, d);
                            rec.status = WorkerStatus::Ready;
                            info!(worker = %rec.url, models = ?rec.models, runtime = ?rec.runtime, "worker registered");
                        }
                        Err(e) => {
                            warn!(worker = %rec.url, error = %e, "worker registered but not reachable yet");
                            rec.last_error = Some(e);
                        }
                    }
                    let out = rec.clone();
                    act.publish();
                    Ok(out)
                }),
        )
    }
}

#[derive(Message, Debug)]
#[rtype(result = "Result<WorkerRecord, RegistryError>")]
pub struct RemoveWorker {
    /// A worker id or its URL.
    pub key: String,
}

impl Handler<RemoveWorker> for RegistryActor {
    type Result = Result<WorkerRecord, RegistryError>;

    fn handle(&mut self, msg: RemoveWorker, _: &mut Context<Self>) -> Self::Result {
        let id = self
            .find(&msg.key)
            .ok_or_else(|| RegistryError::NotFound(msg.key.clone()))?;
        let rec = self
            .workers
            .remove(&id)
            .ok_or_else(|| RegistryError::NotFound(msg.key.clone()))?;
        info!(worker = %rec.url, "worker removed");
        self.remember(&rec.url, false);
        self.publish();
        Ok(rec)
    }
}

#[derive(Message, Debug)]
#[rtype(result = "Fleet")]
pub struct ListWorkers;

impl Handler<ListWorkers> for RegistryActor {
    type Result = MessageResult<ListWorkers>;

    fn handle(&mut self, _: ListWorkers, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.fleet())
    }
}

/// Runs one round of health checks now (tests and operators).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct CheckNow;

impl Handler<CheckNow> for RegistryActor {
    type Result = ();

    fn handle(&mut self, _: CheckNow, ctx: &mut Context<Self>) {
        self.health_tick(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_info_field_of_another_type_costs_only_that_field() {
        let v = serde_json::json!({
            "max_running_requests": "48",
            "dp_size": 2,
            "page_size": 16,
            "startup_time": 1764000000.5,
            "kv_events": {"publisher": "zmq", "endpoint_port_base": 5557},
            "other": [1, 2],
        });
        let mut i = Detected::default();
        read_server_info(&mut i, "http://w:1", &v);
        assert_eq!(i.max_running_requests, None);
        assert_eq!((i.dp_size, i.page_size), (Some(2), Some(16)));
        assert_eq!(i.startup_time, Some(1764000000.5));
        assert_eq!(i.kv_events.unwrap()["endpoint_port_base"], 5557);
        let mut off = Detected::default();
        read_server_info(
            &mut off,
            "http://w:1",
            &serde_json::json!({"kv_events": null, "dp_size": -1}),
        );
        assert!(off.kv_events.is_none() && off.dp_size.is_none());
    }

    #[test]
    fn urls_normalize() {
        assert_eq!(normalize_url("http://A:8000/").unwrap(), "http://a:8000");
        assert_eq!(normalize_url(" http://h:1/v1 ").unwrap(), "http://h:1/v1");
        assert_eq!(normalize_url("HTTP://[::1]:80").unwrap(), "http://[::1]:80");
        for bad in [
            "",
            "h:8000",
            "ftp://h",
            "http://",
            "http://h:99999",
            "http://u@h",
            "http://h/x?y",
        ] {
            assert!(normalize_url(bad).is_err(), "{bad}");
        }
    }

    fn rec() -> WorkerRecord {
        WorkerRecord {
            id: WorkerId(1),
            url: "http://x".into(),
            models: vec![],
            status: WorkerStatus::Ready,
            runtime: Runtime::Sglang,
            source: WorkerSource::Config,
            max_running_requests: None,
            dp_size: None,
            page_size: None,
            startup_time: None,
            kv_events: None,
            added_at: 0.0,
            consecutive_failures: 0,
            consecutive_successes: 0,
            last_error: None,
            incarnation: 1,
        }
    }

    fn check_cfg() -> RegistryConfig {
        RegistryConfig {
            health_check_interval: Duration::from_secs(1),
            health_check_timeout: Duration::from_secs(1),
            failure_threshold: 3,
            success_threshold: 2,
        }
    }

    #[test]
    fn health_has_hysteresis() {
        let cfg = check_cfg();
        let mut r = rec();
        let fail = || Err("down".to_string());
        assert!(!settle(&mut r, fail(), &cfg));
        assert!(!settle(&mut r, fail(), &cfg));
        assert!(
            !settle(&mut r, Ok(None), &cfg),
            "a success resets the failure count"
        );
        assert!(!settle(&mut r, fail(), &cfg));
        assert!(!settle(&mut r, fail(), &cfg));
        assert!(settle(&mut r, fail(), &cfg));
        assert_eq!(r.status, WorkerStatus::Unhealthy);
        assert!(!settle(&mut r, Ok(None), &cfg));
        assert!(settle(&mut r, Ok(None), &cfg));
        assert_eq!(r.status, WorkerStatus::Ready);
    }

    #[test]
    fn a_server_info_that_fails_once_leaves_what_was_learned() {
        let cfg = check_cfg();
        let mut r = rec();
        let seen = |startup: f64, info: bool| Detected {
            models: vec!["m".into()],
            runtime: Some(Runtime::Sglang),
            max_running_requests: info.then_some(48),
            startup_time: info.then_some(startup),
            server_info: info,
            ..Detected::default()
        };
        assert!(settle(&mut r, Ok(Some(seen(5.0, true))), &cfg));
        assert_eq!(
            (r.startup_time, r.max_running_requests),
            (Some(5.0), Some(48))
        );
        assert!(
            !settle(&mut r, Ok(Some(seen(0.0, false))), &cfg),
            "nothing changed"
        );
        assert_eq!(
            (r.startup_time, r.max_running_requests),
            (Some(5.0), Some(48))
        );
        assert!(
            settle(&mut r, Ok(Some(seen(9.0, true))), &cfg),
            "a restart is a change"
        );
        assert_eq!(r.startup_time, Some(9.0));
    }
}
