//! Snapshots of the prefix index and the event chains to the store (`snapshot_*`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::section::{Section, duration, invalid};

/// When changed state is written to the store under `data_dir`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SnapshotConfig {
    /// How often a changed prefix index is written to the store.
    #[serde(rename = "snapshot_interval_secs", with = "kvgate_core::secs")]
    pub interval: Duration,
    /// After a snapshot that took `t`, the timer's next one waits until `t × this` after
    /// it, so a large index that stays dirty is not rewritten back to back; 0 turns it off.
    #[serde(rename = "snapshot_backoff")]
    pub backoff: f64,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        SnapshotConfig {
            interval: Duration::from_secs(5),
            backoff: 4.0,
        }
    }
}

impl Section for SnapshotConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        duration("snapshot_interval_secs", self.interval, false)?;
        if !(0.0..=1000.0).contains(&self.backoff) {
            return invalid("snapshot_backoff", "must be a number from 0 to 1000");
        }
        Ok(())
    }
}
