//! The decision log: a bounded ring of the most recent routing decisions and what came of
//! them, for `GET /admin/decisions`. The pipeline adds each attempt's decision when its
//! worker is chosen; the front door that relays the answer fills in its figures (time to
//! first byte, the cached tokens the engine reported) through the attempt's `AnswerNote`,
//! which reports them when dropped. The ring sits behind a mutex held for a push
//! or an update, not in an actor: two messages per request to another thread cost more
//! than the whole record (`docs/benchmarks.md`, proxy overhead).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kvgate_core::WorkerUrl;
use kvgate_policies::{Decision, RoutingText, WorkerId};

use serde::{Serialize, Serializer};

use crate::metrics::Metrics;
use kvgate_core::Endpoint;

/// Decisions kept; older ones fall off.
pub(crate) const DECISION_LOG_SIZE: usize = 1024;
/// Candidates kept per decision, the best scores first.
const TOP_CANDIDATES: usize = 4;

/// One candidate of a logged decision.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LoggedCandidate {
    #[serde(serialize_with = "hex_id")]
    pub worker_id: WorkerId,
    /// The worker's URL, filled in when the log is read (it may have left since).
    pub worker: Option<String>,
    pub matched: Option<usize>,
    pub score: Option<f64>,
    pub prefill: Option<f64>,
    pub in_flight: u64,
    pub gated: bool,
}

/// What came of a decision, once its response ended.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LoggedAnswer {
    /// `ok`, `error` (the worker answered with an error status), `failed` (no answer, or
    /// a stream cut) or `abandoned` (the client went away mid-answer).
    pub outcome: &'static str,
    pub status: Option<u16>,
    /// Dispatch to the first byte of the answer, measured at the gateway.
    pub ttft_ms: Option<f64>,
    /// Dispatch to the end of the answer.
    pub latency_ms: f64,
    /// `usage.prompt_tokens_details.cached_tokens` or `meta_info.cached_tokens` (the
    /// Responses API's `input_tokens_details.cached_tokens`, the Messages API's
    /// `cache_read_input_tokens`), when the engine reported it.
    pub reported_cached_tokens: Option<u64>,
}

/// One attempt's decision, as `GET /admin/decisions` shows it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DecisionRecord {
    pub seq: u64,
    pub time_unix_ms: u64,
    pub request_id: RequestIdText,
    #[serde(serialize_with = "opt_text")]
    pub model: Option<Arc<str>>,
    pub route: &'static str,
    pub attempt: u32,
    #[serde(serialize_with = "url_text")]
    pub worker: WorkerUrl,
    #[serde(serialize_with = "opt_hex_id")]
    pub worker_id: Option<WorkerId>,
    pub path: &'static str,
    pub rule: Option<kvgate_policies::CostRule>,
    pub notes: Vec<&'static str>,
    pub match_rate: Option<f64>,
    /// The chosen worker's matched prefix, in tokens (text estimated at
    /// `--bytes-per-token`).
    pub predicted_cached_tokens: Option<u64>,
    pub candidates: Vec<LoggedCandidate>,
    pub answer: Option<LoggedAnswer>,
}

/// What the HTTP side knows of a request when its worker is chosen.
#[derive(Debug, Clone)]
pub(crate) struct Decided<'a> {
    pub request_id: &'a Arc<str>,
    /// The served model's name, shared with the selector (no copy per request).
    pub model: Option<Arc<str>>,
    pub endpoint: Endpoint,
    pub attempt: u32,
    pub worker_url: WorkerUrl,
    /// Whether the routing key is text (matched units are bytes) or tokens.
    pub text: bool,
    pub bytes_per_token: f64,
    /// When the request arrived, for its duration.
    pub arrived: Instant,
    /// Whether the client asked for a stream (time to first token and between tokens
    /// are measured on streams only).
    pub stream: bool,
}

/// A request id as the log keeps it: copied when short (the gateway's own are 28 bytes),
/// so that the request's own allocation is freed with the request rather than 1024
/// requests later, which upset the allocator's reuse of its chunks (callgrind: +0.6k
/// instructions per request in malloc and free).
#[derive(Clone)]
pub(crate) enum RequestIdText {
    Inline { len: u8, bytes: [u8; INLINE_ID] },
    Shared(Arc<str>),
}

const INLINE_ID: usize = 38;

impl RequestIdText {
    fn new(id: &Arc<str>) -> RequestIdText {
        let b = id.as_bytes();
        match u8::try_from(b.len()) {
            Ok(len) if b.len() <= INLINE_ID => {
                let mut bytes = [0; INLINE_ID];
                bytes[..b.len()].copy_from_slice(b);
                RequestIdText::Inline { len, bytes }
            }
            _ => RequestIdText::Shared(id.clone()),
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        match self {
            RequestIdText::Inline { len, bytes } => {
                // Copied whole from a `str` at a char boundary (its end): valid UTF-8.
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            RequestIdText::Shared(id) => id,
        }
    }
}

impl std::fmt::Debug for RequestIdText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for RequestIdText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A decision as the ring keeps it: the policy's own `Decision`, moved in whole, and
/// what the request adds. The shape the log shows is built only when it is read.
#[derive(Debug)]
struct Entry {
    seq: u64,
    /// When the worker was chosen; the answer's times count from here.
    at: Instant,
    request_id: RequestIdText,
    model: Option<Arc<str>>,
    endpoint: Endpoint,
    attempt: u32,
    /// The client asked for a stream: its first byte is its first token.
    stream: bool,
    worker: WorkerUrl,
    predicted: Option<u64>,
    decision: Decision,
    answer: Option<Ended>,
}

/// What an access-log line takes from the decision log.
#[derive(Debug)]
pub(super) struct Access {
    request_id: RequestIdText,
    model: Option<Arc<str>>,
    route: &'static str,
    worker: WorkerUrl,
    path: &'static str,
    retries: u32,
    ttft_ms: Option<f64>,
}

/// How an answer ended, as the ring keeps it: instants, turned into milliseconds when
/// read.
#[derive(Debug, Clone, Copy)]
struct Ended {
    outcome: &'static str,
    status: Option<u16>,
    first_byte: Option<Instant>,
    end: Instant,
    cached: Option<u64>,
}

impl Ended {
    fn logged(&self, at: Instant) -> LoggedAnswer {
        LoggedAnswer {
            outcome: self.outcome,
            status: self.status,
            ttft_ms: self.first_byte.map(|t| ms(t.duration_since(at))),
            latency_ms: ms(self.end.duration_since(at)),
            reported_cached_tokens: self.cached,
        }
    }
}

impl Entry {
    fn record(&self, clock: &Clock) -> DecisionRecord {
        let d = &self.decision;
        let mut candidates: Vec<&kvgate_policies::CandidateScore> = d.candidates.iter().collect();
        candidates.sort_by(|a, b| {
            let key = |c: &kvgate_policies::CandidateScore| c.score.unwrap_or(f64::INFINITY);
            key(a).total_cmp(&key(b))
        });
        DecisionRecord {
            seq: self.seq,
            time_unix_ms: clock.unix_ms(self.at),
            request_id: self.request_id.clone(),
            model: self.model.clone(),
            route: self.endpoint.path(),
            attempt: self.attempt,
            worker: self.worker.clone(),
            worker_id: d.worker,
            path: d.path.name(),
            rule: d.rule,
            notes: d.notes.iter().map(|n| n.name()).collect(),
            match_rate: d.match_rate,
            predicted_cached_tokens: self.predicted,
            candidates: candidates
                .into_iter()
                .take(TOP_CANDIDATES)
                .map(|c| LoggedCandidate {
                    worker_id: c.worker,
                    worker: None,
                    matched: c.matched,
                    score: c.score,
                    prefill: c.prefill,
                    in_flight: c.in_flight,
                    gated: c.gated,
                })
                .collect(),
            answer: self.answer.map(|a| a.logged(self.at)),
        }
    }
}

/// The chosen worker's matched prefix in tokens.
fn predicted_tokens(d: &Decision, text: bool, bytes_per_token: f64) -> Option<u64> {
    let units = d.chosen()?.matched?;
    Some(if text {
        (units as f64 / bytes_per_token.max(f64::MIN_POSITIVE)).floor() as u64
    } else {
        units as u64
    })
}

/// Wall-clock time from the monotonic clock: one reading of each at start, so a record
/// costs one `Instant::now()`, shared with its answer's timings.
#[derive(Debug)]
struct Clock {
    start: Instant,
    start_unix_ms: u64,
}

impl Clock {
    fn now() -> Clock {
        Clock {
            start: Instant::now(),
            start_unix_ms: (kvgate_core::clock::unix_now() * 1000.0) as u64,
        }
    }

    fn unix_ms(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.start).as_millis() as u64;
        self.start_unix_ms.saturating_add(since)
    }
}

// Ids and URLs are kept as they are and turned into text only when the log is read.
fn hex_id<S: Serializer>(id: &WorkerId, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(id)
}

fn opt_hex_id<S: Serializer>(id: &Option<WorkerId>, s: S) -> Result<S::Ok, S::Error> {
    match id {
        Some(id) => s.collect_str(id),
        None => s.serialize_none(),
    }
}

fn opt_text<S: Serializer>(t: &Option<Arc<str>>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(t),
        None => s.serialize_none(),
    }
}

fn url_text<S: Serializer>(u: &WorkerUrl, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(u.as_str())
}

/// Whether a routing key's matched units are bytes of text.
pub(crate) fn is_text(key: &RoutingText) -> bool {
    matches!(key, RoutingText::Text(_))
}

/// Where a decision went in the ring.
#[derive(Debug, Clone, Copy)]
struct Slot {
    seq: u64,
    i: usize,
}

/// The ring: a fixed array written in place, in turn.
#[derive(Debug)]
struct Ring {
    slots: Vec<Entry>,
    cap: usize,
    next: u64,
    /// The slot written next: the oldest entry once the ring is full.
    head: usize,
}

impl Ring {
    /// Writes the decision of the next sequence number, over the oldest one when the
    /// ring is full, field by field: whole entries moved in and out cost more than the
    /// rest of the record. Returns where it went, for its answer; `decision` is swapped
    /// with the one it replaced.
    fn push(
        &mut self,
        at: Instant,
        decided: Decided<'_>,
        decision: &mut Decision,
        predicted: Option<u64>,
    ) -> Slot {
        let seq = self.next;
        self.next += 1;
        let i = self.head;
        self.head = if i + 1 == self.cap { 0 } else { i + 1 };
        let slot = Slot { seq, i };
        let Some(e) = self.slots.get_mut(i) else {
            self.slots.push(Entry {
                seq,
                at,
                request_id: RequestIdText::new(decided.request_id),
                model: decided.model,
                endpoint: decided.endpoint,
                attempt: decided.attempt,
                stream: decided.stream,
                worker: decided.worker_url,
                predicted,
                decision: std::mem::replace(decision, Decision::none()),
                answer: None,
            });
            return slot;
        };
        e.seq = seq;
        e.at = at;
        e.request_id = RequestIdText::new(decided.request_id);
        e.stream = decided.stream;
        e.model = decided.model;
        e.endpoint = decided.endpoint;
        e.attempt = decided.attempt;
        e.worker = decided.worker_url;
        e.predicted = predicted;
        std::mem::swap(&mut e.decision, decision);
        e.answer = None;
        slot
    }

    /// Files `answer` under its decision; with `access`, what the access log line needs of
    /// the decision.
    fn answer(&mut self, slot: Slot, answer: Ended, access: bool) -> Option<Access> {
        // The slot may have been taken by a newer decision since.
        let e = self.slots.get_mut(slot.i).filter(|e| e.seq == slot.seq)?;
        e.answer = Some(answer);
        access.then(|| Access {
            request_id: e.request_id.clone(),
            model: e.model.clone(),
            route: e.endpoint.path(),
            worker: e.worker.clone(),
            path: e.decision.path.name(),
            retries: e.attempt.saturating_sub(1),
            ttft_ms: answer.first_byte.map(|t| ms(t.duration_since(e.at))),
        })
    }

    /// The entries, oldest first.
    fn iter(&self) -> impl DoubleEndedIterator<Item = &Entry> {
        // Before the ring is full `head` is its length: nothing is older than slot 0.
        let (newer, older) = self.slots.split_at(self.head.min(self.slots.len()));
        older.iter().chain(newer)
    }

    /// The newest `limit`, or with `since` the first `limit` after it: following pages
    /// forward from the oldest unseen.
    fn read(&self, limit: usize, since: Option<u64>, clock: &Clock) -> Vec<DecisionRecord> {
        let after = self.iter().filter(|e| since.is_none_or(|s| e.seq > s));
        let skip = match since {
            Some(_) => 0,
            None => self.slots.len().saturating_sub(limit),
        };
        after
            .skip(skip)
            .take(limit)
            .map(|e| e.record(clock))
            .collect()
    }
}

#[derive(Debug)]
struct Shared {
    ring: Mutex<Ring>,
    metrics: Arc<Metrics>,
    clock: Clock,
    /// Workers that have reported cached tokens: their answers without a report had none
    /// cached (SGLang and vLLM leave the field out then), not a figure never sent.
    reporters: std::sync::RwLock<std::collections::HashSet<WorkerId>>,
    /// `--access-log`: one line per answered request.
    access_log: bool,
}

/// The decision log, shared by every HTTP thread; it also feeds the answer metrics.
#[derive(Debug, Clone)]
pub(crate) struct DecisionSink(Arc<Shared>);

impl DecisionSink {
    /// A log keeping the last `cap` decisions, without the access log.
    #[cfg(test)]
    pub(crate) fn new(cap: usize, metrics: Arc<Metrics>) -> DecisionSink {
        DecisionSink::with_access_log(cap, metrics, false)
    }

    /// As `new`, writing the access log when `access_log` is set.
    pub(crate) fn with_access_log(
        cap: usize,
        metrics: Arc<Metrics>,
        access_log: bool,
    ) -> DecisionSink {
        let cap = cap.max(1);
        DecisionSink(Arc::new(Shared {
            metrics,
            access_log,
            reporters: std::sync::RwLock::default(),
            ring: Mutex::new(Ring {
                slots: Vec::with_capacity(cap.min(DECISION_LOG_SIZE)),
                cap,
                next: 1,
                head: 0,
            }),
            clock: Clock::now(),
        }))
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        // A panic while holding the lock leaves a ring that is still whole.
        self.0.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Logs `decision` and returns the note that reports its answer when dropped. The
    /// decision is taken as it is (the log's shape is built when it is read); left in its
    /// place is the one it displaced from the ring, for the caller to drop outside the
    /// lock, or an empty one.
    pub(crate) fn decided(&self, decision: &mut Decision, at: Decided<'_>) -> AnswerNote {
        let now = Instant::now();
        let predicted = predicted_tokens(decision, at.text, at.bytes_per_token);
        let (endpoint, arrived, stream) = (at.endpoint, at.arrived, at.stream);
        let worker = decision.worker;
        let slot = self.ring().push(now, at, decision, predicted);
        AnswerNote {
            sink: self.clone(),
            slot,
            started: now,
            arrived,
            first_byte: None,
            last_chunk: None,
            predicted,
            worker,
            cached: None,
            prompt_tokens: None,
            log_access: self.0.access_log
                && tracing::event_enabled!(target: "kvgate::access", tracing::Level::INFO),
            status: None,
            endpoint,
            stream,
            whole: false,
            failed: false,
            abandoned: false,
            relayed: false,
        }
    }

    /// Logged decisions, oldest first: the newest `limit`, or with `since` the first
    /// `limit` after that sequence number.
    pub(crate) fn read(&self, limit: usize, since: Option<u64>) -> Vec<DecisionRecord> {
        self.ring().read(limit, since, &self.0.clock)
    }

    /// Logged decisions per path made within the last `window` (as far back as the ring
    /// goes).
    pub(crate) fn paths_within(&self, window: Duration) -> Vec<(&'static str, u64)> {
        let from = Instant::now().checked_sub(window);
        let mut out: Vec<(&'static str, u64)> = Vec::new();
        for e in self
            .ring()
            .iter()
            .filter(|e| from.is_none_or(|f| e.at >= f))
        {
            let path = if e.attempt > 1 {
                "retry"
            } else {
                e.decision.path.name()
            };
            match out.iter_mut().find(|(p, _)| *p == path) {
                Some((_, n)) => *n += 1,
                None => out.push((path, 1)),
            }
        }
        out
    }

    /// The first-byte times (ms) of the answers that ended after `after` and by `until`,
    /// as far back as the ring goes: streamed answers' (their first token) and whole
    /// ones' (a whole answer's head comes when generation ends).
    pub(crate) fn first_bytes_ended(
        &self,
        after: Option<Instant>,
        until: Instant,
    ) -> (Vec<f64>, Vec<f64>) {
        let (mut streamed, mut whole) = (Vec::new(), Vec::new());
        for e in self.ring().iter() {
            let Some(a) = e.answer else { continue };
            let Some(first) = a.first_byte else { continue };
            if a.end > until || after.is_some_and(|t| a.end <= t) {
                continue;
            }
            let t = ms(first.duration_since(e.at));
            if e.stream {
                streamed.push(t);
            } else {
                whole.push(t);
            }
        }
        (streamed, whole)
    }

    /// The time to first byte (ms) of the newest `n` answered decisions that have one.
    pub(crate) fn recent_ttfts(&self, n: usize) -> Vec<f64> {
        self.ring()
            .iter()
            .rev()
            .filter_map(|e| {
                let first = e.answer?.first_byte?;
                Some(ms(first.duration_since(e.at)))
            })
            .take(n)
            .collect()
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

mod note;

pub(crate) use note::AnswerNote;

#[cfg(test)]
mod tests;
