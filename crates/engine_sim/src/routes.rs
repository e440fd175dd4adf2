//! The HTTP surface of one engine, per flavour, and the server that carries it. The route
//! table below lists every flavour's routes side by side; the handlers live with their
//! family: `info` (health, models, server info, loads, metrics), `control` (cache and
//! simulator controls), `infer` (the inference routes), `stream` (their event streams)
//! and `agents` (the Responses and Messages APIs).

use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::dev::Server;
use actix_web::web::{self, Data, ServiceConfig, resource};
use actix_web::{App, HttpResponse, HttpServer, ResponseError};
use serde_json::json;

use crate::engine::Engine;
use crate::error::ApiError;
use crate::{Fault, Flavor};

mod agents;
mod control;
mod infer;
mod info;
mod stream;

use agents::{messages, responses};
use control::{abort_request, flush_cache, sim_fault, sim_restart, sim_stats};
use infer::{chat, completions, generate, render_chat, render_completion};
use info::{health, health_generate, loads, metrics, model_info, models, ready, server_info};

type Answer = Result<HttpResponse, ApiError>;

/// Largest request body an engine reads (kvgate's own default limit).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Binds one engine's server (one worker thread) on `host:port`; run it on an actix System.
pub(crate) fn bind(
    engine: Arc<Engine>,
    host: &str,
    port: u16,
) -> std::io::Result<(Server, SocketAddr)> {
    let (flavor, metrics_on) = (engine.cfg.flavor, engine.cfg.enable_metrics);
    let render = engine.cfg.render_routes;
    let data = Data::from(engine);
    let server = HttpServer::new(move || {
        let frozen = Data::clone(&data);
        App::new()
            .app_data(Data::clone(&data))
            // actix's `Bytes` extractor stops at 256 KiB; an engine takes long prompts.
            .app_data(web::PayloadConfig::new(MAX_BODY))
            // A frozen process: connections are accepted, nothing is ever answered.
            .wrap_fn(move |req, srv| {
                // The simulator's own control routes stay up, so a test can thaw it.
                let own = req.path().starts_with("/sim/");
                let freeze = frozen.fault() == Fault::Freeze && !own;
                let refused = !own && req.path() != "/health" && !authorized(&frozen, &req);
                let fut = (!freeze && !refused).then(|| actix_web::dev::Service::call(srv, req));
                async move {
                    match fut {
                        Some(f) => f.await,
                        None if refused => {
                            Err(actix_web::error::ErrorUnauthorized("invalid API key"))
                        }
                        None => std::future::pending().await,
                    }
                }
            })
            .configure(|cfg| routes(cfg, flavor, metrics_on, render))
            .default_service(web::to(|| async { ApiError::NotFound.error_response() }))
    })
    .workers(1)
    // As uvicorn does for SGLang: a token is sent when it is ready, not when the last one
    // is acknowledged.
    .tcp_nodelay(true)
    .disable_signals()
    .shutdown_timeout(1)
    // Without this a client that goes away is only noticed on the next write, so a pending
    // non-streaming request would keep its slot.
    .h1_allow_half_closed(false)
    .bind((host, port))
    .map_err(|e| std::io::Error::new(e.kind(), format!("binding {host}:{port}: {e}")))?;
    let addr = server
        .addrs()
        .first()
        .copied()
        .ok_or_else(|| std::io::Error::other("bound no address"))?;
    Ok((server.run(), addr))
}

fn routes(cfg: &mut ServiceConfig, flavor: Flavor, metrics_on: bool, render: bool) {
    // Resources (not bare routes) so a known path with the wrong method answers 405.
    cfg.service(resource("/health").get(health))
        .service(resource("/v1/models").get(models))
        .service(resource("/v1/completions").post(completions))
        .service(resource("/v1/chat/completions").post(chat))
        .service(resource("/v1/responses").post(responses))
        .service(resource("/v1/messages").post(messages))
        .service(resource("/sim/stats").get(sim_stats))
        .service(resource("/sim/fault").post(sim_fault))
        .service(resource("/sim/restart").post(sim_restart));
    // SGLang has no `/metrics` route without `--enable-metrics`; vLLM always serves it.
    if metrics_on || flavor == Flavor::Vllm {
        cfg.service(resource("/metrics").get(metrics));
    }
    match flavor {
        Flavor::Sglang | Flavor::SglangLegacy => {
            // Older SGLang has only the `get_` forms, which newer versions keep as aliases.
            let (info, model) = if flavor == Flavor::Sglang {
                (
                    vec!["/server_info", "/get_server_info"],
                    vec!["/model_info", "/get_model_info"],
                )
            } else {
                (vec!["/get_server_info"], vec!["/get_model_info"])
            };
            cfg.service(resource("/health_generate").get(health_generate))
                .service(resource("/ready").get(ready))
                .service(resource(info).get(server_info))
                .service(resource(model).get(model_info))
                .service(resource("/generate").post(generate))
                .service(resource("/flush_cache").get(flush_cache).post(flush_cache))
                .service(resource("/abort_request").post(abort_request));
            if flavor == Flavor::Sglang {
                cfg.service(resource("/v1/loads").get(loads));
            }
        }
        Flavor::Vllm => {
            let version = || async { HttpResponse::Ok().json(json!({"version": "0.11.0"})) };
            cfg.service(resource("/version").get(version))
                .service(resource("/reset_prefix_cache").post(flush_cache));
            if render {
                cfg.service(resource("/v1/chat/completions/render").post(render_chat))
                    .service(resource("/v1/completions/render").post(render_completion));
            }
        }
    }
}

/// Whether the request carries the engine's key, when it has one.
fn authorized(e: &Engine, req: &actix_web::dev::ServiceRequest) -> bool {
    let Some(key) = &e.cfg.api_key else {
        return true;
    };
    req.headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t == key)
}
