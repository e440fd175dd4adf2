//! Wiring: opens the store, starts the actors (selector and index on the first HTTP
//! thread; registry, poller, events and tokenizer actors on a control arbiter; `wiring`),
//! registers the configured workers and serves the HTTP API (`listen`). `Gateway::start` runs all of it on a dedicated thread, which is
//! what the binary, embedders and the end-to-end tests use.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Addr, Arbiter};
use actix_web::dev::{Server, ServerHandle};
use actix_web::web;
use thiserror::Error;
use tracing::info;

use kvgate_poller::LoadPoller;

use crate::actors::discovery::DiscoveryActor;
use crate::actors::events::EventsActor;
use crate::actors::index::IndexActor;
use crate::actors::registry::RegistryActor;
use crate::actors::selector::SelectorActor;
use crate::actors::supervise::Supervision;
use crate::actors::tokenizers::TokenizerActor;
use crate::config::{ConfigError, GatewayConfig};
use crate::http::auth::{AllowList, Keys};
use crate::http::forwarded::TrustedProxies;
use crate::http::history::History;
use crate::http::state::{AppState, Lifecycle};
use crate::metrics::Metrics;
use crate::pipeline::{Admission, DECISION_LOG_SIZE, DecisionSink, Pipeline, SharedBudget};
use crate::telemetry::{Telemetry, TelemetryError};
use crate::upstream::ConnectGuard;

mod listen;
mod tls;
mod wiring;

use listen::{http_server, metrics_server, picker_server};
use wiring::{
    ControlActors, control_actors, open_store, register, routing_actors, startup_workers,
    warn_about_blind_spots,
};

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
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    #[error("the ext_proc TLS certificate or key {path}: {reason}")]
    PickerTls { path: String, reason: String },
    /// The workers' TLS settings or the listener's certificate cannot be used.
    #[error("TLS: {0}")]
    Tls(String),
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
    /// The side listeners, kept behind one pointer (a `Gateway` is moved by value).
    pub(crate) side: Arc<SideListeners>,
    pub events: Addr<EventsActor>,
    /// For the tests' injected panics.
    #[cfg_attr(
        not(feature = "fault-injection"),
        expect(dead_code, reason = "read only by the test hooks")
    )]
    pub(crate) loader: Addr<TokenizerActor>,
}

/// Where the listeners beside the gateway's own port are.
#[derive(Debug, Default)]
pub(crate) struct SideListeners {
    /// `--prometheus-port`, when given.
    metrics: Option<SocketAddr>,
    /// The endpoint picker (ext_proc) and its separate health port.
    ext_proc: Option<SocketAddr>,
    grpc_health: Option<SocketAddr>,
    /// The picker's gRPC health statuses, turned to not serving when the gateway drains.
    picker_health: Option<tonic_health::server::HealthReporter>,
    /// The gateway's own port speaks TLS.
    tls: bool,
}

/// The threads behind the actors, stopped in order at shutdown.
struct Threads {
    arbiters: Vec<Arbiter>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// The `--prometheus-port` listener, stopped with the gateway.
    metrics: Option<ServerHandle>,
    /// Its last spans are exported once the requests are done.
    telemetry: Arc<Telemetry>,
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
            // A writer stuck in the file system (its directory deleted, a hung disk) is
            // left behind: the process exits without it.
            let deadline = std::time::Instant::now() + kvgate_store::SHUTDOWN_WAIT;
            while !w.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            if w.is_finished() {
                let _ = w.join();
            } else {
                tracing::error!(
                    waited_secs = kvgate_store::SHUTDOWN_WAIT.as_secs(),
                    "the store writer did not finish; stopping without it"
                );
            }
        }
        self.telemetry.shutdown();
    }
}

/// The gateway's listener, refused on a non-loopback address with an open admin. Bound
/// first: a taken port fails the start before any thread or store is opened.
fn bind_listener(cfg: &GatewayConfig) -> Result<(std::net::TcpListener, SocketAddr), StartError> {
    if cfg.access.control_plane_api_keys.is_empty()
        && !cfg.access.allow_open_admin
        && !loopback(&cfg.host)
    {
        return Err(StartError::OpenAdmin {
            host: cfg.host.clone(),
        });
    }
    let bind = format!("{}:{}", cfg.host, cfg.port);
    let listener = std::net::TcpListener::bind(&bind).map_err(|source| StartError::Bind {
        addr: bind.clone(),
        source,
    })?;
    let addr = listener
        .local_addr()
        .map_err(|source| StartError::Bind { addr: bind, source })?;
    Ok((listener, addr))
}

/// The one dispatch pipeline both front doors share.
fn pipeline(
    cfg: &GatewayConfig,
    selector: &Addr<SelectorActor>,
    admission: &Arc<Admission>,
    metrics: &Arc<Metrics>,
) -> Pipeline {
    Pipeline {
        selector: selector.clone(),
        admission: admission.clone(),
        decisions: DecisionSink::with_access_log(
            DECISION_LOG_SIZE,
            metrics.clone(),
            cfg.access_log,
        ),
        metrics: metrics.clone(),
        retry: cfg.retry,
        budget: Arc::new(SharedBudget::new(&cfg.retry)),
        bytes_per_token: cfg.policy.bytes_per_token,
    }
}

/// The TLS settings of `https://` workers, read once at start.
fn worker_tls(cfg: &GatewayConfig) -> Result<Arc<rustls::ClientConfig>, StartError> {
    let t = &cfg.tls;
    let files = crate::upstream::WorkerTlsFiles {
        ca: t.worker_ca_cert.as_deref(),
        client: (t.worker_client_cert.as_deref()).zip(t.worker_client_key.as_deref()),
    };
    crate::upstream::worker_client_config(files).map_err(|e| StartError::Tls(e.to_string()))
}

/// Starts the actors and the HTTP server inside the current actix System.
async fn build(cfg: &GatewayConfig) -> Result<(Server, SocketAddr, Actors, Threads), StartError> {
    let (listener, addr) = bind_listener(cfg)?;
    warn_about_blind_spots(cfg);
    let epoch = Instant::now();
    let store = open_store(cfg);
    let metrics = Arc::new(Metrics::new(cfg.policy.kind.name()));
    let supervision = Arc::new(Supervision::default());
    let (routing, index, selector) = routing_actors(
        cfg,
        epoch,
        store.persister.clone(),
        store.image,
        &metrics,
        supervision.clone(),
    );
    let control = Arbiter::new();
    let workers = startup_workers(cfg, &store.registry);
    // Checked by `validate`: an entry that does not parse was refused then.
    let allow = AllowList::new(cfg.access.allowed().unwrap_or_default());
    let guard = ConnectGuard::new(allow.connect_judge()).with_tls(worker_tls(cfg)?);
    let ControlActors {
        registry,
        poller,
        events,
        tokenizers,
        loader,
    } = control_actors(
        cfg,
        epoch,
        &control,
        (&index, &selector),
        store.persister,
        (store.registry, store.events),
        (&metrics, &supervision, &guard),
    );
    let mut routing = routing;
    let sel = &mut routing.selector.0;
    sel.report_refusals_to(registry.clone().recipient());
    sel.read_events_from(events.clone());
    register(&registry, (&index, &events), workers, (&allow, &guard)).await;
    // After the configured workers: a pod at one of their addresses is theirs.
    DiscoveryActor::start_if_on(
        cfg,
        &control.handle(),
        &registry,
        &selector,
        supervision.clone(),
    );
    let lifecycle = Arc::new(Lifecycle::default());
    let admission = Arc::new(Admission::new(&cfg.admission));
    let pipeline = pipeline(cfg, &selector, &admission, &metrics);
    let picker = picker_server(cfg, &pipeline, &tokenizers)?;
    let history = History::start(&control.handle(), &metrics, pipeline.decisions());
    let telemetry = Arc::new(Telemetry::start(cfg.otlp_endpoint.as_deref())?);
    let state = web::Data::new(AppState {
        pipeline,
        serves_inference: cfg.picker.http_serves_inference(),
        passthrough: cfg.passthrough_unknown_routes,
        answers: Default::default(),
        history,
        telemetry: telemetry.clone(),
        selector: selector.clone(),
        registry: registry.clone(),
        index: index.clone(),
        max_payload_size: cfg.max_payload_size,
        request_timeout: cfg.request_timeout,
        first_token_timeout: cfg.stream_first_token_timeout,
        first_byte_timeout: cfg.first_byte_timeout,
        body_timeout: cfg.body_read_timeout,
        keys: Keys::new(&cfg.access),
        allow,
        guard,
        // Checked by `validate`, like the allow-list.
        proxies: TrustedProxies::new(cfg.access.trusted().unwrap_or_default()),
        grace: cfg.shutdown_grace_period,
        lifecycle: lifecycle.clone(),
        supervision,
        request_id_headers: header_names(&cfg.request_id_headers),
        session_headers: header_names(&cfg.session_headers),
        reads_prompt: cfg.policy.kind.reads_prompt(),
        events: events.clone(),
        tokenizers,
        metrics,
    });
    let metrics = metrics_server(cfg, state.clone())?;
    let tls = tls::listener_tls(cfg, &control)?;
    let server = http_server(cfg, listener, state, routing, tls)?;
    info!(%addr, policy = %cfg.policy.kind, workers = cfg.worker_urls.len(), "kvgate listening");
    let actors = Actors {
        registry,
        selector,
        poller,
        index,
        lifecycle,
        admission,
        side: Arc::new(SideListeners {
            metrics: metrics.as_ref().map(|(_, a)| *a),
            ext_proc: picker.as_ref().map(|p| p.ext_proc),
            grpc_health: picker.as_ref().and_then(|p| p.health),
            picker_health: picker.as_ref().map(|p| p.reporter.clone()),
            tls: cfg.tls.listener().is_some(),
        }),
        events,
        loader,
    };
    let mut arbiters = vec![control];
    arbiters.extend(picker.map(|p| p.arbiter));
    let threads = Threads {
        arbiters,
        writer: store.writer,
        telemetry,
        metrics: metrics.map(|(server, _)| run_metrics(server)),
    };
    Ok((server, addr, actors, threads))
}

/// Header names as the config gives them (checked by `validate`: one that does not parse
/// was refused then).
fn header_names(names: &[String]) -> Arc<[actix_web::http::header::HeaderName]> {
    (names.iter())
        .filter_map(|h| actix_web::http::header::HeaderName::from_bytes(h.as_bytes()).ok())
        .collect()
}

/// Runs the `--prometheus-port` listener; its handle stops it.
fn run_metrics(server: Server) -> ServerHandle {
    let handle = server.handle();
    #[expect(
        clippy::disallowed_methods,
        reason = "the metrics listener is stopped through its handle, kept in Threads"
    )]
    actix_rt::spawn(server);
    handle
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

    /// `http://host:port` of the gateway (`https://` when it speaks TLS).
    pub fn url(&self) -> String {
        let scheme = if self.actors.side.tls {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// Where the endpoint picker's ext_proc gRPC service listens, when it is on.
    pub fn ext_proc_addr(&self) -> Option<SocketAddr> {
        self.actors.side.ext_proc
    }

    /// Where `--grpc-health-port` listens, when given.
    pub fn grpc_health_addr(&self) -> Option<SocketAddr> {
        self.actors.side.grpc_health
    }

    /// `http://host:port` of the `--prometheus-port` listener, when there is one.
    pub fn metrics_url(&self) -> Option<String> {
        self.actors.side.metrics.map(|a| format!("http://{a}"))
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
        self.drain_after(Duration::ZERO, grace);
    }

    /// [`Gateway::drain_and_stop`] after `delay`: readiness is 503 at once, but the
    /// listener keeps accepting and serving for `delay`, the time a load balancer (a
    /// Kubernetes Service's endpoints) takes to stop sending, before the drain begins.
    pub fn drain_after(self, delay: Duration, grace: Duration) {
        self.actors
            .lifecycle
            .shutting_down
            .store(true, std::sync::atomic::Ordering::Release);
        if let Some(r) = self.actors.side.picker_health.clone() {
            self.system.arbiter().spawn(async move {
                crate::picker::set_health(&r, tonic_health::ServingStatus::NotServing).await;
            });
        }
        std::thread::sleep(delay);
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
