//! Admission: how many inference requests run at once, how many may wait for a slot and
//! for how long, and how fast each client may send them. Shared by every front door and
//! every HTTP thread.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use governor::clock::{Clock as _, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

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

/// Clients whose buckets are remembered; past it, the buckets of clients that have been
/// idle long enough to refill are forgotten (they would start full anyway).
const MAX_BUCKETS: usize = 65_536;

/// The per-client token buckets (`governor`'s keyed limiter: GCRA, one state per key).
type Buckets = RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock>;

#[derive(Debug)]
pub(crate) struct Admission {
    slots: Option<std::sync::Arc<Semaphore>>,
    queue_size: usize,
    queue_timeout: Duration,
    waiting: AtomicUsize,
    /// Inference requests inside the gateway now (admitted or waiting), for draining.
    in_flight: std::sync::Arc<AtomicUsize>,
    buckets: Option<Buckets>,
}

/// A request's place in the gateway: its slot (if slots are limited) and its count in
/// `in_flight`, both given back on drop.
#[derive(Debug)]
pub(crate) struct Ticket {
    _slot: Option<OwnedSemaphorePermit>,
    in_flight: std::sync::Arc<AtomicUsize>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Buckets refilled at `rate` requests per second, each holding a second's worth and at
/// least one request; `None` for a rate no quota can express (checked at load).
fn buckets(rate: f64) -> Option<Buckets> {
    let period = Duration::try_from_secs_f64(1.0 / rate).ok()?;
    let burst = NonZeroU32::new(rate.max(1.0).min(f64::from(u32::MAX)) as u32)?;
    let quota = Quota::with_period(period)?.allow_burst(burst);
    Some(RateLimiter::keyed(quota))
}

/// Whole seconds, at least 1, for a `Retry-After` header.
fn secs_up(d: Duration) -> u64 {
    d.as_secs_f64().ceil().max(1.0) as u64
}

impl Admission {
    pub(crate) fn new(cfg: &AdmissionConfig) -> Admission {
        Admission {
            slots: (cfg.max_concurrent_requests).map(|n| std::sync::Arc::new(Semaphore::new(n))),
            queue_size: cfg.queue_size,
            queue_timeout: cfg.queue_timeout,
            waiting: AtomicUsize::new(0),
            in_flight: std::sync::Arc::new(AtomicUsize::new(0)),
            buckets: cfg.rate_limit_tokens_per_second.and_then(buckets),
        }
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// A ticket, once the client's rate allows it and a slot is free: 429 when the rate
    /// is spent or the queue is full, 503 when the wait for a slot times out; both with
    /// `Retry-After`. The front door takes the two halves apart, around the body's read.
    #[cfg(test)]
    pub(crate) async fn admit(
        &self,
        client: Option<String>,
        peer: Option<IpAddr>,
    ) -> Result<Ticket, AdmitError> {
        self.rate(client, peer)?;
        self.slot().await
    }

    /// The client's rate alone: checked before its body is read, so a refused client's
    /// body is never read.
    pub(crate) fn rate(
        &self,
        client: Option<String>,
        peer: Option<IpAddr>,
    ) -> Result<(), AdmitError> {
        self.take_token(client, peer)
    }

    /// A slot, once one is free (the second half of [`Admission::admit`]): taken once the
    /// body is read, so a slow upload holds no slot.
    pub(crate) async fn slot(&self) -> Result<Ticket, AdmitError> {
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
        let Some(buckets) = &self.buckets else {
            return Ok(());
        };
        let key = client
            .or_else(|| peer.map(|p| p.to_string()))
            .unwrap_or_default();
        if buckets.len() >= MAX_BUCKETS {
            buckets.retain_recent();
            buckets.shrink_to_fit();
        }
        buckets.check_key(&key).map_err(|not_until| {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            AdmitError::RateLimited {
                retry_after: secs_up(wait),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(rate: f64) -> Admission {
        Admission::new(&AdmissionConfig {
            rate_limit_tokens_per_second: Some(rate),
            ..AdmissionConfig::default()
        })
    }

    #[actix_rt::test]
    async fn a_client_gets_a_seconds_worth_then_waits_and_others_are_apart() {
        let a = limited(3.0);
        let key = || Some("sk-a".to_owned());
        for _ in 0..3 {
            assert!(a.admit(key(), None).await.is_ok());
        }
        assert_eq!(
            a.admit(key(), None).await.err(),
            Some(AdmitError::RateLimited { retry_after: 1 })
        );
        // Another key, and a keyless client by its address, have buckets of their own.
        assert!(a.admit(Some("sk-b".into()), None).await.is_ok());
        assert!(a.admit(None, Some([10, 0, 0, 1].into())).await.is_ok());
    }

    #[actix_rt::test]
    async fn a_fractional_rate_holds_one_request_and_says_how_long_to_wait() {
        let a = limited(0.25);
        assert!(a.admit(None, Some([10, 0, 0, 2].into())).await.is_ok());
        match a.admit(None, Some([10, 0, 0, 2].into())).await {
            Err(AdmitError::RateLimited { retry_after }) => assert!((3..=4).contains(&retry_after)),
            other => panic!("{other:?}"),
        }
    }
}
