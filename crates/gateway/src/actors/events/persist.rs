//! The chain index's persistence: every snapshot interval, when something changed, each
//! rank's holdings go to the store with the next sequence number to apply and the engine
//! process (`startup_time`) they came from; once more when the actor stops. At start the
//! last snapshot's holdings are restored, and wait for their worker: when it comes back as
//! the same engine process its ranks resume from their sequence (replay brings what was
//! published meanwhile, or a gap it cannot cover clears the rank, as for any gap); when it
//! comes back as another process, or not at all once startup registration is over, they
//! go.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use actix::prelude::*;
use kvgate_core::clock::unix_now;
use kvgate_policies::WorkerId;
use kvgate_store::{
    ChainChunk, EventsHeader, EventsImage, FORMAT_VERSION, Persist, Persister, RankStamp,
};
use tracing::info;

use super::EventsActor;
use crate::actors::index::FleetSettled;

/// Blocks per stored chunk (about 1.7 MB encoded): a large rank spans several.
const CHUNK_BLOCKS: usize = 65_536;
/// How soon a snapshot the writer had no room for is offered again.
const RETRY: Duration = Duration::from_millis(20);

/// Where and how often the chain index is written.
#[derive(Debug, Clone)]
pub struct SnapshotSettings {
    pub persister: Option<Persister>,
    pub interval: Duration,
}

/// What a restored worker's holdings belong to.
#[derive(Debug)]
struct Restored {
    url: String,
    startup_time: Option<f64>,
    block_size: Option<u32>,
    next: BTreeMap<u32, u64>,
}

/// A snapshot in progress: the ranks still to export (each is stamped with its sequence
/// when its blocks are taken, so the two agree), the stamps of those done, the chunks so far.
#[derive(Debug)]
struct SnapJob {
    generation: u64,
    left: VecDeque<(WorkerId, u32)>,
    done: Vec<RankStamp>,
    chunks: u32,
}

#[derive(Debug, Default)]
pub(super) struct Persistence {
    persister: Option<Persister>,
    interval: Duration,
    /// Changed since the last snapshot was handed over.
    pub(super) dirty: bool,
    generation: u64,
    /// A snapshot's messages the writer had no room for yet, the commit last.
    pending: VecDeque<Persist>,
    /// The snapshot being taken, a rank per mailbox turn.
    job: Option<SnapJob>,
    /// Restored holdings whose worker has not subscribed yet.
    restored: HashMap<WorkerId, Restored>,
    /// The workers of the last fleet: restored ones outside it go once it has settled.
    fleet: HashSet<WorkerId>,
}

impl Persistence {
    /// The rank positions to resume `worker` from, when restored holdings are of the
    /// engine process started at `startup_time`; `None` when there are none or they are
    /// another process's (the caller drops them). An engine that reports no
    /// `startup_time` cannot be told from a restarted one here: its publisher's sequence
    /// starting again below the resumed one tells it instead.
    pub(super) fn claim(
        &mut self,
        worker: WorkerId,
        startup_time: Option<f64>,
    ) -> Option<BTreeMap<u32, u64>> {
        let r = self.restored.remove(&worker)?;
        if r.startup_time != startup_time {
            info!(worker = %r.url, "the engine restarted while the gateway was down: its restored KV-event blocks are dropped");
            self.dirty = true;
            return None;
        }
        Some(r.next)
    }

    /// Forgets `worker`'s restored position; true when there was one (the caller drops
    /// its holdings).
    pub(super) fn discard(&mut self, worker: WorkerId) -> bool {
        let had = self.restored.remove(&worker).is_some();
        self.dirty |= had;
        had
    }

    pub(super) fn fleet_is(&mut self, ids: impl IntoIterator<Item = WorkerId>) {
        self.fleet = ids.into_iter().collect();
    }
}

impl EventsActor {
    /// Restores the chain index from `image` (its holdings wait for their workers) and
    /// writes a snapshot every `settings.interval` when something changed.
    pub fn with_snapshots(
        mut self,
        settings: SnapshotSettings,
        image: Option<EventsImage>,
    ) -> Self {
        self.persist.persister = settings.persister;
        self.persist.interval = settings.interval;
        let Some(image) = image else {
            return self;
        };
        self.persist.generation = image.header.generation;
        for stamp in image.header.ranks {
            let r = self
                .persist
                .restored
                .entry(stamp.worker)
                .or_insert_with(|| Restored {
                    url: stamp.url.clone(),
                    startup_time: stamp.startup_time,
                    block_size: stamp.block_size,
                    next: BTreeMap::new(),
                });
            r.next.insert(stamp.rank, stamp.next_seq);
        }
        let mut blocks = 0;
        for c in image.chunks {
            // Only ranks the header vouches for.
            if self
                .persist
                .restored
                .get(&c.worker)
                .is_some_and(|r| r.next.contains_key(&c.rank))
            {
                blocks += self.index.restore_rank(c.worker, c.rank, &c.blocks);
            }
        }
        info!(
            workers = self.persist.restored.len(),
            blocks, "KV-event index restored; it is used once each worker's events resume"
        );
        self
    }

    /// Starts the snapshot timer (from `started`).
    pub(super) fn start_snapshots(&mut self, ctx: &mut Context<Self>) {
        if self.persist.persister.is_some() && !self.persist.interval.is_zero() {
            ctx.run_interval(self.persist.interval, |act, ctx| {
                if act.persist.dirty && act.persist.job.is_none() && act.persist.pending.is_empty()
                {
                    act.start_snapshot();
                    act.snapshot_step(ctx);
                }
            });
        }
    }

    /// Drops the snapshot in progress (its chunks are never committed) and takes a new
    /// one at the next interval.
    pub(super) fn abandon_snapshot(&mut self) {
        self.persist.job = None;
        self.persist.pending.clear();
        self.persist.dirty = true;
    }

    /// Lists every rank, subscribed or restored, for a new snapshot.
    fn start_snapshot(&mut self) {
        self.persist.dirty = false;
        self.persist.generation += 1;
        let subscribed = (self.workers.iter()).flat_map(|(id, w)| w.next.keys().map(|r| (*id, *r)));
        let restored =
            (self.persist.restored.iter()).flat_map(|(id, r)| r.next.keys().map(|k| (*id, *k)));
        let mut left: Vec<(WorkerId, u32)> = subscribed.chain(restored).collect();
        left.sort_unstable();
        self.persist.job = Some(SnapJob {
            generation: self.persist.generation,
            left: left.into(),
            done: Vec::new(),
            chunks: 0,
        });
    }

    /// One rank of the snapshot in progress to the writer, then the next on a later
    /// mailbox turn: routing lookups are answered between ranks, not after all of them.
    fn snapshot_step(&mut self, ctx: &mut Context<Self>) {
        if !self.persist.pending.is_empty() {
            // The writer is still taking the last rank's chunks.
            ctx.run_later(RETRY, |act, ctx| act.snapshot_step(ctx));
            return;
        }
        let more = self.export_next();
        self.hand_over(ctx);
        if more {
            ctx.run_later(Duration::ZERO, |act, ctx| act.snapshot_step(ctx));
        }
    }

    /// The stamp of `worker`'s `rank` as it stands, subscribed or restored.
    fn stamp(&self, worker: WorkerId, rank: u32) -> Option<RankStamp> {
        let stamp = |url: &str, startup_time, block_size, next_seq| RankStamp {
            worker,
            url: url.to_owned(),
            startup_time,
            rank,
            next_seq,
            block_size,
        };
        if let Some(w) = self.workers.get(&worker) {
            return (w.next.get(&rank))
                .map(|&n| stamp(&w.url, w.startup_time, w.desc.block_size, n));
        }
        let r = self.persist.restored.get(&worker)?;
        (r.next.get(&rank)).map(|&n| stamp(&r.url, r.startup_time, r.block_size, n))
    }

    /// Exports the next rank of the snapshot in progress into `pending`, or, when none is
    /// left, its commit; false once the commit is queued.
    fn export_next(&mut self) -> bool {
        let Some(job) = self.persist.job.as_mut() else {
            return false;
        };
        let Some((worker, rank)) = job.left.pop_front() else {
            let job = self.persist.job.take();
            if let Some(job) = job {
                self.persist
                    .pending
                    .push_back(Persist::EventsCommit(EventsHeader {
                        format_version: FORMAT_VERSION,
                        generation: job.generation,
                        written_at: unix_now(),
                        ranks: job.done,
                        chunks: job.chunks,
                    }));
            }
            return false;
        };
        // A rank gone since the snapshot began is left out of it.
        let Some(stamp) = self.stamp(worker, rank) else {
            return true;
        };
        let mut blocks = self.index.export_rank(worker, rank).into_iter();
        let Some(job) = self.persist.job.as_mut() else {
            return false;
        };
        loop {
            let part: Vec<_> = blocks.by_ref().take(CHUNK_BLOCKS).collect();
            if part.is_empty() {
                break;
            }
            self.persist.pending.push_back(Persist::EventsChunk {
                generation: job.generation,
                seq: job.chunks,
                chunk: Box::new(ChainChunk {
                    worker,
                    rank,
                    blocks: part,
                }),
            });
            job.chunks += 1;
        }
        job.done.push(stamp);
        true
    }

    /// Offers the pending messages to the writer without waiting; what it has no room for
    /// is offered again shortly.
    fn hand_over(&mut self, ctx: &mut Context<Self>) {
        let Some(p) = self.persist.persister.clone() else {
            self.persist.pending.clear();
            return;
        };
        while let Some(msg) = self.persist.pending.pop_front() {
            match p.offer(msg) {
                Ok(()) => {}
                Err(Some(msg)) => {
                    self.persist.pending.push_front(msg);
                    ctx.run_later(RETRY, |act, ctx| act.hand_over(ctx));
                    return;
                }
                // The writer is gone (shutdown): nothing more can be written.
                Err(None) => {
                    self.persist.pending.clear();
                    return;
                }
            }
        }
    }

    /// The last snapshot, as the actor stops: waits for the writer's room.
    pub(super) fn final_snapshot(&mut self) {
        let Some(p) = self.persist.persister.clone() else {
            return;
        };
        if self.persist.dirty || self.persist.job.is_some() {
            // A snapshot still queued or in progress is superseded by this one.
            self.persist.pending.clear();
            self.start_snapshot();
            while self.export_next() {}
        }
        while let Some(msg) = self.persist.pending.pop_front() {
            if !p.send_blocking(msg) {
                return;
            }
        }
    }
}

impl Handler<FleetSettled> for EventsActor {
    type Result = ();

    /// Startup registration is over: restored holdings of workers that did not come back go.
    fn handle(&mut self, _: FleetSettled, _: &mut Context<Self>) {
        let gone: Vec<WorkerId> = (self.persist.restored.keys())
            .filter(|w| !self.persist.fleet.contains(w))
            .copied()
            .collect();
        for w in gone {
            if let Some(r) = self.persist.restored.remove(&w) {
                info!(worker = %r.url, "worker did not come back: its restored KV-event blocks are dropped");
            }
            self.index.forget_worker(w);
            self.persist.dirty = true;
        }
    }
}
