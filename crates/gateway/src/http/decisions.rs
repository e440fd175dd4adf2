//! The decision log: a bounded ring of the most recent routing decisions and what came of
//! them, for `GET /admin/decisions`. The HTTP side adds each attempt's decision when its
//! worker is chosen and the answer's figures (time to first byte, the cached tokens the
//! engine reported) when the response ends. The ring sits behind a mutex held for a push
//! or an update, not in an actor: two messages per request to another thread cost more
//! than the whole record (`docs/benchmarks.md`, proxy overhead).

use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kvgate_core::WorkerUrl;
use kvgate_policies::{Decision, RoutingText, WorkerId};

use serde::{Serialize, Serializer};

use crate::metrics::Metrics;
use kvgate_core::Endpoint;

/// Decisions kept; older ones fall off.
pub const DECISION_LOG_SIZE: usize = 1024;
/// Candidates kept per decision, the best scores first.
const TOP_CANDIDATES: usize = 4;

/// One candidate of a logged decision.
#[derive(Debug, Clone, Serialize)]
pub struct LoggedCandidate {
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
pub struct LoggedAnswer {
    /// `ok`, `error` (the worker answered with an error status), `failed` (no answer, or
    /// a stream cut) or `abandoned` (the client went away mid-answer).
    pub outcome: &'static str,
    pub status: Option<u16>,
    /// Dispatch to the first byte of the answer, measured at the gateway.
    pub ttft_ms: Option<f64>,
    /// Dispatch to the end of the answer.
    pub latency_ms: f64,
    /// `usage.prompt_tokens_details.cached_tokens` or `meta_info.cached_tokens`, when
    /// the engine reported it.
    pub reported_cached_tokens: Option<u64>,
}

/// One attempt's decision, as `GET /admin/decisions` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct DecisionRecord {
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
pub struct Decided<'a> {
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
pub enum RequestIdText {
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

    pub fn as_str(&self) -> &str {
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
    worker: WorkerUrl,
    predicted: Option<u64>,
    decision: Decision,
    answer: Option<Ended>,
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
pub fn is_text(key: &RoutingText) -> bool {
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
        e.model = decided.model;
        e.endpoint = decided.endpoint;
        e.attempt = decided.attempt;
        e.worker = decided.worker_url;
        e.predicted = predicted;
        std::mem::swap(&mut e.decision, decision);
        e.answer = None;
        slot
    }

    fn answer(&mut self, slot: Slot, answer: Ended) {
        // The slot may have been taken by a newer decision since.
        if let Some(e) = self.slots.get_mut(slot.i).filter(|e| e.seq == slot.seq) {
            e.answer = Some(answer);
        }
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
}

/// The decision log, shared by every HTTP thread; it also feeds the answer metrics.
#[derive(Debug, Clone)]
pub struct DecisionSink(Arc<Shared>);

impl DecisionSink {
    /// A log keeping the last `cap` decisions.
    pub fn new(cap: usize, metrics: Arc<Metrics>) -> DecisionSink {
        let cap = cap.max(1);
        DecisionSink(Arc::new(Shared {
            metrics,
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
    pub fn decided(&self, decision: &mut Decision, at: Decided<'_>) -> AnswerNote {
        let now = Instant::now();
        let predicted = predicted_tokens(decision, at.text, at.bytes_per_token);
        let (endpoint, arrived, stream) = (at.endpoint, at.arrived, at.stream);
        let slot = self.ring().push(now, at, decision, predicted);
        AnswerNote {
            sink: self.clone(),
            slot,
            started: now,
            arrived,
            first_byte: None,
            last_chunk: None,
            predicted,
            cached: None,
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
    pub fn read(&self, limit: usize, since: Option<u64>) -> Vec<DecisionRecord> {
        self.ring().read(limit, since, &self.0.clock)
    }

    /// Logged decisions per path made within the last `window` (as far back as the ring
    /// goes).
    pub fn paths_within(&self, window: Duration) -> Vec<(&'static str, u64)> {
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

    /// The time to first byte (ms) of the newest `n` answered decisions that have one.
    pub fn recent_ttfts(&self, n: usize) -> Vec<f64> {
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

/// Collects what a response shows of its decision and reports it when dropped, however the
/// response ended.
#[derive(Debug)]
pub struct AnswerNote {
    sink: DecisionSink,
    slot: Slot,
    started: Instant,
    arrived: Instant,
    first_byte: Option<Instant>,
    last_chunk: Option<Instant>,
    predicted: Option<u64>,
    cached: Option<u64>,
    status: Option<u16>,
    endpoint: Endpoint,
    stream: bool,
    /// The answer came whole ([`AnswerNote::body`]): its first byte is timed at its end.
    whole: bool,
    failed: bool,
    abandoned: bool,
    /// The answer went to the client (the attempt was not given up for another).
    relayed: bool,
}

impl AnswerNote {
    pub fn status(&mut self, status: u16) {
        self.status = Some(status);
    }

    /// The answer is the client's: this attempt will not be retried elsewhere.
    pub fn relayed(&mut self) {
        self.relayed = true;
    }

    pub fn failed(&mut self) {
        self.failed = true;
    }

    /// The client went away before the answer ended.
    pub fn abandoned(&mut self) {
        self.abandoned = true;
    }

    /// A chunk of a relayed answer as it passes: the first one times the first byte, and
    /// any `"cached_tokens"` in it is read.
    pub fn chunk(&mut self, b: &[u8]) {
        let now = Instant::now();
        match self.last_chunk {
            None => self.first_byte = Some(now),
            Some(last) if self.stream => self
                .sink
                .0
                .metrics
                .route(self.endpoint)
                .between_chunks
                .observe(now.duration_since(last).as_secs_f64()),
            Some(_) => {}
        }
        self.last_chunk = Some(now);
        if let Some(n) = cached_tokens(b) {
            self.cached = Some(n);
        }
    }

    /// An answer read whole before it is relayed: its first byte and its end are the
    /// same moment, read once when the note is dropped.
    pub fn body(&mut self, b: &[u8]) {
        self.whole = true;
        self.cached = cached_tokens(b);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Drop for AnswerNote {
    fn drop(&mut self) {
        let now = Instant::now();
        let outcome = match (self.failed, self.status) {
            (true, _) | (false, None) => "failed",
            _ if self.abandoned => "abandoned",
            (false, Some(s)) if (200..300).contains(&s) => "ok",
            (false, Some(_)) => "error",
        };
        let first_byte = match self.first_byte {
            Some(t) => Some(t),
            None if self.whole => Some(now),
            None => None,
        };
        let answer = Ended {
            outcome,
            status: self.status,
            first_byte,
            end: now,
            cached: self.cached,
        };
        self.sink.ring().answer(self.slot, answer);
        if !self.relayed {
            return;
        }
        let m = &self.sink.0.metrics;
        let r = m.route(self.endpoint);
        r.duration
            .observe(now.duration_since(self.arrived).as_secs_f64());
        if self.stream
            && let Some(t) = first_byte
        {
            r.ttft.observe(t.duration_since(self.started).as_secs_f64());
        }
        if outcome == "ok" {
            m.cache_report(self.cached.is_some());
            if let Some(c) = self.cached {
                m.reported_cached.inc_by(c);
                m.predicted_cached.inc_by(self.predicted.unwrap_or(0));
            }
        }
    }
}

/// How far from its end an answer is searched first: engines put their usage last
/// (OpenAI's `usage`, SGLang's `meta_info`, a stream's last event) unless logprobs or
/// token ids follow it.
const TAIL: usize = 1024;

/// Where the last match in `b` starts: one call for an answer with none or one (an
/// iterator costs more than the search of a short answer).
fn last_key(finder: &memchr::memmem::Finder<'_>, b: &[u8]) -> Option<usize> {
    let mut at = finder.find(b)?;
    while let Some(i) = finder.find(&b[at + 1..]) {
        at += 1 + i;
    }
    Some(at)
}

/// The value of the last `"cached_tokens": N` in a JSON text. A quote inside a JSON string
/// is escaped, so generated text that mentions the key does not match.
pub fn cached_tokens(b: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"cached_tokens\"";
    // Built once (building one costs more than searching a short answer), and forward:
    // the forward search is vectorised, the reverse one four times slower per byte.
    static FINDER: LazyLock<memchr::memmem::Finder<'static>> =
        LazyLock::new(|| memchr::memmem::Finder::new(KEY));
    // The tail first: a long answer that reports its usage is not searched whole. The
    // rest ends where a key starting before the tail would end.
    let tail = b.len().saturating_sub(TAIL);
    let at = match last_key(&FINDER, &b[tail..]) {
        Some(i) => tail + i,
        None if tail == 0 => return None,
        None => last_key(&FINDER, &b[..tail + KEY.len() - 1])?,
    };
    let rest = &b[at + KEY.len()..];
    let rest = rest
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    let digits = rest.iter().take_while(|c| c.is_ascii_digit()).count();
    std::str::from_utf8(rest.get(..digits)?).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_tokens_are_read_from_usage_and_meta_info_but_not_from_text() {
        let usage =
            br#"data: {"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens": 7}}}"#;
        assert_eq!(cached_tokens(usage), Some(7));
        let meta = br#"{"text":"x","meta_info":{"cached_tokens":12,"id":"a"}}"#;
        assert_eq!(cached_tokens(meta), Some(12));
        let text = br#"{"choices":[{"text":"say \"cached_tokens\": 5"}]}"#;
        assert_eq!(cached_tokens(text), None);
        assert_eq!(
            cached_tokens(br#"{"prompt_tokens_details":{"cached_tokens":null}}"#),
            None
        );
        assert_eq!(cached_tokens(b"no usage here"), None);
    }

    #[test]
    fn the_last_cached_tokens_is_read_wherever_it_lies_from_the_tail() {
        let key = br#""cached_tokens":"#;
        // The last key starting at every place around the tail's edge, with an earlier
        // key far before it and filler after it.
        for after in [
            0,
            1,
            TAIL - key.len() - 3,
            TAIL - 5,
            TAIL - 1,
            TAIL,
            TAIL + 7,
            3000,
        ] {
            let mut b = br#"{"meta_info":{"cached_tokens":1},"x":""#.to_vec();
            b.extend(std::iter::repeat_n(b'a', 4000));
            b.extend_from_slice(br#"","usage":{"cached_tokens":42}"#);
            b.extend(std::iter::repeat_n(b' ', after));
            assert_eq!(cached_tokens(&b), Some(42), "{after} bytes after");
        }
        // Only the early one: found by the forward search.
        let mut b = br#"{"cached_tokens":3,"x":""#.to_vec();
        b.extend(std::iter::repeat_n(b'a', 5000));
        assert_eq!(cached_tokens(&b), Some(3));
        assert_eq!(cached_tokens(b""), None);
    }

    fn decided(request_id: &Arc<str>) -> Decided<'_> {
        Decided {
            request_id,
            model: None,
            endpoint: Endpoint::Completions,
            attempt: 1,
            worker_url: WorkerUrl::parse("http://w:1").unwrap(),
            text: true,
            bytes_per_token: 4.0,
            arrived: Instant::now(),
            stream: false,
        }
    }

    fn seqs(records: &[DecisionRecord]) -> Vec<u64> {
        records.iter().map(|r| r.seq).collect()
    }

    #[test]
    fn the_ring_keeps_the_newest_and_answers_after_a_sequence_number() {
        let sink = DecisionSink::new(3, Arc::new(Metrics::default()));
        let d = Decision::simple(WorkerId(1), kvgate_policies::DecisionPath::Load);
        let mut notes: Vec<AnswerNote> = (0..5)
            .map(|_| sink.decided(&mut d.clone(), decided(&Arc::from("r"))))
            .collect();
        notes[4].status(200);
        drop(notes);
        let all = sink.read(10, None);
        assert_eq!(seqs(&all), vec![3, 4, 5]);
        let outcomes: Vec<_> = all
            .iter()
            .map(|r| r.answer.as_ref().map(|a| a.outcome))
            .collect();
        assert_eq!(outcomes, [Some("failed"), Some("failed"), Some("ok")]);
        assert_eq!(seqs(&sink.read(1, Some(3))), vec![4]);
        assert_eq!(seqs(&sink.read(1, None)), vec![5]);
        // Wrapping round again keeps the order, oldest first.
        for _ in 0..4 {
            drop(sink.decided(&mut d.clone(), decided(&Arc::from("s"))));
        }
        assert_eq!(seqs(&sink.read(10, None)), vec![7, 8, 9]);
        assert_eq!(seqs(&sink.read(2, Some(7))), vec![8, 9]);
        assert_eq!(sink.paths_within(Duration::from_secs(60)), [("load", 3)]);
    }

    #[test]
    fn an_answer_whose_slot_was_taken_is_dropped_and_a_record_has_its_time() {
        let sink = DecisionSink::new(2, Arc::new(Metrics::default()));
        let d = Decision::simple(WorkerId(1), kvgate_policies::DecisionPath::Hit);
        let mut late = sink.decided(&mut d.clone(), decided(&Arc::from("late")));
        late.status(200);
        drop(sink.decided(&mut d.clone(), decided(&Arc::from("a"))));
        drop(sink.decided(&mut d.clone(), decided(&Arc::from("b"))));
        drop(late);
        let all = sink.read(10, None);
        assert_eq!(seqs(&all), vec![2, 3]);
        assert!(all.iter().all(|r| r.request_id.as_str() != "late"));
        assert_eq!(all[0].request_id.as_str(), "a");
        let now_ms = (kvgate_core::clock::unix_now() * 1000.0) as u64;
        for r in &all {
            assert!(
                r.time_unix_ms.abs_diff(now_ms) < 5_000,
                "{}",
                r.time_unix_ms
            );
            assert_eq!(r.route, "/v1/completions");
        }
    }
}
