//! A request the pipeline refused, as every front door answers it: the HTTP status and the
//! OpenAI-style JSON error body (`{"error": {message, type, code, request_id}}`). The HTTP
//! door's `ApiError` builds its body here too, so both doors answer alike.

use serde_json::json;

use super::{AdmitError, DispatchError};
use crate::actors::selector::SelectError;

/// The JSON error body every front door sends.
pub(crate) fn error_body(message: &str, kind: &str, code: &str) -> serde_json::Value {
    json!({"error": {"message": message, "type": kind, "code": code}})
}

impl AdmitError {
    /// The OpenAI-style `type` and the stable `code`.
    pub(crate) fn kind(&self) -> (&'static str, &'static str) {
        match self {
            AdmitError::QueueFull { .. } => ("rate_limit_error", "queue_full"),
            AdmitError::QueueTimeout { .. } => ("service_unavailable", "queue_timeout"),
            AdmitError::RateLimited { .. } => ("rate_limit_error", "rate_limited"),
        }
    }

    /// 429 for a full queue or a spent rate, 503 for a wait that ran out.
    pub(crate) fn status(&self) -> u16 {
        match self {
            AdmitError::QueueFull { .. } | AdmitError::RateLimited { .. } => 429,
            AdmitError::QueueTimeout { .. } => 503,
        }
    }

    pub(crate) fn retry_after(&self) -> u64 {
        match *self {
            AdmitError::QueueFull { retry_after }
            | AdmitError::QueueTimeout { retry_after }
            | AdmitError::RateLimited { retry_after } => retry_after,
        }
    }
}

/// A refusal, whichever step made it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refusal {
    pub status: u16,
    pub kind: &'static str,
    pub code: &'static str,
    pub message: String,
    /// Seconds, for `Retry-After`.
    pub retry_after: Option<u64>,
}

impl Refusal {
    pub(crate) fn admission(e: &AdmitError) -> Refusal {
        let (kind, code) = e.kind();
        Refusal {
            status: e.status(),
            kind,
            code,
            message: e.to_string(),
            retry_after: Some(e.retry_after()),
        }
    }

    /// No worker: 503 (none ready, none registered), 429 (all at their cap), 404 (no
    /// worker serves the model), the same codes the HTTP door answers with.
    pub(crate) fn dispatch(e: &DispatchError) -> Refusal {
        let (status, kind, code, message) = match e {
            DispatchError::Select(SelectError::UnknownModel(m)) => (
                404,
                "invalid_request_error",
                "model_not_found",
                format!("the model '{m}' is not served by any worker"),
            ),
            DispatchError::Select(SelectError::NoWorkers) => (
                503,
                "service_unavailable",
                "no_available_workers",
                "no healthy worker is available (no worker is registered)".into(),
            ),
            DispatchError::Select(SelectError::NoHealthy) => (
                503,
                "service_unavailable",
                "no_available_workers",
                "no healthy worker is available".into(),
            ),
            DispatchError::Select(SelectError::Saturated) => (
                429,
                "rate_limit_error",
                "workers_saturated",
                "every worker is at its waiting-request cap; retry shortly".into(),
            ),
            DispatchError::Select(SelectError::Restarted) => (
                503,
                "service_unavailable",
                "routing_restarted",
                "routing failed on this request and restarted; retry it".into(),
            ),
            DispatchError::Gone(e) => (
                500,
                "internal_error",
                "internal_error",
                format!("internal error: a gateway actor is unavailable: {e}"),
            ),
        };
        let retry_after = matches!(status, 429 | 503).then_some(1);
        Refusal {
            status,
            kind,
            code,
            message,
            retry_after,
        }
    }

    /// The JSON body, with the request's id when it has one.
    pub(crate) fn body(&self, request_id: &str) -> serde_json::Value {
        let mut b = error_body(&self.message, self.kind, self.code);
        if !request_id.is_empty()
            && let Some(e) = b.get_mut("error").and_then(|e| e.as_object_mut())
        {
            e.insert("request_id".into(), json!(request_id));
        }
        b
    }
}
