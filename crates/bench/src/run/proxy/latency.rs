//! Latency at one connection: every target in turn, a round at a time, on one keep-alive
//! connection each.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kvgate_bench::{RawClient, Summary, socket_addr};

use super::body::{BodySpec, Sender};
use super::{PATH, Up};

/// Latency at one connection per target, in rounds that visit every target in turn so
/// the machine's noise (other builds on these 2 cores) falls on all of them alike.
pub(super) fn interleaved_latency(
    ups: &[Up],
    warmup: usize,
    n: usize,
    body: &BodySpec,
) -> anyhow::Result<Vec<Summary>> {
    const ROUND: usize = 250;
    let mut conns = Vec::new();
    for up in ups {
        let addr = socket_addr(&up.url).context("target URL has no socket address")?;
        conns.push(RawClient::connect(addr, Duration::from_secs(5))?);
    }
    let mut sender = Sender::new(body, 'r');
    // Warmed up in rounds too: with large bodies, one target's whole warm-up can outlast
    // another's keep-alive (the simulator's is actix's 5 s), which then closes the
    // connection left idle.
    let mut warm = 0;
    while warm < warmup {
        let k = ROUND.min(warmup - warm);
        for (up, c) in ups.iter().zip(&mut conns) {
            reopen_if_closed(c, up, &sender.next())?;
            for _ in 0..k {
                call(c, up, &sender.next())?;
            }
        }
        warm += k;
    }
    eprintln!("proxy: {n} sequential requests per target on one connection, {ROUND} at a time");
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(n); ups.len()];
    let mut done = 0;
    while done < n {
        let k = ROUND.min(n - done);
        for ((up, c), out) in ups.iter().zip(&mut conns).zip(&mut samples) {
            reopen_if_closed(c, up, &sender.next())?;
            for _ in 0..k {
                let body = sender.next();
                let t = Instant::now();
                call(c, up, &body)?;
                out.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        done += k;
    }
    Ok(samples.iter().map(|v| Summary::of(v)).collect())
}

/// A connection the target closed while the others had their round is opened again,
/// with one untimed request, so no sample includes a connect.
fn reopen_if_closed(c: &mut RawClient, up: &Up, body: &str) -> anyhow::Result<()> {
    if c.closed_while_idle()? {
        eprintln!(
            "proxy: {} closed the idle connection; reconnecting",
            up.name
        );
        call(c, up, body)?;
    }
    Ok(())
}

fn call(c: &mut RawClient, up: &Up, body: &str) -> anyhow::Result<()> {
    let r = c
        .request("POST", PATH, body.as_bytes())
        .with_context(|| format!("{}: single-connection request", up.name))?;
    if r.status != 200 {
        bail!(
            "status {} from {}: {}",
            r.status,
            up.name,
            String::from_utf8_lossy(&r.body)
        );
    }
    Ok(())
}
