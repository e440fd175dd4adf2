//! Rates from cumulative counters: the previous scrape of one worker, kept between polls.

use std::collections::HashMap;
use std::time::Duration;

/// The counters a rate is derived from (vLLM exposes no throughput gauge).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Counter {
    GenerationTokens,
    PrefixCacheHits,
    PrefixCacheQueries,
}

/// Counter readings of one scrape, per (rank, counter).
pub(crate) type Readings = HashMap<(u32, Counter), f64>;

/// One worker's last counter readings, per rank, and when they were sampled.
///
/// Keep one per worker and feed it every scrape of that worker; a fresh one (or one after
/// the worker restarted, seen as a counter going down) gives no rate for that scrape.
#[derive(Debug, Clone, Default)]
pub struct CounterState {
    last: Option<(Duration, Readings)>,
}

/// How much each counter grew since the previous scrape, and over how long.
#[derive(Debug, Default)]
pub(crate) struct Deltas {
    secs: f64,
    grew: Readings,
}

impl Deltas {
    /// Growth per second of `counter` on `rank`, if both scrapes had it.
    pub(crate) fn rate(&self, rank: u32, counter: Counter) -> Option<f64> {
        self.grew.get(&(rank, counter)).map(|d| d / self.secs)
    }

    /// Growth of `counter` on `rank`, if both scrapes had it.
    pub(crate) fn grew(&self, rank: u32, counter: Counter) -> Option<f64> {
        self.grew.get(&(rank, counter)).copied()
    }
}

impl CounterState {
    pub fn new() -> CounterState {
        CounterState::default()
    }

    /// Records this scrape (taken at `at`) and returns the growth since the previous one.
    /// A scrape not later than the previous one is ignored, so a rate never divides by 0.
    pub(crate) fn advance(&mut self, at: Duration, now: Readings) -> Deltas {
        let mut deltas = Deltas::default();
        if let Some((prev_at, prev)) = &self.last {
            if at <= *prev_at {
                return deltas;
            }
            deltas.secs = (at - *prev_at).as_secs_f64();
            for (key, v) in &now {
                // A counter that went down was reset (engine restart): no rate this time.
                if let Some(p) = prev.get(key).filter(|p| v >= *p) {
                    deltas.grew.insert(*key, v - p);
                }
            }
        }
        // Replacing the whole map also forgets ranks the worker no longer reports.
        self.last = Some((at, now));
        deltas
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(state: &mut CounterState, at_ms: u64, gen_tokens: &[(u32, f64)]) -> Deltas {
        let now = gen_tokens
            .iter()
            .map(|&(rank, v)| ((rank, Counter::GenerationTokens), v))
            .collect();
        state.advance(Duration::from_millis(at_ms), now)
    }

    #[test]
    fn rate_over_two_scrapes() {
        let mut s = CounterState::new();
        let first = scrape(&mut s, 1000, &[(0, 100.0), (1, 50.0)]);
        assert_eq!(first.rate(0, Counter::GenerationTokens), None);
        let second = scrape(&mut s, 3000, &[(0, 700.0), (1, 50.0)]);
        assert_eq!(second.rate(0, Counter::GenerationTokens), Some(300.0));
        assert_eq!(second.rate(1, Counter::GenerationTokens), Some(0.0));
        assert_eq!(second.grew(0, Counter::GenerationTokens), Some(600.0));
        assert_eq!(second.rate(0, Counter::PrefixCacheHits), None);
    }

    #[test]
    fn reset_new_rank_and_old_sample() {
        let mut s = CounterState::new();
        scrape(&mut s, 1000, &[(0, 500.0)]);
        // Restarted engine: the counter went down, so no rate, but it becomes the baseline.
        let reset = scrape(&mut s, 2000, &[(0, 10.0), (1, 5.0)]);
        assert_eq!(reset.rate(0, Counter::GenerationTokens), None);
        assert_eq!(reset.rate(1, Counter::GenerationTokens), None);
        // A scrape that is not later than the last one changes nothing.
        let stale = scrape(&mut s, 2000, &[(0, 99.0)]);
        assert_eq!(stale.rate(0, Counter::GenerationTokens), None);
        let next = scrape(&mut s, 4000, &[(0, 30.0), (1, 5.0)]);
        assert_eq!(next.rate(0, Counter::GenerationTokens), Some(10.0));
        assert_eq!(next.rate(1, Counter::GenerationTokens), Some(0.0));
    }
}
