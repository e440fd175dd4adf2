//! Admission: how many inference requests run at once, how many may wait for a slot and
//! for how long, and how fast each client may send them. Shared by every front door and
//! every HTTP thread.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::AdmissionConfig;

/// Why a request was not admitted; each says when to come back.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum AdmitError {
    #[error(
        "the gateway is at its concurrency limit and its queue is full; retry after {retry_after} s"
    )]
    QueueFull { retry_after: u64 },
    #[error("no slot became free in time; retry after {retry_after} s")]
    QueueTimeout { retry_after: u64 },
    #[error("request rate limit reached; retry after {retry_after} s")]
    RateLimited { retry_after: u64 },
}

/// Clients whose buckets are remembered; past it, full (idle) buckets are forgotten.
const MAX_BUCKETS: usize = 65_536;

#[derive(Debug)]
pub struct Admission {
    slots: Option<std::sync::Arc<Semaphore>>,
    queue_size: usize,
    queue_timeout: Duration,
    waiting: AtomicUsize,
    /// Inference requests inside the gateway now (admitted or waiting), for draining.
    in_flight: std::sync::Arc<AtomicUsize>,
    rate: Option<f64>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// A request's place in the gateway: its slot (if slots are limited) and its count in
/// `in_flight`, both given back on drop.
#[derive(Debug)]
pub struct Ticket {
    _slot: Option<OwnedSemaphorePermit>,
    in_flight: std::sync::Arc<AtomicUsize>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whole seconds, at least 1, for a `Retry-After` header.
fn secs_up(d: Duration) -> u64 {
    d.as_secs_f64().ceil().max(1.0) as u64
}

impl Admission {
    pub fn new(cfg: &AdmissionConfig) -> Admission {
        Admission {
            slots: (cfg.max_concurrent_requests).map(|n| std::sync::Arc::new(Semaphore::new(n))),
            queue_size: cfg.queue_size,
            queue_timeout: cfg.queue_timeout,
            waiting: AtomicUsize::new(0),
            in_flight: std::sync::Arc::new(AtomicUsize::new(0)),
            rate: cfg.rate_limit_tokens_per_second,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// A ticket, once the client's rate allows it and a slot is free: 429 when the rate
    /// is spent or the queue is full, 503 when the wait for a slot times out; both with
    /// `Retry-After`.
    pub async fn admit(
        &self,
        client: Option<String>,
        peer: Option<IpAddr>,
    ) -> Result<Ticket, AdmitError> {
        self.take_token(client, peer)?;
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let ticket = |slot| Ticket {
            _slot: slot,
            in_flight: self.in_flight.clone(),
        };
        let Some(slots) = &self.slots else {
            return Ok(ticket(None));
        };
        if let Ok(p) = slots.clone().try_acquire_owned() {
            return Ok(ticket(Some(p)));
        }
        // The counts are given back by the ticket's drop, so build it before any return.
        let mut t = ticket(None);
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.queue_size {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(AdmitError::QueueFull { retry_after: 1 });
        }
        let got = actix_rt::time::timeout(self.queue_timeout, slots.clone().acquire_owned()).await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        match got {
            Ok(Ok(p)) => {
                t._slot = Some(p);
                Ok(t)
            }
            _ => Err(AdmitError::QueueTimeout {
                retry_after: secs_up(self.queue_timeout / 4),
            }),
        }
    }

    fn take_token(&self, client: Option<String>, peer: Option<IpAddr>) -> Result<(), AdmitError> {
        let Some(rate) = self.rate else {
            return Ok(());
        };
        let key = client
            .or_else(|| peer.map(|p| p.to_string()))
            .unwrap_or_default();
        let now = Instant::now();
        let mut buckets = match self.buckets.lock() {
            Ok(b) => b,
            Err(p) => p.into_inner(),
        };
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(&key) {
            // Forget the full buckets (idle clients); if every one is busy, the oldest half.
            let cap = rate.max(1.0);
            buckets.retain(|_, b| b.tokens + rate * now.duration_since(b.at).as_secs_f64() < cap);
            if buckets.len() >= MAX_BUCKETS {
                let mut ages: Vec<Instant> = buckets.values().map(|b| b.at).collect();
                ages.sort_unstable();
                let cut = ages[ages.len() / 2];
                buckets.retain(|_, b| b.at > cut);
            }
        }
        // A bucket holds a second's worth, and at least one request.
        let cap = rate.max(1.0);
        let b = buckets.entry(key).or_insert(Bucket {
            tokens: cap,
            at: now,
        });
        b.tokens = (b.tokens + rate * now.duration_since(b.at).as_secs_f64()).min(cap);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            let wait = Duration::from_secs_f64((1.0 - b.tokens) / rate);
            Err(AdmitError::RateLimited {
                retry_after: secs_up(wait),
            })
        }
    }
}
