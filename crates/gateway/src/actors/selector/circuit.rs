//! One worker's circuit breaker, fed by the outcome of every request sent to it.
//!
//! Closed: traffic flows; a failure is remembered for `window`. `failure_threshold`
//! failures within the window open it, and so do `consecutive_5xx` 5xx answers in a row
//! (Envoy's outlier ejection: an engine that answers 500 to everything is taken out). Open: no traffic for `open_for`. Half-open: at most
//! `half_open_max` probe requests at once, the rest of the traffic goes elsewhere;
//! `success_threshold` successful probes close it, a failed one opens it again. Time is the
//! selector's clock, passed in.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;

pub(crate) use crate::config::CircuitConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    Closed,
    Open,
    HalfOpen,
}

/// How a request sent to a worker ended, as the breaker counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Outcome {
    /// Neither: the client went away, the request was cancelled, or the worker refused the
    /// request itself (a 4xx).
    #[default]
    Neutral,
    Success,
    /// The worker failed the request: no connection, no answer, a reset, a timeout, or a
    /// 429, 502, 503 or 504.
    Failure,
    /// The worker answered another 5xx (a 500), relayed to the client: it counts only
    /// toward the run of consecutive 5xx.
    ServerError,
}

#[derive(Debug, Clone)]
pub(super) struct Circuit {
    state: CircuitState,
    /// Times of the failures still inside the window (closed).
    failures: VecDeque<Duration>,
    /// 5xx answers and failures since the last success (closed).
    streak: u32,
    /// When it last opened.
    opened_at: Duration,
    /// Probes in flight and successful probes (half-open).
    probing: u32,
    successes: u32,
    /// Counts the half-open periods, so a probe of an earlier one decides nothing now.
    period: u32,
}

impl Default for Circuit {
    fn default() -> Self {
        Circuit {
            state: CircuitState::Closed,
            failures: VecDeque::new(),
            streak: 0,
            opened_at: Duration::ZERO,
            probing: 0,
            successes: 0,
            period: 0,
        }
    }
}

impl Circuit {
    /// The state at `now` (an open circuit whose time is up is half-open).
    pub(super) fn state(&mut self, cfg: &CircuitConfig, now: Duration) -> CircuitState {
        if self.state == CircuitState::Open && now >= self.opened_at + cfg.open_for {
            self.state = CircuitState::HalfOpen;
            self.probing = 0;
            self.successes = 0;
            self.period = self.period.wrapping_add(1);
        }
        self.state
    }

    /// Whether a request may be sent now.
    pub(super) fn admits(&mut self, cfg: &CircuitConfig, now: Duration) -> bool {
        if cfg.disabled {
            return true;
        }
        match self.state(cfg, now) {
            CircuitState::Closed => true,
            CircuitState::Open => false,
            CircuitState::HalfOpen => self.probing < cfg.half_open_max,
        }
    }

    /// A request was sent; returns the half-open period it probes, if it is a probe.
    pub(super) fn sent(&mut self, cfg: &CircuitConfig, now: Duration) -> Option<u32> {
        let probe = !cfg.disabled && self.state(cfg, now) == CircuitState::HalfOpen;
        probe.then(|| {
            self.probing += 1;
            self.period
        })
    }

    /// Failures in the window (closed), for inspection.
    pub(super) fn recent_failures(&self) -> usize {
        self.failures.len()
    }

    /// Applies a request's outcome; returns whether the circuit opened.
    pub(super) fn ended(
        &mut self,
        cfg: &CircuitConfig,
        now: Duration,
        outcome: Outcome,
        probe: Option<u32>,
    ) -> bool {
        if cfg.disabled {
            return false;
        }
        let state = self.state(cfg, now);
        // Only a probe of this half-open period counts as one.
        let probe = probe == Some(self.period) && state == CircuitState::HalfOpen;
        if probe {
            self.probing = self.probing.saturating_sub(1);
        }
        match (state, outcome) {
            (_, Outcome::Neutral) => false,
            (CircuitState::Closed, Outcome::Success) => {
                self.streak = 0;
                false
            }
            (CircuitState::Closed, Outcome::ServerError) => {
                self.streak += 1;
                if self.streak >= cfg.consecutive_5xx {
                    self.open(now);
                    return true;
                }
                false
            }
            (CircuitState::Closed, Outcome::Failure) => {
                self.streak += 1;
                self.failures.push_back(now);
                while self
                    .failures
                    .front()
                    .is_some_and(|t| now.saturating_sub(*t) > cfg.window)
                {
                    self.failures.pop_front();
                }
                if self.failures.len() >= cfg.failure_threshold as usize
                    || self.streak >= cfg.consecutive_5xx
                {
                    self.open(now);
                    return true;
                }
                false
            }
            // Only probes decide a half-open circuit; a request sent before it opened
            // says nothing about the worker now.
            (CircuitState::HalfOpen, _) if !probe => false,
            (CircuitState::HalfOpen, Outcome::Success) => {
                self.successes += 1;
                if self.successes >= cfg.success_threshold {
                    let period = self.period;
                    *self = Circuit::default();
                    self.period = period;
                }
                false
            }
            (CircuitState::HalfOpen, Outcome::Failure | Outcome::ServerError) => {
                self.open(now);
                true
            }
            (CircuitState::Open, _) => false,
        }
    }

    fn open(&mut self, now: Duration) {
        self.state = CircuitState::Open;
        self.opened_at = now;
        self.failures.clear();
        self.streak = 0;
        self.probing = 0;
        self.successes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn opens_after_n_failures_in_the_window_and_probes_one_at_a_time() {
        let cfg = CircuitConfig {
            failure_threshold: 3,
            success_threshold: 2,
            open_for: s(10),
            window: s(5),
            ..CircuitConfig::default()
        };
        let mut c = Circuit::default();
        // Two failures, then one outside the window of the first: still closed.
        assert!(!c.ended(&cfg, s(0), Outcome::Failure, None));
        assert!(!c.ended(&cfg, s(1), Outcome::Failure, None));
        assert!(!c.ended(&cfg, s(7), Outcome::Failure, None));
        assert!(!c.ended(&cfg, s(8), Outcome::Failure, None));
        assert!(c.admits(&cfg, s(8)));
        assert!(
            c.ended(&cfg, s(9), Outcome::Failure, None),
            "three within 5 s"
        );
        assert!(!c.admits(&cfg, s(18)), "open for 10 s");
        // Half-open: one probe at a time; the others go elsewhere.
        assert!(c.admits(&cfg, s(19)));
        let probe = c.sent(&cfg, s(19));
        assert!(probe.is_some());
        assert!(!c.admits(&cfg, s(19)));
        // A request sent before the circuit opened ends: it decides nothing.
        assert!(!c.ended(&cfg, s(19), Outcome::Success, None));
        assert_eq!(c.state(&cfg, s(19)), CircuitState::HalfOpen);
        assert!(!c.ended(&cfg, s(20), Outcome::Success, probe));
        assert!(c.admits(&cfg, s(20)));
        let probe = c.sent(&cfg, s(20));
        assert!(!c.ended(&cfg, s(20), Outcome::Success, probe));
        assert_eq!(
            c.state(&cfg, s(20)),
            CircuitState::Closed,
            "two successes close it"
        );
        // A failed probe opens it again at once.
        for t in 21..24 {
            c.ended(&cfg, s(t), Outcome::Failure, None);
        }
        assert!(c.admits(&cfg, s(33)));
        let probe = c.sent(&cfg, s(33));
        assert!(c.ended(&cfg, s(33), Outcome::Failure, probe));
        // A probe of that earlier period, ending in the next one, decides nothing.
        let late = probe;
        assert!(c.admits(&cfg, s(44)));
        let now_probe = c.sent(&cfg, s(44));
        assert!(!c.ended(&cfg, s(44), Outcome::Failure, late));
        assert_eq!(c.state(&cfg, s(44)), CircuitState::HalfOpen);
        assert!(!c.admits(&cfg, s(44)), "its own probe is still out");
        assert!(c.ended(&cfg, s(44), Outcome::Failure, now_probe));
    }

    #[test]
    fn consecutive_5xx_eject_the_worker_until_a_probe_passes() {
        let cfg = CircuitConfig {
            consecutive_5xx: 3,
            failure_threshold: 100,
            success_threshold: 1,
            open_for: s(10),
            ..CircuitConfig::default()
        };
        let mut c = Circuit::default();
        // A success breaks the run; a 4xx (neutral) does not.
        assert!(!c.ended(&cfg, s(0), Outcome::ServerError, None));
        assert!(!c.ended(&cfg, s(0), Outcome::ServerError, None));
        assert!(!c.ended(&cfg, s(0), Outcome::Success, None));
        assert!(!c.ended(&cfg, s(1), Outcome::ServerError, None));
        assert!(!c.ended(&cfg, s(1), Outcome::Neutral, None));
        assert!(!c.ended(&cfg, s(1), Outcome::Failure, None));
        assert!(
            c.ended(&cfg, s(2), Outcome::ServerError, None),
            "three 5xx in a row, a 503 among them"
        );
        assert!(!c.admits(&cfg, s(5)));
        // Half-open: a probe answered 500 ejects it again; one that passes brings it back.
        assert!(c.admits(&cfg, s(12)));
        let probe = c.sent(&cfg, s(12));
        assert!(c.ended(&cfg, s(12), Outcome::ServerError, probe));
        assert!(c.admits(&cfg, s(23)));
        let probe = c.sent(&cfg, s(23));
        assert!(!c.ended(&cfg, s(23), Outcome::Success, probe));
        assert_eq!(c.state(&cfg, s(23)), CircuitState::Closed);
    }

    #[test]
    fn neutral_outcomes_and_a_disabled_breaker_count_nothing() {
        let cfg = CircuitConfig {
            failure_threshold: 1,
            ..CircuitConfig::default()
        };
        let mut c = Circuit::default();
        assert!(!c.ended(&cfg, s(0), Outcome::Neutral, None));
        assert!(c.admits(&cfg, s(0)));
        let off = CircuitConfig {
            disabled: true,
            ..cfg
        };
        assert!(!c.ended(&off, s(0), Outcome::Failure, None));
        assert!(c.admits(&off, s(0)));
    }
}
