//! Workers the Kubernetes API discovered (`WorkerSource::Kubernetes`): added with their
//! pod, drained then dropped when the pod stops serving, never persisted, and kept out
//! after an admin removal until their pod changes.

use std::collections::BTreeMap;

use actix::prelude::*;
use kvgate_core::WorkerUrl;
use kvgate_policies::WorkerId;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::*;

/// The pod a discovered worker is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub pod: String,
    pub namespace: String,
    /// A pod re-created under the same name has a new one.
    pub pod_uid: String,
}

/// Discovered workers removed through the admin API while their pod still served, by
/// URL, with the pod's uid: they stay out until the pod changes (discovery then says the
/// URL stopped serving, which clears the entry: unready, deleted, a new IP or uid).
#[derive(Debug, Default)]
pub(crate) struct Exclusions(BTreeMap<String, String>);

impl Exclusions {
    pub(crate) fn exclude(&mut self, url: &WorkerUrl, pod: &PodRef) {
        info!(worker = %url, pod = %pod.pod, "discovered worker removed through the admin API: kept out until its pod changes");
        self.0.insert(url.to_string(), pod.pod_uid.clone());
    }

    fn excludes(&self, url: &WorkerUrl, pod: &PodRef) -> bool {
        self.0.get(url.as_str()) == Some(&pod.pod_uid)
    }

    fn clear(&mut self, url: &WorkerUrl) {
        self.0.remove(url.as_str());
    }
}

/// A pod serves at `url`: registered (probed like any worker) unless the admin API
/// removed this very pod's worker. `Ok(None)`: kept out.
#[derive(Message, Debug)]
#[rtype(result = "Result<Option<WorkerRecord>, RegistryError>")]
pub struct AddDiscovered {
    pub url: String,
    pub pod: PodRef,
    /// The pod's `kvgate.io/kv-events-config` annotation.
    pub kv_events_config: Option<String>,
}

impl Handler<AddDiscovered> for RegistryActor {
    type Result = ResponseActFuture<Self, Result<Option<WorkerRecord>, RegistryError>>;

    fn handle(&mut self, msg: AddDiscovered, ctx: &mut Context<Self>) -> Self::Result {
        let url = match WorkerUrl::parse(&msg.url) {
            Ok(u) => u,
            Err(e) => return Box::pin(fut::ready(Err(e.into()))),
        };
        if self.excluded.excludes(&url, &msg.pod) {
            info!(worker = %url, pod = %msg.pod.pod, "not added: removed through the admin API while its pod serves");
            return Box::pin(fut::ready(Ok(None)));
        }
        let id = WorkerId::from_url(url.as_str());
        if let Some(rec) = self.workers.get(&id) {
            match &rec.kubernetes {
                Some(p) if *p == msg.pod && rec.status != WorkerStatus::Draining => {
                    return Box::pin(fut::ready(Ok(Some(rec.clone()))));
                }
                // The same pod ready again before its drain ended (a readiness flap): the
                // same engine, so it serves on, and the pending drop passes it by.
                Some(p) if *p == msg.pod => {
                    let back = if rec.models.is_empty() {
                        WorkerStatus::Pending
                    } else {
                        WorkerStatus::Ready
                    };
                    info!(worker = %url, pod = %msg.pod.pod, "pod ready again while draining: it serves on");
                    let out = self.workers.get_mut(&id).map(|r| {
                        r.status = back;
                        r.clone()
                    });
                    self.publish();
                    return Box::pin(fut::ready(Ok(out)));
                }
                // Another pod (a new uid) at this address while the old one drains: the old
                // one is gone from the fleet first, so nothing it cached is taken for the
                // new one's.
                Some(_) => {
                    info!(worker = %url, pod = %msg.pod.pod, "a new incarnation of a discovered worker replaces the old one");
                    self.workers.remove(&id);
                    self.publish();
                }
                // A worker from the flags or the admin API keeps its address.
                None => return Box::pin(fut::ready(Err(RegistryError::Exists(url.to_string())))),
            }
        }
        // A bad annotation does not keep a serving pod out: its events are then off.
        let kv_events_config = msg.kv_events_config.filter(|j| match EventsConfig::parse(j) {
            Ok(_) => true,
            Err(e) => {
                warn!(worker = %url, pod = %msg.pod.pod, error = %e, "the pod's kvgate.io/kv-events-config annotation is not used");
                false
            }
        });
        let add = AddWorker {
            url: url.to_string(),
            source: WorkerSource::Kubernetes,
            api_key: None,
            kv_events_config,
        };
        let pending = <Self as Handler<AddWorker>>::handle(self, add, ctx);
        // Inserted (pending) by the handler above; its answer clones the record.
        if let Some(rec) = self.workers.get_mut(&id) {
            rec.kubernetes = Some(msg.pod);
        }
        Box::pin(pending.map(|r, _, _| r.map(Some)))
    }
}

/// The pod at `url` stopped serving: its worker drains (no new requests). Answers the
/// worker and incarnation to drop once its requests have finished, if it is discovered.
#[derive(Message, Debug)]
#[rtype(result = "Option<(WorkerId, u64)>")]
pub struct RetireDiscovered {
    pub url: String,
}

impl Handler<RetireDiscovered> for RegistryActor {
    type Result = Option<(WorkerId, u64)>;

    fn handle(&mut self, msg: RetireDiscovered, _: &mut Context<Self>) -> Self::Result {
        let url = WorkerUrl::parse(&msg.url).ok()?;
        // The pod changed: an admin removal of it no longer holds.
        self.excluded.clear(&url);
        let id = WorkerId::from_url(url.as_str());
        let rec = self
            .workers
            .get_mut(&id)
            .filter(|r| r.source == WorkerSource::Kubernetes)?;
        let out = (id, rec.incarnation);
        if rec.status != WorkerStatus::Draining {
            info!(worker = %rec.url, "pod no longer serves: draining");
            rec.status = WorkerStatus::Draining;
            self.publish();
        }
        Some(out)
    }
}

/// Drops a discovered worker that has drained, unless a new incarnation replaced it or
/// its pod became ready again meanwhile.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct DropDiscovered {
    pub worker: WorkerId,
    pub incarnation: u64,
}

impl Handler<DropDiscovered> for RegistryActor {
    type Result = ();

    fn handle(&mut self, msg: DropDiscovered, _: &mut Context<Self>) {
        let ours = self.workers.get(&msg.worker).is_some_and(|r| {
            r.incarnation == msg.incarnation
                && r.source == WorkerSource::Kubernetes
                && r.status == WorkerStatus::Draining
        });
        if ours && let Some(rec) = self.workers.remove(&msg.worker) {
            info!(worker = %rec.url, "discovered worker removed");
            self.publish();
        }
    }
}
