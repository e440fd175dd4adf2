//! Latency summaries: nearest-rank percentiles over recorded samples.

use serde::{Deserialize, Serialize};

/// The `p`th percentile (0–100) of `sorted` by nearest rank; `None` when empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p.clamp(0.0, 100.0) / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50, p99, mean and max of a set of samples, in the samples' unit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub count: usize,
    pub p50: f64,
    pub p99: f64,
    pub mean: f64,
    pub max: f64,
}

impl Summary {
    /// Summarizes `samples` (any order); all zero when empty.
    pub fn of(samples: &[f64]) -> Summary {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Summary::default();
        }
        v.sort_by(f64::total_cmp);
        Summary {
            count: v.len(),
            p50: percentile(&v, 50.0).unwrap_or(0.0),
            p99: percentile(&v, 99.0).unwrap_or(0.0),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            max: v[v.len() - 1],
        }
    }
}

/// Largest over smallest of per-engine request counts; `None` when an engine got none.
pub fn split_ratio(split: &[u64]) -> Option<f64> {
    let max = *split.iter().max()?;
    let min = *split.iter().min()?;
    (min > 0).then(|| max as f64 / min as f64)
}
