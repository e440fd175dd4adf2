//! Health checks of every worker (`health_*`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::section::{Section, at_least_one, duration, invalid};

/// How workers are checked: `GET endpoint` every `interval`, a worker going unhealthy
/// after `failure_threshold` failed checks in a row and back after `success_threshold`
/// passing ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    #[serde(rename = "health_check_interval_secs", with = "kvgate_core::secs")]
    pub interval: Duration,
    #[serde(rename = "health_check_timeout_secs", with = "kvgate_core::secs")]
    pub timeout: Duration,
    /// Consecutive failed checks before a worker is marked unhealthy.
    #[serde(rename = "health_failure_threshold")]
    pub failure_threshold: u32,
    /// Consecutive passing checks before an unhealthy worker is healthy again.
    #[serde(rename = "health_success_threshold")]
    pub success_threshold: u32,
    /// The route health checks ask (any 2xx passes).
    #[serde(rename = "health_check_endpoint")]
    pub endpoint: String,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(3),
            failure_threshold: 3,
            success_threshold: 2,
            endpoint: "/health".into(),
        }
    }
}

impl Section for HealthConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        duration("health_check_interval_secs", self.interval, false)?;
        duration("health_check_timeout_secs", self.timeout, false)?;
        at_least_one("health_failure_threshold", self.failure_threshold.into())?;
        at_least_one("health_success_threshold", self.success_threshold.into())?;
        if !self.endpoint.starts_with('/') || !self.endpoint.bytes().all(|b| b.is_ascii_graphic()) {
            return invalid(
                "health_check_endpoint",
                "must be a path starting with / (visible ASCII)",
            );
        }
        Ok(())
    }
}
