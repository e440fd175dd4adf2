//! The wire formats an inference engine uses to publish its KV cache: what kvgate needs to
//! follow SGLang's and vLLM's caches exactly.
//!
//! It owns the decoding and encoding of:
//! - published KV-event messages, `[topic, seq, payload]` ([`decode_message`],
//!   [`decode_payload`]): an [`EventBatch`] of [`KvEvent`]s (blocks stored, blocks removed,
//!   all blocks cleared), tolerant of unknown keys, absent optional fields, unknown event
//!   types (skipped and counted) and block hashes sent as ints or bytes ([`EngineHash`]);
//! - the replay protocol a client uses to fill a gap in the sequence
//!   ([`encode_replay_request`], [`decode_replay_frame`]);
//! - pushed load, `LoadStat` gauges ([`decode_load_message`]);
//! - the `kv_events` descriptor of `/server_info` and the per-rank endpoints it implies
//!   ([`rank_endpoints`]).
//!
//! Every decoder takes bytes from a worker and returns a typed [`DecodeError`] for anything
//! malformed; none panics. Each has an encoder, for the engine simulator and tests, in
//! SGLang's form and in vLLM's ([`encode_payload_vllm`]). The crate is pure: it opens no
//! socket (the ZMQ transport lives with its caller), reads no clock and keeps no state; the
//! specs it follows are SGLang 0.5.23's publisher and vLLM's `ZmqEventPublisher`.
//!
//! ```
//! use kvgate_kv_events::{
//!     BlockStored, EngineHash, EventBatch, KvEvent, decode_message, encode_message,
//! };
//!
//! let batch = EventBatch {
//!     ts: 1733140000.5,
//!     events: vec![KvEvent::BlockStored(BlockStored {
//!         block_hashes: vec![EngineHash::from_i64(-7)],
//!         token_ids: (1..=16).collect(),
//!         block_size: 16,
//!         ..BlockStored::default()
//!     })],
//!     attn_dp_rank: Some(0),
//!     unknown_events: 0,
//! };
//! let frames = encode_message(b"kv-events", 41, &batch);
//! let msg = decode_message(&frames)?;
//! assert_eq!((msg.topic.as_slice(), msg.seq), (&b"kv-events"[..], 41));
//! assert_eq!(msg.batch, batch);
//!
//! // A truncated frame is an error, not a panic.
//! assert!(decode_message(&[&b"kv-events"[..], &[0u8; 7], &[0x93]]).is_err());
//! # Ok::<(), kvgate_kv_events::DecodeError>(())
//! ```

mod endpoints;
mod error;
mod event;
mod frame;
mod hash;
mod load;
mod value;
mod vllm;

#[cfg(test)]
mod tests;

pub use endpoints::{KvEventsDescriptor, RankEndpoints, rank_endpoints};
pub use error::{DecodeError, EndpointError};
pub use event::{
    BlockRemoved, BlockStored, EventBatch, KvEvent, Medium, decode_payload, encode_payload,
};
pub use frame::{
    EventMessage, ReplayFrame, decode_message, decode_replay_frame, decode_replay_request,
    encode_message, encode_replay_batch, encode_replay_end, encode_replay_request,
};
pub use hash::EngineHash;
pub use load::{
    LoadMessage, LoadStat, decode_load_message, decode_load_stat, encode_load_message,
    encode_load_stat,
};
pub use vllm::{VllmHashes, encode_payload_vllm, hash_bytes};
