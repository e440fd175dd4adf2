//! What an answer tells about its decision: the time to its first byte, its status, and
//! the cached tokens the engine reported, filled in as the answer is relayed.

use std::sync::LazyLock;
use std::time::Instant;

use kvgate_core::Endpoint;

use super::{DecisionSink, Ended, Slot};

/// Collects what a response shows of its decision and reports it when dropped, however the
/// response ended.
#[derive(Debug)]
pub(crate) struct AnswerNote {
    pub(super) sink: DecisionSink,
    pub(super) slot: Slot,
    pub(super) started: Instant,
    pub(super) arrived: Instant,
    pub(super) first_byte: Option<Instant>,
    pub(super) last_chunk: Option<Instant>,
    pub(super) predicted: Option<u64>,
    pub(super) worker: Option<kvgate_policies::WorkerId>,
    pub(super) cached: Option<u64>,
    /// The prompt's tokens as the answer's usage gives them (read for the access log only).
    pub(super) prompt_tokens: Option<u64>,
    /// Whether this answer gets an access-log line: the log is on and its level passes,
    /// decided once so an answer whose line would be filtered out is never searched for it.
    pub(super) log_access: bool,
    pub(super) status: Option<u16>,
    pub(super) endpoint: Endpoint,
    pub(super) stream: bool,
    /// The answer came whole ([`AnswerNote::body`]): its first byte is timed at its end.
    pub(super) whole: bool,
    pub(super) failed: bool,
    pub(super) abandoned: bool,
    /// The answer went to the client (the attempt was not given up for another).
    pub(super) relayed: bool,
}

impl AnswerNote {
    pub(crate) fn status(&mut self, status: u16) {
        self.status = Some(status);
    }

    /// The answer is the client's: this attempt will not be retried elsewhere.
    pub(crate) fn relayed(&mut self) {
        self.relayed = true;
    }

    pub(crate) fn failed(&mut self) {
        self.failed = true;
    }

    /// The client went away before the answer ended.
    pub(crate) fn abandoned(&mut self) {
        self.abandoned = true;
    }

    /// A chunk of a relayed answer as it passes: the first one times the first byte, and
    /// any `"cached_tokens"` in it is read.
    pub(crate) fn chunk(&mut self, b: &[u8]) {
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
        let (cached, prompt) = usage_keys(self.endpoint);
        if let Some(n) = usage_number(b, cached) {
            self.cached = Some(n);
        }
        if self.log_access
            && let Some(n) = usage_number(b, prompt)
        {
            self.prompt_tokens = Some(n);
        }
    }

    /// An answer read whole before it is relayed: its first byte and its end are the
    /// same moment, read once when the note is dropped.
    pub(crate) fn body(&mut self, b: &[u8]) {
        self.whole = true;
        let (cached, prompt) = usage_keys(self.endpoint);
        self.cached = usage_number(b, cached);
        if self.log_access {
            self.prompt_tokens = usage_number(b, prompt);
        }
    }
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
        let access = (self.sink.ring()).answer(self.slot, answer, self.relayed && self.log_access);
        if !self.relayed {
            return;
        }
        if let Some(a) = access {
            // Written after the ring's lock is let go.
            tracing::info!(
                target: "kvgate::access",
                request_id = a.request_id.as_str(),
                route = a.route,
                model = a.model.as_deref().unwrap_or(""),
                worker = %a.worker,
                path = a.path,
                status = self.status,
                ttft_ms = a.ttft_ms,
                duration_ms = super::ms(now.duration_since(self.arrived)),
                prompt_tokens = self.prompt_tokens,
                cached_tokens = self.cached,
                retries = a.retries,
                "answered"
            );
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
            let reporters = &self.sink.0.reporters;
            let reported = match (self.cached, self.worker) {
                (Some(c), Some(w)) => {
                    let known = (reporters.read())
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .contains(&w);
                    if !known {
                        (reporters.write())
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .insert(w);
                    }
                    Some(c)
                }
                (Some(c), None) => Some(c),
                // A reporting engine that left the figure out had nothing cached: the
                // prediction counts against zero, so the ratio shows the index's misses.
                (None, Some(w)) => (reporters.read())
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .contains(&w)
                    .then_some(0),
                (None, None) => None,
            };
            if let Some(c) = reported {
                m.reported_cached.inc_by(c);
                m.predicted_cached.inc_by(self.predicted.unwrap_or(0));
            }
        }
    }
}

/// How far from its end an answer is searched first: engines put their usage last
/// (OpenAI's `usage`, SGLang's `meta_info`, a stream's last event) unless logprobs or
/// token ids follow it.
pub(super) const TAIL: usize = 1024;

/// Where the last match in `b` starts: one call for an answer with none or one (an
/// iterator costs more than the search of a short answer).
fn last_key(finder: &memchr::memmem::Finder<'_>, b: &[u8]) -> Option<usize> {
    let mut at = finder.find(b)?;
    while let Some(i) = finder.find(&b[at + 1..]) {
        at += 1 + i;
    }
    Some(at)
}

// Built once (building one costs more than searching a short answer), and forward: the
// forward search is vectorised, the reverse one four times slower per byte.
static CACHED_TOKENS: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(b"\"cached_tokens\""));
static PROMPT_TOKENS: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(b"\"prompt_tokens\""));

static INPUT_TOKENS: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(b"\"input_tokens\""));
static CACHE_READ_TOKENS: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(b"\"cache_read_input_tokens\""));

/// The usage keys of a route's answers, cached then prompt tokens: OpenAI's and SGLang's
/// (`cached_tokens`, `prompt_tokens`), the Responses API's (`cached_tokens` in
/// `input_tokens_details`, `input_tokens`) and the Messages API's
/// (`cache_read_input_tokens`, `input_tokens`).
fn usage_keys(
    endpoint: Endpoint,
) -> (
    &'static memchr::memmem::Finder<'static>,
    &'static memchr::memmem::Finder<'static>,
) {
    match endpoint {
        Endpoint::Responses => (&CACHED_TOKENS, &INPUT_TOKENS),
        Endpoint::Messages => (&CACHE_READ_TOKENS, &INPUT_TOKENS),
        _ => (&CACHED_TOKENS, &PROMPT_TOKENS),
    }
}

/// The value of the last `"cached_tokens": N` in a JSON text. A quote inside a JSON string
/// is escaped, so generated text that mentions the key does not match.
#[cfg(test)]
pub(super) fn cached_tokens(b: &[u8]) -> Option<u64> {
    usage_number(b, &CACHED_TOKENS)
}

/// The value of the last `"<key>": N` in a JSON text, the key being what `finder` finds.
fn usage_number(b: &[u8], finder: &memchr::memmem::Finder<'_>) -> Option<u64> {
    let key_len = finder.needle().len();
    // The tail first: a long answer that reports its usage is not searched whole. The
    // rest ends where a key starting before the tail would end.
    let tail = b.len().saturating_sub(TAIL);
    let at = match last_key(finder, &b[tail..]) {
        Some(i) => tail + i,
        None if tail == 0 => return None,
        None => last_key(finder, &b[..tail + key_len - 1])?,
    };
    let rest = &b[at + key_len..];
    let rest = rest
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    let digits = rest.iter().take_while(|c| c.is_ascii_digit()).count();
    std::str::from_utf8(rest.get(..digits)?).ok()?.parse().ok()
}
