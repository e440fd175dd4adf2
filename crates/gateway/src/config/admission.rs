//! Admission limits (`max_concurrent_requests`, `queue_*`, `rate_limit_tokens_per_second`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::section::{Section, duration, invalid};

/// How many inference requests run at once, how many wait and for how long, and how
/// fast each client may send them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Inference requests served at once; `None`: no limit.
    pub max_concurrent_requests: Option<usize>,
    /// Requests waiting for a slot beyond `max_concurrent_requests`; more are refused (429).
    pub queue_size: usize,
    /// Longest wait for a slot (503 after it).
    #[serde(rename = "queue_timeout_secs", with = "kvgate_core::secs")]
    pub queue_timeout: Duration,
    /// Inference requests per second per client (per API key when keys are set, else per
    /// client address), as a token bucket holding one second's worth; `None`: no limit.
    pub rate_limit_tokens_per_second: Option<f64>,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            max_concurrent_requests: None,
            queue_size: 100,
            queue_timeout: Duration::from_secs(60),
            rate_limit_tokens_per_second: None,
        }
    }
}

impl Section for AdmissionConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.max_concurrent_requests == Some(0) {
            return invalid(
                "max_concurrent_requests",
                "must be at least 1 (leave it out for no limit)",
            );
        }
        duration("queue_timeout_secs", self.queue_timeout, false)?;
        if self
            .rate_limit_tokens_per_second
            .is_some_and(|r| !(r.is_finite() && r > 0.0))
        {
            return invalid(
                "rate_limit_tokens_per_second",
                "must be a positive number (leave it out for no limit)",
            );
        }
        Ok(())
    }
}
