//! The poller's typed configuration, validated once at startup.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// How often and how patiently workers are polled for load.
///
/// Durations use `*_secs` keys (fractions allowed), like the gateway's own config.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PollerConfig {
    /// Time between two ticks.
    #[serde(rename = "interval_secs", with = "kvgate_core::secs")]
    pub interval: Duration,
    /// Upper bound on one worker's poll (fallback included); past it the report is unknown.
    #[serde(rename = "timeout_secs", with = "kvgate_core::secs")]
    pub timeout: Duration,
    /// Sent as `Authorization: Bearer <key>` when set.
    pub api_key: Option<String>,
}

impl Default for PollerConfig {
    fn default() -> Self {
        PollerConfig {
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            api_key: None,
        }
    }
}

// Hand-written so the API key never reaches a log line.
impl fmt::Debug for PollerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollerConfig")
            .field("interval", &self.interval)
            .field("timeout", &self.timeout)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl PollerConfig {
    /// Checks every knob once; the error names the offending key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.interval.is_zero() {
            return Err(ConfigError::Invalid {
                key: "interval_secs",
                reason: "must be greater than 0",
            });
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::Invalid {
                key: "timeout_secs",
                reason: "must be greater than 0",
            });
        }
        if self.api_key.as_deref().is_some_and(str::is_empty) {
            return Err(ConfigError::Invalid {
                key: "api_key",
                reason: "must not be empty (leave it out to send no key)",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let c = PollerConfig::default();
        assert_eq!(c.interval, Duration::from_secs(2));
        assert_eq!(c.timeout, Duration::from_secs(1));
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn reads_secs_keys_and_rejects_unknown() {
        let c: PollerConfig =
            serde_json::from_str(r#"{"interval_secs": 0.5, "api_key": "k"}"#).unwrap();
        assert_eq!(c.interval, Duration::from_millis(500));
        assert_eq!(c.timeout, Duration::from_secs(1));
        assert_eq!(c.api_key.as_deref(), Some("k"));
        assert!(serde_json::from_str::<PollerConfig>(r#"{"interval": 1}"#).is_err());
        assert!(serde_json::from_str::<PollerConfig>(r#"{"timeout_secs": -1}"#).is_err());
    }

    #[test]
    fn validate_names_the_key() {
        let check = |c: PollerConfig, key: &str| match c.validate() {
            Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key),
            Ok(()) => panic!("{key} accepted"),
        };
        check(
            PollerConfig {
                interval: Duration::ZERO,
                ..PollerConfig::default()
            },
            "interval_secs",
        );
        check(
            PollerConfig {
                timeout: Duration::ZERO,
                ..PollerConfig::default()
            },
            "timeout_secs",
        );
        check(
            PollerConfig {
                api_key: Some(String::new()),
                ..PollerConfig::default()
            },
            "api_key",
        );
    }

    #[test]
    fn debug_hides_the_key() {
        let c = PollerConfig {
            api_key: Some("secret".into()),
            ..PollerConfig::default()
        };
        assert!(!format!("{c:?}").contains("secret"));
    }
}
