//! The crate's errors: a worker body that cannot be read as load, or an unusable config.

use thiserror::Error;

/// A worker's load body that does not parse. Always the worker's fault: retrying the
/// same body cannot help, the next poll may.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// The body is not a `/v1/loads` JSON document.
    #[error("worker /v1/loads: not a load body: {0}")]
    Json(String),
    /// A `/v1/loads` body whose `loads` list is empty.
    #[error("worker /v1/loads: no ranks")]
    NoRanks,
    /// A `/metrics` line that is not Prometheus text format.
    #[error("worker /metrics: line {line}: {reason}")]
    Prometheus { line: usize, reason: &'static str },
    /// A `/metrics` body with neither SGLang nor vLLM load gauges.
    #[error("worker /metrics: no SGLang or vLLM load metrics")]
    NoLoadMetrics,
    /// A rank label (`dp_rank`, `engine`) that is not a small integer.
    #[error("worker /metrics: label {label}=\"{value}\" is not a rank number")]
    BadRank { label: &'static str, value: String },
}

/// A poller configuration that cannot be used; the message names the key.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    #[error("poller: invalid value for '{key}': {reason}")]
    Invalid {
        key: &'static str,
        reason: &'static str,
    },
}
