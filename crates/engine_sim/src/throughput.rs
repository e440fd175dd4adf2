//! A rank's `gen_throughput` gauge, computed as SGLang 0.5.23 computes it.
//!
//! Decode batches are counted in windows of `decode_log_interval`; when a window closes the
//! gauge becomes the tokens decoded in it over its wall time, idle and prefill gaps
//! included, and a new window starts. Nothing clears it when the rank goes idle; only a
//! prefill that finds no window closed for `gen_throughput_staleness` zeroes it. Times come
//! in as arguments, so tests drive it with made-up instants.

use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub(crate) struct GenThroughput {
    value: f64,
    window_start: Instant,
    batches: u32,
    tokens: u64,
}

impl GenThroughput {
    /// A gauge showing `initial` whose first window starts at `now`.
    pub(crate) fn new(initial: f64, now: Instant) -> Self {
        Self {
            value: initial,
            window_start: now,
            batches: 0,
            tokens: 0,
        }
    }

    pub(crate) fn value(&self) -> f64 {
        self.value
    }

    /// One decode batch that produced `tokens`; closes the window at its `interval`-th batch.
    pub(crate) fn decode_batch(&mut self, tokens: u64, now: Instant, interval: u32) {
        self.batches += 1;
        self.tokens += tokens;
        if self.batches < interval {
            return;
        }
        let secs = now
            .saturating_duration_since(self.window_start)
            .as_secs_f64();
        if secs > 0.0 {
            self.value = self.tokens as f64 / secs;
        }
        self.window_start = now;
        self.batches = 0;
        self.tokens = 0;
    }

    /// A prefill at `now`: zeroes a gauge no window has refreshed for `staleness`.
    pub(crate) fn prefill(&mut self, now: Instant, staleness: Duration) {
        // The current window started when the last one closed (or at rank start).
        if now.saturating_duration_since(self.window_start) >= staleness {
            self.value = 0.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_window_closes_after_interval_batches_at_tokens_over_wall_time() {
        let t0 = Instant::now();
        let mut g = GenThroughput::new(0.0, t0);
        for i in 1..=3 {
            g.decode_batch(2, t0 + 10 * i * MS, 4);
        }
        assert_eq!(g.value(), 0.0, "three of four batches close nothing");
        // The first window began at rank start: 8 tokens over 100 ms.
        g.decode_batch(2, t0 + 100 * MS, 4);
        assert!((g.value() - 80.0).abs() < 1e-9, "{}", g.value());
        // The next window is counted afresh from there: 4 × 3 tokens over 20 ms.
        for i in 1..=4 {
            g.decode_batch(3, t0 + (100 + 5 * i) * MS, 4);
        }
        assert!((g.value() - 600.0).abs() < 1e-9, "{}", g.value());
    }

    #[test]
    fn idle_time_inside_a_window_lowers_the_rate_and_idling_keeps_it() {
        let t0 = Instant::now();
        let mut g = GenThroughput::new(0.0, t0);
        g.decode_batch(1, t0 + MS, 2);
        g.decode_batch(1, t0 + 2 * MS, 2); // busy: 2 tokens over 2 ms
        let busy = g.value();
        g.decode_batch(1, t0 + 3 * MS, 2);
        g.decode_batch(1, t0 + 1002 * MS, 2); // an idle second inside the window
        assert!(g.value() < busy / 100.0, "{} vs {busy}", g.value());
        let kept = g.value();
        g.prefill(t0 + 1500 * MS, Duration::from_secs(30));
        assert_eq!(
            g.value(),
            kept,
            "neither idling nor a fresh prefill clears it"
        );
    }

    #[test]
    fn a_prefill_zeroes_it_once_no_window_closed_for_the_staleness() {
        let t0 = Instant::now();
        let staleness = Duration::from_secs(30);
        let mut g = GenThroughput::new(800.0, t0);
        g.prefill(t0 + 29 * 1000 * MS, staleness);
        assert_eq!(
            g.value(),
            800.0,
            "the initial value stands until it is stale"
        );
        g.prefill(t0 + 30 * 1000 * MS, staleness);
        assert_eq!(g.value(), 0.0);

        let mut g = GenThroughput::new(0.0, t0);
        g.decode_batch(5, t0 + 10 * 1000 * MS, 1);
        g.prefill(t0 + 39 * 1000 * MS, staleness);
        assert_eq!(g.value(), 0.5, "29 s after the last window closed");
        g.prefill(t0 + 40 * 1000 * MS, staleness);
        assert_eq!(g.value(), 0.0);
    }
}
