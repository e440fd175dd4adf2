//! The standard `process_*` metrics (CPU, memory, open files, start time), read from
//! `/proc/self` at each scrape on Linux; elsewhere they are absent. Unprefixed, as every
//! Prometheus client library names them, so stock dashboards and alerts find them.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type FloatGauge = Gauge<f64, AtomicU64>;

/// The kernel's `USER_HZ`, the unit of `/proc/<pid>/stat`'s times: 100 on every
/// architecture Linux exports it for (reading `sysconf` would need `unsafe`).
const USER_HZ: f64 = 100.0;

#[derive(Debug, Default)]
pub(super) struct Process {
    cpu_seconds: Counter<f64, AtomicU64>,
    resident: Gauge,
    virtual_bytes: Gauge,
    open_fds: Gauge,
    max_fds: Gauge,
    start_time: FloatGauge,
}

/// What one read of `/proc/self` gives.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Sample {
    pub cpu_seconds: f64,
    pub resident_bytes: i64,
    pub virtual_bytes: i64,
    pub open_fds: i64,
    pub max_fds: i64,
    pub start_time_seconds: f64,
}

impl Process {
    pub(super) fn register(r: &mut Registry) -> Process {
        let p = Process::default();
        r.register(
            "process_cpu_seconds",
            "User and system CPU time spent, seconds",
            p.cpu_seconds.clone(),
        );
        r.register(
            "process_resident_memory_bytes",
            "Resident memory size, bytes",
            p.resident.clone(),
        );
        r.register(
            "process_virtual_memory_bytes",
            "Virtual memory size, bytes",
            p.virtual_bytes.clone(),
        );
        r.register(
            "process_open_fds",
            "Open file descriptors",
            p.open_fds.clone(),
        );
        r.register(
            "process_max_fds",
            "The soft limit on open file descriptors",
            p.max_fds.clone(),
        );
        r.register(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch, seconds",
            p.start_time.clone(),
        );
        p
    }

    /// Sets every series from `/proc/self`; leaves them as they were where it cannot be read.
    pub(super) fn set(&self) {
        let Some(s) = sample() else { return };
        let seen = self.cpu_seconds.get();
        if s.cpu_seconds > seen {
            self.cpu_seconds.inc_by(s.cpu_seconds - seen);
        }
        self.resident.set(s.resident_bytes);
        self.virtual_bytes.set(s.virtual_bytes);
        self.open_fds.set(s.open_fds);
        self.max_fds.set(s.max_fds);
        self.start_time.set(s.start_time_seconds);
    }
}

/// Reads `/proc/self`; `None` off Linux or when `/proc` is not mounted.
pub(super) fn sample() -> Option<Sample> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let boot = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as i64);
    parse(&stat, &status, &limits, &boot, open_fds)
}

fn parse(stat: &str, status: &str, limits: &str, boot: &str, open_fds: i64) -> Option<Sample> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    // After the name, field 3 (state) is index 0: utime is field 14, stime 15, starttime 22.
    let num = |field: usize| fields.get(field - 3)?.parse::<f64>().ok();
    let kib = |key: &str| {
        let line = status.lines().find_map(|l| l.strip_prefix(key))?;
        let n: i64 = line.split_whitespace().next()?.parse().ok()?;
        Some(n * 1024)
    };
    let max_fds = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let btime: f64 = boot
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    Some(Sample {
        cpu_seconds: (num(14)? + num(15)?) / USER_HZ,
        resident_bytes: kib("VmRSS:")?,
        virtual_bytes: kib("VmSize:").unwrap_or(0),
        open_fds,
        max_fds,
        start_time_seconds: btime + num(22)? / USER_HZ,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proc_reading_parses_into_the_standard_figures() {
        // A process named "kv (gate) 1", as the kernel writes it: the name in parentheses.
        let stat = "4242 (kv (gate) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 12000 1000 200";
        let status = "Name:\tkvgate\nVmSize:\t  907188 kB\nVmRSS:\t   19144 kB\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 1048576              files\n";
        let boot = "cpu  1 2 3\nbtime 1796600000\n";
        let s = parse(stat, status, limits, boot, 17).expect("parses");
        assert_eq!(
            s,
            Sample {
                cpu_seconds: 3.0,
                resident_bytes: 19144 * 1024,
                virtual_bytes: 907188 * 1024,
                open_fds: 17,
                max_fds: 1024,
                start_time_seconds: 1796600000.0 + 120.0,
            }
        );
        assert_eq!(parse("garbage", status, limits, boot, 0), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_can_be_read() {
        let s = sample().expect("/proc/self");
        assert!(
            s.resident_bytes > 0 && s.open_fds > 0 && s.start_time_seconds > 0.0,
            "{s:?}"
        );
    }
}
