//! Which worker keeps which Responses answer: an engine stores a response's state, and a
//! request that continues it (`previous_response_id`) can only be served there. The id is
//! read from the first bytes of each answer as it is relayed (the answer itself passes
//! unchanged) and kept in a bounded map, oldest out first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

/// Answers remembered; about 100 bytes each.
pub(crate) const MAX_ANSWERS: usize = 65_536;

/// Bytes of an answer searched for its id: a Responses answer names it first (streamed,
/// in the `response.created` event).
const SEARCHED: usize = 8 * 1024;

/// Response id → the URL of the worker that gave it.
#[derive(Debug, Default)]
pub(crate) struct ResponseIds {
    inner: Mutex<Ids>,
}

#[derive(Debug, Default)]
struct Ids {
    by_id: HashMap<Box<str>, Arc<str>>,
    order: VecDeque<Box<str>>,
}

impl ResponseIds {
    pub(crate) fn insert(&self, id: &str, worker: &str) {
        let mut ids = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if ids.by_id.insert(id.into(), worker.into()).is_none() {
            ids.order.push_back(id.into());
        }
        while ids.order.len() > MAX_ANSWERS {
            if let Some(old) = ids.order.pop_front() {
                ids.by_id.remove(&old);
            }
        }
    }

    /// The worker that gave answer `id`, if it is remembered.
    pub(crate) fn worker_of(&self, id: &str) -> Option<Arc<str>> {
        let ids = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        ids.by_id.get(id).cloned()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_id
            .len()
    }
}

/// Looks for the first `"id": "…"` of an answer in its first [`SEARCHED`] bytes, fed in
/// chunks as they are relayed.
#[derive(Debug)]
pub(crate) struct IdCatcher {
    ids: Arc<ResponseIds>,
    worker: Arc<str>,
    seen: Vec<u8>,
    done: bool,
}

impl IdCatcher {
    pub(crate) fn new(ids: Arc<ResponseIds>, worker: &str) -> IdCatcher {
        IdCatcher {
            ids,
            worker: worker.into(),
            seen: Vec::new(),
            done: false,
        }
    }

    /// The next bytes of the answer; once its id is found, it is remembered.
    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        if self.done {
            return;
        }
        let take = chunk.len().min(SEARCHED - self.seen.len());
        self.seen.extend_from_slice(&chunk[..take]);
        if let Some(id) = first_id(&self.seen) {
            self.ids.insert(id, &self.worker);
            self.done = true;
        } else if self.seen.len() >= SEARCHED {
            self.done = true;
        }
        if self.done {
            self.seen = Vec::new();
        }
    }
}

/// The value of the first complete `"id"` member in `b` (a plain string of at most 256
/// bytes, as response ids are).
fn first_id(b: &[u8]) -> Option<&str> {
    let mut from = 0;
    while let Some(at) = memchr::memmem::find(&b[from..], b"\"id\"") {
        let mut i = from + at + 4;
        from = i;
        while b.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        if b.get(i) != Some(&b':') {
            continue;
        }
        i += 1;
        while b.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        if b.get(i) != Some(&b'"') {
            continue;
        }
        let start = i + 1;
        let len = memchr::memchr2(b'"', b'\\', b.get(start..)?)?;
        if b[start + len] != b'"' || len == 0 || len > 256 {
            return None;
        }
        return std::str::from_utf8(&b[start..start + len]).ok();
    }
    None
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{IdCatcher, MAX_ANSWERS, ResponseIds, first_id};

    #[test]
    fn the_first_id_is_read_plain_or_streamed() {
        assert_eq!(
            first_id(br#"{"id":"resp_1","object":"response"}"#),
            Some("resp_1")
        );
        let streamed = b"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\" : \"resp_abc\",\"output\":[]}}\n\n";
        assert_eq!(first_id(streamed), Some("resp_abc"));
        assert_eq!(first_id(br#"{"identity":1,"id":"x"}"#), Some("x"));
        assert_eq!(first_id(br#"{"id":"unfinished"#), None);
        assert_eq!(first_id(br#"{"id":12}"#), None);
    }

    #[test]
    fn an_id_cut_between_chunks_is_caught() {
        let ids = Arc::new(ResponseIds::default());
        let mut c = IdCatcher::new(ids.clone(), "http://a:1");
        c.feed(br#"{"id":"resp_"#);
        assert_eq!(ids.worker_of("resp_"), None);
        c.feed(br#"42","object":"response"}"#);
        assert_eq!(ids.worker_of("resp_42").as_deref(), Some("http://a:1"));
    }

    #[test]
    fn the_oldest_answers_go_first() {
        let ids = ResponseIds::default();
        for i in 0..MAX_ANSWERS + 10 {
            ids.insert(&format!("r{i}"), "http://a:1");
        }
        assert_eq!(ids.len(), MAX_ANSWERS);
        assert_eq!(ids.worker_of("r0"), None);
        assert!(ids.worker_of(&format!("r{}", MAX_ANSWERS + 9)).is_some());
    }
}
