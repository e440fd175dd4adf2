//! What a snapshot is made of, as stored: the committed header, its chunks and the
//! worker registry image.

use std::time::{SystemTime, UNIX_EPOCH};

use kvgate_kv_index::{HashSnapshot, SnapshotRecord};
use kvgate_policies::WorkerId;
use serde::{Deserialize, Serialize};

/// Bumped whenever the layout or an encoded type changes.
pub const FORMAT_VERSION: u32 = 2;

/// Which engine restart an index entry belongs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerStamp {
    pub worker: WorkerId,
    pub url: String,
    pub startup_time: Option<f64>,
}

/// The committed description of one snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageHeader {
    pub format_version: u32,
    pub generation: u64,
    /// Seconds since the Unix epoch.
    pub written_at: f64,
    pub models: Vec<String>,
    pub workers: Vec<WorkerStamp>,
    pub chunks: u32,
}

/// One piece of a snapshot. `model` indexes `ImageHeader::models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Chunk {
    Text {
        model: u32,
        page_size: usize,
        records: Vec<SnapshotRecord<u8, WorkerId>>,
    },
    Tokens {
        model: u32,
        page_size: usize,
        records: Vec<SnapshotRecord<u32, WorkerId>>,
    },
    Hash {
        model: u32,
        snapshot: HashSnapshot<WorkerId>,
    },
}

/// Workers that came and went through the admin API.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryImage {
    /// Added through the API: registered again at start.
    pub added: Vec<String>,
    /// Removed through the API: not registered at start even when the flags list them.
    pub removed: Vec<String>,
}

/// A loaded snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub header: ImageHeader,
    pub chunks: Vec<Chunk>,
}

pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
