//! The sled layout: the only module of kvgate that touches sled.
//!
//! Layout (sled 0.34, directory `DATA_DIR/store`):
//! - tree `meta`: `format_version` (u32, big-endian), `current` (the committed
//!   [`ImageHeader`]), `registry` (JSON [`RegistryImage`]).
//! - tree `index`: key `generation (u64 BE) ‖ seq (u32 BE) ‖ piece (u32 BE)` → up to 16 KiB
//!   of one encoded [`Chunk`]; a chunk is its pieces in key order.
//! - tree `events` and meta key `events_current` ([`EventsHeader`]): the same for the
//!   KV-event chain index's [`ChainChunk`]s, with generations of their own. A store
//!   without them (written before they existed) reads as having no such snapshot.
//!
//! A snapshot writes all its chunks under a new generation, flushes, then replaces
//! `current` in one insert and flushes again; older generations are deleted after. A crash
//! at any point leaves `current` naming a complete generation.

use std::path::{Path, PathBuf};

use crate::error::StoreError;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::image::{
    ChainChunk, Chunk, EventsHeader, EventsImage, FORMAT_VERSION, Image, ImageHeader, RegistryImage,
};

#[derive(Debug)]
pub struct Store {
    pub(crate) path: PathBuf,
    db: sled::Db,
    meta: sled::Tree,
    index: sled::Tree,
    events: sled::Tree,
    /// The format version found on disk (after any upgrade); `None` in a store that has
    /// none yet and was opened for inspection.
    pub(crate) on_disk: Option<u32>,
    /// Tests turn this on to make every write fail as a full disk would.
    #[cfg(test)]
    pub(crate) fail_writes: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

fn chunk_key(generation: u64, seq: u32) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..8].copy_from_slice(&generation.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// A chunk is stored as small pieces. sled keeps a value (or a page of values) above a
/// quarter of its 512 KiB segment as a blob file, reads every blob its log still points to
/// when it opens, and deletes stale blobs late: with whole 1.2 MiB chunks a 1M-prompt store
/// took 0.6 s to open and 2-4 GiB of files for a 217 MiB snapshot. 16 KiB pieces measured
/// best (docs/benchmarks.md): 0.02 s to open, under 0.7 GiB, and routing p99 unmoved
/// during a write, where 96 KiB pieces stalled lookups for 3 ms at p99.9.
const PIECE: usize = 16 * 1024;

fn piece_key(generation: u64, seq: u32, piece: u32) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..12].copy_from_slice(&chunk_key(generation, seq));
    k[12..].copy_from_slice(&piece.to_be_bytes());
    k
}

/// sled's file lock outlives a closed handle by a moment (its flusher thread), so a store
/// that was just closed, by a gateway that stopped or a test, gets a few tries.
fn open_db(path: &Path, cache_bytes: u64) -> sled::Result<sled::Db> {
    let mut tries = 0;
    loop {
        let r = sled::Config::new()
            .path(path)
            .cache_capacity(cache_bytes)
            .open();
        match r {
            Err(sled::Error::Io(_)) if tries < 20 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            other => return other,
        }
    }
}

/// How a store is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// The most memory sled's page cache may hold, in bytes. sled 0.34's own default is
    /// 1 GiB, which a gateway's resident memory would have to budget for.
    pub cache_bytes: u64,
}

/// The page cache a store gets unless told otherwise.
pub const DEFAULT_CACHE_BYTES: u64 = 64 * 1024 * 1024;

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }
}

impl Store {
    /// Opens (or creates) the store in `dir/store` and checks its format version.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        Store::open_with(dir, StoreOptions::default())
    }

    /// [`Store::open`] with `options`.
    pub fn open_with(dir: &Path, options: StoreOptions) -> Result<Store, StoreError> {
        Store::open_here(dir, true, options)
    }

    /// `stamp`: write the format version into a new store; an inspection reads the store
    /// as it is. Any other format is refused, naming the version found.
    pub(crate) fn open_here(
        dir: &Path,
        stamp: bool,
        options: StoreOptions,
    ) -> Result<Store, StoreError> {
        let path = dir.join("store");
        let p = path.display().to_string();
        let sled_err = |e| StoreError::backend(&p, e);
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        let db = open_db(&path, options.cache_bytes.max(1)).map_err(sled_err)?;
        let meta = db.open_tree("meta").map_err(sled_err)?;
        let index = db.open_tree("index").map_err(sled_err)?;
        let events = db.open_tree("events").map_err(sled_err)?;
        let on_disk = match meta.get("format_version").map_err(sled_err)? {
            None if !stamp => None,
            None => {
                meta.insert("format_version", &FORMAT_VERSION.to_be_bytes())
                    .map_err(sled_err)?;
                db.flush().map_err(sled_err)?;
                Some(FORMAT_VERSION)
            }
            Some(v) => {
                let found = <[u8; 4]>::try_from(v.as_ref())
                    .map(u32::from_be_bytes)
                    .map_err(|_| StoreError::Corrupt {
                        path: p.clone(),
                        reason: "unreadable format version".into(),
                    })?;
                if found != FORMAT_VERSION {
                    return Err(StoreError::Version { path: p, found });
                }
                Some(found)
            }
        };
        Ok(Store {
            path,
            on_disk,
            db,
            meta,
            index,
            events,
            #[cfg(test)]
            fail_writes: Default::default(),
        })
    }

    /// The injected failure of the tests; nothing outside them.
    fn writable(&self) -> Result<(), StoreError> {
        #[cfg(test)]
        if self.fail_writes.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(StoreError::Io {
                path: self.path.display().to_string(),
                source: std::io::Error::from_raw_os_error(28), // ENOSPC
            });
        }
        Ok(())
    }

    fn sled_err(&self, e: sled::Error) -> StoreError {
        StoreError::backend(&self.path.display().to_string(), e)
    }

    fn corrupt(&self, reason: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            path: self.path.display().to_string(),
            reason: reason.into(),
        }
    }

    /// The committed header, if a snapshot was ever written.
    pub fn header(&self) -> Result<Option<ImageHeader>, StoreError> {
        self.meta_value("current", "snapshot header")
    }

    fn meta_value<T: DeserializeOwned>(
        &self,
        key: &str,
        what: &str,
    ) -> Result<Option<T>, StoreError> {
        let Some(raw) = self.meta.get(key).map_err(|e| self.sled_err(e))? else {
            return Ok(None);
        };
        kvgate_kv_index::decode(&raw)
            .map(Some)
            .map_err(|e| self.corrupt(format!("{what}: {e}")))
    }

    /// The last complete snapshot.
    pub fn load(&self) -> Result<Option<Image>, StoreError> {
        let Some(header) = self.header()? else {
            return Ok(None);
        };
        // The count comes from disk: never trust it for an allocation.
        // Decoding dominates a large restore and runs before the first request is served:
        // decoders on every core take chunks as this thread reads them out of sled.
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(8);
        let (tx, rx) = crossbeam_channel::bounded::<(u32, Vec<u8>)>(2 * threads);
        let (read, decoded) = std::thread::scope(|scope| {
            let decoders: Vec<_> = (0..threads)
                .map(|_| {
                    let rx = rx.clone();
                    scope.spawn(move || {
                        rx.iter()
                            .map(|(seq, raw)| {
                                let chunk = kvgate_kv_index::decode::<Chunk>(&raw)
                                    .map_err(|e| self.corrupt(format!("chunk {seq}: {e}")));
                                (seq, chunk)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            drop(rx);
            let read = self.read_chunks(&header, &tx);
            drop(tx);
            let decoded: Vec<_> = decoders
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        vec![(0, Err(self.corrupt("a decoding thread panicked")))]
                    })
                })
                .collect();
            (read, decoded)
        });
        read?;
        let mut numbered: Vec<(u32, Chunk)> = Vec::with_capacity(header.chunks as usize);
        for part in decoded {
            for (seq, chunk) in part {
                numbered.push((seq, chunk?));
            }
        }
        if numbered.len() != header.chunks as usize {
            return Err(self.corrupt(format!(
                "{} of {} chunks decoded",
                numbered.len(),
                header.chunks
            )));
        }
        numbered.sort_unstable_by_key(|c| c.0);
        let chunks = numbered.into_iter().map(|c| c.1).collect();
        Ok(Some(Image { header, chunks }))
    }

    /// Sends every chunk of `header`'s generation, whole, to the decoders.
    fn read_chunks(
        &self,
        header: &ImageHeader,
        tx: &crossbeam_channel::Sender<(u32, Vec<u8>)>,
    ) -> Result<(), StoreError> {
        for seq in 0..header.chunks {
            let raw = self.read_pieces(&self.index, header.generation, seq)?;
            if tx.send((seq, raw)).is_err() {
                break;
            }
        }
        Ok(())
    }

    /// One chunk's pieces, joined.
    fn read_pieces(
        &self,
        tree: &sled::Tree,
        generation: u64,
        seq: u32,
    ) -> Result<Vec<u8>, StoreError> {
        let mut raw = Vec::new();
        // Pieces come back in key order, which is their order.
        for kv in tree.scan_prefix(chunk_key(generation, seq)) {
            let (_, piece) = kv.map_err(|e| self.sled_err(e))?;
            raw.extend_from_slice(&piece);
        }
        if raw.is_empty() {
            return Err(self.corrupt(format!("chunk {seq} of generation {generation} is missing")));
        }
        Ok(raw)
    }

    /// Writes one chunk of a generation that is not committed yet.
    pub fn put_chunk(&self, generation: u64, seq: u32, chunk: &Chunk) -> Result<(), StoreError> {
        self.put_pieces(&self.index, generation, seq, chunk)
    }

    fn put_pieces<T: Serialize>(
        &self,
        tree: &sled::Tree,
        generation: u64,
        seq: u32,
        chunk: &T,
    ) -> Result<(), StoreError> {
        self.writable()?;
        let bytes =
            kvgate_kv_index::encode(chunk).map_err(|e| self.corrupt(format!("encoding: {e}")))?;
        let mut batch = sled::Batch::default();
        for (i, piece) in bytes.chunks(PIECE).enumerate() {
            let i = u32::try_from(i).map_err(|_| self.corrupt("chunk too large"))?;
            batch.insert(&piece_key(generation, seq, i), piece);
        }
        tree.apply_batch(batch).map_err(|e| self.sled_err(e))?;
        Ok(())
    }

    /// Makes `header`'s generation the current one. Old chunks stay until
    /// [`Store::drop_uncommitted`].
    pub fn commit(&self, header: &ImageHeader) -> Result<(), StoreError> {
        self.commit_as("current", header)
    }

    fn commit_as<H: Serialize>(&self, key: &str, header: &H) -> Result<(), StoreError> {
        self.writable()?;
        // Chunks must be durable before the header that names them.
        self.db.flush().map_err(|e| self.sled_err(e))?;
        let bytes =
            kvgate_kv_index::encode(header).map_err(|e| self.corrupt(format!("encoding: {e}")))?;
        self.meta.insert(key, bytes).map_err(|e| self.sled_err(e))?;
        self.db.flush().map_err(|e| self.sled_err(e))?;
        Ok(())
    }

    /// Removes every chunk that is not of the committed generation.
    pub fn drop_uncommitted(&self) -> Result<(), StoreError> {
        let keep = self.header()?.map_or(u64::MAX, |h| h.generation);
        self.drop_generations_except(keep)
    }

    /// Removes every chunk not of `keep` (stale or abandoned generations).
    pub fn drop_generations_except(&self, keep: u64) -> Result<(), StoreError> {
        self.drop_except(&self.index, keep)
    }

    fn drop_except(&self, tree: &sled::Tree, keep: u64) -> Result<(), StoreError> {
        let mut stale = Vec::new();
        for kv in tree.iter().keys() {
            let k = kv.map_err(|e| self.sled_err(e))?;
            if k.len() < 8 || k[..8] != keep.to_be_bytes() {
                stale.push(k);
            }
        }
        for k in stale {
            tree.remove(k).map_err(|e| self.sled_err(e))?;
        }
        Ok(())
    }

    /// The committed header of the chain index's snapshot, if one was ever written.
    pub fn events_header(&self) -> Result<Option<EventsHeader>, StoreError> {
        self.meta_value("events_current", "KV-event snapshot header")
    }

    /// The last complete snapshot of the chain index.
    pub fn load_events(&self) -> Result<Option<EventsImage>, StoreError> {
        let Some(header) = self.events_header()? else {
            return Ok(None);
        };
        // The count comes from disk: grown as chunks are read, never allocated up front.
        let mut chunks = Vec::new();
        for seq in 0..header.chunks {
            let raw = self.read_pieces(&self.events, header.generation, seq)?;
            let chunk = kvgate_kv_index::decode::<ChainChunk>(&raw)
                .map_err(|e| self.corrupt(format!("KV-event chunk {seq}: {e}")))?;
            chunks.push(chunk);
        }
        Ok(Some(EventsImage { header, chunks }))
    }

    /// Writes one chunk of a chain-index generation that is not committed yet.
    pub fn put_events_chunk(
        &self,
        generation: u64,
        seq: u32,
        chunk: &ChainChunk,
    ) -> Result<(), StoreError> {
        self.put_pieces(&self.events, generation, seq, chunk)
    }

    /// Makes the chain index's `header` generation the current one.
    pub fn commit_events(&self, header: &EventsHeader) -> Result<(), StoreError> {
        self.commit_as("events_current", header)
    }

    /// Removes every chain-index chunk that is not of its committed generation.
    pub fn drop_uncommitted_events(&self) -> Result<(), StoreError> {
        let keep = self.events_header()?.map_or(u64::MAX, |h| h.generation);
        self.drop_except(&self.events, keep)
    }

    pub fn registry(&self) -> Result<RegistryImage, StoreError> {
        match self.meta.get("registry").map_err(|e| self.sled_err(e))? {
            None => Ok(RegistryImage::default()),
            Some(raw) => {
                serde_json::from_slice(&raw).map_err(|e| self.corrupt(format!("registry: {e}")))
            }
        }
    }

    pub fn put_registry(&self, r: &RegistryImage) -> Result<(), StoreError> {
        self.writable()?;
        let bytes = serde_json::to_vec(r).map_err(|e| self.corrupt(format!("registry: {e}")))?;
        self.meta
            .insert("registry", bytes)
            .map_err(|e| self.sled_err(e))?;
        self.db.flush().map_err(|e| self.sled_err(e))?;
        Ok(())
    }

    /// Bytes on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests;
