//! Wall-clock time, read here and nowhere else: stamps that outlive the process (snapshot
//! times, an engine's `startup_time`) need it; everything that measures an interval uses
//! `Instant` instead.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch; 0 on a clock set before it.
pub fn unix_now() -> f64 {
    #[expect(
        clippy::disallowed_methods,
        reason = "the one place that reads the wall clock"
    )]
    let now = SystemTime::now();
    now.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
