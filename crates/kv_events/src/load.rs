//! Pushed load: `LoadStat` gauges a rank publishes on its own socket.

use rmpv::Value;

use crate::error::DecodeError;
use crate::frame::sequence;
use crate::value::{array, opt, read, u32_of, uint, write};

/// One rank's load as it pushes it: `["LoadStat", ...]`, positional. The first six positions
/// are always present; the later ones appeared in newer versions and are `None` when
/// absent. Positions past the last known one are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadStat {
    pub num_running_reqs: u64,
    pub num_waiting_reqs: u64,
    /// Tokens in use in the KV pool.
    pub num_tokens: u64,
    pub max_total_num_tokens: u64,
    pub attn_dp_rank: u32,
    pub num_waiting_uncached_tokens: Option<u64>,
    pub num_total_tokens: Option<u64>,
    pub max_running_requests: Option<u64>,
    /// Cumulative counters.
    pub total_prefill_uncached_tokens: Option<u64>,
    pub total_prefill_busy_us: Option<u64>,
}

/// One decoded pushed-load message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadMessage {
    /// `b"load"` from SGLang.
    pub topic: Vec<u8>,
    pub seq: u64,
    pub stat: LoadStat,
}

const TAG: &str = "LoadStat";

/// Decodes `[topic, seq (8 bytes, big-endian), msgpack LoadStat]`.
pub fn decode_load_message<F: AsRef<[u8]>>(frames: &[F]) -> Result<LoadMessage, DecodeError> {
    let [topic, seq, payload] = frames else {
        return Err(DecodeError::Frames {
            expected: 3,
            found: frames.len(),
        });
    };
    Ok(LoadMessage {
        topic: topic.as_ref().to_vec(),
        seq: sequence(seq.as_ref())?,
        stat: decode_load_stat(payload.as_ref())?,
    })
}

/// Decodes a `LoadStat` payload.
pub fn decode_load_stat(payload: &[u8]) -> Result<LoadStat, DecodeError> {
    let v = read(payload)?;
    let items = array(&v, "LoadStat")?;
    let [tag, running, waiting, tokens, max_tokens, rank, extra @ ..] = items else {
        return Err(DecodeError::shape("LoadStat", "fewer than six fields"));
    };
    if tag.as_str() != Some(TAG) {
        return Err(DecodeError::shape("LoadStat", "tag is not \"LoadStat\""));
    }
    let extra_at = |i: usize, what| opt(extra.get(i)).map(|v| uint(v, what)).transpose();
    Ok(LoadStat {
        num_running_reqs: uint(running, "num_running_reqs")?,
        num_waiting_reqs: uint(waiting, "num_waiting_reqs")?,
        num_tokens: uint(tokens, "num_tokens")?,
        max_total_num_tokens: uint(max_tokens, "max_total_num_tokens")?,
        attn_dp_rank: u32_of(rank, "attn_dp_rank")?,
        num_waiting_uncached_tokens: extra_at(0, "num_waiting_uncached_tokens")?,
        num_total_tokens: extra_at(1, "num_total_tokens")?,
        max_running_requests: extra_at(2, "max_running_requests")?,
        total_prefill_uncached_tokens: extra_at(3, "total_prefill_uncached_tokens")?,
        total_prefill_busy_us: extra_at(4, "total_prefill_busy_us")?,
    })
}

/// Encodes a `LoadStat` payload, up to its last set optional field (the ones before it nil).
pub fn encode_load_stat(s: &LoadStat) -> Vec<u8> {
    let mut items = vec![
        Value::from(TAG),
        Value::from(s.num_running_reqs),
        Value::from(s.num_waiting_reqs),
        Value::from(s.num_tokens),
        Value::from(s.max_total_num_tokens),
        Value::from(s.attn_dp_rank),
    ];
    let extra = [
        s.num_waiting_uncached_tokens,
        s.num_total_tokens,
        s.max_running_requests,
        s.total_prefill_uncached_tokens,
        s.total_prefill_busy_us,
    ];
    let set = extra.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
    items.extend(
        extra[..set]
            .iter()
            .map(|x| x.map_or(Value::Nil, Value::from)),
    );
    write(&Value::Array(items))
}

/// Encodes a pushed-load message.
pub fn encode_load_message(topic: &[u8], seq: u64, stat: &LoadStat) -> [Vec<u8>; 3] {
    [
        topic.to_vec(),
        seq.to_be_bytes().to_vec(),
        encode_load_stat(stat),
    ]
}
