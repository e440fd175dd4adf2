//! Talking to `wrk`: the Lua script that makes it POST, and parsing what it prints.

use serde::{Deserialize, Serialize};

/// What one `wrk --latency` run reported. Latencies in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WrkReport {
    pub requests_per_sec: f64,
    pub requests: u64,
    pub latency_avg_ms: Option<f64>,
    pub latency_p50_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
    /// `Non-2xx or 3xx responses`.
    pub non_2xx: u64,
    /// Sum of connect, read, write and timeout socket errors.
    pub socket_errors: u64,
}

/// Output with no `Requests/sec:` line (wrk failed, or is not wrk).
#[derive(Debug, thiserror::Error)]
#[error("wrk output has no 'Requests/sec:' line")]
pub struct WrkParseError;

/// Parses the text `wrk --latency` prints.
pub fn parse_wrk(out: &str) -> Result<WrkReport, WrkParseError> {
    let mut r = WrkReport::default();
    let mut rps = None;
    for line in out.lines() {
        let t = line.trim();
        let mut words = t.split_whitespace();
        match words.next() {
            Some("Requests/sec:") => rps = words.next().and_then(|v| v.parse().ok()),
            // The thread-stats line; the "Latency Distribution" header parses to nothing.
            Some("Latency") => {
                if let Some(v) = words.next().and_then(duration_ms) {
                    r.latency_avg_ms = Some(v);
                }
            }
            Some("50.000%" | "50%") => r.latency_p50_ms = words.next().and_then(duration_ms),
            Some("99.000%" | "99%") => r.latency_p99_ms = words.next().and_then(duration_ms),
            Some("Non-2xx") => {
                r.non_2xx = t
                    .rsplit(' ')
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
            }
            Some("Socket") => {
                // "Socket errors: connect 0, read 0, write 0, timeout 0"
                r.socket_errors = t
                    .split([' ', ','])
                    .filter_map(|w| w.parse::<u64>().ok())
                    .sum();
            }
            Some(n) if words.next() == Some("requests") => {
                r.requests = n.parse().unwrap_or(0);
            }
            _ => {}
        }
    }
    r.requests_per_sec = rps.ok_or(WrkParseError)?;
    Ok(r)
}

/// `635.91us`, `1.20ms`, `2.00s`, `1.5m` as milliseconds.
fn duration_ms(text: &str) -> Option<f64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (num, unit) = text.split_at(split);
    let v: f64 = num.parse().ok()?;
    let scale = match unit {
        "us" => 1e-3,
        "ms" => 1.0,
        "s" => 1e3,
        "m" => 60e3,
        _ => return None,
    };
    Some(v * scale)
}

/// A wrk script that POSTs `body` as JSON on every request.
pub fn post_script(body: &str) -> String {
    format!(
        "wrk.method = \"POST\"\nwrk.body = {}\nwrk.headers[\"Content-Type\"] = \"application/json\"\n",
        lua_string(body)
    )
}

/// A Lua long string needs no escaping as long as its closing bracket does not occur.
pub fn lua_string(s: &str) -> String {
    let mut level = 0;
    while s.contains(&format!("]{}]", "=".repeat(level))) {
        level += 1;
    }
    let eq = "=".repeat(level);
    format!("[{eq}[{s}]{eq}]")
}
