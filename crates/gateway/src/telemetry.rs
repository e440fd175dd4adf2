//! Distributed traces (W3C trace context, OpenTelemetry): with `--otlp-endpoint`, each
//! proxied request is a span, the child of the client's `traceparent` when it sent one, and
//! the engine gets the gateway's span as its parent; spans are exported over OTLP/gRPC by
//! the OpenTelemetry SDK's batch processor. Without an endpoint nothing is made or sent,
//! and the client's trace headers reach the engine unchanged, as any other header does.
//!
//! The OTLP exporter (tonic) needs a tokio runtime of its own: the SDK's batch processor
//! exports from its own thread, and the gateway's runtimes are actix's, one per thread.
//! [`OtlpExporter`] runs the exporter on a current-thread runtime driven by one thread.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanData, SpanExporter};
use tracing::warn;

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("the OTLP endpoint {endpoint}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("cannot start the trace exporter's thread: {0}")]
    Thread(std::io::Error),
}

/// Longest wait for the last spans at shutdown.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The gateway's tracer, or nothing when traces are off.
#[derive(Debug, Default)]
pub(crate) struct Telemetry {
    on: Option<On>,
}

#[derive(Debug)]
struct On {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Telemetry {
    /// Spans exported to `endpoint` (an OTLP/gRPC collector, `http://host:4317`), or none.
    pub(crate) fn start(endpoint: Option<&str>) -> Result<Telemetry, TelemetryError> {
        let Some(endpoint) = endpoint else {
            return Ok(Telemetry::default());
        };
        let exporter = OtlpExporter::new(endpoint)?;
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("kvgate");
        }
        let provider = SdkTracerProvider::builder()
            .with_resource(resource.build())
            .with_batch_exporter(exporter)
            .build();
        let tracer = provider.tracer("kvgate");
        Ok(Telemetry {
            on: Some(On { provider, tracer }),
        })
    }

    /// A span for a request on `route` with these headers, when traces are on.
    pub(crate) fn request_span(
        &self,
        headers: &HeaderMap,
        route: &str,
        request_id: &str,
    ) -> Option<RequestSpan> {
        let on = self.on.as_ref()?;
        let parent = TraceContextPropagator::new().extract(&Headers(headers));
        let span = on
            .tracer
            .span_builder(format!("POST {route}"))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new("http.route", route.to_owned()),
                KeyValue::new("kvgate.request_id", request_id.to_owned()),
            ])
            .start_with_context(&on.tracer, &parent);
        let cx = parent.with_span(span);
        let mut out = Injected::default();
        TraceContextPropagator::new().inject_context(&cx, &mut out);
        Some(RequestSpan {
            cx,
            traceparent: out.traceparent,
            tracestate: out.tracestate,
        })
    }

    /// Exports what is left (at shutdown).
    pub(crate) fn shutdown(&self) {
        if let Some(on) = &self.on
            && let Err(e) = on.provider.shutdown_with_timeout(FLUSH_TIMEOUT)
        {
            warn!(error = %e, "the last spans were not exported");
        }
    }
}

/// One request's span: what the engine is sent, and what the answer adds before it ends
/// (when this is dropped).
#[derive(Debug)]
pub(crate) struct RequestSpan {
    cx: Context,
    pub(crate) traceparent: String,
    pub(crate) tracestate: String,
}

impl RequestSpan {
    /// The worker an attempt went to.
    pub(crate) fn worker(&self, url: &str, attempt: u32) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("server.address", url.to_owned()));
        span.set_attribute(KeyValue::new("kvgate.attempts", i64::from(attempt)));
    }

    /// The status the client got.
    pub(crate) fn status(&self, code: u16) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("http.response.status_code", i64::from(code)));
        if code >= 500 {
            span.set_status(Status::error(format!("status {code}")));
        }
    }
}

impl Drop for RequestSpan {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

/// A request's headers as the propagator reads them.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// What the propagator writes for the engine.
#[derive(Default)]
struct Injected {
    traceparent: String,
    tracestate: String,
}

impl Injector for Injected {
    fn set(&mut self, key: &str, value: String) {
        match key {
            "traceparent" => self.traceparent = value,
            "tracestate" => self.tracestate = value,
            _ => {}
        }
    }
}

/// The OTLP/gRPC exporter on a runtime of its own.
#[derive(Debug)]
struct OtlpExporter {
    inner: Arc<opentelemetry_otlp::SpanExporter>,
    rt: tokio::runtime::Handle,
    /// Dropped with the exporter: the runtime's thread then ends.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl OtlpExporter {
    fn new(endpoint: &str) -> Result<OtlpExporter, TelemetryError> {
        use opentelemetry_otlp::WithExportConfig as _;
        let bad = |reason: String| TelemetryError::Endpoint {
            endpoint: endpoint.to_owned(),
            reason,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(TelemetryError::Thread)?;
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("kvgate-otlp".into())
            .spawn(move || {
                let _ = rt.block_on(stopped);
            })
            .map_err(TelemetryError::Thread)?;
        // The channel is made inside the runtime it will run on.
        let _inside = handle.enter();
        let inner = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| bad(e.to_string()))?;
        Ok(OtlpExporter {
            inner: Arc::new(inner),
            rt: handle.clone(),
            _stop: stop,
        })
    }
}

impl SpanExporter for OtlpExporter {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let inner = self.inner.clone();
        let sent = self.rt.spawn(async move { inner.export(batch).await });
        async move {
            sent.await.unwrap_or_else(|e| {
                Err(OTelSdkError::InternalFailure(
                    Cow::<str>::from(e.to_string()).into_owned(),
                ))
            })
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }
}

#[cfg(test)]
mod tests {
    use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};

    use super::Telemetry;

    #[test]
    fn without_an_endpoint_nothing_is_made() {
        let t = Telemetry::start(None).expect("off");
        assert!(
            t.request_span(&HeaderMap::new(), "/v1/chat/completions", "r")
                .is_none()
        );
    }

    #[test]
    fn a_clients_trace_is_continued() {
        // Nothing listens there: spans are made, and their export fails later, quietly.
        let t = Telemetry::start(Some("http://127.0.0.1:9")).expect("on");
        let mut h = HeaderMap::new();
        h.insert(
            HeaderName::from_static("traceparent"),
            HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        let span = t
            .request_span(&h, "/v1/chat/completions", "r")
            .expect("a span");
        let parts: Vec<&str> = span.traceparent.split('-').collect();
        assert_eq!(parts.len(), 4, "{}", span.traceparent);
        assert_eq!(parts[1], "0af7651916cd43dd8448eb211c80319c");
        assert_ne!(
            parts[2], "b7ad6b7169203331",
            "the gateway's own span is the parent"
        );
        assert_eq!(parts[3], "01");
        // Without one, a new trace.
        let root = t
            .request_span(&HeaderMap::new(), "/v1/completions", "s")
            .expect("a span");
        assert!(
            !root
                .traceparent
                .contains("0af7651916cd43dd8448eb211c80319c")
        );
        drop((span, root));
    }
}
