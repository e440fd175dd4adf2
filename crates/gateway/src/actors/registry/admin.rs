//! What the registry is asked: add, drain and remove a worker, take out one that refused
//! a connection, list the fleet.

use actix::prelude::*;
use detect::{Probe, detect};
use kvgate_core::Secret;
use kvgate_core::WorkerUrl;
use kvgate_policies::WorkerId;
use tracing::{info, warn};

use super::*;

/// Registers a worker: detection runs before the reply, so the answer says what it is.
#[derive(Message, Debug)]
#[rtype(result = "Result<WorkerRecord, RegistryError>")]
pub struct AddWorker {
    pub url: String,
    pub source: WorkerSource,
    /// The key this worker expects, if not the configured `worker_api_key`.
    pub api_key: Option<Secret>,
    /// Its own `--kv-events-config` JSON, for an engine that advertises none.
    pub kv_events_config: Option<String>,
}

impl Handler<AddWorker> for RegistryActor {
    type Result = ResponseActFuture<Self, Result<WorkerRecord, RegistryError>>;

    fn handle(&mut self, msg: AddWorker, _: &mut Context<Self>) -> Self::Result {
        let url = match WorkerUrl::parse(&msg.url) {
            Ok(u) => u,
            Err(e) => return Box::pin(fut::ready(Err(e.into()))),
        };
        let id = WorkerId::from_url(url.as_str());
        if self.workers.contains_key(&id) {
            return Box::pin(fut::ready(Err(RegistryError::Exists(url.to_string()))));
        }
        if let Some(Err(e)) = msg.kv_events_config.as_deref().map(EventsConfig::parse) {
            return Box::pin(fut::ready(Err(e.into())));
        }
        self.incarnations += 1;
        let key = msg.api_key.or_else(|| self.cfg.worker_key.clone());
        // Reserve the id now so a concurrent add of the same URL is refused.
        let mut rec = WorkerRecord::pending(url.clone(), msg.source, self.incarnations, key);
        rec.kv_events_config.clone_from(&msg.kv_events_config);
        self.workers.insert(id, rec);
        if msg.source == WorkerSource::Api {
            self.remember(url.as_str(), Some(msg.kv_events_config));
        }
        let client = self.client.clone();
        let timeout = self.cfg.health.timeout;
        let probe_url = url.clone();
        let key = self.workers.get(&id).and_then(|r| r.api_key.clone());
        Box::pin(
            async move {
                let probe = Probe {
                    client: &client,
                    timeout,
                    key: key.as_ref(),
                };
                detect(probe, &probe_url).await
            }
                .into_actor(self)
                .map(move |detected, act, _| {
                    let rec = act
                        .workers
                        .get_mut(&id)
                        .ok_or_else(|| RegistryError::NotFound(url.to_string()))?;
                    match detected {
                        // As in the health loop: ready once it serves a model.
                        Ok(d) if d.models.is_empty() => {
                            RegistryActor::apply_detected(rec, d, &act.cfg);
                            let e = ProbeError::NoModel {
                                url: rec.url.join("/v1/models"),
                            };
                            warn!(worker = %rec.url, error = %e, "worker registered but not ready yet");
                            rec.last_error = Some(e.to_string());
                        }
                        Ok(d) => {
                            RegistryActor::apply_detected(rec, d, &act.cfg);
                            rec.status = WorkerStatus::Ready;
                            info!(worker = %rec.url, models = ?rec.models, runtime = ?rec.runtime, "worker registered");
                        }
                        Err(e) => {
                            warn!(worker = %rec.url, error = %e, "worker registered but not reachable yet");
                            rec.last_error = Some(e.to_string());
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
        match &rec.kubernetes {
            // Its pod still serves: out until the pod changes, and never persisted.
            Some(pod) => self.excluded.exclude(&rec.url, pod),
            None => self.remember(rec.url.as_str(), None),
        }
        self.publish();
        Ok(rec)
    }
}

/// A request to the worker found nobody listening: it is taken out now, without waiting
/// for its health checks, and comes back once they pass.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct WorkerFailed {
    pub worker: WorkerId,
    pub incarnation: u64,
    pub reason: String,
}

impl Handler<WorkerFailed> for RegistryActor {
    type Result = ();

    fn handle(&mut self, msg: WorkerFailed, _: &mut Context<Self>) {
        let Some(rec) = self
            .workers
            .get_mut(&msg.worker)
            .filter(|r| r.incarnation == msg.incarnation && r.status == WorkerStatus::Ready)
        else {
            return;
        };
        warn!(worker = %rec.url, reason = %msg.reason, "worker taken out: it refused a connection");
        rec.status = WorkerStatus::Unhealthy;
        rec.consecutive_successes = 0;
        rec.consecutive_failures = self.cfg.health.failure_threshold;
        rec.last_error = Some(msg.reason);
        rec.refused = true;
        self.publish();
    }
}

/// Stops new requests to a worker before it is removed; in-flight ones finish.
#[derive(Message, Debug)]
#[rtype(result = "Result<WorkerRecord, RegistryError>")]
pub struct DrainWorker {
    /// A worker id or its URL.
    pub key: String,
}

impl Handler<DrainWorker> for RegistryActor {
    type Result = Result<WorkerRecord, RegistryError>;

    fn handle(&mut self, msg: DrainWorker, _: &mut Context<Self>) -> Self::Result {
        let id = self
            .find(&msg.key)
            .ok_or_else(|| RegistryError::NotFound(msg.key.clone()))?;
        let rec = self
            .workers
            .get_mut(&id)
            .ok_or_else(|| RegistryError::NotFound(msg.key.clone()))?;
        if rec.status != WorkerStatus::Draining {
            info!(worker = %rec.url, "draining: no new requests, in-flight ones finish");
            rec.status = WorkerStatus::Draining;
            let out = rec.clone();
            self.publish();
            return Ok(out);
        }
        Ok(rec.clone())
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
