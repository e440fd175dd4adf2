//! The writer thread: the only owner of the sled handle at run time. Actors hand it
//! snapshot chunks (of the prefix index and of the KV-event chain index, each family with
//! generations of its own) and registry images over a crossbeam channel and never wait for
//! disk.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, SendTimeoutError, Sender, TrySendError};
use tracing::{debug, error, info};

use crate::db::Store;
use crate::error::StoreError;
use crate::image::{ChainChunk, Chunk, EventsHeader, Image, ImageHeader, RegistryImage};

/// What is done with a snapshot read back, on the writer's thread.
pub struct Loaded(Box<dyn FnOnce(Option<Image>) + Send>);

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Loaded")
    }
}

/// Work for the writer.
#[derive(Debug)]
pub enum Persist {
    /// A chunk of an uncommitted generation.
    Chunk {
        generation: u64,
        seq: u32,
        chunk: Box<Chunk>,
    },
    /// Every chunk of this generation was sent: make it current.
    Commit(ImageHeader),
    /// A chunk of an uncommitted generation of the KV-event chain index.
    EventsChunk {
        generation: u64,
        seq: u32,
        chunk: Box<ChainChunk>,
    },
    /// Every chunk of this chain-index generation was sent: make it current.
    EventsCommit(EventsHeader),
    /// Answered once everything queued before it is on disk.
    Flush(Sender<()>),
    /// Answered with the last committed snapshot (an actor rebuilding its state).
    Load(Loaded),
}

/// Counters a person or a test can read.
#[derive(Debug, Default)]
pub struct PersistStats {
    pub snapshots_written: AtomicU64,
    pub write_failures: AtomicU64,
    /// Times a chunk waited because the writer was behind (the snapshot pauses).
    pub deferred: AtomicU64,
    /// The newest generation on disk.
    pub committed_generation: AtomicU64,
    /// Snapshots of the KV-event chain index committed.
    pub events_snapshots_written: AtomicU64,
}

/// The longest a shutdown waits on the writer, for room in its queue or for a flush: a
/// writer stuck in the file system (its data directory deleted under it, a hung disk)
/// must not keep the gateway from exiting.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// The sending side, held by the actors.
#[derive(Debug, Clone)]
pub struct Persister {
    tx: Sender<Persist>,
    /// Registry images travel apart from snapshot chunks, so an admin change never waits
    /// behind a large snapshot.
    reg_tx: Sender<RegistryImage>,
    pub stats: Arc<PersistStats>,
    /// A shutdown wait ran out: the writer is taken as stuck, and later waits return at once.
    stuck: Arc<AtomicBool>,
}

impl Persister {
    /// Queues without waiting. When the writer is behind the message comes back
    /// (`Err(Some)`) to be offered again later; `Err(None)` means the writer is gone.
    pub fn offer(&self, p: Persist) -> Result<(), Option<Persist>> {
        match self.tx.try_send(p) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(p)) => {
                self.stats.deferred.fetch_add(1, Ordering::Relaxed);
                Err(Some(p))
            }
            Err(TrySendError::Disconnected(_)) => Err(None),
        }
    }

    /// Hands the newest registry image to the writer (never blocks; the writer keeps only
    /// the latest).
    pub fn registry(&self, r: RegistryImage) {
        let _ = self.reg_tx.send(r);
    }

    /// Queues, waiting for room at most [`SHUTDOWN_WAIT`] (shutdown only). False when the
    /// writer is gone or stuck: the rest of the shutdown does not wait on it either.
    pub fn send_blocking(&self, p: Persist) -> bool {
        if self.stuck.load(Ordering::Relaxed) {
            return false;
        }
        match self.tx.send_timeout(p, SHUTDOWN_WAIT) {
            Ok(()) => true,
            Err(SendTimeoutError::Timeout(_)) => {
                self.gave_up("room in its queue");
                false
            }
            Err(SendTimeoutError::Disconnected(_)) => false,
        }
    }

    /// Whether a shutdown wait on the writer ran out.
    pub fn stuck(&self) -> bool {
        self.stuck.load(Ordering::Relaxed)
    }

    fn gave_up(&self, what: &str) {
        if !self.stuck.swap(true, Ordering::Relaxed) {
            error!(
                waited_secs = SHUTDOWN_WAIT.as_secs(),
                "the store writer gave no {what}: the data directory may be gone or its disk hung; the last snapshot is not written"
            );
            self.stats.write_failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The last committed snapshot, read back from disk; waits for the writer (a rebuild
    /// after a failure only).
    pub fn reload(&self) -> Option<Image> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        if !self.reload_then(move |image| {
            let _ = tx.send(image);
        }) {
            return None;
        }
        rx.recv().ok().flatten()
    }

    /// Reads the last committed snapshot back without waiting: `done` gets it on the
    /// writer's thread, after what was queued before. False when the writer is gone.
    pub fn reload_then(&self, done: impl FnOnce(Option<Image>) + Send + 'static) -> bool {
        self.tx.send(Persist::Load(Loaded(Box::new(done)))).is_ok()
    }

    /// Waits until everything queued so far is written, at most [`SHUTDOWN_WAIT`]
    /// (shutdown only); false when it is not.
    pub fn flush(&self) -> bool {
        let (tx, rx) = crossbeam_channel::bounded(1);
        if !self.send_blocking(Persist::Flush(tx)) {
            return false;
        }
        match rx.recv_timeout(SHUTDOWN_WAIT) {
            Ok(()) => true,
            Err(RecvTimeoutError::Timeout) => {
                self.gave_up("answer to a flush");
                false
            }
            Err(RecvTimeoutError::Disconnected) => false,
        }
    }
}

/// Starts the writer thread on `store`.
pub fn spawn(store: Store) -> std::io::Result<(Persister, JoinHandle<()>)> {
    // Bounded: a slow disk pauses snapshots, never makes memory grow. A chunk holds up to
    // 1 MiB of edges, so a handful queued keeps the writer busy without copying out a
    // whole tree of long prompts ahead of it.
    let (tx, rx) = crossbeam_channel::bounded(8);
    let (reg_tx, reg_rx) = crossbeam_channel::unbounded();
    let stats = Arc::new(PersistStats::default());
    if let Ok(Some(h)) = store.header() {
        stats
            .committed_generation
            .store(h.generation, Ordering::Release);
    }
    let s = stats.clone();
    let handle = std::thread::Builder::new()
        .name("kvgate-writer".into())
        .spawn(move || run(store, rx, reg_rx, &s))?;
    let stuck = Arc::default();
    Ok((
        Persister {
            tx,
            reg_tx,
            stats,
            stuck,
        },
        handle,
    ))
}

/// The newest registry image not yet on disk. A failed write is retried after each
/// commit and flush, so a disk that was full for a moment does not leave an API change
/// unsaved until the next one.
#[derive(Default)]
struct UnsavedRegistry {
    image: Option<RegistryImage>,
    /// Whether this image already failed once (counted once, not per retry).
    failed: bool,
}

impl UnsavedRegistry {
    fn offer(&mut self, image: RegistryImage) {
        self.image = Some(image);
        self.failed = false;
    }

    fn save(&mut self, store: &Store, stats: &PersistStats) {
        let Some(r) = self.image.take() else {
            return;
        };
        if let Err(e) = store.put_registry(&r) {
            if !self.failed {
                error!(error = %e, "registry write failed; it is retried after the next snapshot");
                stats.write_failures.fetch_add(1, Ordering::Relaxed);
            }
            self.image = Some(r);
            self.failed = true;
        }
    }
}

/// One family of snapshots (the prefix index's, the chain index's) as the writer sees it.
#[derive(Default)]
struct Family {
    /// A generation with a failed chunk is never committed.
    failed: Option<u64>,
}

impl Family {
    fn chunk(
        &mut self,
        generation: u64,
        seq: u32,
        drop_uncommitted: impl FnOnce() -> Result<(), StoreError>,
        put: impl FnOnce() -> Result<(), StoreError>,
        stats: &PersistStats,
    ) {
        if self.failed == Some(generation) {
            return;
        }
        // A new generation starts: chunks of abandoned ones go first.
        if seq == 0
            && let Err(e) = drop_uncommitted()
        {
            error!(error = %e, "cannot clear abandoned snapshot chunks");
        }
        if let Err(e) = put() {
            error!(error = %e, "snapshot write failed; routing goes on, the previous snapshot stays");
            stats.write_failures.fetch_add(1, Ordering::Relaxed);
            self.failed = Some(generation);
        }
    }

    /// Commits `generation`; true when it became current.
    fn commit(
        &self,
        generation: u64,
        commit: impl FnOnce() -> Result<(), StoreError>,
        drop_uncommitted: impl FnOnce() -> Result<(), StoreError>,
        stats: &PersistStats,
    ) -> bool {
        if self.failed == Some(generation) {
            return false;
        }
        if let Err(e) = commit() {
            error!(error = %e, "snapshot commit failed; the previous snapshot stays");
            stats.write_failures.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        if let Err(e) = drop_uncommitted() {
            error!(error = %e, "cannot clear old snapshot chunks");
        }
        true
    }
}

fn run(store: Store, rx: Receiver<Persist>, reg_rx: Receiver<RegistryImage>, stats: &PersistStats) {
    let mut index = Family::default();
    let mut events = Family::default();
    let mut registry = UnsavedRegistry::default();
    loop {
        let msg = crossbeam_channel::select! {
            recv(rx) -> m => match m {
                Ok(m) => m,
                Err(_) => break,
            },
            recv(reg_rx) -> r => {
                if let Ok(r) = r {
                    // Only the newest image matters.
                    registry.offer(reg_rx.try_iter().last().unwrap_or(r));
                    registry.save(&store, stats);
                }
                continue;
            }
        };
        match msg {
            Persist::Chunk {
                generation,
                seq,
                chunk,
            } => index.chunk(
                generation,
                seq,
                || store.drop_uncommitted(),
                || store.put_chunk(generation, seq, &chunk),
                stats,
            ),
            Persist::Commit(header) => {
                let done = index.commit(
                    header.generation,
                    || store.commit(&header),
                    || store.drop_uncommitted(),
                    stats,
                );
                if done {
                    stats.snapshots_written.fetch_add(1, Ordering::Relaxed);
                    stats
                        .committed_generation
                        .store(header.generation, Ordering::Release);
                    info!(
                        generation = header.generation,
                        chunks = header.chunks,
                        "index snapshot written"
                    );
                    registry.save(&store, stats);
                }
            }
            Persist::EventsChunk {
                generation,
                seq,
                chunk,
            } => events.chunk(
                generation,
                seq,
                || store.drop_uncommitted_events(),
                || store.put_events_chunk(generation, seq, &chunk),
                stats,
            ),
            Persist::EventsCommit(header) => {
                let done = events.commit(
                    header.generation,
                    || store.commit_events(&header),
                    || store.drop_uncommitted_events(),
                    stats,
                );
                if done {
                    stats
                        .events_snapshots_written
                        .fetch_add(1, Ordering::Relaxed);
                    debug!(
                        generation = header.generation,
                        ranks = header.ranks.len(),
                        "KV-event index snapshot written"
                    );
                }
            }
            Persist::Load(reply) => {
                let image = store.load().unwrap_or_else(|e| {
                    error!(error = %e, "cannot read the committed snapshot back");
                    None
                });
                (reply.0)(image);
            }
            Persist::Flush(ack) => {
                if let Some(r) = reg_rx.try_iter().last() {
                    registry.offer(r);
                }
                registry.save(&store, stats);
                let _ = ack.send(());
            }
        }
    }
    if let Some(r) = reg_rx.try_iter().last() {
        registry.offer(r);
    }
    registry.save(&store, stats);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;
    use crate::testing::{header, text_chunk};

    fn snapshot(p: &Persister, generation: u64, prompt: &str) {
        let chunk = Box::new(text_chunk(&[(prompt, 1)]));
        assert!(p.send_blocking(Persist::Chunk {
            generation,
            seq: 0,
            chunk,
        }));
        assert!(p.send_blocking(Persist::Commit(header(generation, 1))));
        p.flush();
    }

    #[test]
    fn failing_writes_are_counted_and_the_last_good_snapshot_stays() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path()).expect("store");
        let disk_full = store.fail_writes.clone();
        let (p, writer) = spawn(store).expect("writer");

        snapshot(&p, 1, "first");
        assert_eq!(p.stats.snapshots_written.load(Relaxed), 1);
        assert_eq!(p.stats.write_failures.load(Relaxed), 0);

        // A full disk: the chunk fails, so its generation is never committed; the
        // registry write fails too. Each failure is counted; the writer keeps going.
        disk_full.store(true, Relaxed);
        snapshot(&p, 2, "second");
        p.registry(RegistryImage {
            added: vec!["http://x:1".into()],
            removed: vec![],
            kv_events: Default::default(),
        });
        p.flush();
        assert_eq!(p.stats.write_failures.load(Relaxed), 2);
        assert_eq!(p.stats.snapshots_written.load(Relaxed), 1);
        assert_eq!(p.stats.committed_generation.load(Relaxed), 1);

        // Space again: the next snapshot lands.
        disk_full.store(false, Relaxed);
        snapshot(&p, 3, "third");
        assert_eq!(p.stats.committed_generation.load(Relaxed), 3);
        drop(p);
        writer.join().expect("writer thread");

        let store = Store::open(dir.path()).expect("reopen");
        let image = store.load().expect("load").expect("an image");
        assert_eq!(image.header.generation, 3);
        assert_eq!(image.chunks, vec![text_chunk(&[("third", 1)])]);
        // The registry image that failed was written once there was space again.
        assert_eq!(
            store.registry().expect("registry").added,
            vec!["http://x:1"]
        );
    }
}
