//! What a snapshot is made of, as stored: the committed header and its chunks, for the
//! prefix index and for the KV-event chain index, and the worker registry image.

use kvgate_core::WorkerId;
use kvgate_kv_index::{ChainBlock, HashSnapshot, SnapshotRecord};
use serde::{Deserialize, Serialize};

/// Bumped whenever the layout or an encoded type changes. 3: postcard bytes; stores of
/// 1 and 2 (bincode) are refused, and moved aside by [`open_or_reset`](crate::open_or_reset).
pub const FORMAT_VERSION: u32 = 3;

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

/// Where one data-parallel rank's KV events stood when its holdings were written: the
/// engine process they came from and the next sequence number to apply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankStamp {
    pub worker: WorkerId,
    pub url: String,
    /// The engine's `/server_info` `startup_time` (`None` when it reports none).
    pub startup_time: Option<f64>,
    pub rank: u32,
    /// Every batch below it is in the holdings: a restarted gateway asks replay from here.
    pub next_seq: u64,
    pub block_size: Option<u32>,
}

/// The committed description of one snapshot of the KV-event chain index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventsHeader {
    pub format_version: u32,
    pub generation: u64,
    /// Seconds since the Unix epoch.
    pub written_at: f64,
    pub ranks: Vec<RankStamp>,
    pub chunks: u32,
}

/// Part of one rank's holdings, parents first; a rank's chunks come in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainChunk {
    pub worker: WorkerId,
    pub rank: u32,
    pub blocks: Vec<ChainBlock>,
}

/// A loaded snapshot of the chain index.
#[derive(Debug, Clone, PartialEq)]
pub struct EventsImage {
    pub header: EventsHeader,
    pub chunks: Vec<ChainChunk>,
}

/// Workers that came and went through the admin API.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryImage {
    /// Added through the API: registered again at start.
    pub added: Vec<String>,
    /// Removed through the API: not registered at start even when the flags list them.
    pub removed: Vec<String>,
    /// The KV-event settings an added worker was given (URL → its `--kv-events-config`
    /// JSON), registered with it again.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kv_events: std::collections::BTreeMap<String, String>,
}

/// A loaded snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub header: ImageHeader,
    pub chunks: Vec<Chunk>,
}
