//! A consistent-hash ring over the fleet's URLs, shared by consistent_hashing and
//! prefix_hash.
//!
//! Each worker gets [`HashRing::VNODES`] points at `xxh3_64("{url}#{i}")`; a key hashes
//! (xxh3_64) to a position and the walk goes clockwise to the first acceptable worker.
//! When a worker joins or leaves, only the keys between its points and their predecessors
//! move: about 1/N of them. The selector builds the ring when the set of workers changes
//! (never per request) and passes it in [`SelectInput::ring`](crate::SelectInput); the
//! walk skips ineligible workers, so health changes need no rebuild.

use xxhash_rust::xxh3::xxh3_64;

use kvgate_core::WorkerId;

use crate::snapshot::WorkerView;

/// Points on the ring, sorted by position.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HashRing {
    points: Vec<(u64, WorkerId)>,
    workers: usize,
}

impl HashRing {
    /// Virtual nodes per worker.
    pub const VNODES: usize = 150;

    /// A ring over `(id, url)` pairs.
    pub fn new<'a>(workers: impl IntoIterator<Item = (WorkerId, &'a str)>) -> HashRing {
        let mut points = Vec::new();
        let mut count = 0;
        let mut buf = String::new();
        for (id, url) in workers {
            count += 1;
            for i in 0..Self::VNODES {
                buf.clear();
                buf.push_str(url);
                buf.push('#');
                buf.push_str(&i.to_string());
                points.push((xxh3_64(buf.as_bytes()), id));
            }
        }
        points.sort_unstable();
        HashRing {
            points,
            workers: count,
        }
    }

    /// A ring over every worker of the snapshot, eligible or not.
    pub fn from_views(views: &[WorkerView]) -> HashRing {
        HashRing::new(views.iter().map(|w| (w.id, &*w.url)))
    }

    /// Number of workers on the ring.
    pub fn len(&self) -> usize {
        self.workers
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The ring position of a key.
    pub fn position(key: &[u8]) -> u64 {
        xxh3_64(key)
    }

    /// The first worker clockwise from `position` that `accept` accepts.
    pub fn owner(&self, position: u64, accept: impl Fn(WorkerId) -> bool) -> Option<WorkerId> {
        let start = self.points.partition_point(|(p, _)| *p < position);
        let (before, after) = self.points.split_at(start);
        after
            .iter()
            .chain(before)
            .map(|(_, id)| *id)
            .find(|id| accept(*id))
    }
}

#[cfg(test)]
mod tests;
