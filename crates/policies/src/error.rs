use thiserror::Error;

/// A policy configuration that cannot be used.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ConfigError {
    #[error(
        "unknown policy '{0}' (expected one of random, round_robin, power_of_two, least_load, cache_aware, prefix_hash, consistent_hashing)"
    )]
    UnknownPolicy(String),
    #[error("invalid value for '{key}': {reason}")]
    Invalid { key: &'static str, reason: String },
}
