//! The one place where gateway errors become HTTP responses. A client learns what went
//! wrong and the request id, never where workers are: the worker's URL and the OS error of
//! an upstream failure stay in the log (`Display`) and in `GET /workers`.

use actix::MailboxError;
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;
use thiserror::Error;

use crate::actors::registry::RegistryError;
use crate::actors::selector::SelectError;
use crate::facts::FactsError;
use crate::pipeline::{AdmitError, DispatchError, error_body};
use crate::upstream::UpstreamError;

/// Every error the gateway itself answers with. Upstream error bodies never pass through
/// here: they are relayed unchanged.
#[derive(Debug, Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("request body of {size} bytes exceeds the limit of {limit} bytes")]
    PayloadTooLarge { size: u64, limit: usize },
    #[error("the model '{0}' is not served by any worker")]
    ModelNotFound(String),
    #[error("no route for {0}")]
    RouteNotFound(String),
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("worker not found: {0}")]
    WorkerNotFound(String),
    #[error("worker already registered: {0}")]
    WorkerExists(String),
    #[error("no healthy worker is available{}", if *.registered { "" } else { " (no worker is registered)" })]
    NoWorker { registered: bool },
    #[error("every worker is at its waiting-request cap; retry shortly")]
    Saturated,
    #[error("the request body did not arrive within {0:.0} s")]
    BodyTimeout(f64),
    #[error("routing failed on this request and restarted; retry it")]
    RoutingRestarted,
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("{0}")]
    Forbidden(&'static str),
    /// A state-changing admin request a browser sent for a page of another site.
    #[error("{0}")]
    CrossSite(&'static str),
    #[error("the body must be sent with Content-Type: application/json, not {0}")]
    UnsupportedMediaType(String),
    #[error("worker {url} may not be added: {why}")]
    WorkerNotAllowed { url: String, why: String },
    #[error(transparent)]
    Admission(#[from] AdmitError),
    #[error("upstream worker {worker} failed: {source}")]
    Upstream {
        worker: String,
        #[source]
        source: UpstreamError,
    },
    #[error("upstream worker {worker} did not answer within {secs:.1}s")]
    UpstreamTimeout { worker: String, secs: f64 },
    #[error("internal error: a gateway actor is unavailable: {0}")]
    ActorGone(#[from] MailboxError),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// The OpenAI-style `type` and a stable snake_case `code`.
    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            ApiError::BadRequest(_) => ("invalid_request_error", "invalid_request"),
            ApiError::InvalidJson(_) => ("invalid_request_error", "json_parse_error"),
            ApiError::PayloadTooLarge { .. } => ("invalid_request_error", "payload_too_large"),
            ApiError::ModelNotFound(_) => ("invalid_request_error", "model_not_found"),
            ApiError::RouteNotFound(_) => ("invalid_request_error", "route_not_found"),
            ApiError::MethodNotAllowed { .. } => ("invalid_request_error", "method_not_allowed"),
            ApiError::WorkerNotFound(_) => ("invalid_request_error", "worker_not_found"),
            ApiError::WorkerExists(_) => ("invalid_request_error", "worker_already_exists"),
            ApiError::NoWorker { .. } => ("service_unavailable", "no_available_workers"),
            ApiError::Saturated => ("rate_limit_error", "workers_saturated"),
            ApiError::RoutingRestarted => ("service_unavailable", "routing_restarted"),
            ApiError::BodyTimeout(_) => ("invalid_request_error", "request_timeout"),
            ApiError::Unauthorized(_) => ("authentication_error", "invalid_api_key"),
            ApiError::Forbidden(_) => ("permission_error", "forbidden"),
            ApiError::CrossSite(_) => ("permission_error", "cross_site_request"),
            ApiError::UnsupportedMediaType(_) => {
                ("invalid_request_error", "unsupported_media_type")
            }
            ApiError::WorkerNotAllowed { .. } => ("permission_error", "worker_not_allowed"),
            ApiError::Admission(e) => e.kind(),
            ApiError::Upstream { .. } => ("upstream_error", "upstream_failed"),
            ApiError::UpstreamTimeout { .. } => ("upstream_error", "upstream_timeout"),
            ApiError::ActorGone(_) | ApiError::Internal(_) => ("internal_error", "internal_error"),
        }
    }

    /// The message a client is given: `Display` but for upstream failures, which name
    /// the kind of failure without the worker's address or the OS error.
    fn client_message(&self) -> String {
        match self {
            ApiError::Upstream { source, .. } => {
                format!("the upstream worker failed: {}", upstream_summary(source))
            }
            ApiError::UpstreamTimeout { secs, .. } => {
                format!("the upstream worker did not answer within {secs:.1}s")
            }
            e => e.to_string(),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        let (kind, code) = self.kind();
        error_body(&self.client_message(), kind, code)
    }

    /// The JSON body with the request's id, which the log's lines for it carry too; also
    /// the SSE error event that ends a broken stream.
    pub fn body_for(&self, request_id: &str) -> serde_json::Value {
        let mut b = self.body();
        with_request_id(&mut b, request_id);
        b
    }
}

/// Adds `request_id` to an error body.
pub(crate) fn with_request_id(body: &mut serde_json::Value, request_id: &str) {
    if let Some(e) = body.get_mut("error").and_then(|e| e.as_object_mut()) {
        e.insert("request_id".into(), json!(request_id));
    }
}

/// An upstream failure as a client may see it: what happened, not where.
fn upstream_summary(e: &UpstreamError) -> String {
    match e {
        UpstreamError::Connect(_) | UpstreamError::ConnectTimeout(_) | UpstreamError::Guard(_) => {
            "could not connect to it".into()
        }
        UpstreamError::Write(_)
        | UpstreamError::Read(_)
        | UpstreamError::ClosedBeforeHead
        | UpstreamError::Truncated { .. }
        | UpstreamError::ChunkedTruncated
        | UpstreamError::StreamUnfinished => "the connection broke off".into(),
        UpstreamError::Malformed(_) => "its answer was malformed".into(),
        UpstreamError::BodyTooLarge(n) => format!("its answer exceeds {n} bytes"),
        UpstreamError::Status(s) => format!("it answered {s}"),
        UpstreamError::NoFirstToken(s) => format!("no first byte within {s:.1}s"),
        UpstreamError::TakenOut => "it was taken out before it answered".into(),
    }
}

/// An error body as answered, kept on the response so the request-id middleware can add
/// the id (`http/app.rs`): the body is built where the request is not known.
#[derive(Debug)]
pub(crate) struct ErrorBody(pub serde_json::Value);

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::InvalidJson(_) => StatusCode::BAD_REQUEST,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::ModelNotFound(_)
            | ApiError::RouteNotFound(_)
            | ApiError::WorkerNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::WorkerExists(_) => StatusCode::CONFLICT,
            ApiError::NoWorker { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Saturated
            | ApiError::Admission(AdmitError::QueueFull { .. } | AdmitError::RateLimited { .. }) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Forbidden(_) | ApiError::CrossSite(_) | ApiError::WorkerNotAllowed { .. } => {
                StatusCode::FORBIDDEN
            }
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Admission(AdmitError::QueueTimeout { .. }) | ApiError::RoutingRestarted => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Upstream { .. } => StatusCode::BAD_GATEWAY,
            ApiError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ApiError::ActorGone(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut b = HttpResponse::build(self.status_code());
        b.insert_header(("x-kvgate-error-code", self.kind().1));
        match self {
            ApiError::Saturated | ApiError::RoutingRestarted => {
                b.insert_header(("retry-after", "1"));
            }
            ApiError::Admission(
                AdmitError::QueueFull { retry_after }
                | AdmitError::QueueTimeout { retry_after }
                | AdmitError::RateLimited { retry_after },
            ) => {
                b.insert_header(("retry-after", retry_after.to_string()));
            }
            ApiError::Unauthorized(_) => {
                b.insert_header(("www-authenticate", "Bearer"));
            }
            _ => {}
        }
        let body = self.body();
        let mut resp = b.json(&body);
        resp.extensions_mut().insert(ErrorBody(body));
        resp
    }
}

impl From<SelectError> for ApiError {
    fn from(e: SelectError) -> Self {
        match e {
            SelectError::UnknownModel(m) => ApiError::ModelNotFound(m),
            SelectError::NoWorkers => ApiError::NoWorker { registered: false },
            SelectError::NoHealthy => ApiError::NoWorker { registered: true },
            SelectError::Saturated => ApiError::Saturated,
            SelectError::Restarted => ApiError::RoutingRestarted,
        }
    }
}

impl From<DispatchError> for ApiError {
    fn from(e: DispatchError) -> Self {
        match e {
            DispatchError::Select(e) => e.into(),
            DispatchError::Gone(e) => ApiError::ActorGone(e),
        }
    }
}

impl From<FactsError> for ApiError {
    fn from(e: FactsError) -> Self {
        match e {
            FactsError::BadRequest(m) => ApiError::BadRequest(m),
            FactsError::InvalidJson(m) => ApiError::InvalidJson(m),
        }
    }
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        match e {
            RegistryError::InvalidUrl(_) => ApiError::BadRequest(e.to_string()),
            RegistryError::Exists(u) => ApiError::WorkerExists(u),
            RegistryError::NotFound(u) => ApiError::WorkerNotFound(u),
            RegistryError::EventsConfig(_) => ApiError::BadRequest(e.to_string()),
        }
    }
}
