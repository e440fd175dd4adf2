//! A rank's page-granular prefix cache with LRU eviction.
//!
//! A page is `page_size` tokens keyed by a hash chained to its parent page, so a key names the
//! whole prefix up to that page. Touching a prefix stamps every page on it with one tick, so a
//! parent is never older than its children; ties evict the deeper page first. Eviction
//! therefore only ever removes leaves and a cached prefix stays reachable from its root.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};

use xxhash_rust::xxh3::Xxh3;

#[derive(Debug)]
pub(crate) struct PrefixCache {
    page_size: usize,
    capacity_pages: usize,
    pages: HashMap<u64, Page>,
    /// Eviction order: oldest tick first, deeper first within a tick.
    lru: BTreeSet<(u64, Reverse<usize>, u64)>,
    tick: u64,
}

#[derive(Debug, Clone, Copy)]
struct Page {
    last_used: u64,
    depth: usize,
}

impl PrefixCache {
    pub(crate) fn new(page_size: usize, capacity_tokens: usize) -> Self {
        Self {
            page_size,
            capacity_pages: capacity_tokens / page_size.max(1),
            pages: HashMap::new(),
            lru: BTreeSet::new(),
            tick: 0,
        }
    }

    /// Cached tokens at the start of `tokens` (whole pages), without touching the LRU order.
    pub(crate) fn peek(&self, tokens: &[u32]) -> usize {
        self.page_keys(tokens)
            .take_while(|key| self.pages.contains_key(key))
            .count()
            * self.page_size
    }

    /// Cached tokens at the start of `tokens`; marks the matched pages as just used.
    pub(crate) fn match_prefix(&mut self, tokens: &[u32]) -> usize {
        self.tick += 1;
        let keys: Vec<u64> = self
            .page_keys(tokens)
            .take_while(|key| self.pages.contains_key(key))
            .collect();
        for &key in &keys {
            self.touch(key);
        }
        keys.len() * self.page_size
    }

    /// Stores every whole page of `tokens`, then evicts least recently used pages beyond capacity.
    pub(crate) fn insert(&mut self, tokens: &[u32]) {
        self.tick += 1;
        let keys: Vec<u64> = self.page_keys(tokens).collect();
        for (depth, key) in keys.into_iter().enumerate() {
            if self.pages.contains_key(&key) {
                self.touch(key);
            } else {
                let page = Page {
                    last_used: self.tick,
                    depth,
                };
                self.pages.insert(key, page);
                self.lru.insert((page.last_used, Reverse(depth), key));
            }
        }
        while self.pages.len() > self.capacity_pages {
            let Some((_, _, key)) = self.lru.pop_first() else {
                break;
            };
            self.pages.remove(&key);
        }
    }

    pub(crate) fn clear(&mut self) {
        self.pages.clear();
        self.lru.clear();
    }

    /// Tokens resident in the cache.
    pub(crate) fn tokens(&self) -> usize {
        self.pages.len() * self.page_size
    }

    fn touch(&mut self, key: u64) {
        if let Some(page) = self.pages.get_mut(&key) {
            self.lru.remove(&(page.last_used, Reverse(page.depth), key));
            page.last_used = self.tick;
            self.lru.insert((page.last_used, Reverse(page.depth), key));
        }
    }

    /// Chained keys of the whole pages of `tokens`.
    fn page_keys<'a>(&self, tokens: &'a [u32]) -> impl Iterator<Item = u64> + 'a {
        let mut parent = 0u64;
        tokens.chunks_exact(self.page_size).map(move |page| {
            let mut hasher = Xxh3::with_seed(parent);
            for token in page {
                hasher.update(&token.to_le_bytes());
            }
            parent = hasher.digest();
            parent
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(start: u32, len: u32) -> Vec<u32> {
        (start..start + len).collect()
    }

    #[test]
    fn matches_whole_pages_of_a_stored_prefix() {
        let mut cache = PrefixCache::new(4, 64);
        let prompt = seq(0, 10);
        assert_eq!(cache.match_prefix(&prompt), 0);
        cache.insert(&prompt);
        assert_eq!(cache.tokens(), 8);
        assert_eq!(cache.match_prefix(&prompt), 8);
        assert_eq!(cache.peek(&seq(0, 6)), 4);
        // Same tokens after a different first page share nothing: keys are chained.
        let mut other = seq(100, 4);
        other.extend(seq(4, 4));
        assert_eq!(cache.peek(&other), 0);
    }

    #[test]
    fn evicts_least_recently_used_prefix_first() {
        let mut cache = PrefixCache::new(4, 16);
        let (a, b, c) = (seq(0, 8), seq(100, 8), seq(200, 8));
        cache.insert(&a);
        cache.insert(&b);
        assert_eq!(cache.match_prefix(&a), 8); // a is now the most recent
        cache.insert(&c);
        assert_eq!(cache.tokens(), 16);
        assert_eq!(cache.peek(&a), 8);
        assert_eq!(cache.peek(&b), 0);
        assert_eq!(cache.peek(&c), 8);
    }

    #[test]
    fn eviction_trims_leaves_and_keeps_prefixes_reachable() {
        let mut cache = PrefixCache::new(4, 12);
        cache.insert(&seq(0, 20)); // five pages into room for three
        assert_eq!(cache.peek(&seq(0, 20)), 12);
        cache.clear();
        assert_eq!(cache.tokens(), 0);
        assert_eq!(cache.peek(&seq(0, 20)), 0);
    }
}
