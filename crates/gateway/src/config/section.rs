//! How a section of the configuration is read: each section owns its keys (the names its
//! fields serialize under), takes them out of the merged file, environment and flags, and
//! checks its own values. The keys stay flat (`cb_failure_threshold`, not
//! `circuit.failure_threshold`): they are the reference gateway's flag names and the
//! documented variables.

use std::collections::HashMap;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::ConfigError;

/// A part of [`GatewayConfig`](crate::GatewayConfig) that reads and checks its own keys.
pub trait Section: Serialize + DeserializeOwned + Default {
    /// Checks every value; the error names the key.
    fn validate(&self) -> Result<(), ConfigError>;
}

/// The keys a section reads: its fields as its default serializes them.
pub(crate) fn keys_of<S: Serialize + Default>() -> Vec<String> {
    match serde_json::to_value(S::default()) {
        Ok(serde_json::Value::Object(m)) => m.into_iter().map(|(k, _)| k).collect(),
        _ => Vec::new(),
    }
}

/// Takes `S`'s keys out of `table` and reads them into `S`, checked. A wrong type is
/// reported with its key, as the `config` crate reports it.
pub(crate) fn take<S: Section>(
    table: &mut HashMap<String, config::Value>,
) -> Result<S, ConfigError> {
    let mut own = config::Map::new();
    for k in keys_of::<S>() {
        if let Some(v) = table.remove(&k) {
            own.insert(k, v);
        }
    }
    let s: S = config::Value::new(None, config::ValueKind::Table(own)).try_deserialize()?;
    s.validate()?;
    Ok(s)
}

/// `Err(Invalid)` naming `key`.
pub(crate) fn invalid<T>(key: &'static str, reason: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid {
        key,
        reason: reason.into(),
    })
}

/// Longest duration any setting takes: deadlines are `now + d`, so an absurd value is
/// refused here rather than overflowing later.
pub(crate) const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// Checks a duration setting: positive unless `zero_ok`, at most [`MAX_DURATION`].
pub(crate) fn duration(
    key: &'static str,
    d: std::time::Duration,
    zero_ok: bool,
) -> Result<(), ConfigError> {
    if d.is_zero() && !zero_ok {
        return invalid(key, "must be greater than 0");
    }
    if d > MAX_DURATION {
        return invalid(key, "must be at most 30 days (2592000 s)");
    }
    Ok(())
}

/// Checks a count that must be at least 1.
pub(crate) fn at_least_one(key: &'static str, n: u64) -> Result<(), ConfigError> {
    if n == 0 {
        return invalid(key, "must be at least 1");
    }
    Ok(())
}
