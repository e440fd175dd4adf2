//! Batches encoded as vLLM's `ZmqEventPublisher` sends them (msgspec structs): the batch as
//! `[ts, events, data_parallel_rank]`, each event a map tagged by `"type"` whose fields
//! without a default are always written (`lora_id`, `medium`, `lora_name`, nil when
//! unset) and whose defaulted ones (`extra_keys`, `group_idx`) are left out when unset;
//! block hashes as unsigned 64-bit integers, or as bytes when vLLM is told not to turn
//! them into integers. For simulators and tests; [`crate::decode_payload`] reads both this
//! and SGLang's form.

use rmpv::Value;

use crate::event::{EventBatch, KvEvent, Medium};
use crate::hash::EngineHash;
use crate::value::{opt_value, write};

/// How vLLM writes block hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VllmHashes {
    /// Unsigned 64-bit integers (vLLM's default).
    Ints,
    /// 32 bytes each, as a content hash is.
    Bytes,
}

/// The 32 bytes a simulated engine sends for `h`: the same hash always the same bytes.
pub fn hash_bytes(h: EngineHash) -> Vec<u8> {
    h.as_u64().to_be_bytes().repeat(4)
}

fn encode_hash(h: EngineHash, form: VllmHashes) -> Value {
    match form {
        VllmHashes::Ints => Value::from(h.as_u64()),
        VllmHashes::Bytes => Value::Binary(hash_bytes(h)),
    }
}

fn encode_hashes(hs: &[EngineHash], form: VllmHashes) -> Value {
    Value::Array(hs.iter().map(|h| encode_hash(*h, form)).collect())
}

fn event(e: &KvEvent, form: VllmHashes) -> Value {
    let key = |k: &str| Value::from(k);
    let text = |s: Option<&str>| s.map_or(Value::Nil, Value::from);
    let medium = |m: Option<&Medium>| Value::from(m.map_or("GPU", Medium::as_str));
    let mut m = Vec::new();
    match e {
        KvEvent::BlockStored(s) => {
            m.push((key("type"), key("BlockStored")));
            m.push((key("block_hashes"), encode_hashes(&s.block_hashes, form)));
            let parent = opt_value(s.parent_block_hash, |h| encode_hash(h, form));
            m.push((key("parent_block_hash"), parent));
            let tokens = s.token_ids.iter().map(|&t| Value::from(t)).collect();
            m.push((key("token_ids"), Value::Array(tokens)));
            m.push((key("block_size"), Value::from(s.block_size)));
            m.push((key("lora_id"), opt_value(s.lora_id, Value::from)));
            m.push((key("medium"), medium(s.medium.as_ref())));
            m.push((key("lora_name"), text(s.lora_name.as_deref())));
            if let Some(keys) = extra_keys(s) {
                m.push((key("extra_keys"), keys));
            }
        }
        KvEvent::BlockRemoved(r) => {
            m.push((key("type"), key("BlockRemoved")));
            m.push((key("block_hashes"), encode_hashes(&r.block_hashes, form)));
            m.push((key("medium"), medium(r.medium.as_ref())));
        }
        KvEvent::AllBlocksCleared => m.push((key("type"), key("AllBlocksCleared"))),
    }
    Value::Map(m)
}

/// The blocks' `extra_keys` as vLLM computes them: the adapter's name on every block, the
/// salt on a sequence's first block only; `None` (left out) when neither applies.
fn extra_keys(s: &crate::event::BlockStored) -> Option<Value> {
    if s.lora_name.is_none() && s.cache_salt.is_none() {
        return None;
    }
    let keys = (0..s.block_hashes.len())
        .map(|i| {
            let mut k: Vec<Value> = s
                .lora_name
                .iter()
                .map(|n| Value::from(n.as_str()))
                .collect();
            if i == 0 && s.parent_block_hash.is_none() {
                k.extend(s.cache_salt.iter().map(|c| Value::from(c.as_str())));
            }
            if k.is_empty() {
                Value::Nil
            } else {
                Value::Array(k)
            }
        })
        .collect();
    Some(Value::Array(keys))
}

/// One payload frame as vLLM writes it.
pub fn encode_payload_vllm(batch: &EventBatch, form: VllmHashes) -> Vec<u8> {
    let events = batch.events.iter().map(|e| event(e, form)).collect();
    write(&Value::Array(vec![
        Value::F64(batch.ts),
        Value::Array(events),
        opt_value(batch.attn_dp_rank, Value::from),
    ]))
}

#[cfg(test)]
mod tests {
    use super::{VllmHashes, encode_payload_vllm, hash_bytes};
    use crate::{BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent, decode_payload};

    fn batch(hashes: &[u64]) -> EventBatch {
        EventBatch {
            ts: 2.5,
            events: vec![
                KvEvent::BlockStored(BlockStored {
                    block_hashes: hashes.iter().map(|h| EngineHash::from_u64(*h)).collect(),
                    parent_block_hash: Some(EngineHash::from_u64(7)),
                    token_ids: (0..8).collect(),
                    block_size: 4,
                    ..BlockStored::default()
                }),
                KvEvent::BlockRemoved(BlockRemoved {
                    block_hashes: vec![EngineHash::from_u64(hashes[0])],
                    medium: None,
                }),
                KvEvent::AllBlocksCleared,
            ],
            attn_dp_rank: Some(1),
            unknown_events: 0,
        }
    }

    #[test]
    fn vllm_batches_read_back_with_their_hashes_as_ints_or_bytes() {
        // Above i64::MAX: vLLM's hashes are unsigned.
        let b = batch(&[u64::MAX - 3, 12]);
        let ints = decode_payload(&encode_payload_vllm(&b, VllmHashes::Ints)).unwrap();
        assert_eq!(ints.events.len(), 3);
        let KvEvent::BlockStored(s) = &ints.events[0] else {
            panic!("not stored")
        };
        assert_eq!(s.block_hashes[0], EngineHash::from_u64(u64::MAX - 3));
        assert_eq!(ints.attn_dp_rank, Some(1));
        // As bytes, a hash reads back as the hash of its bytes, the same in a store and a
        // removal.
        let bytes = decode_payload(&encode_payload_vllm(&b, VllmHashes::Bytes)).unwrap();
        let (KvEvent::BlockStored(s), KvEvent::BlockRemoved(r)) =
            (&bytes.events[0], &bytes.events[1])
        else {
            panic!("not stored and removed")
        };
        let want = EngineHash::from_bytes(&hash_bytes(EngineHash::from_u64(u64::MAX - 3)));
        assert_eq!((s.block_hashes[0], r.block_hashes[0]), (want, want));
    }
}
