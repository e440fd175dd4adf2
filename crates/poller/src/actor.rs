//! The load-poller actor: polls every target each tick and reports all of them at once.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use actix::{
    Actor, ActorFutureExt, AsyncContext, Context, Handler, Message, Recipient, WrapFuture,
};
use awc::Client;
use futures_util::future::join_all;
use kvgate_policies::{WorkerId, WorkerLoad};

use crate::config::PollerConfig;
use crate::counters::CounterState;
use crate::fetch::{Fetch, Fetched, PollError, Source, fetch};
use crate::ranks::metrics_to_ranks;

/// A worker to poll and the base URL it serves on (`http://host:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollTarget {
    pub worker: WorkerId,
    pub url: String,
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

/// One tick's outcome, sent to the sink once the tick's polls are all done.
///
/// It holds one entry per target polled in that tick; `None` means the load is unknown
/// (the poll failed, timed out or did not parse) and must not be replaced by an older
/// report. A target whose previous poll was still running is left out: that poll reports
/// it when it ends.
#[derive(Debug, Clone, PartialEq, Message)]
#[rtype(result = "()")]
pub struct LoadsPolled {
    pub reports: Vec<(WorkerId, Option<WorkerLoad>)>,
}

/// Owns the periodic load poll of every worker it is given.
pub struct LoadPoller {
    cfg: PollerConfig,
    epoch: Instant,
    sink: Recipient<LoadsPolled>,
    /// Made in `started`, on the actor's own thread (the client is not `Send`).
    client: Option<Client>,
    targets: BTreeMap<WorkerId, Target>,
}

struct Target {
    url: String,
    /// The worker answered `/v1/loads` with "absent": go straight to `/metrics`.
    no_loads: bool,
    /// A poll of this worker is running; the next tick leaves it alone.
    polling: bool,
    counters: CounterState,
}

impl Target {
    fn new(url: String) -> Target {
        Target {
            url,
            no_loads: false,
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
            targets: BTreeMap::new(),
        }
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        let Some(client) = &self.client else {
            return;
        };
        let timeout = self.cfg.timeout;
        let mut polls = Vec::new();
        for (&worker, target) in &mut self.targets {
            if target.polling {
                continue;
            }
            target.polling = true;
            let job = Fetch {
                client: client.clone(),
                url: target.url.clone(),
                api_key: self.cfg.api_key.clone(),
                timeout,
                epoch: self.epoch,
                try_loads: !target.no_loads,
            };
            let url = target.url.clone();
            polls.push(async move {
                // Bounds the whole poll, fallback and body reads included.
                let out = actix::clock::timeout(timeout, fetch(job)).await.ok();
                (worker, url, out)
            });
        }
        if polls.is_empty() {
            return;
        }
        // Spawned on the actor's context, so the polls stop with the actor.
        ctx.spawn(
            join_all(polls)
                .into_actor(self)
                .map(|results, act, _| act.finish(results)),
        );
    }

    fn finish(&mut self, results: Vec<(WorkerId, String, Option<Fetched>)>) {
        let mut reports = Vec::with_capacity(results.len());
        for (worker, url, out) in results {
            // Removed or moved while the poll ran: the result describes nothing tracked.
            let Some(target) = self.targets.get_mut(&worker).filter(|t| t.url == url) else {
                continue;
            };
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
            reports.push((worker, load));
        }
        if !reports.is_empty() {
            // do_send: one message per tick, and the poll loop must never wait on the sink.
            self.sink.do_send(LoadsPolled { reports });
        }
    }
}

fn to_load(
    source: Source,
    sampled_at: Duration,
    counters: &mut CounterState,
) -> Result<WorkerLoad, PollError> {
    let ranks = match source {
        Source::Loads(ranks) => ranks,
        Source::Metrics(samples) => metrics_to_ranks(&samples, sampled_at, counters)?,
    };
    Ok(WorkerLoad { ranks, sampled_at })
}

impl Actor for LoadPoller {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.client = Some(Client::builder().timeout(self.cfg.timeout).finish());
        ctx.run_interval(self.cfg.interval, |act, ctx| act.tick(ctx));
    }
}

/// Result `()`: the registry may `do_send` it; the last set received wins.
impl Handler<SetTargets> for LoadPoller {
    type Result = ();

    fn handle(&mut self, msg: SetTargets, _: &mut Context<Self>) {
        let mut old = std::mem::take(&mut self.targets);
        for PollTarget { worker, url } in msg.0 {
            let target = match old.remove(&worker) {
                Some(t) if t.url == url => t,
                _ => Target::new(url),
            };
            self.targets.insert(worker, target);
        }
    }
}

/// Result `()`: the tick's outcome goes to the sink, not back to the sender.
impl Handler<PollNow> for LoadPoller {
    type Result = ();

    fn handle(&mut self, _: PollNow, ctx: &mut Context<Self>) {
        self.tick(ctx);
    }
}
