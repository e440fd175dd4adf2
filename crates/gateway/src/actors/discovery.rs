//! The discovery actor: the Kubernetes API's worker pods (`--service-discovery`) fed to
//! the registry. A pod that starts serving is added; one that stops (unready, being
//! deleted, gone, a new IP or uid) is drained, and dropped once its requests have finished
//! or the grace period is over. While the API server is unreachable nothing changes: the
//! workers known keep being routed to and health-checked, and the watcher relists when
//! it comes back.
//!
//! With `--inference-pool`, the pool is watched first: each version of its selector and
//! target port restarts the pods' watch with them, the workers of the old one retired
//! (drained) first; a pool deleted retires them all.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use std::collections::BTreeSet;

use kvgate_discovery::{Change, DiscoveryConfig, DiscoveryError, PoolSpec};
use tracing::{info, warn};

use crate::actors::registry::{
    AddDiscovered, DropDiscovered, PodRef, RegistryActor, RetireDiscovered,
};
use crate::actors::selector::{GetWorkerStates, SelectorActor, worker_state};
use crate::actors::supervise::{Supervision, run_watched};
use crate::config::GatewayConfig;

/// How long after a failure to build the client (no kubeconfig yet, a bad one) it is
/// tried again. Watch errors back off inside the watcher itself.
const CLIENT_RETRY: Duration = Duration::from_secs(10);

/// How often a draining worker's in-flight count is read.
const DRAIN_POLL: Duration = Duration::from_millis(50);

pub(crate) struct DiscoveryActor {
    watch: DiscoveryConfig,
    kubeconfig: Option<PathBuf>,
    registry: Addr<RegistryActor>,
    selector: Addr<SelectorActor>,
    /// Longest wait for a retired worker's requests before it is dropped anyway.
    grace: Duration,
    /// The InferencePool that says what to watch, when one is followed.
    pool: Option<String>,
    /// With a pool: the client, the pool's last spec and the pods' watch it started.
    client: Option<kvgate_discovery::Client>,
    spec: Option<PoolSpec>,
    pods: Option<SpawnHandle>,
    /// The workers this actor added and has not retired.
    known: BTreeSet<String>,
}

impl std::fmt::Debug for DiscoveryActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscoveryActor")
            .field("watch", &self.watch)
            .finish()
    }
}

impl DiscoveryActor {
    /// Starts watching on `arbiter` when `--service-discovery` is on. The actor lives as
    /// long as its watch (an actor with work in hand keeps running without an address),
    /// and stops with the arbiter.
    pub(crate) fn start_if_on(
        cfg: &GatewayConfig,
        arbiter: &ArbiterHandle,
        registry: &Addr<RegistryActor>,
        selector: &Addr<SelectorActor>,
        sup: Arc<Supervision>,
    ) {
        let Some(watch) = cfg.discovery.watch() else {
            return;
        };
        let actor = DiscoveryActor {
            watch,
            kubeconfig: cfg.discovery.service_discovery_kubeconfig.clone(),
            registry: registry.clone(),
            selector: selector.clone(),
            grace: cfg.shutdown_grace_period,
            pool: cfg.discovery.inference_pool.clone(),
            client: None,
            spec: None,
            pods: None,
            known: BTreeSet::new(),
        };
        let started = arbiter.spawn_fn(move || {
            run_watched(Context::new(), actor, "discovery", sup);
        });
        if !started {
            warn!("service discovery: its arbiter has stopped; no pods are watched");
        }
    }

    fn connect(&mut self, ctx: &mut Context<Self>) {
        let path = self.kubeconfig.clone();
        let client = async move { kvgate_discovery::client(path.as_deref()).await };
        ctx.spawn(client.into_actor(self).map(|r, act, ctx| match r {
            Ok(client) if act.pool.is_some() => {
                let name = act.pool.clone().unwrap_or_default();
                let namespace = act.watch.resolved_namespace();
                info!(pool = %name, %namespace, "service discovery: following the InferencePool");
                ctx.add_stream(kvgate_discovery::pool_specs(client.clone(), &name, &namespace));
                act.client = Some(client);
            }
            Ok(client) => {
                info!(
                    namespace = %act.watch.resolved_namespace(),
                    selector = %act.watch.label_selector(),
                    port = act.watch.port,
                    "service discovery: watching pods"
                );
                ctx.add_stream(kvgate_discovery::changes(client, &act.watch));
            }
            Err(e) => {
                warn!(error = %e, retry_secs = CLIENT_RETRY.as_secs(), "service discovery: no Kubernetes client yet");
                ctx.run_later(CLIENT_RETRY, |act, ctx| act.connect(ctx));
            }
        }));
    }

    fn apply(&mut self, change: Change, ctx: &mut Context<Self>) {
        match change {
            Change::Added {
                url,
                pod,
                namespace,
                uid,
                kv_events_config,
            } => {
                self.known.insert(url.clone());
                // Queued now, so it stays behind a removal of the same URL sent before.
                let add = self.registry.send(AddDiscovered {
                    url: url.clone(),
                    pod: PodRef {
                        pod,
                        namespace,
                        pod_uid: uid,
                    },
                    kv_events_config,
                });
                ctx.spawn(
                    async move {
                        match add.await {
                            Ok(Ok(Some(rec))) => {
                                info!(worker = %rec.url, status = ?rec.status, "discovered worker registered");
                            }
                            // Kept out: the registry said why.
                            Ok(Ok(None)) => {}
                            Ok(Err(e)) => warn!(worker = %url, error = %e, "discovered worker not registered"),
                            Err(e) => warn!(worker = %url, error = %e, "registry unavailable"),
                        }
                    }
                    .into_actor(self),
                );
            }
            Change::Removed(url) => {
                self.known.remove(&url);
                let retire = self.registry.send(RetireDiscovered { url });
                let (registry, selector, grace) =
                    (self.registry.clone(), self.selector.clone(), self.grace);
                ctx.spawn(
                    async move {
                        let Ok(Some((worker, incarnation))) = retire.await else {
                            return;
                        };
                        // As the admin API's removal: in-flight requests finish first.
                        let until = Instant::now() + grace;
                        loop {
                            let busy = selector.send(GetWorkerStates).await.is_ok_and(|s| {
                                worker_state(&s, worker).is_some_and(|w| w.view.in_flight > 0)
                            });
                            if !busy || Instant::now() >= until {
                                break;
                            }
                            actix_rt::time::sleep(DRAIN_POLL).await;
                        }
                        registry.do_send(DropDiscovered {
                            worker,
                            incarnation,
                        });
                    }
                    .into_actor(self),
                );
            }
        }
    }
}

impl Actor for DiscoveryActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.connect(ctx);
    }
}

/// Never restarted (see `run_watched`): a new watch would not know which of the workers
/// this one added went away meanwhile, and retirements in progress would be lost, so a
/// panic here fails liveness and the process is replaced.
impl Supervised for DiscoveryActor {}

impl StreamHandler<Result<Vec<Change>, DiscoveryError>> for DiscoveryActor {
    fn handle(&mut self, item: Result<Vec<Change>, DiscoveryError>, ctx: &mut Self::Context) {
        match item {
            Ok(batch) => {
                for change in batch {
                    self.apply(change, ctx);
                }
            }
            // The watcher backs off and retries; the workers known keep serving.
            Err(e) => {
                warn!(error = %e, "service discovery: the watch failed; routing goes on with the workers known")
            }
        }
    }

    /// The watch stream does not end by itself; should it, a new client starts over.
    /// Following a pool, the pool's watch restarts the pods' instead.
    fn finished(&mut self, ctx: &mut Self::Context) {
        if self.pool.is_some() {
            return;
        }
        warn!("service discovery: the watch ended; starting over");
        ctx.run_later(CLIENT_RETRY, |act, ctx| act.connect(ctx));
    }
}

impl StreamHandler<Result<Option<PoolSpec>, DiscoveryError>> for DiscoveryActor {
    fn handle(&mut self, item: Result<Option<PoolSpec>, DiscoveryError>, ctx: &mut Self::Context) {
        let spec = match item {
            Ok(spec) => spec,
            Err(e) => {
                warn!(error = %e, "service discovery: the InferencePool's watch failed; routing goes on with the workers known");
                return;
            }
        };
        if spec == self.spec {
            return;
        }
        // The old selector's workers go (drained), then the new one's watch lists its own.
        if let Some(h) = self.pods.take() {
            ctx.cancel_future(h);
        }
        for url in std::mem::take(&mut self.known) {
            self.apply(Change::Removed(url), ctx);
        }
        self.spec.clone_from(&spec);
        match (spec, self.client.clone()) {
            (Some(s), Some(client)) => {
                self.watch = DiscoveryConfig {
                    selector: s.selector,
                    namespace: self.watch.namespace.clone(),
                    port: s.port,
                };
                info!(selector = %self.watch.label_selector(), port = s.port, "service discovery: the InferencePool's engines");
                self.pods = Some(ctx.add_stream(kvgate_discovery::changes(client, &self.watch)));
            }
            _ => warn!("service discovery: no usable InferencePool; no engine from it"),
        }
    }

    /// Should the pool's watch end, a new client starts over.
    fn finished(&mut self, ctx: &mut Self::Context) {
        warn!("service discovery: the InferencePool's watch ended; starting over");
        self.spec = None;
        ctx.run_later(CLIENT_RETRY, |act, ctx| act.connect(ctx));
    }
}
