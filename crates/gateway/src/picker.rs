//! The ext_proc front door: kvgate as the endpoint picker an Envoy-based gateway (the
//! Kubernetes Gateway API Inference Extension's data plane) asks for every request over
//! `envoy.service.ext_proc.v3.ExternalProcessor/Process`. Envoy proxies, kvgate chooses:
//! the request's facts go through the same dispatch pipeline as the HTTP door's (admission,
//! selector, booking, decision log), and the outcome is rendered in this protocol: the pick
//! (and its fallbacks) as a header and as `envoy.lb` metadata, or an immediate 429/503.
//! The booking is held until Envoy reports the response's end, against the endpoint that
//! served it. `grpc.health.v1.Health` answers beside it. `docs/endpoint-picker.md` has
//! the protocol and its sources.
//!
//! Children: `envoy` reads and writes the protocol's messages, `exchange` is one stream's
//! state machine, `choose` the pick through the pipeline.

use std::net::TcpListener;
use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::Stream;
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;
use tracing::warn;

use crate::actors::tokenizers::Tokenizers;
use crate::pipeline::Pipeline;

mod choose;
mod envoy;
mod exchange;

use exchange::Exchange;

/// What every stream of the picker shares.
#[derive(Debug)]
pub(crate) struct Picker {
    pub pipeline: Pipeline,
    pub tokenizers: Arc<Tokenizers>,
    /// The policy reads the prompt (else only the model and the routing key are read).
    pub reads_prompt: bool,
    /// Largest request body read for routing; a larger one is refused (413).
    pub max_body: usize,
    /// `--session-headers`, lower case.
    pub session_headers: Arc<[String]>,
}

/// The service names the gateways and kubelets probe besides the server as a whole (""):
/// liveness, readiness, the extension's conformance probes and the ext_proc service.
const HEALTH_NAMES: [&str; 4] = [
    "liveness",
    "readiness",
    "inference-extension",
    <ExternalProcessorServer<Service> as NamedService>::NAME,
];

/// The `ExternalProcessor` service: one [`Exchange`] per stream.
#[derive(Debug, Clone)]
struct Service(Arc<Picker>);

type Answers = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl ExternalProcessor for Service {
    type ProcessStream = Answers;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Answers>, Status> {
        // The answers are pulled by the connection that sends them: no task of its own.
        let answers = Exchange::new(self.0.clone(), request.into_inner()).answers();
        Ok(Response::new(Box::pin(answers)))
    }
}

/// Sets every probed name to `status`.
pub(crate) async fn set_health(reporter: &HealthReporter, status: ServingStatus) {
    for name in HEALTH_NAMES {
        reporter.set_service_status(name, status).await;
    }
    reporter.set_service_status("", status).await;
}

/// Serves ext_proc and health on `ext_proc` (over TLS with `tls`, else h2c), health alone
/// on `health_only` (h2c), until the runtime it runs on stops (the picker's arbiter).
pub(crate) async fn serve<H>(
    picker: Picker,
    health: HealthServer<H>,
    tls: Option<Identity>,
    ext_proc: TcpListener,
    health_only: Option<TcpListener>,
) where
    H: Health,
{
    // A body chunk is at most what the picker reads for routing, and some framing.
    let limit = picker.max_body.saturating_add(64 * 1024);
    let service =
        ExternalProcessorServer::new(Service(Arc::new(picker))).max_decoding_message_size(limit);
    let main = async {
        let incoming = incoming(ext_proc)?;
        let mut builder = Server::builder();
        if let Some(id) = tls {
            builder = builder
                .tls_config(ServerTlsConfig::new().identity(id))
                .map_err(std::io::Error::other)?;
        }
        builder
            .add_service(service)
            .add_service(health.clone())
            .serve_with_incoming(incoming)
            .await
            .map_err(std::io::Error::other)
    };
    let second = async {
        let Some(l) = health_only else {
            return Ok(());
        };
        Server::builder()
            .add_service(health.clone())
            .serve_with_incoming(incoming(l)?)
            .await
            .map_err(std::io::Error::other)
    };
    let (a, b) = futures_util::future::join(main, second).await;
    for e in [a.err(), b.err()].into_iter().flatten() {
        warn!(error = %e, "an endpoint-picker listener failed");
    }
}

/// A bound listener as tonic's incoming connections; call on the runtime that serves it.
fn incoming(l: TcpListener) -> std::io::Result<TcpIncoming> {
    l.set_nonblocking(true)?;
    let l = tokio::net::TcpListener::from_std(l)?;
    Ok(TcpIncoming::from(l).with_nodelay(Some(true)))
}

#[cfg(test)]
mod tests;
