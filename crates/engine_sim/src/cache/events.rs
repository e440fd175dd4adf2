//! What the cache tells KV-event subscribers, in SGLang's event types: pages stored (with
//! their engine hashes), pages removed, everything cleared. Recorded as the tree changes and
//! taken by the scheduler once per step, so it never waits on a socket.

use kvgate_kv_events::{BlockRemoved, BlockStored, EngineHash, KvEvent, Medium};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use std::sync::Arc;

use crate::scopes::{self, Scopes};

/// The seed of a sequence's first block, standing for "no parent".
const ROOT_SEED: u64 = 0x5347_4c61_6e67_0001;

#[derive(Debug)]
pub(super) struct Recorder {
    page_size: usize,
    pending: Vec<KvEvent>,
    scopes: Arc<Scopes>,
}

impl Recorder {
    pub(super) fn new(page_size: usize, scopes: Arc<Scopes>) -> Self {
        Self {
            page_size,
            pending: Vec::new(),
            scopes,
        }
    }

    /// Records the store of `tokens` (whole pages) after the page hashed `parent`; returns
    /// one engine hash per page.
    pub(super) fn stored(&mut self, parent: Option<u64>, tokens: &[u32]) -> Vec<u64> {
        let mut prev = parent;
        let hashes: Vec<u64> = tokens
            .chunks_exact(self.page_size)
            .map(|page| {
                let h = block_hash(prev, page);
                prev = Some(h);
                h
            })
            .collect();
        // A scoped prompt's pages name their adapter (vLLM's `lora_id` and `lora_name`)
        // and salt; the ids leave in the vocabulary's own numbering.
        let scope = tokens.first().map_or(0, |&t| scopes::of(t));
        let (adapter, salt) = self.scopes.get(scope).unwrap_or_default();
        self.pending.push(KvEvent::BlockStored(BlockStored {
            block_hashes: hashes.iter().copied().map(EngineHash::from_u64).collect(),
            parent_block_hash: parent.map(EngineHash::from_u64),
            token_ids: tokens.iter().map(|&t| scopes::plain(t)).collect(),
            block_size: u32::try_from(self.page_size).unwrap_or(u32::MAX),
            lora_id: adapter.is_some().then_some(i64::from(scope)),
            lora_name: adapter,
            cache_salt: salt,
            medium: Some(Medium::Gpu),
            ..BlockStored::default()
        }));
        hashes
    }

    pub(super) fn removed(&mut self, hashes: &[u64]) {
        if hashes.is_empty() {
            return;
        }
        self.pending.push(KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: hashes.iter().copied().map(EngineHash::from_u64).collect(),
            medium: Some(Medium::Gpu),
        }));
    }

    pub(super) fn cleared(&mut self) {
        self.pending.push(KvEvent::AllBlocksCleared);
    }

    pub(super) fn take(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.pending)
    }
}

/// A page's engine hash: XXH3 of its tokens seeded with its parent's hash, so it names the
/// whole prefix (as SGLang chains its page hashes) and stays the same when a node splits.
/// Engines with the same tokens agree, as SGLang's do; it is deliberately not the gateway's
/// content key, since subscribers must treat it as opaque.
pub(super) fn block_hash(parent: Option<u64>, page: &[u32]) -> u64 {
    let bytes: Vec<u8> = page.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxh3_64_with_seed(&bytes, parent.unwrap_or(ROOT_SEED))
}
