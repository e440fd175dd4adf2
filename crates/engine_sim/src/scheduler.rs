//! One data-parallel rank: running slots, a FIFO queue, a KV pool shared by running requests
//! and the prefix cache, and the continuous-batching step loop that drives them.
//!
//! Each loop iteration admits waiting requests into free slots while the pool has room for
//! their uncached prompt and their `max_new_tokens` (evicting unlocked cached prefixes, LRU,
//! to make room; FIFO, so one that does not fit holds back those behind it), prefills them
//! (time proportional to their uncached tokens; the first token comes out of prefill, as in
//! SGLang), then runs one decode step that gives every running request one more token. A
//! running request locks its prompt's pages in the cache; when it ends, its prompt and output
//! (but the last token, whose KV was never computed) are cached and the lock released. State
//! sits behind a mutex that is never held across an await; HTTP handlers on other threads
//! submit and cancel, the loop on the engine's own thread steps.
//!
//! With KV events on, the cache's changes go out as one batch per phase that changed it (an
//! admission's evictions, a prefill's stores, a decode step's finished requests) and per
//! abort, flush or restart, handed to the rank's publisher through an unbounded channel so
//! the step never waits on a socket. With pushed load on, every `load_publish_every_steps`th
//! step (a prefill or a decode batch) hands the rank's snapshot to its load publisher the
//! same way.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Notify;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::SimConfig;
use crate::cache::{NodeId, PrefixCache};
use crate::events::{Outbox, Publish};
use crate::scopes::{self, Scopes};
use crate::throughput::GenThroughput;
use crate::vocab::Vocab;

/// Where a rank's scheduler sends the snapshot to push.
pub(crate) type LoadOutbox = tokio::sync::mpsc::UnboundedSender<Snapshot>;

/// What the scheduler tells a request's handler, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    Admitted {
        cached_tokens: usize,
    },
    /// One generated token and its text; `finish` is set on the last one.
    Token {
        id: u32,
        text: &'static str,
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
    /// KV in use as SGLang counts it: the pool minus free and evictable tokens, i.e. the
    /// cache pages running requests lock plus their own uncached prompt and output.
    pub(crate) used_tokens: usize,
    pub(crate) cache_tokens: usize,
    pub(crate) gen_throughput: f64,
    pub(crate) total_prefill_uncached_tokens: u64,
    pub(crate) total_prefill_busy_us: u64,
    pub(crate) counters: Counters,
    /// The scopes (see `scopes`) of the running and of the waiting requests.
    pub(crate) scopes_running: Vec<u32>,
    pub(crate) scopes_waiting: Vec<u32>,
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
    gen_throughput: GenThroughput,
    total_prefill_uncached_tokens: u64,
    total_prefill_busy_us: u64,
    /// Where the cache's events go, once the publisher runs.
    events: Option<Outbox>,
    /// Where pushed load goes, once its publisher runs.
    load: Option<LoadOutbox>,
    /// Scheduler steps since the load was last pushed.
    steps: u32,
    vocab: Arc<Vocab>,
}

#[derive(Debug)]
struct Req {
    id: u64,
    job: Job,
    output: Vec<u32>,
    prefilled: bool,
    /// The cache node this running request locks, and the prompt tokens up to it.
    held: Option<(NodeId, usize)>,
    tx: UnboundedSender<Event>,
}

impl Req {
    /// Pool tokens it needs beyond the cache pages it locks: its uncached prompt and room
    /// for all its output.
    fn committed(&self) -> usize {
        self.job.prompt.len() - self.held_tokens() + self.job.max_new_tokens
    }

    /// Pool tokens in use beyond its locked pages.
    fn used(&self) -> usize {
        self.job.prompt.len() - self.held_tokens() + self.output.len()
    }

    fn held_tokens(&self) -> usize {
        self.held.map_or(0, |(_, n)| n)
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
    pub(crate) fn new(
        index: usize,
        cfg: Arc<SimConfig>,
        vocab: Arc<Vocab>,
        scopes: Arc<Scopes>,
    ) -> Self {
        let state = State {
            next_id: 0,
            waiting: VecDeque::new(),
            running: Vec::new(),
            cache: if cfg.kv_events_port.is_some() {
                PrefixCache::recording(cfg.page_size, scopes)
            } else {
                PrefixCache::new(cfg.page_size)
            },
            rng: SmallRng::seed_from_u64(cfg.seed.wrapping_add(index as u64)),
            counters: Counters::default(),
            gen_throughput: GenThroughput::new(cfg.initial_gen_throughput, Instant::now()),
            total_prefill_uncached_tokens: 0,
            total_prefill_busy_us: 0,
            events: None,
            load: None,
            steps: 0,
            vocab,
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
                output: Vec::new(),
                prefilled: false,
                held: None,
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

    /// Sends this rank's cache events to `outbox` from now on.
    pub(crate) fn set_publisher(&self, outbox: Outbox) {
        self.state().events = Some(outbox);
    }

    /// Pushes this rank's load to `outbox` every `load_publish_every_steps` steps from now on.
    pub(crate) fn set_load_publisher(&self, outbox: LoadOutbox) {
        self.state().load = Some(outbox);
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
        s.end(&req, false);
        s.publish();
        drop(s);
        // Its pool space may let a waiting request in.
        self.wake.notify_one();
        true
    }

    /// The client went away: drop the request wherever it is. A no-op once it finished.
    fn cancel(&self, id: u64) {
        let mut s = self.state();
        if let Some(req) = s.take(|r| r.id == id) {
            s.end(&req, false);
            s.publish();
            drop(s);
            self.wake.notify_one();
        }
    }

    /// Empties the cache; refused (false) while a request runs, as its pages are locked.
    pub(crate) fn clear_cache(&self) -> bool {
        let mut s = self.state();
        if !s.running.is_empty() {
            return false;
        }
        s.cache.clear();
        s.publish();
        true
    }

    /// A process restart: every request in flight is aborted, the cache starts empty and the
    /// throughput gauge at 0 with a new window. The counters are kept.
    pub(crate) fn restart(&self) {
        let mut guard = self.state();
        let s = &mut *guard;
        let reqs: Vec<Req> = s.waiting.drain(..).chain(s.running.drain(..)).collect();
        for req in reqs {
            let _ = req.tx.send(Event::Done(Finish::Abort));
            if !req.job.probe {
                s.counters.aborted += 1;
            }
        }
        s.cache.clear();
        // The old process's publisher died with it: its clear is never sent, and the new
        // one numbers its batches from 0.
        let _ = s.cache.take_events();
        if let Some(outbox) = &s.events {
            let _ = outbox.send(Publish::Restart);
        }
        s.gen_throughput = GenThroughput::new(0.0, Instant::now());
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        self.state().snapshot(self.cfg.page_size)
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
                // A submit (or a finish that frees room) between this check and the await
                // leaves a permit, so no wakeup is lost.
                let parked = self.state().running.is_empty();
                if parked {
                    self.wake.notified().await;
                }
                continue;
            }
            let step = self.cfg.decode_step_base
                + self.cfg.decode_step_per_req * u32::try_from(batch).unwrap_or(u32::MAX);
            tokio::time::sleep(step).await;
            self.state().decode(&self.cfg);
        }
    }
}

/// How much of a prompt of `len` tokens the cache may serve: all but the last token, which
/// is always recomputed, rounded down to whole pages.
fn reusable(len: usize, page_size: usize) -> usize {
    len.saturating_sub(1) / page_size * page_size
}

impl State {
    /// The rank's state now, as `/v1/loads` and pushed load report it.
    fn snapshot(&self, ps: usize) -> Snapshot {
        Snapshot {
            running: self.running.len(),
            waiting: self.waiting.len(),
            waiting_uncached_tokens: self
                .waiting
                .iter()
                .map(|r| {
                    let p = &r.job.prompt;
                    p.len() - self.cache.peek(&p[..reusable(p.len(), ps)])
                })
                .sum(),
            used_tokens: self.cache.locked_tokens()
                + self.running.iter().map(Req::used).sum::<usize>(),
            cache_tokens: self.cache.tokens(),
            gen_throughput: self.gen_throughput.value(),
            total_prefill_uncached_tokens: self.total_prefill_uncached_tokens,
            total_prefill_busy_us: self.total_prefill_busy_us,
            counters: self.counters,
            scopes_running: scopes_of(self.running.iter()),
            scopes_waiting: scopes_of(self.waiting.iter()),
        }
    }

    /// Pool tokens spoken for: every cached page plus what running requests need beyond
    /// the pages they lock.
    fn committed(&self) -> usize {
        self.cache.tokens() + self.running.iter().map(Req::committed).sum::<usize>()
    }

    /// Moves waiting requests into free slots while the pool has room for them, in order;
    /// returns the prefill time of their uncached tokens.
    fn admit(&mut self, cfg: &SimConfig) -> Duration {
        let capacity = cfg.cache_capacity_tokens;
        let mut uncached = 0;
        let mut admitted = false;
        while self.running.len() < cfg.max_running_requests {
            let Some(front) = self.waiting.front() else {
                break;
            };
            let prompt = &front.job.prompt;
            let limit = reusable(prompt.len(), cfg.page_size);
            let (cached, node) = self.cache.match_prefix(&prompt[..limit]);
            let need = prompt.len() - cached + front.job.max_new_tokens;
            // Locked first, so making room cannot evict the prefix it is about to reuse.
            self.cache.lock(node);
            let free = capacity.saturating_sub(self.committed());
            if free < need {
                self.cache.evict(need - free);
            }
            if capacity.saturating_sub(self.committed()) < need {
                // FIFO: it waits for running requests to finish, and so does everyone behind it.
                self.cache.unlock(node);
                break;
            }
            let Some(mut req) = self.waiting.pop_front() else {
                break;
            };
            req.held = Some((node, cached));
            uncached += req.job.prompt.len() - cached;
            if !req.job.probe {
                self.counters.prompt_tokens += req.job.prompt.len() as u64;
                self.counters.cached_tokens += cached as u64;
            }
            let _ = req.tx.send(Event::Admitted {
                cached_tokens: cached,
            });
            self.running.push(req);
            admitted = true;
        }
        if admitted {
            self.gen_throughput
                .prefill(Instant::now(), cfg.gen_throughput_staleness);
        }
        let time = Duration::from_secs_f64(uncached as f64 / cfg.prefill_tokens_per_sec);
        self.total_prefill_uncached_tokens += uncached as u64;
        self.total_prefill_busy_us += u64::try_from(time.as_micros()).unwrap_or(u64::MAX);
        self.publish();
        time
    }

    /// Caches the prompts just prefilled (locked while they run) and hands out their first
    /// tokens. A health probe's one token counts as a decode batch of one, as SGLang's
    /// one-token generation does in its throughput window.
    fn finish_prefill(&mut self, cfg: &SimConfig) {
        let mut prefilled = false;
        let mut i = 0;
        while i < self.running.len() {
            let req = &mut self.running[i];
            if req.prefilled {
                i += 1;
                continue;
            }
            req.prefilled = true;
            prefilled = true;
            let probe = req.job.probe;
            let node = self.cache.insert(&req.job.prompt);
            self.cache.lock(node);
            let whole = req.job.prompt.len() / cfg.page_size * cfg.page_size;
            if let Some((old, _)) = req.held.replace((node, whole)) {
                self.cache.unlock(old);
            }
            if probe {
                self.gen_throughput
                    .decode_batch(1, Instant::now(), cfg.decode_log_interval);
            }
            if self.step(i) {
                i += 1;
            }
        }
        self.publish();
        if prefilled {
            self.stepped(cfg);
        }
    }

    /// One decode step: one token for every running request.
    fn decode(&mut self, cfg: &SimConfig) {
        let decoded = self.running.len() as u64;
        let mut i = 0;
        while i < self.running.len() {
            if self.step(i) {
                i += 1;
            }
        }
        self.gen_throughput
            .decode_batch(decoded, Instant::now(), cfg.decode_log_interval);
        self.publish();
        self.stepped(cfg);
    }

    /// A scheduler step (a prefill or a decode batch) ended: every
    /// `load_publish_every_steps`th one pushes the rank's load as it now stands.
    fn stepped(&mut self, cfg: &SimConfig) {
        let Some(outbox) = &self.load else {
            return;
        };
        self.steps = (self.steps + 1) % cfg.load_publish_every_steps.max(1);
        if self.steps == 0 {
            // Closed only once the engine's runtime stops; nothing is listening then.
            let _ = outbox.send(self.snapshot(cfg.page_size));
        }
    }

    /// Hands the cache's changes since the last call to the publisher, as one batch.
    fn publish(&mut self) {
        let events = self.cache.take_events();
        if let (false, Some(outbox)) = (events.is_empty(), &self.events) {
            // Closed only once the engine's runtime stops; nothing is listening then.
            let _ = outbox.send(Publish::Batch(events));
        }
    }

    /// Gives running request `i` its next token, or ends it; false once it has ended (and
    /// left `running`).
    fn step(&mut self, i: usize) -> bool {
        let req = &mut self.running[i];
        if req.output.len() >= req.job.max_new_tokens {
            let req = self.running.swap_remove(i);
            let _ = req.tx.send(Event::Done(Finish::Length));
            self.end(&req, true);
            return false;
        }
        let (id, text) = self
            .vocab
            .generated(self.rng.gen_range(0..self.vocab.generated_len()));
        req.output.push(id);
        let finished = req.output.len() >= req.job.max_new_tokens;
        let _ = req.tx.send(Event::Token {
            id,
            text,
            finish: finished.then_some(Finish::Length),
        });
        if !req.job.probe {
            self.counters.generated_tokens += 1;
        }
        if finished {
            let req = self.running.swap_remove(i);
            self.end(&req, true);
            return false;
        }
        true
    }

    /// A request left: cache what it computed (its prompt and output but the last token,
    /// whose KV was never computed), release its lock, count it.
    fn end(&mut self, req: &Req, completed: bool) {
        if let Some((node, _)) = req.held {
            if req.prefilled {
                let computed = req.output.len().saturating_sub(1);
                let mut seq = Vec::with_capacity(req.job.prompt.len() + computed);
                seq.extend_from_slice(&req.job.prompt);
                seq.extend_from_slice(&req.output[..computed]);
                self.cache.insert(&seq);
            }
            self.cache.unlock(node);
        }
        if !req.job.probe {
            if completed {
                self.counters.completed += 1;
            } else {
                self.counters.aborted += 1;
            }
        }
    }

    /// Removes the first waiting or running request that matches.
    fn take(&mut self, matches: impl Fn(&Req) -> bool) -> Option<Req> {
        if let Some(i) = self.waiting.iter().position(&matches) {
            return self.waiting.remove(i);
        }
        let i = self.running.iter().position(matches)?;
        Some(self.running.remove(i))
    }
}

/// The distinct scopes of `reqs`' prompts, 0 (no adapter, no salt) left out.
fn scopes_of<'a>(reqs: impl Iterator<Item = &'a Req>) -> Vec<u32> {
    let mut out: Vec<u32> = reqs
        .filter_map(|r| r.job.prompt.first().map(|&t| scopes::of(t)))
        .filter(|&s| s != 0)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}
