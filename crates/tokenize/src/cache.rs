//! Token ids of text segments already encoded, bounded by the tokens held.
//!
//! Two generations: lookups read the current one, then the previous one (and bring a hit
//! forward); when the current one holds half the budget it becomes the previous one and
//! the old previous one is dropped. What is used stays, what is not ages out in two turns,
//! without a list to keep in order on every hit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// A segment's key: its bytes' 128-bit hash and its length.
pub(crate) type Key = (u128, usize);

pub(crate) fn key(flag: u8, text: &str) -> Key {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&[flag]);
    h.update(text.as_bytes());
    (h.digest128(), text.len())
}

#[derive(Debug, Default)]
struct Generations {
    current: HashMap<Key, Arc<[u32]>>,
    current_tokens: usize,
    previous: HashMap<Key, Arc<[u32]>>,
    hits: u64,
    misses: u64,
}

/// What the cache holds and how often it answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub entries: usize,
    pub hits: u64,
    pub misses: u64,
}

#[derive(Debug)]
pub(crate) struct SegmentCache {
    inner: Mutex<Generations>,
    /// Tokens one generation may hold.
    half: usize,
}

impl SegmentCache {
    pub(crate) fn new(max_tokens: usize) -> SegmentCache {
        SegmentCache {
            inner: Mutex::new(Generations::default()),
            half: (max_tokens / 2).max(1),
        }
    }

    pub(crate) fn get(&self, k: &Key) -> Option<Arc<[u32]>> {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ids) = g.current.get(k).cloned() {
            g.hits += 1;
            return Some(ids);
        }
        match g.previous.remove(k) {
            Some(ids) => {
                g.hits += 1;
                Self::put(&mut g, self.half, *k, ids.clone());
                Some(ids)
            }
            None => {
                g.misses += 1;
                None
            }
        }
    }

    pub(crate) fn insert(&self, k: Key, ids: Arc<[u32]>) {
        if ids.len() > self.half {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        Self::put(&mut g, self.half, k, ids);
    }

    fn put(g: &mut Generations, half: usize, k: Key, ids: Arc<[u32]>) {
        if g.current_tokens + ids.len() > half {
            g.previous = std::mem::take(&mut g.current);
            g.current_tokens = 0;
        }
        g.current_tokens += ids.len();
        if let Some(old) = g.current.insert(k, ids) {
            g.current_tokens -= old.len();
        }
    }

    pub(crate) fn stats(&self) -> CacheStats {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        CacheStats {
            entries: g.current.len() + g.previous.len(),
            hits: g.hits,
            misses: g.misses,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u32) -> Arc<[u32]> {
        (0..n).collect::<Vec<_>>().into()
    }

    #[test]
    fn what_is_used_stays_and_the_rest_ages_out_within_the_budget() {
        let c = SegmentCache::new(20);
        let (a, b) = (key(0, "a"), key(0, "b"));
        c.insert(a, ids(6));
        c.insert(b, ids(4));
        // The current generation is full (10 of 10): the next insert turns it over.
        c.insert(key(0, "c"), ids(5));
        assert!(c.get(&a).is_some(), "a was in the previous generation");
        // b was never read again: two turnovers drop it.
        c.insert(key(0, "d"), ids(9));
        c.insert(key(0, "e"), ids(9));
        assert!(c.get(&b).is_none());
        assert_eq!(c.stats().hits, 1);
        assert_eq!(c.stats().misses, 1);
    }

    #[test]
    fn a_segment_over_half_the_budget_is_not_kept_and_keys_tell_flags_apart() {
        let c = SegmentCache::new(10);
        c.insert(key(0, "big"), ids(6));
        assert!(c.get(&key(0, "big")).is_none());
        c.insert(key(0, "x"), ids(1));
        assert!(c.get(&key(1, "x")).is_none());
    }
}
