//! The engine's block hash, kept opaque.

use xxhash_rust::xxh3::xxh3_64;

/// An engine's hash of one KV block: an opaque id, only ever compared.
///
/// SGLang sends an `i64` (negative values included), vLLM may send bytes. Both are kept as
/// 64 bits: an int by its two's-complement bits, bytes folded with XXH3-64. A fixed-size
/// `Copy` key is what an index keeps per held block (no allocation per block, cheap to hash),
/// and the only use of an engine hash is finding the block again when the same engine
/// removes it or names it as a parent, for which 64 bits of an already-random hash suffice.
/// One engine always uses one form, so the two forms never need to be told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineHash(u64);

impl EngineHash {
    /// An int hash as SGLang sends it.
    pub const fn from_i64(h: i64) -> Self {
        EngineHash(h as u64)
    }

    /// An int hash sent as an unsigned 64-bit value; the same bits as [`Self::from_i64`].
    pub const fn from_u64(h: u64) -> Self {
        EngineHash(h)
    }

    /// A bytes hash (vLLM), folded to 64 bits.
    pub fn from_bytes(b: &[u8]) -> Self {
        EngineHash(xxh3_64(b))
    }

    /// The 64 bits, for an index keyed by `u64`.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// The 64 bits read as signed, the form the encoders write.
    pub const fn as_i64(self) -> i64 {
        self.0 as i64
    }
}
