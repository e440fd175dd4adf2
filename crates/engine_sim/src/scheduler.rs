//! One data-parallel rank: running slots, a FIFO queue, a prefix cache and the
//! continuous-batching step loop that drives them.
//!
//! Each loop iteration admits waiting requests into free slots, prefills them (time
//! proportional to their uncached tokens; the first token comes out of prefill, as in SGLang),
//! then runs one decode step that gives every running request one more token. State sits
//! behind a mutex that is never held across an await; HTTP handlers on other threads submit
//! and cancel, the loop on the engine's own thread steps.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Notify;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::SimConfig;
use crate::cache::PrefixCache;
use crate::tokenizer::VOCAB;

/// Decode steps over which `gen_throughput` is measured (SGLang logs every 40).
const THROUGHPUT_WINDOW_STEPS: u32 = 10;

/// What the scheduler tells a request's handler, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    Admitted {
        cached_tokens: usize,
    },
    /// One generated token; `finish` is set on the last one.
    Token {
        id: u32,
        finish: Option<Finish>,
    },
    /// Finished with no further token: aborted, or nothing to generate.
    Done(Finish),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    Length,
    Abort,
}

#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) rid: String,
    pub(crate) prompt: Vec<u32>,
    pub(crate) max_new_tokens: usize,
    /// Internal health probe: served like any request, left out of the counters.
    pub(crate) probe: bool,
}

/// Counters summed into `EngineStats`; they survive restarts and flushes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counters {
    pub(crate) requests: u64,
    pub(crate) completed: u64,
    pub(crate) aborted: u64,
    /// Prompt tokens of admitted requests: the prefix cache's queries.
    pub(crate) prompt_tokens: u64,
    /// Cached prompt tokens of admitted requests: the prefix cache's hits.
    pub(crate) cached_tokens: u64,
    pub(crate) generated_tokens: u64,
}

/// A rank's state at one instant, for `/v1/loads`, `/metrics` and stats.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) running: usize,
    pub(crate) waiting: usize,
    pub(crate) waiting_uncached_tokens: usize,
    /// KV held by running requests (prompt + generated).
    pub(crate) used_tokens: usize,
    pub(crate) cache_tokens: usize,
    pub(crate) gen_throughput: f64,
    pub(crate) total_prefill_uncached_tokens: u64,
    pub(crate) total_prefill_busy_us: u64,
    pub(crate) counters: Counters,
}

#[derive(Debug)]
pub(crate) struct Rank {
    cfg: Arc<SimConfig>,
    state: Mutex<State>,
    wake: Notify,
}

#[derive(Debug)]
struct State {
    next_id: u64,
    waiting: VecDeque<Req>,
    running: Vec<Req>,
    cache: PrefixCache,
    rng: SmallRng,
    counters: Counters,
    /// Had work since it last went idle.
    busy: bool,
    gen_throughput: f64,
    window: Window,
    total_prefill_uncached_tokens: u64,
    total_prefill_busy_us: u64,
}

#[derive(Debug)]
struct Req {
    id: u64,
    job: Job,
    generated: usize,
    prefilled: bool,
    tx: UnboundedSender<Event>,
}

/// Decode tokens over simulated step time, so the rate is deterministic.
#[derive(Debug, Default)]
struct Window {
    steps: u32,
    tokens: u64,
    time: Duration,
}

impl Window {
    fn take(&mut self) -> Option<f64> {
        let rate = (self.steps > 0 && !self.time.is_zero())
            .then(|| self.tokens as f64 / self.time.as_secs_f64());
        *self = Window::default();
        rate
    }
}

/// A submitted request's event stream. Dropping it (the client went away) aborts the
/// request in the scheduler and frees its slot.
#[derive(Debug)]
pub(crate) struct Ticket {
    rx: UnboundedReceiver<Event>,
    _cancel: CancelOnDrop,
}

impl Ticket {
    /// The next event; `None` once the engine has stopped.
    pub(crate) async fn next(&mut self) -> Option<Event> {
        self.rx.recv().await
    }
}

#[derive(Debug)]
struct CancelOnDrop {
    rank: Arc<Rank>,
    id: u64,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.rank.cancel(self.id);
    }
}

impl Rank {
    pub(crate) fn new(index: usize, cfg: Arc<SimConfig>) -> Self {
        let state = State {
            next_id: 0,
            waiting: VecDeque::new(),
            running: Vec::new(),
            cache: PrefixCache::new(cfg.page_size, cfg.cache_capacity_tokens),
            rng: SmallRng::seed_from_u64(cfg.seed.wrapping_add(index as u64)),
            counters: Counters::default(),
            busy: false,
            gen_throughput: 0.0,
            window: Window::default(),
            total_prefill_uncached_tokens: 0,
            total_prefill_busy_us: 0,
        };
        Self {
            cfg,
            state: Mutex::new(state),
            wake: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the counters half-updated in a way worth refusing.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn submit(self: &Arc<Self>, job: Job) -> Ticket {
        let (tx, rx) = unbounded_channel();
        let id = {
            let mut s = self.state();
            s.next_id += 1;
            let id = s.next_id;
            if !job.probe {
                s.counters.requests += 1;
            }
            s.waiting.push_back(Req {
                id,
                job,
                generated: 0,
                prefilled: false,
                tx,
            });
            id
        };
        self.wake.notify_one();
        Ticket {
            rx,
            _cancel: CancelOnDrop {
                rank: Arc::clone(self),
                id,
            },
        }
    }

    /// A canned reply (`fixed_response`) skips the scheduler but still counts.
    pub(crate) fn count_canned(&self) {
        let mut s = self.state();
        s.counters.requests += 1;
        s.counters.completed += 1;
    }

    /// Running plus waiting requests.
    pub(crate) fn queue_len(&self) -> usize {
        let s = self.state();
        s.running.len() + s.waiting.len()
    }

    /// Aborts the request with this `rid`; false when no such request is in flight.
    pub(crate) fn abort(&self, rid: &str) -> bool {
        let mut s = self.state();
        let Some(req) = s.take(|r| r.job.rid == rid) else {
            return false;
        };
        let _ = req.tx.send(Event::Done(Finish::Abort));
        s.count_abort(&req);
        s.settle(&self.cfg);
        true
    }

    /// The client went away: drop the request wherever it is. A no-op once it finished.
    fn cancel(&self, id: u64) {
        let mut s = self.state();
        if let Some(req) = s.take(|r| r.id == id) {
            s.count_abort(&req);
            s.settle(&self.cfg);
        }
    }

    pub(crate) fn clear_cache(&self) {
        self.state().cache.clear();
    }

    /// A process restart: every request in flight is aborted, the cache and the throughput
    /// gauge start empty. The counters are kept.
    pub(crate) fn restart(&self) {
        let mut guard = self.state();
        let s = &mut *guard;
        let reqs: Vec<Req> = s.waiting.drain(..).chain(s.running.drain(..)).collect();
        for req in reqs {
            let _ = req.tx.send(Event::Done(Finish::Abort));
            s.count_abort(&req);
        }
        s.cache.clear();
        s.busy = false;
        s.gen_throughput = 0.0;
        s.window = Window::default();
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let s = self.state();
        Snapshot {
            running: s.running.len(),
            waiting: s.waiting.len(),
            waiting_uncached_tokens: s
                .waiting
                .iter()
                .map(|r| r.job.prompt.len() - s.cache.peek(&r.job.prompt))
                .sum(),
            used_tokens: s
                .running
                .iter()
                .map(|r| r.job.prompt.len() + r.generated)
                .sum(),
            cache_tokens: s.cache.tokens(),
            gen_throughput: s.gen_throughput,
            total_prefill_uncached_tokens: s.total_prefill_uncached_tokens,
            total_prefill_busy_us: s.total_prefill_busy_us,
            counters: s.counters,
        }
    }

    /// The step loop; runs until the engine's runtime stops.
    pub(crate) async fn run(self: Arc<Self>) {
        loop {
            let prefill = self.state().admit(&self.cfg);
            if !prefill.is_zero() {
                tokio::time::sleep(prefill).await;
            }
            let batch = {
                let mut s = self.state();
                s.finish_prefill(&self.cfg);
                s.running.len()
            };
            if batch == 0 {
                // A submit between this check and the await leaves a permit, so no wakeup is lost.
                let parked = self.state().waiting.is_empty();
                if parked {
                    self.wake.notified().await;
                }
                continue;
            }
            let step = self.cfg.decode_step_base
                + self.cfg.decode_step_per_req * u32::try_from(batch).unwrap_or(u32::MAX);
            tokio::time::sleep(step).await;
            self.state().decode(step, &self.cfg);
        }
    }
}

impl State {
    /// Moves waiting requests into free slots; returns the prefill time of their uncached tokens.
    fn admit(&mut self, cfg: &SimConfig) -> Duration {
        let mut uncached = 0;
        while self.running.len() < cfg.max_running_requests {
            let Some(req) = self.waiting.pop_front() else {
                break;
            };
            let cached = self.cache.match_prefix(&req.job.prompt);
            uncached += req.job.prompt.len() - cached;
            if !req.job.probe {
                self.counters.prompt_tokens += req.job.prompt.len() as u64;
                self.counters.cached_tokens += cached as u64;
            }
            let _ = req.tx.send(Event::Admitted {
                cached_tokens: cached,
            });
            self.running.push(req);
            self.busy = true;
        }
        let time = Duration::from_secs_f64(uncached as f64 / cfg.prefill_tokens_per_sec);
        self.total_prefill_uncached_tokens += uncached as u64;
        self.total_prefill_busy_us += u64::try_from(time.as_micros()).unwrap_or(u64::MAX);
        time
    }

    /// Caches the prompts just prefilled and hands out their first tokens.
    fn finish_prefill(&mut self, cfg: &SimConfig) {
        let State {
            running,
            cache,
            rng,
            counters,
            ..
        } = self;
        running.retain_mut(|req| {
            if req.prefilled {
                return true;
            }
            req.prefilled = true;
            cache.insert(&req.job.prompt);
            generate_one(req, rng, counters)
        });
        self.settle(cfg);
    }

    /// One decode step that took `step`: one token for every running request.
    fn decode(&mut self, step: Duration, cfg: &SimConfig) {
        let State {
            running,
            rng,
            counters,
            ..
        } = self;
        let decoded = running.len() as u64;
        running.retain_mut(|req| generate_one(req, rng, counters));
        self.window.steps += 1;
        self.window.tokens += decoded;
        self.window.time += step;
        if self.window.steps >= THROUGHPUT_WINDOW_STEPS
            && let Some(rate) = self.window.take()
        {
            self.gen_throughput = rate;
        }
        self.settle(cfg);
    }

    /// Removes the first waiting or running request that matches.
    fn take(&mut self, matches: impl Fn(&Req) -> bool) -> Option<Req> {
        if let Some(i) = self.waiting.iter().position(&matches) {
            return self.waiting.remove(i);
        }
        let i = self.running.iter().position(matches)?;
        Some(self.running.remove(i))
    }

    fn count_abort(&mut self, req: &Req) {
        if !req.job.probe {
            self.counters.aborted += 1;
        }
    }

    /// On going idle: close the throughput window; show the residual if one is configured.
    /// Otherwise the gauge keeps its last busy value, as SGLang's does.
    fn settle(&mut self, cfg: &SimConfig) {
        if self.busy && self.running.is_empty() && self.waiting.is_empty() {
            self.busy = false;
            if let Some(rate) = self.window.take() {
                self.gen_throughput = rate;
            }
            if let Some(residual) = cfg.idle_gen_throughput_residual {
                self.gen_throughput = residual;
            }
        }
    }
}

/// Gives `req` its next token or finishes it; false once it is finished.
fn generate_one(req: &mut Req, rng: &mut SmallRng, counters: &mut Counters) -> bool {
    if req.generated >= req.job.max_new_tokens {
        let _ = req.tx.send(Event::Done(Finish::Length));
        if !req.job.probe {
            counters.completed += 1;
        }
        return false;
    }
    req.generated += 1;
    let finished = req.generated >= req.job.max_new_tokens;
    let id = rng.gen_range(0..VOCAB);
    let _ = req.tx.send(Event::Token {
        id,
        finish: finished.then_some(Finish::Length),
    });
    if !req.job.probe {
        counters.generated_tokens += 1;
        counters.completed += u64::from(finished);
    }
    !finished
}
