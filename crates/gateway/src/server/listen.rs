//! The listeners: the gateway's HTTP server (actix-http's HTTP/1 service over `Intake`
//! connections, the routing actors started by its first thread) and the keyless
//! `--prometheus-port` one, and the endpoint picker's gRPC listeners (`--ext-proc-port`,
//! `--grpc-health-port`).

use crate::actors::tokenizers::Tokenizers;
use crate::config::GatewayConfig;
use crate::http::intake::Intake;
use crate::http::state::AppState;
use crate::picker::{self, Picker, set_health};
use crate::pipeline::Pipeline;
use crate::upstream::Pool;
use actix_http::error::DispatchError;
use actix_http::{Extensions, HttpService};
use actix_service::{IntoServiceFactory, ServiceFactoryExt, fn_service, map_config};
use actix_web::dev::AppConfig;
use actix_web::dev::Server;
use actix_web::{HttpServer, web};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpStream;

use super::StartError;
use super::tls::ListenerIo;
use super::wiring::RoutingStart;

/// Idle upstream connections are dropped before the engines' own keep-alive (uvicorn's
/// default is 5 s) would close them under a request.
pub(super) const UPSTREAM_KEEP_ALIVE: Duration = Duration::from_secs(3);

/// The `--prometheus-port` listener: `GET /metrics` alone, on one thread.
pub(super) fn metrics_server(
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

/// The HTTP server over `listener`, with the routing actors started by its first thread;
/// with `tls`, each connection's TLS handshake first (within the head's read timeout).
pub(super) fn http_server(
    cfg: &GatewayConfig,
    listener: std::net::TcpListener,
    state: web::Data<AppState>,
    routing: RoutingStart,
    tls: Option<tokio_rustls::TlsAcceptor>,
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
            let pool = Pool::new(connect_timeout, UPSTREAM_KEEP_ALIVE, state.guard.clone());
            pool.spawn_sweeper();
            let app = crate::http::app::app(state.clone(), pool)
                .into_factory()
                .map_err(|e| e.error_response());
            let stopping = stopping.clone();
            let mut http = HttpService::<Intake<ListenerIo>, _, _>::build()
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
                .on_connect_ext(|io: &Intake<ListenerIo>, ext: &mut Extensions| {
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
            let tls = tls.clone();
            fn_service(move |io: TcpStream| {
                let peer = io.peer_addr().ok();
                // Streamed tokens are small writes: with Nagle's algorithm each waited for
                // the client's delayed ACK of the one before (+28 ms TTFT measured at two
                // streams).
                let _ = io.set_nodelay(true);
                let tls = tls.clone();
                async move {
                    let io = match &tls {
                        None => tokio_util::either::Either::Left(io),
                        Some(a) => super::tls::accept(a, io, header_read_timeout)
                            .await
                            .map_err(|e| {
                                // A client's failure, not the gateway's: at debug only.
                                tracing::debug!(peer = ?peer, error = %e, "TLS handshake failed");
                                DispatchError::Io(e)
                            })?,
                    };
                    Ok::<_, DispatchError>((Intake::new(io, limit), peer))
                }
            })
            .and_then(http)
        })
        .map_err(|source| StartError::Bind { addr, source })?;
    Ok(builder.run())
}

/// The endpoint picker, running on its own arbiter: its listeners' addresses and the
/// health statuses it answers.
pub(super) struct PickerRun {
    pub arbiter: actix::Arbiter,
    pub ext_proc: SocketAddr,
    pub health: Option<SocketAddr>,
    pub reporter: tonic_health::server::HealthReporter,
}

/// Binds `--ext-proc-port` (and `--grpc-health-port`) and serves the picker on a thread
/// of its own, so a burst of picks never waits behind HTTP work; `None` when off.
pub(super) fn picker_server(
    cfg: &GatewayConfig,
    pipeline: &Pipeline,
    tokenizers: &Arc<Tokenizers>,
) -> Result<Option<PickerRun>, StartError> {
    let Some(port) = cfg.picker.ext_proc_port else {
        return Ok(None);
    };
    let bind = |port: u16| {
        let addr = format!("{}:{port}", cfg.picker.ext_proc_host);
        let l = std::net::TcpListener::bind(&addr).map_err(|source| StartError::Bind {
            addr: addr.clone(),
            source,
        })?;
        let a = l
            .local_addr()
            .map_err(|source| StartError::Bind { addr, source })?;
        Ok::<_, StartError>((l, a))
    };
    let (ext_proc, ext_proc_addr) = bind(port)?;
    let health = cfg.picker.grpc_health_port.map(bind).transpose()?;
    let picker = Picker {
        pipeline: pipeline.clone(),
        tokenizers: tokenizers.clone(),
        reads_prompt: cfg.policy.kind.reads_prompt(),
        max_body: cfg.max_payload_size,
        session_headers: (cfg.session_headers.iter())
            .map(|h| h.to_ascii_lowercase())
            .collect(),
    };
    let tls = picker_tls(cfg)?;
    let (reporter, service) = tonic_health::server::health_reporter();
    let arbiter = actix::Arbiter::new();
    let ready = reporter.clone();
    let health_addr = health.as_ref().map(|(_, a)| *a);
    arbiter.spawn(async move {
        set_health(&ready, tonic_health::ServingStatus::Serving).await;
        picker::serve(picker, service, tls, ext_proc, health.map(|(l, _)| l)).await;
    });
    tracing::info!(addr = %ext_proc_addr, "endpoint picker (ext_proc) listening");
    Ok(Some(PickerRun {
        arbiter,
        ext_proc: ext_proc_addr,
        health: health_addr,
        reporter,
    }))
}

/// The ext_proc port's TLS identity, read and checked once at start.
fn picker_tls(cfg: &GatewayConfig) -> Result<Option<tonic::transport::Identity>, StartError> {
    let (Some(cert), Some(key)) = (&cfg.picker.ext_proc_tls_cert, &cfg.picker.ext_proc_tls_key)
    else {
        return Ok(None);
    };
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| StartError::PickerTls {
            path: p.display().to_string(),
            reason: e.to_string(),
        })
    };
    let identity = tonic::transport::Identity::from_pem(read(cert)?, read(key)?);
    // Tried here so a bad pair fails the start, not the listener.
    tonic::transport::Server::builder()
        .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity.clone()))
        .map_err(|e| StartError::PickerTls {
            path: cert.display().to_string(),
            reason: e.to_string(),
        })?;
    Ok(Some(identity))
}
