//! Content keys: what a block is, computed the same way from an engine's event and from a
//! request's tokens.

use std::hash::Hasher;

use xxhash_rust::xxh3::xxh3_64;

/// Tells chain starts apart from orphan starts and from ordinary links.
const ROOT_TAG: u64 = 0x6b76_6761_7465_0001;
const ORPHAN_TAG: u64 = 0x6b76_6761_7465_0002;

/// The parent key of a sequence's first block. The block size is folded in, so a request
/// hashed at another block size than the engine's matches nothing rather than something
/// wrong.
pub(crate) fn root(namespace: u64, block_size: usize) -> u64 {
    link(link(ROOT_TAG, namespace), block_size as u64)
}

/// The parent key of a store whose parent the index does not know. No request computes it
/// (short of a 64-bit collision), so such chains serve removals and their own continuations,
/// never a match (see the module docs).
pub(crate) fn orphan(namespace: u64, block_size: usize, parent_engine_hash: u64) -> u64 {
    link(
        link(root(namespace, block_size), ORPHAN_TAG),
        parent_engine_hash,
    )
}

/// The key of a block: XXH3 of its tokens (little-endian `u32`s) folded into its parent's
/// key, so equal tokens after different prefixes get different keys. The tokens' hash does
/// not depend on the parent, so a request's blocks hash in parallel and only the fold is a
/// chain (seeding each block's hash with its parent's key would make every block wait for
/// the hash before it).
#[inline]
pub(crate) fn block(parent: u64, tokens: &[u32], buf: &mut Vec<u8>) -> u64 {
    // Blocks of up to 64 tokens (the usual sizes) go through the stack.
    let mut stack = [0u8; 256];
    let bytes = match stack.get_mut(..tokens.len() * 4) {
        Some(b) => b,
        None => {
            buf.resize(tokens.len() * 4, 0);
            buf.as_mut_slice()
        }
    };
    for (b, t) in bytes.chunks_exact_mut(4).zip(tokens) {
        b.copy_from_slice(&t.to_le_bytes());
    }
    fold(parent, xxh3_64(bytes))
}

/// A folded 128-bit multiply of both inputs, each offset by an odd constant: a few cycles,
/// and every output bit depends on every input bit.
#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let m = u128::from(a ^ 0x9E37_79B9_7F4A_7C15) * u128::from(b ^ 0xC2B2_AE3D_27D4_EB4F);
    (m as u64) ^ ((m >> 64) as u64)
}

fn link(a: u64, b: u64) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a.to_le_bytes());
    bytes[8..].copy_from_slice(&b.to_le_bytes());
    xxh3_64(&bytes)
}

/// For maps keyed by `u64`s that are hashes already, or engine hashes that may be small
/// integers: one folded multiply spreads both over high and low bits.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Mix(u64);

impl Hasher for Mix {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        let m = u128::from(self.0 ^ x) * 0x9E37_79B9_7F4A_7C15;
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
}
