//! The retry budget, as Finagle's: across all requests, a retry is allowed while the
//! retries of the last [`WINDOW`] seconds stay within `--retry-budget-percent` of its
//! requests plus a floor of `--retry-budget-min-per-sec` for each of its seconds (so
//! quiet traffic, and a gateway that just started, can still retry). A fleet that sheds
//! load then gets at most that share more of it, whatever each request's own attempts
//! allow.
//!
//! Counts are kept per second in a ring; time comes in as an argument, so tests pin it.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::config::RetryConfig;

/// Seconds of history the percentage reads.
pub(crate) const WINDOW: usize = 10;

/// One second's requests and retries.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// Which second since the epoch it counts; a slot of an older second is stale.
    second: u64,
    requests: u64,
    retries: u64,
}

/// The counts of the last [`WINDOW`] seconds.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    percent: f64,
    min_per_sec: u64,
    slots: [Slot; WINDOW],
}

impl Budget {
    pub(crate) fn new(cfg: &RetryConfig) -> Budget {
        Budget {
            percent: cfg.budget_percent,
            min_per_sec: cfg.budget_min_per_sec,
            slots: [Slot::default(); WINDOW],
        }
    }

    /// The slot of second `now`, emptied if it held an older second.
    fn slot(&mut self, second: u64) -> &mut Slot {
        let i = usize::try_from(second % WINDOW as u64).unwrap_or(0);
        let s = &mut self.slots[i];
        if s.second != second {
            *s = Slot {
                second,
                ..Slot::default()
            };
        }
        s
    }

    /// A client request arrived (its first attempt).
    pub(crate) fn request(&mut self, now: Duration) {
        self.slot(now.as_secs()).requests += 1;
    }

    /// Whether one more retry fits; if so it is counted.
    pub(crate) fn retry(&mut self, now: Duration) -> bool {
        let second = now.as_secs();
        let live = |s: &&Slot| second.saturating_sub(s.second) < WINDOW as u64;
        let (requests, retries) = self
            .slots
            .iter()
            .filter(live)
            .fold((0, 0), |(q, r), s| (q + s.requests, r + s.retries));
        let floor = self.min_per_sec.saturating_mul(WINDOW as u64);
        // Counts of ten seconds are far below 2^52: exact as floats.
        let allowed = requests as f64 * self.percent / 100.0 + floor as f64;
        let fits = (retries + 1) as f64 <= allowed;
        if fits {
            self.slot(second).retries += 1;
        }
        fits
    }
}

/// The budget shared by every front door and HTTP thread of a gateway.
#[derive(Debug)]
pub(crate) struct SharedBudget {
    epoch: Instant,
    inner: Mutex<Budget>,
}

impl SharedBudget {
    pub(crate) fn new(cfg: &RetryConfig) -> SharedBudget {
        SharedBudget {
            epoch: Instant::now(),
            inner: Mutex::new(Budget::new(cfg)),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Budget, Duration) -> R) -> R {
        let now = self.epoch.elapsed();
        // A poisoned lock still holds counts that are good enough for a budget.
        let mut b = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut b, now)
    }

    pub(crate) fn request(&self) {
        self.with(|b, now| b.request(now));
    }

    pub(crate) fn retry(&self) -> bool {
        self.with(Budget::retry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(percent: f64, min_per_sec: u64) -> Budget {
        Budget::new(&RetryConfig {
            budget_percent: percent,
            budget_min_per_sec: min_per_sec,
            ..RetryConfig::default()
        })
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Retries allowed when each of `n` requests at `t(i)` asks for one.
    fn allowed(b: &mut Budget, n: u64, t: impl Fn(u64) -> Duration) -> u64 {
        (0..n)
            .filter(|&i| {
                b.request(t(i));
                b.retry(t(i))
            })
            .count() as u64
    }

    #[test]
    fn retries_are_a_share_of_requests_plus_a_floor_per_second() {
        // 400 requests within one second, each failing: 20 % of them plus the floor of
        // 3 per second over the window.
        let mut b = budget(20.0, 3);
        assert_eq!(allowed(&mut b, 400, |i| ms(i * 2)), 80 + 30);
        // No floor: the share alone; no share: the floor alone, 30 in any ten seconds.
        assert_eq!(allowed(&mut budget(20.0, 0), 100, ms), 20);
        assert_eq!(allowed(&mut budget(0.0, 3), 100, |i| ms(i * 30)), 30);
        // Twenty seconds of it: the floor again once the first retries leave the window.
        assert_eq!(allowed(&mut budget(0.0, 3), 100, |i| ms(i * 200)), 60);
        // Ten seconds later the old requests no longer pay for retries.
        let mut b = budget(50.0, 0);
        for i in 0..100 {
            b.request(ms(i));
        }
        assert!(b.retry(ms(9_000)));
        assert!(!b.retry(ms(10_500)), "the requests of second 0 are gone");
        // Retries already spent count against the share.
        let mut b = budget(10.0, 0);
        for i in 0..20 {
            b.request(ms(i));
        }
        assert!(b.retry(ms(30)) && b.retry(ms(31)));
        assert!(!b.retry(ms(32)));
    }
}
