//! The discovery actor: the Kubernetes API's worker pods (`--service-discovery`) fed to
//! the registry. A pod that starts serving is added; one that stops (unready, being
//! deleted, gone, a new IP or uid) is drained, and dropped once its requests have finished
//! or the grace period is over. While the API server is unreachable nothing changes: the
//! workers known keep being routed to and health-checked, and the watcher relists when
//! it comes back.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kvgate_discovery::{Change, DiscoveryConfig, DiscoveryError};
use tracing::{info, warn};

use crate::actors::registry::{
    AddDiscovered, DropDiscovered, PodRef, RegistryActor, RetireDiscovered,
};
use crate::actors::selector::{GetWorkerStates, SelectorActor, worker_state};
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
        };
        DiscoveryActor::start_in_arbiter(arbiter, move |_| actor);
    }

    fn connect(&mut self, ctx: &mut Context<Self>) {
        let path = self.kubeconfig.clone();
        let client = async move { kvgate_discovery::client(path.as_deref()).await };
        ctx.spawn(client.into_actor(self).map(|r, act, ctx| match r {
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
            } => {
                // Queued now, so it stays behind a removal of the same URL sent before.
                let add = self.registry.send(AddDiscovered {
                    url: url.clone(),
                    pod: PodRef {
                        pod,
                        namespace,
                        pod_uid: uid,
                    },
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
    fn finished(&mut self, ctx: &mut Self::Context) {
        warn!("service discovery: the watch ended; starting over");
        ctx.run_later(CLIENT_RETRY, |act, ctx| act.connect(ctx));
    }
}
