//! ZMQ multipart framing: published batches and the replay protocol.

use crate::error::DecodeError;
use crate::event::{EventBatch, decode_payload, encode_payload};

/// One decoded published message.
#[derive(Debug, Clone, PartialEq)]
pub struct EventMessage {
    pub topic: Vec<u8>,
    /// The publisher's sequence number: from 0, one more per batch.
    pub seq: u64,
    pub batch: EventBatch,
}

/// One frame a replay client receives.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayFrame {
    /// A buffered batch, in the same form as a published one.
    Batch(EventMessage),
    /// Nothing more to replay.
    End,
}

/// The sequence frame of the end marker: -1 as a signed 64-bit big-endian value.
const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// Decodes a published message `[topic, seq (8 bytes, big-endian), payload]`.
pub fn decode_message<F: AsRef<[u8]>>(frames: &[F]) -> Result<EventMessage, DecodeError> {
    let [topic, seq, payload] = frames else {
        return Err(DecodeError::Frames {
            expected: 3,
            found: frames.len(),
        });
    };
    message(topic.as_ref(), seq.as_ref(), payload.as_ref())
}

/// Encodes a published message.
pub fn encode_message(topic: &[u8], seq: u64, batch: &EventBatch) -> [Vec<u8>; 3] {
    [
        topic.to_vec(),
        seq.to_be_bytes().to_vec(),
        encode_payload(batch),
    ]
}

/// The request a replay client (DEALER) sends: `[b"", start_seq (8 bytes, big-endian)]`.
pub fn encode_replay_request(start_seq: u64) -> [Vec<u8>; 2] {
    [Vec::new(), start_seq.to_be_bytes().to_vec()]
}

/// Reads a replay request, as the publisher's ROUTER sees it once it has removed the
/// client's identity frame.
pub fn decode_replay_request<F: AsRef<[u8]>>(frames: &[F]) -> Result<u64, DecodeError> {
    let [empty, seq] = frames else {
        return Err(DecodeError::Frames {
            expected: 2,
            found: frames.len(),
        });
    };
    if !empty.as_ref().is_empty() {
        return Err(DecodeError::Delimiter);
    }
    sequence(seq.as_ref())
}

/// One replayed batch: `[b"", topic, seq, payload]`, the payload already encoded (a
/// publisher replays the bytes it buffered).
pub fn encode_replay_batch(topic: &[u8], seq: u64, payload: &[u8]) -> [Vec<u8>; 4] {
    [
        Vec::new(),
        topic.to_vec(),
        seq.to_be_bytes().to_vec(),
        payload.to_vec(),
    ]
}

/// The end marker: `[b"", b"", -1 (8 bytes, signed big-endian), b""]`.
pub fn encode_replay_end() -> [Vec<u8>; 4] {
    [Vec::new(), Vec::new(), END_SEQ.to_vec(), Vec::new()]
}

/// Decodes one frame of a replay answer: `[b"", topic, seq, payload]` (SGLang), or
/// `[b"", seq, payload]` (vLLM's `ZmqEventPublisher`: no topic), each list ending with its
/// end marker.
pub fn decode_replay_frame<F: AsRef<[u8]>>(frames: &[F]) -> Result<ReplayFrame, DecodeError> {
    let (empty, topic, seq, payload) = match frames {
        [empty, topic, seq, payload] => (empty.as_ref(), topic.as_ref(), seq, payload),
        // vLLM sends no topic: `[b"", seq, payload]`, ending `[b"", -1, b""]`.
        [empty, seq, payload] => (empty.as_ref(), &[][..], seq, payload),
        _ => {
            return Err(DecodeError::Frames {
                expected: 4,
                found: frames.len(),
            });
        }
    };
    if !empty.is_empty() {
        return Err(DecodeError::Delimiter);
    }
    // The default topic is empty too, so the sequence and the empty payload mark the end.
    if seq.as_ref() == END_SEQ && payload.as_ref().is_empty() {
        return Ok(ReplayFrame::End);
    }
    message(topic, seq.as_ref(), payload.as_ref()).map(ReplayFrame::Batch)
}

/// An 8-byte big-endian sequence frame.
pub(crate) fn sequence(b: &[u8]) -> Result<u64, DecodeError> {
    <[u8; 8]>::try_from(b)
        .map(u64::from_be_bytes)
        .map_err(|_| DecodeError::Sequence { len: b.len() })
}

fn message(topic: &[u8], seq: &[u8], payload: &[u8]) -> Result<EventMessage, DecodeError> {
    Ok(EventMessage {
        topic: topic.to_vec(),
        seq: sequence(seq)?,
        batch: decode_payload(payload)?,
    })
}
