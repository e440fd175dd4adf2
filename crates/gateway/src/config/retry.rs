//! How failed attempts are tried again (`retry_*`, `disable_retries`), and how many may be
//! across all requests (`retry_budget_*`).

use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::section::{Section, at_least_one, duration, invalid};

/// How failed attempts are tried again: another worker, after a jittered exponential
/// backoff.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts in all for one request, the first included (1: never retried). A retry is
    /// decided again with the failed workers left out.
    #[serde(rename = "retry_max_retries")]
    pub max_retries: u32,
    /// Turns retries off (as `retry_max_retries = 1`).
    #[serde(rename = "disable_retries")]
    pub disabled: bool,
    /// Backoff before the second attempt; each later one is `backoff_multiplier` times the
    /// one before, up to the maximum.
    #[serde(rename = "retry_initial_backoff_secs", with = "kvgate_core::secs")]
    pub initial_backoff: Duration,
    #[serde(rename = "retry_max_backoff_secs", with = "kvgate_core::secs")]
    pub max_backoff: Duration,
    #[serde(rename = "retry_backoff_multiplier")]
    pub backoff_multiplier: f64,
    /// Each backoff is drawn within ± this fraction of its nominal value.
    #[serde(rename = "retry_jitter_factor")]
    pub jitter: f64,
    /// Retries across all requests stay within this percentage of the requests of the
    /// last 10 s...
    #[serde(rename = "retry_budget_percent")]
    pub budget_percent: f64,
    /// ...plus this many per second of those 10 s (the floor for quiet traffic).
    #[serde(rename = "retry_budget_min_per_sec")]
    pub budget_min_per_sec: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_retries: 3,
            disabled: false,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            backoff_multiplier: 2.0,
            jitter: 0.2,
            budget_percent: 20.0,
            budget_min_per_sec: 3,
        }
    }
}

impl Section for RetryConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        at_least_one("retry_max_retries", self.max_retries.into())?;
        duration("retry_initial_backoff_secs", self.initial_backoff, true)?;
        duration("retry_max_backoff_secs", self.max_backoff, true)?;
        if !(self.backoff_multiplier.is_finite() && self.backoff_multiplier >= 1.0) {
            return invalid("retry_backoff_multiplier", "must be a number of at least 1");
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return invalid("retry_jitter_factor", "must be a number from 0 to 1");
        }
        if !(0.0..=100.0).contains(&self.budget_percent) {
            return invalid("retry_budget_percent", "must be a number from 0 to 100");
        }
        Ok(())
    }
}

impl RetryConfig {
    /// Attempts in all, the first included.
    pub fn attempts(&self) -> u32 {
        if self.disabled { 1 } else { self.max_retries }
    }

    /// The wait before attempt `n` (2 for the first retry): the initial backoff, times the
    /// multiplier for each later attempt, capped, jittered.
    pub fn backoff(&self, n: u32, rng: &mut impl Rng) -> Duration {
        let steps = n.saturating_sub(2).min(64);
        let factor = self.backoff_multiplier.max(1.0).powi(steps as i32);
        let cap = self.max_backoff.as_secs_f64();
        let nominal =
            Duration::from_secs_f64((self.initial_backoff.as_secs_f64() * factor).min(cap));
        let spread = 1.0 + self.jitter * rng.gen_range(-1.0..=1.0);
        nominal.mul_f64(spread.max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap_within_its_jitter() {
        let p = RetryConfig {
            max_retries: 5,
            disabled: false,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(300),
            jitter: 0.2,
            ..RetryConfig::default()
        };
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        for (n, nominal) in [(2, 100.0), (3, 200.0), (4, 300.0), (9, 300.0)] {
            for _ in 0..50 {
                let ms = p.backoff(n, &mut rng).as_secs_f64() * 1000.0;
                assert!(
                    (nominal * 0.8 - 1e-6..=nominal * 1.2 + 1e-6).contains(&ms),
                    "attempt {n}: {ms} ms"
                );
            }
        }
        let tripled = RetryConfig {
            backoff_multiplier: 3.0,
            max_backoff: Duration::from_secs(10),
            jitter: 0.0,
            ..p
        };
        for (n, ms) in [(2, 100), (3, 300), (4, 900)] {
            assert_eq!(tripled.backoff(n, &mut rng), Duration::from_millis(ms));
        }
        assert_eq!(p.attempts(), 5);
        assert_eq!(
            RetryConfig {
                disabled: true,
                ..p
            }
            .attempts(),
            1
        );
    }
}
