//! Each worker's circuit breaker (`cb_*`, `disable_circuit_breaker`), its outlier
//! ejection on consecutive 5xx answers and the panic threshold over the fleet.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::section::{Section, at_least_one, duration};

/// The breaker's settings: `failure_threshold` failures within `window`, or
/// `consecutive_5xx` 5xx answers in a row, open a worker's circuit for `open_for`; then
/// `half_open_max` probes at once, `success_threshold` of them passing closing it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CircuitConfig {
    /// Failures within `cb_window_duration_secs` that open a worker's circuit.
    #[serde(rename = "cb_failure_threshold")]
    pub failure_threshold: u32,
    /// 5xx answers in a row that open a worker's circuit (Envoy's outlier ejection):
    /// relayed 500s and the failures `cb_failure_threshold` counts alike; a success resets
    /// the count.
    #[serde(rename = "cb_consecutive_5xx")]
    pub consecutive_5xx: u32,
    /// Successful probes that close a half-open circuit.
    #[serde(rename = "cb_success_threshold")]
    pub success_threshold: u32,
    /// How long an open circuit admits nothing before it is half-open.
    #[serde(rename = "cb_timeout_duration_secs", with = "kvgate_core::secs")]
    pub open_for: Duration,
    #[serde(rename = "cb_window_duration_secs", with = "kvgate_core::secs")]
    pub window: Duration,
    /// Probe requests a half-open circuit admits at once.
    #[serde(rename = "cb_half_open_max_requests")]
    pub half_open_max: u32,
    #[serde(rename = "disable_circuit_breaker")]
    pub disabled: bool,
}

impl Default for CircuitConfig {
    fn default() -> Self {
        CircuitConfig {
            failure_threshold: 5,
            consecutive_5xx: 5,
            success_threshold: 2,
            open_for: Duration::from_secs(30),
            window: Duration::from_secs(60),
            half_open_max: 1,
            disabled: false,
        }
    }
}

impl Section for CircuitConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        at_least_one("cb_failure_threshold", self.failure_threshold.into())?;
        at_least_one("cb_consecutive_5xx", self.consecutive_5xx.into())?;
        at_least_one("cb_success_threshold", self.success_threshold.into())?;
        at_least_one("cb_half_open_max_requests", self.half_open_max.into())?;
        duration("cb_timeout_duration_secs", self.open_for, false)?;
        duration("cb_window_duration_secs", self.window, false)
    }
}
