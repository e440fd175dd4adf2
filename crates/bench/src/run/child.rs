//! Servers run as child processes (the reference gateway, nginx, the release `kvgate`):
//! each in its own process group, stopped by that group's id when dropped.

use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kvgate_bench::{RawClient, socket_addr};

/// A running child server. Dropping it stops it.
#[derive(Debug)]
pub(crate) struct ChildServer {
    name: String,
    child: Child,
    url: String,
}

impl ChildServer {
    /// The `kvgate` binary `bin` on a free loopback port in front of `workers`, with its
    /// state in `data`, logging warnings to `log`, `extra` flags added; ready once
    /// `/readiness` answers.
    pub(crate) fn kvgate(
        bin: &Path,
        workers: &[String],
        data: &Path,
        extra: &[&str],
        log: &Path,
    ) -> anyhow::Result<ChildServer> {
        let port = free_port()?.to_string();
        let mut args: Vec<String> = [
            "--host",
            "127.0.0.1",
            "--port",
            &port,
            "--log-level",
            "warn",
        ]
        .map(String::from)
        .to_vec();
        args.extend(["--data-dir".into(), data.display().to_string()]);
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args.push("--worker-urls".into());
        args.extend(workers.iter().cloned());
        let mut gw = ChildServer::spawn(
            "kvgate",
            bin,
            &args,
            log,
            format!("http://127.0.0.1:{port}"),
        )?;
        gw.wait_ready(&["/readiness"], Duration::from_secs(30))?;
        Ok(gw)
    }

    /// Starts `program args...` with stdout and stderr in `log`; `url` is where it listens.
    pub(crate) fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
        url: String,
    ) -> anyhow::Result<ChildServer> {
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Its own group, so helpers it forks are stopped with it.
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        Ok(ChildServer {
            name: name.to_owned(),
            child,
            url,
        })
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until one of `paths` answers 200, or fails when the child exits or `timeout`
    /// passes.
    pub(crate) fn wait_ready(&mut self, paths: &[&str], timeout: Duration) -> anyhow::Result<()> {
        let addr = socket_addr(&self.url).context("child URL has no socket address")?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!("{} exited during startup ({status})", self.name);
            }
            for path in paths {
                let ok = RawClient::connect(addr, Duration::from_secs(1))
                    .and_then(|mut c| c.request("GET", path, b""))
                    .is_ok_and(|r| r.status == 200);
                if ok {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("{} not ready on {} after {timeout:?}", self.name, self.url)
    }

    fn signal_group(&self, signal: &str) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args([signal, "--", &group])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        self.signal_group("-TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Whatever is left of the group (the leader or its helpers).
        self.signal_group("-KILL");
        let _ = self.child.wait();
    }
}

/// A port that was free a moment ago on 127.0.0.1.
pub(crate) fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding a probe port")?;
    Ok(l.local_addr()?.port())
}

/// The first executable named `name` on `PATH`.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// A process's resident memory, from `/proc`.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// CPU time (ns) the threads of a process and of its direct children (nginx's workers)
/// have run, from `/proc/PID/task/*/schedstat`.
pub(crate) fn cpu_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0;
    for t in tasks.flatten() {
        let p = t.path();
        total += std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
        for child in std::fs::read_to_string(p.join("children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|c| c.parse::<u32>().ok())
        {
            total += cpu_ns(child).unwrap_or(0);
        }
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_time_of_a_process_grows_as_it_runs() {
        let me = std::process::id();
        let before = super::cpu_ns(me).expect("this process's schedstat");
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let after = super::cpu_ns(me).expect("this process's schedstat");
        assert!(after > before, "{before} -> {after}");
        assert_eq!(super::cpu_ns(u32::MAX), None, "no such process");
    }
}
