//! Bytes for snapshots: bincode with varint integers, decoding bounded by the input size
//! so a corrupt length prefix cannot make it allocate without limit.

use bincode::Options;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::SnapshotError;

fn options() -> impl Options {
    bincode::DefaultOptions::new()
}

/// Encodes a snapshot, a chunk of records (`&[SnapshotRecord]`) or a hash snapshot.
pub fn encode<S: Serialize + ?Sized>(value: &S) -> Result<Vec<u8>, SnapshotError> {
    options().serialize(value).map_err(SnapshotError::from)
}

/// Decodes what [`encode`] wrote.
pub fn decode<D: DeserializeOwned>(bytes: &[u8]) -> Result<D, SnapshotError> {
    options()
        .with_limit(bytes.len() as u64)
        .deserialize(bytes)
        .map_err(SnapshotError::from)
}
