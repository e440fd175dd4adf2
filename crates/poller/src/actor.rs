//! The load-poller actor: polls every target each tick and reports each one as its poll
//! ends.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use actix::{
    Actor, ActorFutureExt, AsyncContext, Context, Handler, Message, Recipient, Supervised,
    WrapFuture,
};
use awc::Client;
use kvgate_policies::{WorkerId, WorkerLoad};

use crate::config::PollerConfig;
use crate::counters::CounterState;
use crate::fetch::{Fetch, Fetched, PollError, Source, fetch};
use crate::ranks::metrics_to_ranks;
use kvgate_core::WorkerUrl;

/// A worker to poll and the base URL it serves on.
#[derive(Clone, PartialEq, Eq)]
pub struct PollTarget {
    pub worker: WorkerId,
    pub url: WorkerUrl,
    /// Sent as `Authorization: Bearer`, in place of the poller's configured key.
    pub api_key: Option<String>,
}

// Hand-written so a key never reaches a log line.
impl fmt::Debug for PollTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollTarget")
            .field("worker", &self.worker)
            .field("url", &self.url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Replaces the whole target set; the registry sends it on every change. State learned
/// about a worker (its source, its counters) is kept while its URL stays the same.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct SetTargets(pub Vec<PollTarget>);

/// Starts a tick now, without waiting for the interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct PollNow;

/// The outcome of one worker's poll, sent to the sink as that poll ends, so a worker that
/// hangs until the timeout delays no one else's report.
///
/// `None` means the load is unknown (the poll failed, timed out or did not parse) and must
/// not be replaced by an older report. A target whose previous poll is still running is
/// not polled again by a tick: that poll reports it when it ends.
#[derive(Debug, Clone, PartialEq, Message)]
#[rtype(result = "()")]
pub struct LoadsPolled {
    pub worker: WorkerId,
    pub load: Option<WorkerLoad>,
}

/// Owns the periodic load poll of every worker it is given.
pub struct LoadPoller {
    cfg: PollerConfig,
    epoch: Instant,
    sink: Recipient<LoadsPolled>,
    /// Made in `started`, on the actor's own thread (the client is not `Send`).
    client: Option<Client>,
    /// Makes the client instead of the default one (see [`LoadPoller::with_client`]).
    make_client: Option<MakeClient>,
    targets: BTreeMap<WorkerId, Target>,
    /// The last `Target::serial` handed out.
    serial: u64,
}

/// Builds the poller's HTTP client from the poll timeout, on the poller's thread.
pub type MakeClient = std::sync::Arc<dyn Fn(Duration) -> Client + Send + Sync>;

/// A worker remembered without `/v1/loads` is asked again every this many polls (about a
/// minute at the default 2 s interval): an engine upgraded in place, or one whose
/// `/v1/loads` answered a proxy's error page during a restart, gets its richer report back.
const LOADS_RECHECK_EVERY: u32 = 30;

struct Target {
    url: WorkerUrl,
    api_key: Option<String>,
    /// Tells this target from an earlier one of the same worker and URL (removed and added
    /// again while its poll ran): that poll's result is not this target's.
    serial: u64,
    /// The worker answered `/v1/loads` with "absent": go straight to `/metrics`.
    no_loads: bool,
    /// Polls since `/v1/loads` was last tried, while `no_loads`.
    since_loads_tried: u32,
    /// A poll of this worker is running; the next tick leaves it alone.
    polling: bool,
    counters: CounterState,
}

impl Target {
    fn new(url: WorkerUrl, api_key: Option<String>, serial: u64) -> Target {
        Target {
            url,
            api_key,
            serial,
            no_loads: false,
            since_loads_tried: 0,
            polling: false,
            counters: CounterState::new(),
        }
    }
}

impl fmt::Debug for LoadPoller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadPoller")
            .field("cfg", &self.cfg)
            .field("targets", &self.targets.len())
            .finish_non_exhaustive()
    }
}

impl LoadPoller {
    /// `epoch` is the selector's clock origin: reports' `sampled_at` is measured from it.
    /// `cfg` should have passed [`PollerConfig::validate`].
    pub fn new(cfg: PollerConfig, epoch: Instant, sink: Recipient<LoadsPolled>) -> LoadPoller {
        LoadPoller {
            cfg,
            epoch,
            sink,
            client: None,
            make_client: None,
            targets: BTreeMap::new(),
            serial: 0,
        }
    }

    /// Polls with the clients `make` builds (say, one whose connections pass an embedder's
    /// own address checks). It should follow no redirect and time out at the timeout it is
    /// given, as the default client does.
    pub fn with_client(mut self, make: MakeClient) -> LoadPoller {
        self.make_client = Some(make);
        self
    }

    /// Polls every target not already being polled. With `spread`, each poll starts at
    /// its own point of the interval ([`phase`]), so a large fleet is not polled in one
    /// burst every interval; [`PollNow`] polls at once.
    fn tick(&mut self, ctx: &mut Context<Self>, spread: bool) {
        let Some(client) = &self.client else {
            return;
        };
        let interval = self.cfg.interval;
        let timeout = self.cfg.timeout;
        let mut jobs = Vec::new();
        for (&worker, target) in &mut self.targets {
            if target.polling {
                continue;
            }
            target.polling = true;
            let recheck = target.no_loads && target.since_loads_tried >= LOADS_RECHECK_EVERY;
            target.since_loads_tried = if recheck || !target.no_loads {
                0
            } else {
                target.since_loads_tried + 1
            };
            let job = Fetch {
                client: client.clone(),
                url: target.url.clone(),
                api_key: target.api_key.clone().or_else(|| self.cfg.api_key.clone()),
                timeout,
                epoch: self.epoch,
                try_loads: !target.no_loads || recheck,
            };
            jobs.push((worker, target.serial, job));
        }
        // One task per worker, each reported as it ends: a worker that hangs until the
        // timeout delays nobody else's report. Spawned on the actor's context, so the polls
        // stop with the actor.
        for (worker, serial, job) in jobs {
            let wait = if spread {
                phase(worker, interval)
            } else {
                Duration::ZERO
            };
            let poll = async move {
                if !wait.is_zero() {
                    actix::clock::sleep(wait).await;
                }
                // Bounds the whole poll, fallback and body reads included.
                let out = actix::clock::timeout(timeout, fetch(job)).await.ok();
                (worker, serial, out)
            };
            ctx.spawn(
                poll.into_actor(self)
                    .map(|(worker, serial, out), act, _| act.finish(worker, serial, out)),
            );
        }
    }

    fn finish(&mut self, worker: WorkerId, serial: u64, out: Option<Fetched>) {
        // Removed, moved or added again while the poll ran: the result describes nothing
        // tracked now.
        let Some(target) = self.targets.get_mut(&worker).filter(|t| t.serial == serial) else {
            return;
        };
        let url = target.url.as_str();
        target.polling = false;
        let load = match out {
            None => {
                tracing::debug!(%worker, url, "load poll timed out");
                None
            }
            Some(fetched) => {
                if fetched.no_loads && !target.no_loads {
                    tracing::debug!(%worker, url, "worker has no /v1/loads; polling /metrics");
                    target.no_loads = true;
                } else if target.no_loads && matches!(fetched.result, Ok((Source::Loads(_), _))) {
                    tracing::debug!(%worker, url, "worker has /v1/loads again");
                    target.no_loads = false;
                }
                match fetched
                    .result
                    .and_then(|(source, sent)| to_load(source, sent, &mut target.counters))
                {
                    Ok(load) => Some(load),
                    Err(e) => {
                        tracing::debug!(%worker, url, error = %e, "load poll failed");
                        None
                    }
                }
            }
        };
        // do_send: the poll loop must never wait on the sink.
        self.sink.do_send(LoadsPolled { worker, load });
    }
}

/// Where in each interval `worker` is polled: its id (a hash of its URL) as a fraction of
/// the interval, so the fleet's polls spread evenly and each worker keeps its own rhythm.
pub(crate) fn phase(worker: WorkerId, interval: Duration) -> Duration {
    interval.mul_f64(worker.0 as f64 / (u64::MAX as f64 + 1.0))
}

fn to_load(
    source: Source,
    sampled_at: Duration,
    counters: &mut CounterState,
) -> Result<WorkerLoad, PollError> {
    let (ranks, adapters) = match source {
        Source::Loads(ranks) => (ranks, None),
        Source::Metrics(samples) => (
            metrics_to_ranks(&samples, sampled_at, counters)?,
            crate::ranks::adapters_at_work(&samples),
        ),
    };
    Ok(WorkerLoad {
        ranks,
        sampled_at,
        adapters,
    })
}

impl Actor for LoadPoller {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.client = Some(match &self.make_client {
            Some(make) => make(self.cfg.timeout),
            None => crate::fetch::client(self.cfg.timeout),
        });
        ctx.run_interval(self.cfg.interval, |act, ctx| act.tick(ctx, true));
    }
}

/// Under actix's `Supervisor` (or any supervisor that restarts the context): the polls that
/// were running went with the old context, so no target waits on one; `started` arms the
/// tick again.
impl Supervised for LoadPoller {
    fn restarting(&mut self, _: &mut Context<Self>) {
        for t in self.targets.values_mut() {
            t.polling = false;
        }
    }
}

/// Result `()`: the registry may `do_send` it; the last set received wins.
impl Handler<SetTargets> for LoadPoller {
    type Result = ();

    fn handle(&mut self, msg: SetTargets, _: &mut Context<Self>) {
        self.set_targets(msg.0);
    }
}

impl LoadPoller {
    fn set_targets(&mut self, targets: Vec<PollTarget>) {
        let mut old = std::mem::take(&mut self.targets);
        for PollTarget {
            worker,
            url,
            api_key,
        } in targets
        {
            let target = match old.remove(&worker) {
                Some(t) if t.url == url && t.api_key == api_key => t,
                _ => {
                    self.serial += 1;
                    Target::new(url, api_key, self.serial)
                }
            };
            self.targets.insert(worker, target);
        }
    }
}

/// Result `()`: the tick's outcome goes to the sink, not back to the sender.
impl Handler<PollNow> for LoadPoller {
    type Result = ();

    fn handle(&mut self, _: PollNow, ctx: &mut Context<Self>) {
        self.tick(ctx, false);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn a_fleets_polls_spread_over_the_interval() {
        let interval = Duration::from_secs(2);
        let mut per_tenth = [0u32; 10];
        for i in 0..256 {
            let w = WorkerId::from_url(&format!("http://10.0.{}.{}:8000", i / 200, i % 200));
            let p = phase(w, interval);
            assert!(p < interval, "{p:?}");
            per_tenth[(p.as_secs_f64() / 0.2) as usize] += 1;
            // A worker keeps its own point in the interval.
            assert_eq!(p, phase(w, interval));
        }
        // 25.6 each on average; no tenth empty or holding a burst.
        assert!(
            per_tenth.iter().all(|n| (8..=48).contains(n)),
            "{per_tenth:?}"
        );
    }

    /// Keeps every report it gets.
    struct Sink(Arc<Mutex<Vec<LoadsPolled>>>);

    impl Actor for Sink {
        type Context = Context<Self>;
    }

    impl Handler<LoadsPolled> for Sink {
        type Result = ();
        fn handle(&mut self, msg: LoadsPolled, _: &mut Context<Self>) {
            if let Ok(mut got) = self.0.lock() {
                got.push(msg);
            }
        }
    }

    #[actix_rt::test]
    async fn a_poll_of_an_earlier_target_of_the_same_worker_is_not_reported() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink(got.clone()).start();
        let mut p = LoadPoller::new(
            PollerConfig::default(),
            Instant::now(),
            sink.clone().recipient(),
        );
        let w = WorkerId(1);
        let target = || PollTarget {
            worker: w,
            url: WorkerUrl::parse("http://w:1").unwrap(),
            api_key: None,
        };
        let polling = |p: &mut LoadPoller| {
            if let Some(t) = p.targets.get_mut(&w) {
                t.polling = true;
            }
        };
        // Polled as serial 1, then removed and added again (serial 2) while that poll ran.
        p.set_targets(vec![target()]);
        polling(&mut p);
        p.set_targets(Vec::new());
        p.set_targets(vec![target()]);
        polling(&mut p);
        p.finish(w, 1, None);
        assert!(
            p.targets[&w].polling,
            "the old poll does not end the new one's"
        );
        p.finish(w, 2, None);
        assert!(!p.targets[&w].polling);
        // Delivered in order: only the new poll's report reaches the sink.
        sink.send(Flush).await.ok();
        let got = got.lock().map(|g| g.clone()).unwrap_or_default();
        assert_eq!(
            got,
            vec![LoadsPolled {
                worker: w,
                load: None
            }]
        );
    }

    /// A message after the reports, to know they were handled.
    #[derive(Message)]
    #[rtype(result = "()")]
    struct Flush;

    impl Handler<Flush> for Sink {
        type Result = ();
        fn handle(&mut self, _: Flush, _: &mut Context<Self>) {}
    }
}
