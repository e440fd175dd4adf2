//! Bytes for snapshots: postcard (serde, varint integers). Decoding never allocates more
//! than its input can describe: a sequence's length prefix only bounds how far it reads,
//! serde preallocates at most a small cautious amount, so a corrupt length cannot make it
//! allocate without limit.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::SnapshotError;

/// Encodes a snapshot, a chunk of records (`&[SnapshotRecord]`) or a hash snapshot.
pub fn encode<S: Serialize + ?Sized>(value: &S) -> Result<Vec<u8>, SnapshotError> {
    postcard::to_stdvec(value).map_err(SnapshotError::from)
}

/// Decodes what [`encode`] wrote; bytes left over after the value are an error.
pub fn decode<D: DeserializeOwned>(bytes: &[u8]) -> Result<D, SnapshotError> {
    let (value, rest) = postcard::take_from_bytes(bytes).map_err(SnapshotError::from)?;
    if rest.is_empty() {
        Ok(value)
    } else {
        Err(SnapshotError::Codec(
            postcard::Error::DeserializeBadEncoding,
        ))
    }
}
