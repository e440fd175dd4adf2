//! The fleet page's chart, kept by the gateway: every 5 s, the requests answered so far and
//! the first-byte times of the answers that ended since the last sample, for the last 15
//! minutes. A page opened during an incident shows what happened before it was opened.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::metrics::Metrics;
use crate::pipeline::DecisionSink;

/// Time between samples.
pub(crate) const STEP: Duration = Duration::from_secs(5);
/// Samples kept: 15 minutes.
pub(crate) const KEEP: usize = 180;

/// Nearest-rank quantiles of a sample's times, in ms (`None` without any).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Quantiles {
    pub n: usize,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

impl Quantiles {
    pub(crate) fn of(mut v: Vec<f64>) -> Quantiles {
        Quantiles {
            n: v.len(),
            p50: percentile(&mut v, 50.0),
            p99: percentile(&mut v, 99.0),
        }
    }
}

/// Nearest-rank percentile of `v` (sorted in place); `None` when empty.
pub(crate) fn percentile(v: &mut [f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v.get(rank.clamp(1, v.len()) - 1).copied()
}

/// One step of the chart.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Sample {
    pub time_unix_ms: u64,
    /// Inference requests answered since the gateway started.
    pub requests_total: u64,
    /// Time to first token of the streamed answers that ended in this step.
    pub ttft_ms: Quantiles,
    /// Time to the head of the non-streamed answers that ended in this step: an engine
    /// sends it when generation ends, so this is the whole answer's time.
    pub whole_answer_ms: Quantiles,
}

/// The last [`KEEP`] samples, oldest first.
#[derive(Debug, Default)]
pub(crate) struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    pub(crate) fn record(&self, s: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.push_back(s);
        while samples.len() > KEEP {
            samples.pop_front();
        }
    }

    pub(crate) fn read(&self) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.iter().cloned().collect()
    }

    /// The gateway's state at `now`, as one sample of the answers ended since `since`.
    pub(crate) fn sample(
        metrics: &Metrics,
        decisions: &DecisionSink,
        since: Option<Instant>,
        now: Instant,
    ) -> Sample {
        let (streamed, whole) = decisions.first_bytes_ended(since, now);
        Sample {
            time_unix_ms: (kvgate_core::clock::unix_now() * 1000.0) as u64,
            requests_total: metrics.requests_total(),
            ttft_ms: Quantiles::of(streamed),
            whole_answer_ms: Quantiles::of(whole),
        }
    }

    /// A history sampled on `arbiter` for as long as it runs.
    pub(crate) fn start(
        arbiter: &actix_rt::ArbiterHandle,
        metrics: &Arc<Metrics>,
        decisions: &DecisionSink,
    ) -> Arc<History> {
        let h = Arc::new(History::default());
        arbiter.spawn(h.clone().run_sampler(metrics.clone(), decisions.clone()));
        h
    }

    /// Samples every [`STEP`].
    async fn run_sampler(self: Arc<Self>, metrics: Arc<Metrics>, decisions: DecisionSink) {
        let mut tick = actix_rt::time::interval(STEP);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut since = None;
        loop {
            tick.tick().await;
            let now = Instant::now();
            self.record(History::sample(&metrics, &decisions, since, now));
            since = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{History, KEEP, Quantiles, Sample, percentile};

    fn at(t: u64) -> Sample {
        let none = Quantiles::of(Vec::new());
        Sample {
            time_unix_ms: t,
            requests_total: t,
            ttft_ms: none,
            whole_answer_ms: none,
        }
    }

    #[test]
    fn fifteen_minutes_are_kept_oldest_first() {
        let h = History::default();
        for t in 0..(KEEP as u64 + 5) {
            h.record(at(t));
        }
        let s = h.read();
        assert_eq!(s.len(), KEEP);
        assert_eq!(s[0].time_unix_ms, 5);
        assert_eq!(s[KEEP - 1].time_unix_ms, KEEP as u64 + 4);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let mut v = vec![5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(percentile(&mut v, 50.0), Some(3.0));
        assert_eq!(percentile(&mut v, 99.0), Some(5.0));
        assert_eq!(percentile(&mut [], 50.0), None);
        let q = Quantiles::of(vec![10.0, 20.0]);
        assert_eq!((q.n, q.p50, q.p99), (2, Some(10.0), Some(20.0)));
    }
}
