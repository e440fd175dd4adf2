//! The hash index (`--cache-index hash`): affinity by hashed token heads at fixed
//! boundaries, with no tree.
//!
//! A key is `(boundary, xxh3(namespace seed, tokens[..boundary]))`; its value is at most
//! `max_holders` tenants with their last touch. Holders expire after `ttl`; unlike the
//! reference there is also a bound on keys: recording a new key at capacity drops the key
//! touched least recently (O(1), keys sit on a recency list).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::mem;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use crate::error::SnapshotError;
use crate::lru::NIL;
use crate::snapshot::SNAPSHOT_VERSION;
use crate::tree::TenantId;

#[cfg(test)]
mod tests;

/// Hash-mode settings. `ttl` is in the unit of the `now` the caller passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashConfig {
    /// Token positions to hash at; cleaned on construction (zeros dropped, sorted,
    /// deduplicated).
    pub boundaries: Vec<usize>,
    /// A holder is live while `now − last_touch ≤ ttl`.
    pub ttl: u64,
    /// Holders per key; recording one more drops the stalest.
    pub max_holders: usize,
    /// Keys kept; recording a new key at capacity drops the stalest key. `None`: no bound.
    pub max_keys: Option<usize>,
}

impl HashConfig {
    /// `boundaries` and `ttl`, with 3 holders per key and at most 2^20 keys.
    pub fn new(boundaries: Vec<usize>, ttl: u64) -> Self {
        Self {
            boundaries,
            ttl,
            max_holders: 3,
            max_keys: Some(1 << 20),
        }
    }
}

/// The result of a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashProbe<T> {
    /// Boundaries the request reaches (0: too short or untokenized; nothing is recorded).
    pub applicable: usize,
    /// The deepest boundary with a live holder.
    pub boundary: Option<usize>,
    /// Live holders at that boundary, least recently recorded first.
    pub holders: Vec<T>,
}

/// What a sweep or a purge removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepStats {
    pub holders: usize,
    pub keys: usize,
}

/// A whole hash index, serde-encoded (postcard). Ages are `clock − last_touch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashSnapshot<T> {
    pub version: u32,
    /// Stalest key first.
    pub records: Vec<HashRecord<T>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashRecord<T> {
    pub boundary: usize,
    pub hash: u64,
    pub holders: Vec<(T, u64)>,
}

type Key = (usize, u64);
type Holders<T> = Vec<(T, u64)>;

/// Keys are already xxh3 output; this only folds the boundary in.
#[derive(Debug, Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(23) ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

#[derive(Debug, Clone)]
struct Slot<T> {
    key: Key,
    holders: Holders<T>,
    prev: u32,
    next: u32,
}

/// The hash-mode affinity index for one model.
#[derive(Debug, Clone)]
pub struct HashIndex<T> {
    config: HashConfig,
    map: HashMap<Key, u32, BuildHasherDefault<KeyHasher>>,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    /// Recency list of keys, stalest at `head`.
    head: u32,
    tail: u32,
    holders: usize,
    clock: u64,
    keys: Vec<Key>,
}

impl<T: TenantId> HashIndex<T> {
    pub fn new(mut config: HashConfig) -> Self {
        config.boundaries.retain(|&b| b > 0);
        config.boundaries.sort_unstable();
        config.boundaries.dedup();
        Self {
            config,
            map: HashMap::default(),
            slots: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            holders: 0,
            clock: 0,
            keys: Vec::new(),
        }
    }

    /// The cleaned configuration.
    pub fn config(&self) -> &HashConfig {
        &self.config
    }

    /// Live holders at the deepest applicable boundary that has any. Expired holders met
    /// on the way are dropped.
    pub fn probe(&mut self, tokens: &[u32], namespace: u64, now: u64) -> HashProbe<T> {
        self.clock = self.clock.max(now);
        let keys = self.take_keys(tokens, namespace);
        let p = self.probe_keys(&keys);
        self.keys = keys;
        p
    }

    /// Records `tenant` at every applicable boundary. Returns how many.
    pub fn record(&mut self, tokens: &[u32], namespace: u64, tenant: T, now: u64) -> usize {
        self.clock = self.clock.max(now);
        let keys = self.take_keys(tokens, namespace);
        self.record_keys(&keys, tenant);
        let n = keys.len();
        self.keys = keys;
        n
    }

    /// Probe, let `choose` pick, record the choice; the heads are hashed once.
    pub fn probe_and_record(
        &mut self,
        tokens: &[u32],
        namespace: u64,
        now: u64,
        choose: impl FnOnce(&HashProbe<T>) -> Option<T>,
    ) -> (HashProbe<T>, Option<T>) {
        self.clock = self.clock.max(now);
        let keys = self.take_keys(tokens, namespace);
        let p = self.probe_keys(&keys);
        let chosen = choose(&p);
        if let Some(t) = chosen {
            self.record_keys(&keys, t);
        }
        self.keys = keys;
        (p, chosen)
    }

    /// Undoes a record of `tokens` for `tenant` past boundary `keep` (the deepest boundary
    /// it held before, 0 for none): it is dropped from the keys of every deeper boundary.
    /// Returns the holders removed.
    pub fn forget(&mut self, tokens: &[u32], namespace: u64, tenant: T, keep: usize) -> usize {
        let keys = self.take_keys(tokens, namespace);
        let mut gone = 0;
        for key in keys.iter().filter(|k| k.0 > keep) {
            let Some(&s) = self.map.get(key) else {
                continue;
            };
            let holders = &mut self.slots[s as usize].holders;
            let before = holders.len();
            holders.retain(|h| h.0 != tenant);
            let n = before - holders.len();
            gone += n;
            self.holders -= n;
            if self.slots[s as usize].holders.is_empty() {
                self.remove_slot(s);
            }
        }
        self.keys = keys;
        gone
    }

    /// Drops every expired holder and the keys left empty.
    pub fn sweep(&mut self, now: u64) -> SweepStats {
        self.clock = self.clock.max(now);
        let (clock, ttl) = (self.clock, self.config.ttl);
        self.retain_holders(|_, touch| clock.saturating_sub(touch) <= ttl)
    }

    /// Drops `tenant` from every key.
    pub fn remove_tenant(&mut self, tenant: T) -> SweepStats {
        self.retain_holders(|t, _| t != tenant)
    }

    /// Drops every holder whose tenant `keep` refuses (e.g. workers a restored snapshot
    /// names that are not in the fleet).
    pub fn retain_tenants(&mut self, mut keep: impl FnMut(T) -> bool) -> SweepStats {
        self.retain_holders(|t, _| keep(t))
    }

    pub fn key_count(&self) -> usize {
        self.map.len()
    }

    pub fn holder_count(&self) -> usize {
        self.holders
    }

    /// Estimated bytes of the structure (allocator overhead excluded).
    pub fn size_bytes(&self) -> usize {
        size_of::<Self>()
            + self.map.capacity() * (size_of::<(Key, u32)>() + 1)
            + self.slots.capacity() * size_of::<Slot<T>>()
            + self
                .slots
                .iter()
                .map(|s| s.holders.capacity() * size_of::<(T, u64)>())
                .sum::<usize>()
            + self.free.capacity() * size_of::<u32>()
    }

    pub fn snapshot(&self) -> HashSnapshot<T> {
        let mut records = Vec::with_capacity(self.map.len());
        let mut cur = self.head;
        while cur != NIL {
            let s = &self.slots[cur as usize];
            records.push(self.to_record(s));
            cur = s.next;
        }
        HashSnapshot {
            version: SNAPSHOT_VERSION,
            records,
        }
    }

    /// Part of a snapshot, for writing a large index a piece at a time: the records of the
    /// live keys in slots `from..`, at most `max` of them, and the slot to continue from
    /// (`None` when done). Records come in slot order, not recency order ([`Self::restore`]
    /// orders them by age). Keys added behind the cursor between calls are missed, and a key
    /// that moved ahead of it can appear twice (restore keeps one), as in any snapshot of
    /// an index that keeps serving while it is taken.
    pub fn snapshot_part(&self, from: usize, max: usize) -> (Vec<HashRecord<T>>, Option<usize>) {
        let mut records = Vec::with_capacity(max.min(self.map.len()));
        let mut i = from;
        while i < self.slots.len() && records.len() < max {
            let s = &self.slots[i];
            // A freed slot is not in the map under its old key.
            if self.map.get(&s.key) == Some(&(i as u32)) {
                records.push(self.to_record(s));
            }
            i += 1;
        }
        (records, (i < self.slots.len()).then_some(i))
    }

    /// Rebuilds an index under `config` with touches at `now − age`. Records at a
    /// boundary `config` no longer has are dropped; holder and key caps are applied,
    /// keeping the freshest.
    pub fn restore(
        snapshot: HashSnapshot<T>,
        config: HashConfig,
        now: u64,
    ) -> Result<Self, SnapshotError> {
        if snapshot.version != SNAPSHOT_VERSION {
            return Err(SnapshotError::Version {
                found: snapshot.version,
                expected: SNAPSHOT_VERSION,
            });
        }
        let mut index = Self::new(config);
        index.clock = now;
        let mut records: Vec<(u64, Key, Holders<T>)> = Vec::new();
        for r in snapshot.records {
            if index.config.boundaries.binary_search(&r.boundary).is_err() {
                continue;
            }
            let mut holders: Vec<(T, u64)> = r
                .holders
                .into_iter()
                .map(|(t, age)| (t, now.saturating_sub(age)))
                .collect();
            // One per tenant (its freshest), the freshest up to the cap, stalest first.
            holders.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            holders.dedup_by_key(|h| h.0);
            holders.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            holders.truncate(index.config.max_holders);
            holders.reverse();
            if let Some(newest) = holders.last().map(|h| h.1) {
                records.push((newest, (r.boundary, r.hash), holders));
            }
        }
        records.sort_by_key(|r| r.0);
        for (_, key, holders) in records {
            if index.map.contains_key(&key) {
                continue;
            }
            let Some(s) = index.new_slot(key) else {
                break;
            };
            index.holders += holders.len();
            index.slots[s as usize].holders = holders;
        }
        Ok(index)
    }

    // ---- internals ----

    /// A slot as a snapshot record, with ages relative to the clock.
    fn to_record(&self, s: &Slot<T>) -> HashRecord<T> {
        HashRecord {
            boundary: s.key.0,
            hash: s.key.1,
            holders: s
                .holders
                .iter()
                .map(|&(t, touch)| (t, self.clock.saturating_sub(touch)))
                .collect(),
        }
    }

    fn take_keys(&mut self, tokens: &[u32], namespace: u64) -> Vec<Key> {
        let mut keys = mem::take(&mut self.keys);
        keys.clear();
        let mut h = Xxh3::with_seed(namespace);
        let mut fed = 0;
        let mut buf = [0u8; 256];
        for &b in &self.config.boundaries {
            if b > tokens.len() {
                break;
            }
            for chunk in tokens[fed..b].chunks(buf.len() / 4) {
                for (dst, t) in buf.chunks_exact_mut(4).zip(chunk) {
                    dst.copy_from_slice(&t.to_le_bytes());
                }
                h.update(&buf[..chunk.len() * 4]);
            }
            fed = b;
            keys.push((b, h.digest()));
        }
        keys
    }

    fn probe_keys(&mut self, keys: &[Key]) -> HashProbe<T> {
        let (clock, ttl) = (self.clock, self.config.ttl);
        for key in keys.iter().rev() {
            let Some(&s) = self.map.get(key) else {
                continue;
            };
            let slot = &mut self.slots[s as usize];
            let before = slot.holders.len();
            slot.holders
                .retain(|&(_, touch)| clock.saturating_sub(touch) <= ttl);
            self.holders -= before - slot.holders.len();
            if slot.holders.is_empty() {
                self.remove_slot(s);
                continue;
            }
            return HashProbe {
                applicable: keys.len(),
                boundary: Some(key.0),
                holders: slot.holders.iter().map(|h| h.0).collect(),
            };
        }
        HashProbe {
            applicable: keys.len(),
            boundary: None,
            holders: Vec::new(),
        }
    }

    fn record_keys(&mut self, keys: &[Key], tenant: T) {
        let (clock, cap) = (self.clock, self.config.max_holders);
        if cap == 0 {
            return;
        }
        for &key in keys {
            let s = match self.map.get(&key) {
                Some(&s) => s,
                None => match self.new_slot(key) {
                    Some(s) => s,
                    None => return,
                },
            };
            // Holders stay ordered by last touch, stalest first.
            let holders = &mut self.slots[s as usize].holders;
            if let Some(i) = holders.iter().position(|h| h.0 == tenant) {
                holders.remove(i);
            } else {
                if holders.len() >= cap {
                    holders.remove(0);
                } else {
                    self.holders += 1;
                }
            }
            holders.push((tenant, clock));
            self.unlink(s);
            self.link_back(s);
        }
    }

    /// An empty slot for `key` at the back of the list, making room first. `None` when
    /// the key bound is 0.
    fn new_slot(&mut self, key: Key) -> Option<u32> {
        if let Some(max) = self.config.max_keys {
            if max == 0 {
                return None;
            }
            while self.map.len() >= max && self.head != NIL {
                self.remove_slot(self.head);
            }
        }
        let slot = Slot {
            key,
            holders: Vec::new(),
            prev: NIL,
            next: NIL,
        };
        let s = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = slot;
                s
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.map.insert(key, s);
        self.link_back(s);
        Some(s)
    }

    fn remove_slot(&mut self, s: u32) {
        self.unlink(s);
        let slot = &mut self.slots[s as usize];
        self.holders -= slot.holders.len();
        slot.holders = Vec::new();
        self.map.remove(&slot.key);
        self.free.push(s);
    }

    fn retain_holders(&mut self, mut keep: impl FnMut(T, u64) -> bool) -> SweepStats {
        let mut stats = SweepStats::default();
        let mut cur = self.head;
        while cur != NIL {
            let slot = &mut self.slots[cur as usize];
            let next = slot.next;
            let before = slot.holders.len();
            slot.holders.retain(|&(t, touch)| keep(t, touch));
            let gone = before - slot.holders.len();
            self.holders -= gone;
            stats.holders += gone;
            if slot.holders.is_empty() {
                self.remove_slot(cur);
                stats.keys += 1;
            }
            cur = next;
        }
        stats
    }

    fn unlink(&mut self, s: u32) {
        let (prev, next) = {
            let sl = &self.slots[s as usize];
            (sl.prev, sl.next)
        };
        match prev {
            NIL => self.head = next,
            p => self.slots[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.slots[n as usize].prev = prev,
        }
        let sl = &mut self.slots[s as usize];
        sl.prev = NIL;
        sl.next = NIL;
    }

    fn link_back(&mut self, s: u32) {
        let tail = self.tail;
        {
            let sl = &mut self.slots[s as usize];
            sl.prev = tail;
            sl.next = NIL;
        }
        match tail {
            NIL => self.head = s,
            t => self.slots[t as usize].next = s,
        }
        self.tail = s;
    }
}
