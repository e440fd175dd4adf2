//! The decision log: a bounded ring of the most recent routing decisions and what came of
//! them, for `GET /admin/decisions`. The HTTP side adds each attempt's decision when its
//! worker is chosen and the answer's figures (time to first byte, the cached tokens the
//! engine reported) when the response ends. The ring sits behind a mutex held for a push
//! or an update, not in an actor: two messages per request to another thread cost more
//! than the whole record (`docs/benchmarks.md`, proxy overhead).

use std::collections::VecDeque;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use kvgate_policies::{Decision, RoutingText, WorkerId};
use kvgate_poller::WorkerUrl;

use crate::metrics::Metrics;
use serde::{Serialize, Serializer};

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

/// One attempt's decision.
#[derive(Debug, Clone, Serialize)]
pub struct DecisionRecord {
    pub seq: u64,
    pub time_unix_ms: u64,
    #[serde(serialize_with = "text")]
    pub request_id: Arc<str>,
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
pub struct Decided {
    pub request_id: Arc<str>,
    pub model: Option<Arc<str>>,
    pub route: &'static str,
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

impl DecisionRecord {
    pub fn new(seq: u64, d: &Decision, at: Decided) -> DecisionRecord {
        let chosen = d.chosen();
        let predicted = chosen.and_then(|c| c.matched).map(|units| {
            if at.text {
                (units as f64 / at.bytes_per_token.max(f64::MIN_POSITIVE)).floor() as u64
            } else {
                units as u64
            }
        });
        let mut candidates: Vec<&kvgate_policies::CandidateScore> = d.candidates.iter().collect();
        candidates.sort_by(|a, b| {
            let key = |c: &kvgate_policies::CandidateScore| c.score.unwrap_or(f64::INFINITY);
            key(a).total_cmp(&key(b))
        });
        DecisionRecord {
            seq,
            time_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |t| t.as_millis() as u64),
            request_id: at.request_id.clone(),
            model: at.model,
            route: at.route,
            attempt: at.attempt,
            worker: at.worker_url,
            worker_id: d.worker,
            path: d.path.name(),
            rule: d.rule,
            notes: d.notes.iter().map(|n| n.name()).collect(),
            match_rate: d.match_rate,
            predicted_cached_tokens: predicted,
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
            answer: None,
        }
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

fn text<S: Serializer>(t: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(t)
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

/// The ring.
#[derive(Debug)]
struct Ring {
    records: VecDeque<DecisionRecord>,
    cap: usize,
    next: u64,
}

impl Ring {
    fn push(&mut self, seq_of: impl FnOnce(u64) -> DecisionRecord) -> u64 {
        let seq = self.next;
        self.next += 1;
        if self.records.len() == self.cap {
            self.records.pop_front();
        }
        self.records.push_back(seq_of(seq));
        seq
    }

    fn answer(&mut self, seq: u64, answer: LoggedAnswer) {
        // Records are in sequence order: the answer's record is found by position.
        let Some(first) = self.records.front().map(|r| r.seq) else {
            return;
        };
        if let Some(r) = seq
            .checked_sub(first)
            .and_then(|i| self.records.get_mut(i as usize))
        {
            r.answer = Some(answer);
        }
    }

    /// The newest `limit`, or with `since` the first `limit` after it: following pages
    /// forward from the oldest unseen.
    fn read(&self, limit: usize, since: Option<u64>) -> Vec<DecisionRecord> {
        let after = self
            .records
            .iter()
            .filter(|r| since.is_none_or(|s| r.seq > s));
        let skip = match since {
            Some(_) => 0,
            None => self.records.len().saturating_sub(limit),
        };
        after.skip(skip).take(limit).cloned().collect()
    }
}

/// The decision log, shared by every HTTP thread; it also feeds the answer metrics.
#[derive(Debug, Clone)]
pub struct DecisionSink {
    ring: Arc<Mutex<Ring>>,
    metrics: Arc<Metrics>,
}

impl DecisionSink {
    /// A log keeping the last `cap` decisions.
    pub fn new(cap: usize, metrics: Arc<Metrics>) -> DecisionSink {
        DecisionSink {
            metrics,
            ring: Arc::new(Mutex::new(Ring {
                records: VecDeque::with_capacity(cap.clamp(1, DECISION_LOG_SIZE)),
                cap: cap.max(1),
                next: 1,
            })),
        }
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        // A panic while holding the lock leaves a ring that is still whole.
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Logs `d` and returns the note that reports its answer when dropped.
    pub fn decided(&self, d: &Decision, at: Decided) -> AnswerNote {
        let (route, arrived, stream) = (at.route, at.arrived, at.stream);
        let mut predicted = None;
        let seq = self.ring().push(|seq| {
            let r = DecisionRecord::new(seq, d, at);
            predicted = r.predicted_cached_tokens;
            r
        });
        AnswerNote {
            sink: self.clone(),
            seq,
            route,
            arrived,
            started: Instant::now(),
            stream,
            first_byte: None,
            last_chunk: None,
            status: None,
            failed: false,
            abandoned: false,
            relayed: false,
            predicted,
            cached: None,
        }
    }

    /// Logged decisions, oldest first: the newest `limit`, or with `since` the first
    /// `limit` after that sequence number.
    pub fn read(&self, limit: usize, since: Option<u64>) -> Vec<DecisionRecord> {
        self.ring().read(limit, since)
    }

    /// Logged decisions per path made since `since_unix_ms` (as far back as the ring goes).
    pub fn paths_since(&self, since_unix_ms: u64) -> Vec<(&'static str, u64)> {
        let mut out: Vec<(&'static str, u64)> = Vec::new();
        for r in self
            .ring()
            .records
            .iter()
            .filter(|r| r.time_unix_ms >= since_unix_ms)
        {
            let path = if r.attempt > 1 { "retry" } else { r.path };
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
            .records
            .iter()
            .rev()
            .filter_map(|r| r.answer.as_ref().and_then(|a| a.ttft_ms))
            .take(n)
            .collect()
    }
}

/// Collects what a response shows of its decision and reports it when dropped, however the
/// response ended.
#[derive(Debug)]
pub struct AnswerNote {
    sink: DecisionSink,
    seq: u64,
    route: &'static str,
    arrived: Instant,
    started: Instant,
    stream: bool,
    first_byte: Option<f64>,
    last_chunk: Option<Instant>,
    status: Option<u16>,
    failed: bool,
    abandoned: bool,
    /// The answer went to the client (the attempt was not given up for another).
    relayed: bool,
    predicted: Option<u64>,
    cached: Option<u64>,
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

    /// A chunk of the answer as it passes: the first one times the first byte, and any
    /// `"cached_tokens"` in it is read.
    pub fn chunk(&mut self, b: &[u8]) {
        let now = Instant::now();
        match self.last_chunk {
            None => self.first_byte = Some(now.duration_since(self.started).as_secs_f64() * 1000.0),
            Some(last) if self.stream => {
                if let Some(r) = self.sink.metrics.route(self.route) {
                    r.between_chunks
                        .observe(now.duration_since(last).as_secs_f64());
                }
            }
            Some(_) => {}
        }
        self.last_chunk = Some(now);
        if let Some(n) = cached_tokens(b) {
            self.cached = Some(n);
        }
    }
}

impl Drop for AnswerNote {
    fn drop(&mut self) {
        let outcome = match (self.failed, self.status) {
            (true, _) | (false, None) => "failed",
            _ if self.abandoned => "abandoned",
            (false, Some(s)) if (200..300).contains(&s) => "ok",
            (false, Some(_)) => "error",
        };
        let answer = LoggedAnswer {
            outcome,
            status: self.status,
            ttft_ms: self.first_byte,
            latency_ms: self.started.elapsed().as_secs_f64() * 1000.0,
            reported_cached_tokens: self.cached,
        };
        self.sink.ring().answer(self.seq, answer);
        if !self.relayed {
            return;
        }
        let m = &self.sink.metrics;
        if let Some(r) = m.route(self.route) {
            r.duration.observe(self.arrived.elapsed().as_secs_f64());
            if let (true, Some(ms)) = (self.stream, self.first_byte) {
                r.ttft.observe(ms / 1000.0);
            }
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

/// The value of the last `"cached_tokens": N` in a JSON text. A quote inside a JSON string
/// is escaped, so generated text that mentions the key does not match.
pub fn cached_tokens(b: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"cached_tokens\"";
    // Built once (building one costs more than searching a short chunk), and forward:
    // the forward search is vectorised, the reverse one is not.
    static FINDER: LazyLock<memchr::memmem::Finder<'static>> =
        LazyLock::new(|| memchr::memmem::Finder::new(KEY));
    let at = FINDER.find_iter(b).last()?;
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
    fn the_ring_keeps_the_newest_and_answers_after_a_sequence_number() {
        let sink = DecisionSink::new(3, Arc::new(Metrics::default()));
        let d = Decision::simple(WorkerId(1), kvgate_policies::DecisionPath::Load);
        let at = Decided {
            request_id: Arc::from("r"),
            model: None,
            route: "/v1/completions",
            attempt: 1,
            worker_url: WorkerUrl::parse("http://w:1").unwrap(),
            text: true,
            bytes_per_token: 4.0,
            arrived: Instant::now(),
            stream: false,
        };
        let mut notes: Vec<AnswerNote> = (0..5).map(|_| sink.decided(&d, at.clone())).collect();
        notes[4].status(200);
        drop(notes);
        let all = sink.read(10, None);
        assert_eq!(all.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![3, 4, 5]);
        let outcomes: Vec<_> = all
            .iter()
            .map(|r| r.answer.as_ref().map(|a| a.outcome))
            .collect();
        assert_eq!(outcomes, [Some("failed"), Some("failed"), Some("ok")]);
        let after = sink.read(1, Some(3));
        assert_eq!(after.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![4]);
        let newest = sink.read(1, None);
        assert_eq!(newest.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![5]);
    }
}
