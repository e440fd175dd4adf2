//! A worker's identity.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A worker's identity: a hash of its normalised URL, so it is stable across restarts.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkerId(pub u64);

impl WorkerId {
    /// The id of the worker at `url` (already normalised by the caller).
    pub fn from_url(url: &str) -> WorkerId {
        WorkerId(xxhash_rust::xxh3::xxh3_64(url.as_bytes()))
    }

    /// The id of this worker's data-parallel rank `rank` as a routing target of its own:
    /// rank 0 is the worker itself, so a worker with one rank keeps its id, and every id
    /// is stable across restarts (the index's tenants outlive the gateway).
    pub fn rank(self, rank: u32) -> WorkerId {
        if rank == 0 {
            return self;
        }
        let mut b = [0u8; 12];
        b[..8].copy_from_slice(&self.0.to_le_bytes());
        b[8..].copy_from_slice(&rank.to_le_bytes());
        WorkerId(xxhash_rust::xxh3::xxh3_64(&b))
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkerId({self})")
    }
}

impl std::str::FromStr for WorkerId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        u64::from_str_radix(s, 16).map(WorkerId)
    }
}
