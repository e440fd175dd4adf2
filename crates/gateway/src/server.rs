//! Wiring: opens the store, starts the actors (selector and index on the first HTTP
//! thread, registry and poller on a control arbiter), registers the configured workers and
//! serves the HTTP API. `Gateway::start` runs all of it on a dedicated thread, which is
//! what the binary, embedders and the end-to-end tests use.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::dev::channel::AddressReceiver;
use actix::{Actor, Addr, Arbiter, Context};
use actix_http::error::DispatchError;
use actix_http::{Extensions, HttpService};
use actix_service::{IntoServiceFactory, ServiceFactoryExt, fn_service, map_config};
use actix_web::dev::AppConfig;
use actix_web::dev::{Server, ServerHandle};
use actix_web::{HttpServer, web};
use thiserror::Error;
use tokio::net::TcpStream;
use tracing::{error, info, warn};

use kvgate_core::WorkerUrl;
use kvgate_policies::CacheIndex;
use kvgate_poller::LoadPoller;
use kvgate_store::{EventsImage, Image, Persister, RegistryImage};

use crate::actors::events::{EventsActor, SelectorLink, SnapshotSettings};
use crate::actors::index::{FleetSettled, IndexActor, IndexConfig};
use crate::actors::registry::{
    AddWorker, PollerLink, RegistryActor, RegistryConfig, RegistryError, WorkerSource,
};
use crate::actors::selector::SelectorActor;
use crate::actors::tokenizers::{TokenizerActor, Tokenizers};
use crate::config::{ConfigError, GatewayConfig};
use crate::http::auth::{AllowList, Keys};
use crate::http::intake::Intake;
use crate::http::state::{AppState, Lifecycle};
use crate::metrics::Metrics;
use crate::pipeline::{Admission, DECISION_LOG_SIZE, DecisionSink, Pipeline};
use crate::upstream::Pool;

#[derive(Debug, Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot start the gateway thread: {0}")]
    Thread(std::io::Error),
    #[error("the gateway thread exited during startup")]
    Startup,
    #[error(
        "refusing to start: on {host} the admin routes would be open to the network; give \
         --control-plane-api-keys, or --allow-open-admin to accept it"
    )]
    OpenAdmin { host: String },
}

/// Whether `host` is reachable only from this machine.
fn loopback(host: &str) -> bool {
    let h = host.trim_matches(['[', ']']);
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Addresses of the running actors, for the workspace's tests and benchmarks.
#[derive(Debug, Clone)]
pub struct Actors {
    pub registry: Addr<RegistryActor>,
    pub selector: Addr<SelectorActor>,
    pub poller: Addr<LoadPoller>,
    pub index: Addr<IndexActor>,
    pub(crate) lifecycle: Arc<Lifecycle>,
    pub(crate) admission: Arc<Admission>,
    /// Where `--prometheus-port` listens, when given.
    pub metrics_addr: Option<SocketAddr>,
    pub events: Addr<EventsActor>,
}

/// Idle upstream connections are dropped before the engines' own keep-alive (uvicorn's
/// default is 5 s) would close them under a request.
const UPSTREAM_KEEP_ALIVE: Duration = Duration::from_secs(3);

/// The threads behind the actors, stopped in order at shutdown.
struct Threads {
    arbiters: Vec<Arbiter>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// The `--prometheus-port` listener, stopped with the gateway.
    metrics: Option<ServerHandle>,
}

impl Threads {
    /// Stops the actors; once they are gone the writer sees its channel close, finishes
    /// what is queued and releases the store (sled's lock) before this returns.
    fn join(self) {
        for a in &self.arbiters {
            a.stop();
        }
        for a in self.arbiters {
            let _ = a.join();
        }
        if let Some(w) = self.writer {
            let _ = w.join();
        }
    }
}

/// Default mailbox depth before `started` raises it; only startup messages queue here.
const MAILBOX: usize = 16;

/// The routing actors, built and waiting for the thread they will run on. A dispatch is
/// HTTP handler → selector → index and back; on one thread those hops are queue pushes,
/// where across threads each one is a wake-up that costs more than the decision itself.
struct RoutingStart {
    index: (IndexActor, AddressReceiver<IndexActor>),
    selector: (SelectorActor, AddressReceiver<SelectorActor>),
}

impl RoutingStart {
    /// Starts both actors on the current arbiter.
    fn run_here(self) {
        let (index, rx) = self.index;
        Context::with_receiver(rx).run(index);
        let (selector, rx) = self.selector;
        Context::with_receiver(rx).run(selector);
    }
}

/// The store, read once at startup, and the writer thread that owns it afterwards.
struct Persistence {
    persister: Option<Persister>,
    writer: Option<std::thread::JoinHandle<()>>,
    image: Option<Image>,
    events: Option<EventsImage>,
    registry: RegistryImage,
}

/// Opens the store under `data_dir`. A store that cannot be used is reported once and
/// never stops the gateway: it then runs without persistence.
fn open_store(cfg: &GatewayConfig) -> Persistence {
    let kvgate_store::Opened {
        store,
        image,
        events,
        registry,
        problems,
    } = kvgate_store::open_or_reset(&cfg.data_dir);
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
fn routing_actors(
    cfg: &GatewayConfig,
    epoch: Instant,
    persister: Option<Persister>,
    image: Option<Image>,
    metrics: &Metrics,
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
            .with_mailbox_histogram(metrics.selector_wait.clone());
    let start = RoutingStart {
        index: (index_actor, index_rx),
        selector: (selector_actor, selector_rx),
    };
    (start, index, selector)
}

/// Starts the load poller and the registry on the control arbiter.
fn control_actors(
    cfg: &GatewayConfig,
    epoch: Instant,
    control: &Arbiter,
    routing: (&Addr<IndexActor>, &Addr<SelectorActor>),
    persister: Option<Persister>,
    (image, events_image): (RegistryImage, Option<EventsImage>),
    metrics: &Arc<Metrics>,
) -> (
    Addr<RegistryActor>,
    Addr<LoadPoller>,
    Addr<EventsActor>,
    Arc<Tokenizers>,
) {
    let metrics = metrics.clone();
    let (index, selector) = routing;
    let sink = selector.clone().recipient();
    let mut poller_cfg = cfg.poller.clone();
    if poller_cfg.api_key.is_none() {
        poller_cfg.api_key = (cfg.access.worker_api_key.as_ref()).map(|k| k.expose().to_owned());
    }
    let poller = LoadPoller::start_in_arbiter(&control.handle(), move |_| {
        LoadPoller::new(poller_cfg, epoch, sink)
    });
    let reg_cfg = RegistryConfig {
        health: cfg.health.clone(),
        worker_key: cfg.access.worker_api_key.clone(),
        // Checked by `validate`: a value that does not parse was refused then.
        kv_events: cfg.events.publisher().ok().flatten(),
    };
    // Its subscriber tasks run on this arbiter's runtime, beside the poller's.
    let max_blocks = cfg.events.kv_events_max_blocks;
    let to_selector = SelectorLink {
        loads: selector.clone().recipient(),
        live: selector.clone().recipient(),
    };
    let snapshots = SnapshotSettings {
        persister: persister.clone(),
        interval: cfg.snapshot.interval,
    };
    let routed = index.clone().recipient();
    let events = EventsActor::start_in_arbiter(&control.handle(), move |_| {
        EventsActor::new(Some(max_blocks), Some(to_selector))
            .with_snapshots(snapshots, events_image)
            .with_prefix_index(routed)
    });
    let tokenizers = Arc::new(Tokenizers::new(cfg.events.tokenizer_path.clone()));
    let loader = TokenizerActor {
        tokenizers: tokenizers.clone(),
    };
    let loader = TokenizerActor::start_in_arbiter(&control.handle(), move |_| loader);
    let subscribers = vec![
        selector.clone().recipient(),
        index.clone().recipient(),
        events.clone().recipient(),
        loader.recipient(),
    ];
    let link = PollerLink {
        targets: poller.clone().recipient(),
        now: poller.clone().recipient(),
    };
    let registry = RegistryActor::start_in_arbiter(&control.handle(), move |_| {
        RegistryActor::new(reg_cfg, subscribers, Some(link), persister, image).with_metrics(metrics)
    });
    (registry, poller, events, tokenizers)
}

/// The workers to register at start: the configured ones less those the admin API
/// removed, plus those it added.
fn startup_workers(cfg: &GatewayConfig, image: &RegistryImage) -> Vec<(String, WorkerSource)> {
    let mut startup = Vec::new();
    for u in &cfg.worker_urls {
        let norm = WorkerUrl::parse(u).map_or_else(|_| u.clone(), |w| w.to_string());
        if image.removed.contains(&norm) {
            info!(worker = %norm, "not registered: it was removed through the admin API");
        } else {
            startup.push((u.clone(), WorkerSource::Config));
        }
    }
    for u in &image.added {
        startup.push((u.clone(), WorkerSource::Api));
    }
    startup
}

/// Registers the startup workers (each probed before its answer), then tells the index
/// that restored entries of workers that did not come back can go.
async fn register(
    registry: &Addr<RegistryActor>,
    (index, events): (&Addr<IndexActor>, &Addr<EventsActor>),
    workers: Vec<(String, WorkerSource)>,
    allow: &AllowList,
) {
    let adds = workers.into_iter().map(|(url, source)| {
        let registry = registry.clone();
        async move {
            // A worker the API added before the restart is checked against today's list.
            if source == WorkerSource::Api
                && let Ok(u) = WorkerUrl::parse(&url)
                && !allow.allows(&u).await
            {
                warn!(worker = %url, "not registered again: outside --worker-allow");
                return;
            }
            let r = registry
                .send(AddWorker {
                    url: url.clone(),
                    source,
                    api_key: None,
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
fn warn_about_blind_spots(cfg: &GatewayConfig) {
    if cfg.policy.kind.needs_prefix_matches() && cfg.policy.cache_index == CacheIndex::Hash {
        warn!(
            "--cache-index hash matches token prompts only: /v1/chat/completions, and text \
             prompts on /v1/completions and /generate, are routed by load with no prefix \
             affinity (use --cache-index tree for them)"
        );
    }
}

/// The HTTP server over `listener`, with the routing actors started by its first thread.
/// The `--prometheus-port` listener: `GET /metrics` alone, on one thread.
fn metrics_server(
    cfg: &GatewayConfig,
    state: web::Data<AppState>,
) -> Result<Option<(Server, SocketAddr)>, StartError> {
    let Some(port) = cfg.prometheus_port else {
        return Ok(None);
    };
    let bind = format!("{}:{port}", cfg.prometheus_host);
    let listener = std::net::TcpListener::bind(&bind).map_err(|source| StartError::Bind {
        addr: bind.clone(),
        source,
    })?;
    let addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: bind.clone(),
        source,
    })?;
    let server = HttpServer::new(move || {
        actix_web::App::new()
            .app_data(state.clone())
            .route(
                "/metrics",
                web::get().to(crate::http::inspect::open_metrics),
            )
            .default_service(web::to(crate::http::routes::not_found))
    })
    .workers(1)
    .disable_signals()
    .listen(listener)
    .map_err(|source| StartError::Bind { addr: bind, source })?
    .run();
    Ok(Some((server, addr)))
}

fn http_server(
    cfg: &GatewayConfig,
    listener: std::net::TcpListener,
    state: web::Data<AppState>,
    routing: RoutingStart,
) -> Result<Server, StartError> {
    let routing_start = Arc::new(Mutex::new(Some(routing)));
    let connect_timeout = cfg.connect_timeout;
    let header_read_timeout = cfg.header_read_timeout;
    let limit = cfg.max_payload_size;
    let addr = listener
        .local_addr()
        .map_or_else(|_| format!("{}:{}", cfg.host, cfg.port), |a| a.to_string());
    let local = listener.local_addr().ok();
    let builder = Server::build()
        .shutdown_timeout(cfg.shutdown_grace_period.as_secs().max(1))
        .disable_signals();
    let builder = match cfg.http_workers {
        Some(n) => builder.workers(n),
        None => builder,
    };
    // Ends idle keep-alive connections when the server stops.
    let stopping = builder.graceful_shutdown_signal();
    let builder = builder
        .listen("kvgate", listener, move || {
            // The first worker to build its app hosts the routing actors; later calls
            // (other workers, a restarted service) find them started.
            let start = match routing_start.lock() {
                Ok(mut g) => g.take(),
                Err(p) => p.into_inner().take(),
            };
            if let Some(r) = start {
                r.run_here();
            }
            // One upstream pool per HTTP thread.
            let pool = Pool::new(connect_timeout, UPSTREAM_KEEP_ALIVE);
            pool.spawn_sweeper();
            let app = crate::http::app::app(state.clone(), pool)
                .into_factory()
                .map_err(|e| e.error_response());
            let stopping = stopping.clone();
            let mut http = HttpService::<Intake, _, _>::build()
                .graceful_shutdown_signal(move || {
                    let s = stopping.clone();
                    async move { s.notified().await }
                })
                .client_request_timeout(header_read_timeout)
                // A client that closes its socket ends the request (and the upstream one)
                // even while the answer has not started: no engine keeps generating for
                // nobody.
                .h1_allow_half_closed(false)
                .client_disconnect_timeout(Duration::from_secs(1))
                .on_connect_ext(|io: &Intake, ext: &mut Extensions| {
                    ext.insert(io.bodies());
                });
            if let Some(a) = local {
                http = http.local_addr(a);
            }
            // actix-web builds its own with the listener's address, through a constructor
            // it does not export; the default's placeholder host and address are read only
            // by `connection_info()` without a Host header and `app_config()`, which no
            // route here uses.
            let http = http.h1(map_config(app, |_| AppConfig::default()));
            fn_service(move |io: TcpStream| {
                let peer = io.peer_addr().ok();
                // Streamed tokens are small writes: with Nagle's algorithm each waited for
                // the client's delayed ACK of the one before (+28 ms TTFT measured at two
                // streams).
                let _ = io.set_nodelay(true);
                std::future::ready(Ok::<_, DispatchError>((Intake::new(io, limit), peer)))
            })
            .and_then(http)
        })
        .map_err(|source| StartError::Bind { addr, source })?;
    Ok(builder.run())
}

/// Starts the actors and the HTTP server inside the current actix System.
async fn build(cfg: &GatewayConfig) -> Result<(Server, SocketAddr, Actors, Threads), StartError> {
    if cfg.access.control_plane_api_keys.is_empty()
        && !cfg.access.allow_open_admin
        && !loopback(&cfg.host)
    {
        return Err(StartError::OpenAdmin {
            host: cfg.host.clone(),
        });
    }
    // Bound first: a taken port fails the start before any thread or store is opened.
    let bind = format!("{}:{}", cfg.host, cfg.port);
    let listener = std::net::TcpListener::bind(&bind).map_err(|source| StartError::Bind {
        addr: bind.clone(),
        source,
    })?;
    let addr = listener
        .local_addr()
        .map_err(|source| StartError::Bind { addr: bind, source })?;
    warn_about_blind_spots(cfg);
    let epoch = Instant::now();
    let store = open_store(cfg);
    let metrics = Arc::new(Metrics::new(cfg.policy.kind.name()));
    let (routing, index, selector) =
        routing_actors(cfg, epoch, store.persister.clone(), store.image, &metrics);
    let control = Arbiter::new();
    let workers = startup_workers(cfg, &store.registry);
    let (registry, poller, events, tokenizers) = control_actors(
        cfg,
        epoch,
        &control,
        (&index, &selector),
        store.persister,
        (store.registry, store.events),
        &metrics,
    );
    let mut routing = routing;
    routing
        .selector
        .0
        .report_refusals_to(registry.clone().recipient());
    routing.selector.0.read_events_from(events.clone());
    // Checked by `validate`: an entry that does not parse was refused then.
    let allow = AllowList::new(cfg.access.allowed().unwrap_or_default());
    register(&registry, (&index, &events), workers, &allow).await;
    let lifecycle = Arc::new(Lifecycle::default());
    let admission = Arc::new(Admission::new(&cfg.admission));
    let pipeline = Pipeline::new(
        selector.clone(),
        admission.clone(),
        DecisionSink::new(DECISION_LOG_SIZE, metrics.clone()),
        metrics.clone(),
        cfg.retry,
        cfg.policy.bytes_per_token,
    );
    let state = web::Data::new(AppState {
        pipeline,
        selector: selector.clone(),
        registry: registry.clone(),
        index: index.clone(),
        max_payload_size: cfg.max_payload_size,
        request_timeout: cfg.request_timeout,
        first_token_timeout: cfg.stream_first_token_timeout,
        body_timeout: cfg.body_read_timeout,
        keys: Keys::new(&cfg.access),
        allow,
        grace: cfg.shutdown_grace_period,
        lifecycle: lifecycle.clone(),
        reads_prompt: cfg.policy.kind.reads_prompt(),
        events: events.clone(),
        tokenizers,
        metrics,
    });
    let metrics = metrics_server(cfg, state.clone())?;
    let server = http_server(cfg, listener, state, routing)?;
    info!(%addr, policy = %cfg.policy.kind, workers = cfg.worker_urls.len(), "kvgate listening");
    let actors = Actors {
        registry,
        selector,
        poller,
        index,
        lifecycle,
        admission,
        metrics_addr: metrics.as_ref().map(|(_, a)| *a),
        events,
    };
    let threads = Threads {
        arbiters: vec![control],
        writer: store.writer,
        metrics: metrics.map(|(server, _)| {
            let handle = server.handle();
            #[expect(
                clippy::disallowed_methods,
                reason = "the metrics listener is stopped through its handle, kept in Threads"
            )]
            actix_rt::spawn(server);
            handle
        }),
    };
    Ok((server, addr, actors, threads))
}

/// A gateway running on its own thread.
#[derive(Debug)]
pub struct Gateway {
    addr: SocketAddr,
    server: ServerHandle,
    actors: Actors,
    system: actix_rt::System,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Gateway {
    /// Starts the gateway; returns once it is listening and the configured workers have
    /// been probed.
    pub fn start(cfg: GatewayConfig) -> Result<Gateway, StartError> {
        // An embedder builds the value itself: it is checked here as the loader checks it.
        cfg.validate()?;
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("kvgate".into())
            .spawn(move || {
                let sys = actix_rt::System::new();
                sys.block_on(async move {
                    match build(&cfg).await {
                        Ok((server, addr, actors, threads)) => {
                            let handle = server.handle();
                            let _ =
                                tx.send(Ok((addr, handle, actors, actix_rt::System::current())));
                            let _ = server.await;
                            if let Some(m) = &threads.metrics {
                                m.stop(false).await;
                            }
                            // In-flight requests have drained and the workers' threads are
                            // ending; the index writes its final snapshot as it stops, and
                            // the join waits for the writer to put it on disk.
                            threads.join();
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                });
            })
            .map_err(StartError::Thread)?;
        let (addr, server, actors, system) = rx.recv().map_err(|_| StartError::Startup)??;
        Ok(Gateway {
            addr,
            server,
            actors,
            system,
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://host:port` of the gateway.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://host:port` of the `--prometheus-port` listener, when there is one.
    pub fn metrics_url(&self) -> Option<String> {
        self.actors.metrics_addr.map(|a| format!("http://{a}"))
    }

    #[doc(hidden)]
    pub fn actors(&self) -> &Actors {
        &self.actors
    }

    /// Blocks until the server stops (a signal or [`Gateway::stop`] from elsewhere).
    pub fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// A handle that can stop the server from another thread (signal handling).
    pub fn handle(&self) -> ServerHandle {
        self.server.clone()
    }

    /// Stops accepting, lets in-flight requests finish, then stops the actors.
    pub fn stop(mut self) {
        self.shutdown(true);
    }

    /// The orderly end (what SIGTERM does): `/readiness` answers 503 at once so load
    /// balancers move on, requests keep being served until none is in flight or `grace`
    /// is over, then the server stops (streams still open get the rest of the grace) and
    /// the final snapshot is written.
    pub fn drain_and_stop(self, grace: Duration) {
        self.actors
            .lifecycle
            .shutting_down
            .store(true, std::sync::atomic::Ordering::Release);
        let until = Instant::now() + grace;
        while self.actors.admission.in_flight() > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        // The grace is spent: what still runs is cut now rather than given it again.
        let graceful = self.actors.admission.in_flight() == 0;
        let mut this = self;
        this.shutdown(graceful);
    }

    /// Inference requests inside the gateway now.
    pub fn in_flight(&self) -> usize {
        self.actors.admission.in_flight()
    }

    fn shutdown(&mut self, graceful: bool) {
        if let Some(t) = self.thread.take() {
            let server = self.server.clone();
            // The stop runs on the gateway's own runtime, so this works from any thread,
            // inside an async runtime or not. The final snapshot follows in that thread.
            self.system.arbiter().spawn(async move {
                server.stop(graceful).await;
            });
            let _ = t.join();
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.shutdown(false);
    }
}
