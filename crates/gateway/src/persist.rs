//! The writer thread: the only owner of the sled handle at run time. Actors hand it
//! snapshot chunks and registry images over a crossbeam channel and never wait for disk.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use tracing::{error, info};

use crate::store::{Chunk, ImageHeader, RegistryImage, Store};

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
    Registry(RegistryImage),
    /// Answered once everything queued before it is on disk.
    Flush(Sender<()>),
}

/// Counters a person or a test can read.
#[derive(Debug, Default)]
pub struct PersistStats {
    pub snapshots_written: AtomicU64,
    pub write_failures: AtomicU64,
    /// Chunks not queued because the writer was behind (that snapshot is abandoned).
    pub dropped: AtomicU64,
    pub bytes_on_disk: AtomicU64,
    /// The newest generation on disk.
    pub committed_generation: AtomicU64,
}

/// The sending side, held by the actors.
#[derive(Debug, Clone)]
pub struct Persister {
    tx: Sender<Persist>,
    pub stats: Arc<PersistStats>,
}

impl Persister {
    /// Queues without waiting; `false` if the writer is behind or gone.
    pub fn offer(&self, p: Persist) -> bool {
        match self.tx.try_send(p) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Queues, waiting for room (shutdown only).
    pub fn send_blocking(&self, p: Persist) -> bool {
        self.tx.send(p).is_ok()
    }

    /// Waits until everything queued so far is written (shutdown only).
    pub fn flush(&self) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        if self.tx.send(Persist::Flush(tx)).is_ok() {
            let _ = rx.recv();
        }
    }
}

/// Starts the writer thread on `store`.
pub fn spawn(store: Store) -> std::io::Result<(Persister, JoinHandle<()>)> {
    // Bounded: a slow disk makes snapshots skip, never memory grow.
    let (tx, rx) = crossbeam_channel::bounded(64);
    let stats = Arc::new(PersistStats::default());
    if let Ok(Some(h)) = store.header() {
        stats
            .committed_generation
            .store(h.generation, Ordering::Release);
    }
    let s = stats.clone();
    let handle = std::thread::Builder::new()
        .name("kvgate-writer".into())
        .spawn(move || run(store, rx, &s))?;
    Ok((Persister { tx, stats }, handle))
}

fn run(store: Store, rx: Receiver<Persist>, stats: &PersistStats) {
    // A generation with a failed chunk is never committed.
    let mut failed_generation: Option<u64> = None;
    for msg in rx {
        match msg {
            Persist::Chunk {
                generation,
                seq,
                chunk,
            } => {
                if failed_generation == Some(generation) {
                    continue;
                }
                if let Err(e) = store.put_chunk(generation, seq, &chunk) {
                    error!(error = %e, "snapshot write failed; routing goes on, the previous snapshot stays");
                    stats.write_failures.fetch_add(1, Ordering::Relaxed);
                    failed_generation = Some(generation);
                }
            }
            Persist::Commit(header) => {
                if failed_generation == Some(header.generation) {
                    continue;
                }
                match store.commit(&header) {
                    Ok(()) => {
                        stats.snapshots_written.fetch_add(1, Ordering::Relaxed);
                        stats
                            .committed_generation
                            .store(header.generation, Ordering::Release);
                        stats
                            .bytes_on_disk
                            .store(store.size_on_disk(), Ordering::Relaxed);
                        info!(
                            generation = header.generation,
                            chunks = header.chunks,
                            "index snapshot written"
                        );
                    }
                    Err(e) => {
                        error!(error = %e, "snapshot commit failed; the previous snapshot stays");
                        stats.write_failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Persist::Registry(r) => {
                if let Err(e) = store.put_registry(&r) {
                    error!(error = %e, "registry write failed");
                    stats.write_failures.fetch_add(1, Ordering::Relaxed);
                }
            }
            Persist::Flush(ack) => {
                let _ = ack.send(());
            }
        }
    }
}
