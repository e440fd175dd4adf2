//! One simulated engine: its ranks, its fault, its identity, and the operations the
//! routes and the [`EngineHandle`](crate::EngineHandle) share.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use kvgate_core::clock::unix_now;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::events::{self, Ports};
use crate::pushed_load;
use crate::scheduler::{Event, Job, Rank, Snapshot};
use crate::scopes::Scopes;
use crate::vocab::Vocab;
use crate::{Fault, LoadBalanceMethod, SimConfig};

/// A copy of an engine's counters (`GET /sim/stats`). Counts survive flushes and restarts;
/// `running`, `waiting` and `cache_tokens` are the current values.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct EngineStats {
    /// Inference requests accepted (health probes and faulted requests excluded).
    pub requests: u64,
    /// Inference requests that reached the engine at all, faulted ones included.
    pub http_requests: u64,
    /// Requests that generated all their tokens.
    pub completed: u64,
    /// Requests aborted: client gone, `/abort_request`, or a restart.
    pub aborted: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Prompt tokens served from the prefix cache, summed over admitted requests.
    pub cached_tokens: u64,
    pub running: u64,
    pub waiting: u64,
    /// Successful `/flush_cache` calls.
    pub flushes: u64,
    pub generated_tokens: u64,
    /// Tokens resident in the prefix caches of all ranks (locked by running requests or not).
    pub cache_tokens: u64,
    pub restarts: u64,
    /// Calls of vLLM's render routes (`/v1/chat/completions/render`, `/v1/completions/render`).
    pub renders: u64,
}

/// The fleet index of the engine that generated a response id (`id` in an OpenAI answer or
/// chunk, `meta_info.id` on `/generate`), so a test can tell which engine answered. `None`
/// for an id the simulator did not generate (one the client gave as `rid`).
pub fn engine_of(id: &str) -> Option<usize> {
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    usize::from_str_radix(id.get(..8)?, 16).ok()
}

#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) cfg: Arc<SimConfig>,
    pub(crate) vocab: Arc<Vocab>,
    pub(crate) ranks: Vec<Arc<Rank>>,
    index: usize,
    fault: Mutex<Fault>,
    startup_time: Mutex<f64>,
    flushes: AtomicU64,
    restarts: AtomicU64,
    next_rid: AtomicU64,
    /// The next rank for round robin.
    next_rank: AtomicUsize,
    /// Inference requests received, whatever became of them.
    pub(crate) received: AtomicU64,
    /// Render calls answered.
    pub(crate) renders: AtomicU64,
    /// The KV-event ports bound, once publishing runs.
    kv_events: OnceLock<Ports>,
    /// Faults of the KV-event publisher alone.
    pub(crate) publisher_faults: Arc<events::PublisherFaults>,
    /// Stored Responses answers (`store`, the API's default): id → the conversation so
    /// far, which a request naming it as `previous_response_id` continues. Lost on restart.
    pub(crate) responses: Mutex<std::collections::HashMap<String, Vec<(String, String)>>>,
    /// The adapter and salt pairs whose caches are kept apart.
    pub(crate) scopes: Arc<Scopes>,
}

impl Engine {
    /// Fails when the configured tokenizer cannot be loaded.
    pub(crate) fn new(index: usize, cfg: SimConfig) -> std::io::Result<Self> {
        let cfg = Arc::new(cfg);
        let vocab = Arc::new(Vocab::load(&cfg)?);
        let scopes = Arc::new(Scopes::default());
        let ranks = (0..cfg.dp_size)
            .map(|r| {
                let (cfg, vocab) = (Arc::clone(&cfg), Arc::clone(&vocab));
                Arc::new(Rank::new(r, cfg, vocab, Arc::clone(&scopes)))
            })
            .collect();
        Ok(Self {
            scopes,
            cfg,
            vocab,
            ranks,
            index,
            fault: Mutex::new(Fault::None),
            startup_time: Mutex::new(unix_now()),
            flushes: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            next_rid: AtomicU64::new(0),
            next_rank: AtomicUsize::new(0),
            received: AtomicU64::new(0),
            renders: AtomicU64::new(0),
            kv_events: OnceLock::new(),
            publisher_faults: Arc::default(),
            responses: Mutex::default(),
        })
    }

    /// Binds the KV-event and pushed-load sockets (when configured) on `host` and starts
    /// publishing on the current actix runtime; before the schedulers start, so no change
    /// goes unpublished.
    pub(crate) async fn start_events(&self, host: &str) -> std::io::Result<()> {
        let Some((mut ports, outboxes)) =
            events::start(host, &self.cfg, &self.publisher_faults).await?
        else {
            return Ok(());
        };
        for (rank, outbox) in self.ranks.iter().zip(outboxes) {
            rank.set_publisher(outbox);
        }
        // Validation keeps pushed load to engines with KV events: it is advertised there.
        ports.load = pushed_load::start(host, &self.cfg, &self.ranks).await?;
        let _ = self.kv_events.set(ports);
        Ok(())
    }

    /// The KV-event ports bound; `None` when publishing is off.
    pub(crate) fn kv_events(&self) -> Option<Ports> {
        self.kv_events.get().copied()
    }

    /// Spawns one step loop per rank on the current actix runtime.
    pub(crate) fn start_schedulers(&self) {
        for rank in &self.ranks {
            #[expect(
                clippy::disallowed_methods,
                reason = "a simulated engine's tasks run on its own runtime, which stops with the fleet"
            )]
            actix_rt::spawn(Arc::clone(rank).run());
        }
    }

    pub(crate) fn fault(&self) -> Fault {
        self.fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set_fault(&self, fault: Fault) {
        tracing::info!(engine = self.index, ?fault, "fault set");
        *self.fault.lock().unwrap_or_else(PoisonError::into_inner) = fault;
    }

    pub(crate) fn health_down(&self) -> bool {
        matches!(self.fault(), Fault::HealthDown)
    }

    pub(crate) fn startup_time(&self) -> f64 {
        *self
            .startup_time
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A request id shaped like SGLang's (32 hex digits), unique within this engine; its
    /// first 8 digits are the engine's fleet index ([`engine_of`]).
    pub(crate) fn new_rid(&self) -> String {
        let n = self.next_rid.fetch_add(1, Ordering::Relaxed);
        format!("{:08x}{n:024x}", self.index)
    }

    /// Checks a request's `routed_dp_rank` as SGLang's tokenizer manager does: rank 0 on a
    /// single-rank engine is ignored, anything outside `[0, dp_size)` is refused.
    pub(crate) fn check_rank(&self, pinned: Option<i64>) -> Result<Option<usize>, ApiError> {
        let Some(r) = pinned else {
            return Ok(None);
        };
        let dp_size = self.ranks.len();
        match usize::try_from(r) {
            Ok(r) if r < dp_size => Ok(Some(r)),
            _ => Err(ApiError::BadRequest(format!(
                "routed_dp_rank={r} out of range [0, {dp_size})"
            ))),
        }
    }

    /// The rank a request runs on: the pinned one (checked by [`Self::check_rank`]), else the
    /// next by the load-balance method. A pin does not advance the round robin, as in SGLang.
    pub(crate) fn rank(&self, pinned: Option<usize>) -> &Arc<Rank> {
        let n = self.ranks.len();
        let i = match (pinned, self.cfg.load_balance_method) {
            (Some(r), _) => r.min(n - 1),
            (None, LoadBalanceMethod::RoundRobin) => {
                self.next_rank.fetch_add(1, Ordering::Relaxed) % n
            }
            (None, LoadBalanceMethod::ShortestQueue) => (0..n)
                .min_by_key(|&i| self.ranks[i].queue_len())
                .unwrap_or(0),
        };
        &self.ranks[i]
    }

    /// Empties every rank's cache, as SGLang does only when no request is in flight.
    pub(crate) fn flush(&self) -> bool {
        if self.ranks.iter().any(|r| r.queue_len() > 0) {
            return false;
        }
        // A request admitted since the check keeps its rank's cache: its pages are locked.
        let cleared = self.ranks.iter().filter(|r| r.clear_cache()).count();
        let all = cleared == self.ranks.len();
        if all {
            self.flushes.fetch_add(1, Ordering::Relaxed);
        }
        all
    }

    pub(crate) fn restart(&self) {
        self.ranks.iter().for_each(|r| r.restart());
        self.responses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        let mut startup = self
            .startup_time
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Strictly later, so a poller always sees the change.
        *startup = unix_now().max(*startup + 1e-3);
        self.restarts.fetch_add(1, Ordering::Relaxed);
        tracing::info!(engine = self.index, startup_time = *startup, "restarted");
    }

    pub(crate) fn abort(&self, rid: &str) -> bool {
        self.ranks.iter().any(|r| r.abort(rid))
    }

    /// SGLang's `/health_generate`: a one-token generation (`input_ids=[0]`) on every idle rank.
    pub(crate) async fn health_generate(&self) {
        let probes: Vec<_> = self
            .ranks
            .iter()
            .filter(|r| r.queue_len() == 0)
            .map(|r| {
                let job = Job {
                    rid: self.new_rid(),
                    prompt: vec![0],
                    max_new_tokens: 1,
                    probe: true,
                };
                r.submit(job)
            })
            .collect();
        for mut probe in probes {
            while let Some(event) = probe.next().await {
                if matches!(
                    event,
                    Event::Token {
                        finish: Some(_),
                        ..
                    } | Event::Done(_)
                ) {
                    break;
                }
            }
        }
    }

    pub(crate) fn snapshots(&self) -> Vec<Snapshot> {
        self.ranks.iter().map(|r| r.snapshot()).collect()
    }

    pub(crate) fn stats(&self) -> EngineStats {
        let mut stats = EngineStats {
            flushes: self.flushes.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
            http_requests: self.received.load(Ordering::Relaxed),
            renders: self.renders.load(Ordering::Relaxed),
            ..EngineStats::default()
        };
        for s in self.snapshots() {
            let c = s.counters;
            stats.requests += c.requests;
            stats.completed += c.completed;
            stats.aborted += c.aborted;
            stats.prompt_tokens += c.prompt_tokens;
            stats.cached_tokens += c.cached_tokens;
            stats.generated_tokens += c.generated_tokens;
            stats.running += s.running as u64;
            stats.waiting += s.waiting as u64;
            stats.cache_tokens += s.cache_tokens as u64;
        }
        stats
    }
}
