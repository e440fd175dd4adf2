//! The scope of a prompt's blocks in the chain index: its LoRA adapter and cache salt. An
//! adapter's KV cache is not its base model's, and a salt keeps a tenant's apart, so each
//! (adapter, salt) has a namespace of chain keys of its own.

/// The chain namespace of an adapter (by name) and a cache salt: a request is matched in
/// the namespace of its own adapter and salt, so neither ever shares another's blocks.
pub(crate) fn namespace(adapter: Option<&str>, salt: Option<&str>) -> u64 {
    match (adapter, salt) {
        (None, None) => 0,
        (a, s) => {
            let mut b = Vec::new();
            for part in [a, s] {
                let part = part.unwrap_or("").as_bytes();
                b.extend_from_slice(&(part.len() as u64).to_le_bytes());
                b.extend_from_slice(part);
            }
            xxhash_rust::xxh3::xxh3_64(&b) | 1
        }
    }
}

/// The namespace of stored blocks: their adapter by `lora_name` (vLLM), else by the
/// decimal `lora_id` (engines that send only the id: requests naming the adapter then
/// match none of its blocks, and routing falls back to what kvgate sent where).
pub(super) fn stored_namespace(s: &kvgate_kv_events::BlockStored) -> u64 {
    let id = s.lora_id.filter(|&i| i != 0).map(|i| i.to_string());
    let adapter = s.lora_name.as_deref().or(id.as_deref());
    namespace(adapter, s.cache_salt.as_deref())
}
