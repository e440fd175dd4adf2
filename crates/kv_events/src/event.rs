//! KV-event batches: the msgpack payload of one ZMQ message.

use rmpv::Value;

use crate::error::DecodeError;
use crate::hash::EngineHash;
use crate::value::{array, from_i64, int, opt, opt_value, read, string, u32_of, write};

/// One published batch: `[ts, events, attn_dp_rank]` on the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// The engine's wall clock when it sent the batch, in seconds.
    pub ts: f64,
    pub events: Vec<KvEvent>,
    /// The data-parallel rank that published it, when the engine says.
    pub attn_dp_rank: Option<u32>,
    /// Events of a type this crate does not know, skipped while decoding (never encoded).
    pub unknown_events: u32,
}

/// One cache change on one engine rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    BlockStored(BlockStored),
    BlockRemoved(BlockRemoved),
    /// The rank dropped every block it held.
    AllBlocksCleared,
}

/// Blocks the engine added to its cache, in sequence order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockStored {
    pub block_hashes: Vec<EngineHash>,
    /// The engine hash of the block before the first stored one; `None` at a sequence's start.
    pub parent_block_hash: Option<EngineHash>,
    /// The tokens of all stored blocks, `block_size` per block.
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    pub lora_id: Option<i64>,
    pub medium: Option<Medium>,
    /// The salt the blocks were cached under: SGLang's `cache_salt` field, or what vLLM
    /// puts in the first block's `extra_keys` (see [`BlockStored`]'s decoding).
    pub cache_salt: Option<String>,
    pub session_id: Option<String>,
    pub lora_name: Option<String>,
}

/// Blocks the engine dropped from one tier (from every tier when `medium` is absent).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockRemoved {
    pub block_hashes: Vec<EngineHash>,
    pub medium: Option<Medium>,
}

/// Where a block lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Medium {
    Gpu,
    CpuPinned,
    Disk,
    External,
    /// A name this crate does not know, kept as sent.
    Other(String),
}

impl Medium {
    pub fn parse(s: &str) -> Medium {
        match s {
            "GPU" => Medium::Gpu,
            "CPU_PINNED" => Medium::CpuPinned,
            "DISK" => Medium::Disk,
            "EXTERNAL" => Medium::External,
            other => Medium::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Medium::Gpu => "GPU",
            Medium::CpuPinned => "CPU_PINNED",
            Medium::Disk => "DISK",
            Medium::External => "EXTERNAL",
            Medium::Other(s) => s,
        }
    }
}

/// Decodes one payload frame.
///
/// Events come as maps tagged by `"type"` (SGLang; unknown keys ignored, optional fields
/// absent or nil) or as positional arrays whose first element is the tag (msgspec's
/// `array_like` form, as vLLM sends; fields in declared order, extras ignored). An event of
/// an unknown type is skipped and counted in [`EventBatch::unknown_events`]; any other
/// defect refuses the whole batch, since a half-applied batch would leave the index out of
/// step with the engine.
pub fn decode_payload(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    let v = read(payload)?;
    let parts = array(&v, "batch")?;
    let [ts, events, rest @ ..] = parts else {
        return Err(DecodeError::shape(
            "batch",
            "expected [ts, events, attn_dp_rank]",
        ));
    };
    let ts = float(ts).ok_or(DecodeError::shape("ts", "expected a number"))?;
    let attn_dp_rank = opt(rest.first())
        .map(|r| u32_of(r, "attn_dp_rank"))
        .transpose()?;
    let mut batch = EventBatch {
        ts,
        events: Vec::new(),
        attn_dp_rank,
        unknown_events: 0,
    };
    let events = array(events, "events")?;
    batch.events.reserve(events.len());
    for e in events {
        match decode_event(e)? {
            Some(e) => batch.events.push(e),
            None => batch.unknown_events += 1,
        }
    }
    Ok(batch)
}

/// Encodes a batch the way SGLang does: events as maps, optional fields left out when unset
/// (`parent_block_hash` and `lora_id` are always written, nil when unset).
pub fn encode_payload(batch: &EventBatch) -> Vec<u8> {
    let events = batch.events.iter().map(encode_event).collect();
    write(&Value::Array(vec![
        Value::F64(batch.ts),
        Value::Array(events),
        opt_value(batch.attn_dp_rank, Value::from),
    ]))
}

fn float(v: &Value) -> Option<f64> {
    match v {
        Value::F64(x) => Some(*x),
        Value::F32(x) => Some(f64::from(*x)),
        // An engine writing whole seconds as an int is still a time.
        Value::Integer(i) => i.as_f64(),
        _ => None,
    }
}

/// The fields of one event, by name, whichever form it came in.
#[derive(Default)]
struct Fields<'a> {
    block_hashes: Option<&'a Value>,
    parent_block_hash: Option<&'a Value>,
    token_ids: Option<&'a Value>,
    block_size: Option<&'a Value>,
    lora_id: Option<&'a Value>,
    medium: Option<&'a Value>,
    cache_salt: Option<&'a Value>,
    session_id: Option<&'a Value>,
    lora_name: Option<&'a Value>,
    extra_keys: Option<&'a Value>,
}

/// `None`: an event type this crate does not know.
fn decode_event(v: &Value) -> Result<Option<KvEvent>, DecodeError> {
    let mut f = Fields::default();
    let tag = match v {
        Value::Map(pairs) => {
            let mut tag = None;
            for (k, val) in pairs {
                let slot = match k.as_str() {
                    Some("type") => {
                        tag = val.as_str();
                        continue;
                    }
                    Some("block_hashes") => &mut f.block_hashes,
                    Some("parent_block_hash") => &mut f.parent_block_hash,
                    Some("token_ids") => &mut f.token_ids,
                    Some("block_size") => &mut f.block_size,
                    Some("lora_id") => &mut f.lora_id,
                    Some("medium") => &mut f.medium,
                    Some("cache_salt") => &mut f.cache_salt,
                    Some("session_id") => &mut f.session_id,
                    Some("lora_name") => &mut f.lora_name,
                    Some("extra_keys") => &mut f.extra_keys,
                    _ => continue,
                };
                *slot = Some(val);
            }
            tag.ok_or(DecodeError::shape("event", "no string \"type\""))?
        }
        Value::Array(items) => {
            let (tag, rest) = items
                .split_first()
                .ok_or(DecodeError::shape("event", "empty array"))?;
            let tag = tag.as_str().ok_or(DecodeError::shape(
                "event",
                "first element is not a type name",
            ))?;
            let at = |i: usize| rest.get(i);
            match tag {
                // vLLM's array layout (`array_like` structs, declaration order, nil when
                // unset): older releases stop at `lora_id` or `medium`; later ones add
                // `lora_name` and `extra_keys`.
                "BlockStored" => {
                    f.block_hashes = at(0);
                    f.parent_block_hash = at(1);
                    f.token_ids = at(2);
                    f.block_size = at(3);
                    f.lora_id = at(4);
                    f.medium = at(5);
                    f.lora_name = at(6);
                    f.extra_keys = at(7);
                }
                "BlockRemoved" => {
                    f.block_hashes = at(0);
                    f.medium = at(1);
                }
                _ => {}
            }
            tag
        }
        _ => return Err(DecodeError::shape("event", "expected a map or an array")),
    };
    Ok(Some(match tag {
        "BlockStored" => KvEvent::BlockStored(stored(&f)?),
        "BlockRemoved" => KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: hashes(f.block_hashes)?,
            medium: medium(f.medium)?,
        }),
        "AllBlocksCleared" => KvEvent::AllBlocksCleared,
        _ => return Ok(None),
    }))
}

fn stored(f: &Fields<'_>) -> Result<BlockStored, DecodeError> {
    let token_ids = match opt(f.token_ids) {
        Some(t) => array(t, "token_ids")?
            .iter()
            .map(|t| u32_of(t, "token_ids"))
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let block_size = opt(f.block_size)
        .map(|b| u32_of(b, "block_size"))
        .transpose()?
        .unwrap_or(0);
    let lora_id = opt(f.lora_id)
        .map(|l| {
            int(l)
                .and_then(rmpv::Integer::as_i64)
                .ok_or(DecodeError::shape("lora_id", "expected an integer"))
        })
        .transpose()?;
    let text = |v: Option<&Value>, what| opt(v).map(|s| string(s, what)).transpose();
    let parent_block_hash = opt(f.parent_block_hash).map(hash).transpose()?;
    let lora_name = text(f.lora_name, "lora_name")?;
    let cache_salt = match text(f.cache_salt, "cache_salt")? {
        Some(s) => Some(s),
        // vLLM salts a sequence's first block only (its hash chains the rest).
        None if parent_block_hash.is_none() => salt_of(f.extra_keys, lora_name.as_deref()),
        None => None,
    };
    Ok(BlockStored {
        block_hashes: hashes(f.block_hashes)?,
        parent_block_hash,
        token_ids,
        block_size,
        lora_id,
        medium: medium(f.medium)?,
        cache_salt,
        session_id: text(f.session_id, "session_id")?,
        lora_name,
    })
}

/// The cache salt in vLLM's `extra_keys` of a sequence's first block: vLLM assembles each
/// block's keys as the adapter's name, then multimodal keys (each an `[identifier, offset]`
/// pair), then, on the first block only, the salt, then a prompt-embeddings hash (bytes).
/// So the salt is the first string after the adapter's name. `None` when there is none, or
/// the keys are of another shape (then the blocks stay in the unsalted scope).
fn salt_of(extra_keys: Option<&Value>, lora_name: Option<&str>) -> Option<String> {
    let first = opt(extra_keys)?.as_array()?.first()?.as_array()?;
    let mut keys = first.iter();
    if let Some(name) = lora_name {
        // The adapter's name leads every block's keys.
        match keys.clone().next().and_then(Value::as_str) {
            Some(s) if s == name => {
                keys.next();
            }
            _ => return None,
        }
    }
    keys.find_map(Value::as_str).map(str::to_owned)
}

fn hash(v: &Value) -> Result<EngineHash, DecodeError> {
    match v {
        Value::Integer(i) => i
            .as_i64()
            .map(EngineHash::from_i64)
            .or_else(|| i.as_u64().map(EngineHash::from_u64))
            .ok_or(DecodeError::shape("block hash", "integer out of range")),
        Value::Binary(b) => Ok(EngineHash::from_bytes(b)),
        _ => Err(DecodeError::shape(
            "block hash",
            "expected an integer or bytes",
        )),
    }
}

fn hashes(v: Option<&Value>) -> Result<Vec<EngineHash>, DecodeError> {
    match opt(v) {
        Some(v) => array(v, "block_hashes")?.iter().map(hash).collect(),
        None => Ok(Vec::new()),
    }
}

fn medium(v: Option<&Value>) -> Result<Option<Medium>, DecodeError> {
    opt(v)
        .map(|m| string(m, "medium").map(|s| Medium::parse(&s)))
        .transpose()
}

fn encode_hashes(h: &[EngineHash]) -> Value {
    Value::Array(h.iter().map(|h| from_i64(h.as_i64())).collect())
}

fn encode_event(e: &KvEvent) -> Value {
    let key = |k: &str| Value::from(k);
    let mut m = Vec::new();
    match e {
        KvEvent::BlockStored(s) => {
            m.push((key("type"), key("BlockStored")));
            m.push((key("block_hashes"), encode_hashes(&s.block_hashes)));
            m.push((
                key("parent_block_hash"),
                opt_value(s.parent_block_hash, |h| from_i64(h.as_i64())),
            ));
            let tokens = s.token_ids.iter().map(|&t| Value::from(t)).collect();
            m.push((key("token_ids"), Value::Array(tokens)));
            m.push((key("block_size"), Value::from(s.block_size)));
            m.push((key("lora_id"), opt_value(s.lora_id, from_i64)));
            let optional = [
                ("medium", s.medium.as_ref().map(Medium::as_str)),
                ("cache_salt", s.cache_salt.as_deref()),
                ("session_id", s.session_id.as_deref()),
                ("lora_name", s.lora_name.as_deref()),
            ];
            for (k, v) in optional {
                if let Some(v) = v {
                    m.push((key(k), key(v)));
                }
            }
        }
        KvEvent::BlockRemoved(r) => {
            m.push((key("type"), key("BlockRemoved")));
            m.push((key("block_hashes"), encode_hashes(&r.block_hashes)));
            if let Some(md) = &r.medium {
                m.push((key("medium"), key(md.as_str())));
            }
        }
        KvEvent::AllBlocksCleared => m.push((key("type"), key("AllBlocksCleared"))),
    }
    Value::Map(m)
}
