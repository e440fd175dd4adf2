//! The actors' wiring at startup: the store opened once, the routing actors built and
//! restored before any request reaches them, the control actors started, the startup
//! workers registered.

use crate::actors::events::{EventsActor, SelectorLink, SnapshotSettings};
use crate::actors::index::{FleetSettled, IndexActor, IndexConfig};
use crate::actors::registry::{
    AddWorker, PollerLink, RegistryActor, RegistryConfig, RegistryError, WorkerSource,
};
use crate::actors::selector::SelectorActor;
use crate::actors::supervise::{Supervision, run_supervised, start_supervised};
use crate::actors::tokenizers::{TokenizerActor, Tokenizers};
use crate::config::GatewayConfig;
use crate::http::auth::AllowList;
use crate::metrics::Metrics;
use crate::upstream::ConnectGuard;
use actix::dev::channel::AddressReceiver;
use actix::{Addr, Arbiter, Context};
use kvgate_core::WorkerUrl;
use kvgate_policies::CacheIndex;
use kvgate_poller::LoadPoller;
use kvgate_store::{EventsImage, Image, Persister, RegistryImage};
use std::sync::Arc;
use std::time::Instant;
use tracing::{error, info, warn};

/// Default mailbox depth before `started` raises it; only startup messages queue here.
pub(super) const MAILBOX: usize = 16;

/// The routing actors, built and waiting for the thread they will run on. A dispatch is
/// HTTP handler → selector → index and back; on one thread those hops are queue pushes,
/// where across threads each one is a wake-up that costs more than the decision itself.
pub(super) struct RoutingStart {
    pub(super) index: (IndexActor, AddressReceiver<IndexActor>),
    pub(super) selector: (SelectorActor, AddressReceiver<SelectorActor>),
    pub(super) supervision: Arc<Supervision>,
}

impl RoutingStart {
    /// Starts both actors on the current arbiter, each restarted after a panic.
    pub(super) fn run_here(self) {
        let (index, rx) = self.index;
        run_supervised(
            Context::with_receiver(rx),
            index,
            "index",
            self.supervision.clone(),
        );
        let (selector, rx) = self.selector;
        run_supervised(
            Context::with_receiver(rx),
            selector,
            "selector",
            self.supervision,
        );
    }
}

/// The store, read once at startup, and the writer thread that owns it afterwards.
pub(super) struct Persistence {
    pub(super) persister: Option<Persister>,
    pub(super) writer: Option<std::thread::JoinHandle<()>>,
    pub(super) image: Option<Image>,
    pub(super) events: Option<EventsImage>,
    pub(super) registry: RegistryImage,
}

/// Opens the store under `data_dir`. A store that cannot be used is reported once and
/// never stops the gateway: it then runs without persistence.
pub(super) fn open_store(cfg: &GatewayConfig) -> Persistence {
    let kvgate_store::Opened {
        store,
        image,
        events,
        registry,
        problems,
    } = kvgate_store::open_or_reset_with(
        &cfg.data_dir,
        kvgate_store::StoreOptions {
            cache_bytes: cfg.store_cache_bytes,
        },
    );
    for p in problems {
        error!("{p}");
    }
    let (persister, writer) = match store.map(kvgate_store::spawn) {
        Some(Ok((p, w))) => (Some(p), Some(w)),
        Some(Err(e)) => {
            error!(error = %e, "cannot start the store writer; running without persistence");
            (None, None)
        }
        None => (None, None),
    };
    Persistence {
        persister,
        writer,
        image,
        events,
        registry,
    }
}

/// Builds the routing actors, restored from the stored snapshot before any request can
/// reach them. They start on the first HTTP thread; their addresses exist already.
pub(super) fn routing_actors(
    cfg: &GatewayConfig,
    epoch: Instant,
    persister: Option<Persister>,
    image: Option<Image>,
    metrics: &Metrics,
    supervision: Arc<Supervision>,
) -> (RoutingStart, Addr<IndexActor>, Addr<SelectorActor>) {
    let (index_tx, index_rx) = actix::dev::channel::channel::<IndexActor>(MAILBOX);
    let (selector_tx, selector_rx) = actix::dev::channel::channel::<SelectorActor>(MAILBOX);
    let index = Addr::new(index_tx);
    let selector = Addr::new(selector_tx);
    let index_cfg = IndexConfig::from_policy(&cfg.policy, &cfg.snapshot);
    let mut index_actor = IndexActor::new(index_cfg, epoch, persister)
        .with_snapshot_histogram(metrics.snapshot_seconds.clone());
    if let Some(img) = image {
        index_actor.restore(img);
    }
    let selector_actor =
        SelectorActor::new(cfg.policy.clone(), cfg.seed, epoch, Some(index.clone()))
            .with_prefill_hold(cfg.prefill_hold)
            .with_circuit_breaker(cfg.circuit)
            // Out on its checks for as long again as it took to go out, and never under
            // 10 s: a slow engine shows progress by then, a frozen one does not.
            .with_stall_grace(
                (cfg.health.interval * cfg.health.failure_threshold + cfg.health.timeout)
                    .max(std::time::Duration::from_secs(10)),
            )
            .with_mailbox_histogram(metrics.selector_wait.clone());
    let start = RoutingStart {
        index: (index_actor, index_rx),
        selector: (selector_actor, selector_rx),
        supervision,
    };
    (start, index, selector)
}

/// The actors on the control arbiter.
pub(super) struct ControlActors {
    pub(super) registry: Addr<RegistryActor>,
    pub(super) poller: Addr<LoadPoller>,
    pub(super) events: Addr<EventsActor>,
    pub(super) tokenizers: Arc<Tokenizers>,
    pub(super) loader: Addr<TokenizerActor>,
}

/// Starts the load poller, the KV-event subscriber, the tokenizer loader and the registry
/// on the control arbiter, each restarted after a panic.
pub(super) fn control_actors(
    cfg: &GatewayConfig,
    epoch: Instant,
    control: &Arbiter,
    routing: (&Addr<IndexActor>, &Addr<SelectorActor>),
    persister: Option<Persister>,
    (image, events_image): (RegistryImage, Option<EventsImage>),
    (metrics, sup, guard): (&Arc<Metrics>, &Arc<Supervision>, &ConnectGuard),
) -> ControlActors {
    let metrics = metrics.clone();
    let arbiter = control.handle();
    let (index, selector) = routing;
    let sink = selector.clone().recipient();
    let mut poller_cfg = cfg.poller.clone();
    if poller_cfg.api_key.is_none() {
        poller_cfg.api_key = (cfg.access.worker_api_key.as_ref()).map(|k| k.expose().to_owned());
    }
    // Polls connect as checks and requests do: through the guard.
    let poll_guard = guard.clone();
    let make: kvgate_poller::MakeClient = Arc::new(move |timeout| poll_guard.awc_client(timeout));
    let poller = start_supervised(&arbiter, "poller", sup.clone(), move || {
        LoadPoller::new(poller_cfg, epoch, sink).with_client(make)
    });
    let reg_cfg = RegistryConfig {
        health: cfg.health.clone(),
        worker_key: cfg.access.worker_api_key.clone(),
        // Checked by `validate`: a value that does not parse was refused then.
        kv_events: cfg.events.publisher().ok().flatten(),
    };
    // Its subscriber tasks run on this arbiter's runtime, beside the poller's.
    let max_blocks = cfg.events.kv_events_max_blocks;
    let silence = cfg.events.kv_events_silence;
    let to_selector = SelectorLink {
        loads: selector.clone().recipient(),
        live: selector.clone().recipient(),
    };
    let snapshots = SnapshotSettings {
        persister: persister.clone(),
        interval: cfg.snapshot.interval,
    };
    let routed = index.clone().recipient();
    // Checked by `validate`: a value that does not parse was refused then.
    let allow = AllowList::new(cfg.access.allowed().unwrap_or_default());
    let events = start_supervised(&arbiter, "events", sup.clone(), move || {
        EventsActor::new(Some(max_blocks), Some(to_selector))
            .with_snapshots(snapshots, events_image)
            .with_prefix_index(routed)
            .with_allow_list(allow)
            .with_silence(silence)
    });
    let tokenizers = Arc::new(Tokenizers::new(cfg.events.tokenizer_path.clone()));
    let loader = TokenizerActor {
        tokenizers: tokenizers.clone(),
    };
    let loader = start_supervised(&arbiter, "tokenizer", sup.clone(), move || loader);
    tokenizers.set_renderer(loader.clone().recipient());
    let subscribers = vec![
        selector.clone().recipient(),
        index.clone().recipient(),
        events.clone().recipient(),
        loader.clone().recipient(),
    ];
    let link = PollerLink {
        targets: poller.clone().recipient(),
        now: poller.clone().recipient(),
    };
    let check_guard = guard.clone();
    let registry = start_supervised(&arbiter, "registry", sup.clone(), move || {
        RegistryActor::new(reg_cfg, subscribers, Some(link), persister, image)
            .with_metrics(metrics)
            .with_guard(&check_guard)
    });
    ControlActors {
        registry,
        poller,
        events,
        tokenizers,
        loader,
    }
}

/// The workers to register at start: the configured ones less those the admin API
/// removed, plus those it added.
/// A worker registered at start: its URL, where it came from, its own events config.
pub(super) type Startup = (String, WorkerSource, Option<String>);

pub(super) fn startup_workers(cfg: &GatewayConfig, image: &RegistryImage) -> Vec<Startup> {
    let mut startup = Vec::new();
    for u in &cfg.worker_urls {
        let norm = WorkerUrl::parse(u).map_or_else(|_| u.clone(), |w| w.to_string());
        if image.removed.contains(&norm) {
            info!(worker = %norm, "not registered: it was removed through the admin API");
        } else {
            let own = cfg.events.worker_kv_events_config(&norm);
            startup.push((u.clone(), WorkerSource::Config, own));
        }
    }
    for u in &image.added {
        startup.push((
            u.clone(),
            WorkerSource::Api,
            image.kv_events.get(u).cloned(),
        ));
    }
    startup
}

/// Registers the startup workers (each probed before its answer), then tells the index
/// that restored entries of workers that did not come back can go.
pub(super) async fn register(
    registry: &Addr<RegistryActor>,
    (index, events): (&Addr<IndexActor>, &Addr<EventsActor>),
    workers: Vec<Startup>,
    (allow, guard): (&AllowList, &ConnectGuard),
) {
    let adds = workers.into_iter().map(|(url, source, kv_events_config)| {
        let registry = registry.clone();
        async move {
            // A worker the API added before the restart is checked against today's list.
            if source == WorkerSource::Api
                && let Ok(u) = WorkerUrl::parse(&url)
                && let Err(why) = allow.check(u.host(), u.port()).await
            {
                warn!(worker = %url, reason = %why, "not registered again");
                return;
            }
            if source == WorkerSource::Api
                && let Ok(u) = WorkerUrl::parse(&url)
            {
                guard.watch(u.host());
            }
            let r = registry
                .send(AddWorker {
                    url: url.clone(),
                    source,
                    api_key: None,
                    kv_events_config,
                })
                .await;
            match r {
                Ok(Ok(_)) | Ok(Err(RegistryError::Exists(_))) => {}
                Ok(Err(e)) => warn!(worker = %url, error = %e, "worker not registered"),
                Err(e) => warn!(worker = %url, error = %e, "registry unavailable"),
            }
        }
    });
    futures_util::future::join_all(adds).await;
    index.do_send(FleetSettled);
    events.do_send(FleetSettled);
}

/// Says at start what the configuration leaves unrouted by prefix, rather than let it
/// pass silently.
pub(super) fn warn_about_blind_spots(cfg: &GatewayConfig) {
    if cfg.policy.kind.needs_prefix_matches() && cfg.policy.cache_index == CacheIndex::Hash {
        warn!(
            "--cache-index hash matches token prompts only: /v1/chat/completions, and text \
             prompts on /v1/completions and /generate, are routed by load with no prefix \
             affinity (use --cache-index tree for them)"
        );
    }
}
