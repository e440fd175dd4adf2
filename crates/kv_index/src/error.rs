//! Errors of this crate: all come from restoring data the caller supplied (a snapshot read
//! back from disk), so none is worth a retry with the same input.

use thiserror::Error;

/// Why a snapshot was refused.
#[derive(Debug, Error)]
pub enum SnapshotError {
    #[error("snapshot format version {found}, this build reads {expected}")]
    Version { found: u32, expected: u32 },
    #[error("snapshot page size {snapshot} differs from the configured {config}")]
    PageSize { snapshot: usize, config: usize },
    #[error("snapshot record {record} names a parent that does not precede it")]
    BadParent { record: usize },
    #[error("snapshot record {record} has an empty edge or one that is not whole pages")]
    BadEdge { record: usize },
    #[error("snapshot record {record} repeats a sibling's first page")]
    DuplicateChild { record: usize },
    #[error("snapshot has more records than an index can address")]
    TooLarge,
    #[error("snapshot bytes do not decode")]
    Codec(#[from] postcard::Error),
}
