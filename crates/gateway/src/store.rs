//! The one module that touches sled: where kvgate keeps the prefix index and the runtime
//! worker registry across restarts, under `--data-dir`.
//!
//! Layout (sled 0.34, directory `DATA_DIR/store`):
//! - tree `meta`: `format_version` (u32, big-endian), `current` (the committed
//!   [`ImageHeader`]), `registry` (JSON [`RegistryImage`]).
//! - tree `index`: key `generation (u64 BE) ‖ seq (u32 BE) ‖ piece (u32 BE)` → up to 16 KiB
//!   of one encoded [`Chunk`]; a chunk is its pieces in key order. (Format 1 stored each
//!   chunk whole under the 12-byte key; it is read as one piece and upgraded on open.)
//!
//! A snapshot writes all its chunks under a new generation, flushes, then replaces
//! `current` in one insert and flushes again; older generations are deleted after. A crash
//! at any point leaves `current` naming a complete generation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use kvgate_kv_index::{HashSnapshot, SnapshotRecord};
use kvgate_policies::WorkerId;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Bumped whenever the layout or an encoded type changes.
pub const FORMAT_VERSION: u32 = 2;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("store at {path}: {source}")]
    Sled { path: String, source: sled::Error },
    #[error("store at {path} has format version {found}, this kvgate reads {FORMAT_VERSION}")]
    Version { path: String, found: u32 },
    #[error("store at {path} is damaged: {reason}")]
    Corrupt { path: String, reason: String },
    #[error("store at {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

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

#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    db: sled::Db,
    meta: sled::Tree,
    index: sled::Tree,
    /// The format version found on disk (after any upgrade); `None` in a store that has
    /// none yet and was opened for inspection.
    on_disk: Option<u32>,
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
fn open_db(path: &Path) -> sled::Result<sled::Db> {
    let mut tries = 0;
    loop {
        let r = sled::Config::new()
            .path(path)
            .cache_capacity(64 * 1024 * 1024)
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

impl Store {
    /// Opens (or creates) the store in `dir/store` and checks its format version.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        Store::open_here(dir, true)
    }

    /// `stamp`: write the format version into a new store and upgrade a version-1 one;
    /// an inspection reads the store as it is.
    fn open_here(dir: &Path, stamp: bool) -> Result<Store, StoreError> {
        let path = dir.join("store");
        let p = path.display().to_string();
        let sled_err = |source| StoreError::Sled {
            path: p.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        let db = open_db(&path).map_err(sled_err)?;
        let meta = db.open_tree("meta").map_err(sled_err)?;
        let index = db.open_tree("index").map_err(sled_err)?;
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
                if found == 1 && stamp {
                    // Version 1 kept each chunk whole under its 12-byte key; a prefix scan
                    // reads that as a chunk of one piece, so the store is upgraded in place.
                    meta.insert("format_version", &FORMAT_VERSION.to_be_bytes())
                        .map_err(sled_err)?;
                    db.flush().map_err(sled_err)?;
                } else if found != FORMAT_VERSION && found != 1 {
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

    fn sled_err(&self, source: sled::Error) -> StoreError {
        StoreError::Sled {
            path: self.path.display().to_string(),
            source,
        }
    }

    fn corrupt(&self, reason: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            path: self.path.display().to_string(),
            reason: reason.into(),
        }
    }

    /// The committed header, if a snapshot was ever written.
    pub fn header(&self) -> Result<Option<ImageHeader>, StoreError> {
        let Some(raw) = self.meta.get("current").map_err(|e| self.sled_err(e))? else {
            return Ok(None);
        };
        kvgate_kv_index::decode(&raw)
            .map(Some)
            .map_err(|e| self.corrupt(format!("snapshot header: {e}")))
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
            let mut raw = Vec::new();
            // Pieces come back in key order, which is their order.
            for kv in self.index.scan_prefix(chunk_key(header.generation, seq)) {
                let (_, piece) = kv.map_err(|e| self.sled_err(e))?;
                raw.extend_from_slice(&piece);
            }
            if raw.is_empty() {
                return Err(self.corrupt(format!(
                    "chunk {seq} of generation {} is missing",
                    header.generation
                )));
            }
            if tx.send((seq, raw)).is_err() {
                break;
            }
        }
        Ok(())
    }

    /// Writes one chunk of a generation that is not committed yet.
    pub fn put_chunk(&self, generation: u64, seq: u32, chunk: &Chunk) -> Result<(), StoreError> {
        self.writable()?;
        let bytes =
            kvgate_kv_index::encode(chunk).map_err(|e| self.corrupt(format!("encoding: {e}")))?;
        let mut batch = sled::Batch::default();
        for (i, piece) in bytes.chunks(PIECE).enumerate() {
            let i = u32::try_from(i).map_err(|_| self.corrupt("chunk too large"))?;
            batch.insert(&piece_key(generation, seq, i), piece);
        }
        self.index
            .apply_batch(batch)
            .map_err(|e| self.sled_err(e))?;
        Ok(())
    }

    /// Makes `header`'s generation the current one. Old chunks stay until
    /// [`Store::drop_uncommitted`].
    pub fn commit(&self, header: &ImageHeader) -> Result<(), StoreError> {
        self.writable()?;
        // Chunks must be durable before the header that names them.
        self.db.flush().map_err(|e| self.sled_err(e))?;
        let bytes =
            kvgate_kv_index::encode(header).map_err(|e| self.corrupt(format!("encoding: {e}")))?;
        self.meta
            .insert("current", bytes)
            .map_err(|e| self.sled_err(e))?;
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
        let mut stale = Vec::new();
        for kv in self.index.iter().keys() {
            let k = kv.map_err(|e| self.sled_err(e))?;
            if k.len() < 8 || k[..8] != keep.to_be_bytes() {
                stale.push(k);
            }
        }
        for k in stale {
            self.index.remove(k).map_err(|e| self.sled_err(e))?;
        }
        Ok(())
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

/// What opening the store at startup gave.
#[derive(Debug, Default)]
pub struct Opened {
    /// `None`: kvgate runs without persistence (see `problems`).
    pub store: Option<Store>,
    /// The last complete snapshot, read once.
    pub image: Option<Image>,
    pub registry: RegistryImage,
    /// One line each, for the log.
    pub problems: Vec<String>,
}

impl StoreError {
    /// Damage (or a format from another kvgate) that a fresh store fixes; as opposed to
    /// I/O trouble (permissions, a full disk, another process holding the lock), where
    /// moving the store aside would lose good state.
    fn fixed_by_reset(&self) -> bool {
        match self {
            StoreError::Version { .. } | StoreError::Corrupt { .. } => true,
            StoreError::Sled { source, .. } => !matches!(source, sled::Error::Io(_)),
            StoreError::Io { .. } => false,
        }
    }
}

/// Opens and reads the store. When the snapshot is damaged, the error comes with the
/// worker registry if that could still be read: it is a separate key, and losing it would
/// bring back workers removed through the API and forget those added.
fn open_and_load(
    dir: &Path,
) -> Result<(Store, Option<Image>), (StoreError, Option<RegistryImage>)> {
    let store = Store::open(dir).map_err(|e| (e, None))?;
    match store.load() {
        Ok(image) => Ok((store, image)),
        Err(e) => {
            let kept = store.registry().ok();
            Err((e, kept))
        }
    }
}

/// Opens the store and reads it once. A damaged or foreign-format store is moved aside
/// (`store.bad-<unix time>`) and a fresh one opened, so it never keeps kvgate from
/// starting; a store that cannot be reached for I/O reasons is left alone and kvgate runs
/// without persistence.
pub fn open_or_reset(dir: &Path) -> Opened {
    let mut out = Opened::default();
    let (store, image) = match open_and_load(dir) {
        Ok(x) => x,
        Err((e, kept)) if e.fixed_by_reset() => {
            let src = dir.join("store");
            let aside = dir.join(format!("store.bad-{}", unix_now() as u64));
            if let Err(mv) = std::fs::rename(&src, &aside) {
                out.problems.push(format!(
                    "{e}; could not move it aside ({mv}); running without persistence"
                ));
                return out;
            }
            match Store::open(dir) {
                Ok(s) => {
                    let registry = match kept.filter(|r| *r != RegistryImage::default()) {
                        None => "",
                        Some(r) => match s.put_registry(&r) {
                            Ok(()) => " (the worker registry was kept)",
                            Err(_) => " (the worker registry could not be carried over)",
                        },
                    };
                    out.problems.push(format!(
                        "{e}; moved it to {} and started empty{registry}",
                        aside.display()
                    ));
                    (s, None)
                }
                Err(e2) => {
                    out.problems.push(format!(
                        "{e}; moved it to {}, but a fresh store failed too ({e2}); running without persistence",
                        aside.display()
                    ));
                    return out;
                }
            }
        }
        Err((e, _)) => {
            out.problems.push(format!(
                "{e}; running without persistence (the store was left as it is)"
            ));
            return out;
        }
    };
    match store.registry() {
        Ok(r) => out.registry = r,
        Err(e) => out.problems.push(format!(
            "{e}; workers added or removed through the API before the restart are not restored"
        )),
    }
    out.image = image;
    out.store = Some(store);
    out
}

/// What `kvgatectl snapshot inspect` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoreSummary {
    pub path: String,
    /// As found on disk (a version-1 store is shown as 1, not upgraded); 0 when none is
    /// recorded.
    pub format_version: u32,
    pub written_at: Option<f64>,
    pub generation: Option<u64>,
    pub size_on_disk: u64,
    pub models: Vec<ModelSummary>,
    pub registry: RegistryImage,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSummary {
    pub model: String,
    pub workers: Vec<WorkerSummary>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerSummary {
    pub worker: String,
    pub url: Option<String>,
    pub startup_time: Option<f64>,
    /// Index nodes (text and token trees) and hash-mode keys the worker holds.
    pub entries: u64,
    /// Bytes of text plus tokens the worker holds.
    pub units: u64,
}

/// Reads a store offline. A directory without a store is an error (nothing is created).
pub fn inspect(dir: &Path) -> Result<StoreSummary, StoreError> {
    if !dir.join("store").is_dir() {
        return Err(StoreError::Io {
            path: dir.join("store").display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no kvgate store here"),
        });
    }
    let store = Store::open_here(dir, false)?;
    let image = store.load()?;
    let registry = store.registry()?;
    let mut models = Vec::new();
    if let Some(img) = &image {
        let mut per: BTreeMap<(u32, WorkerId), (u64, u64)> = BTreeMap::new();
        let mut add = |m: u32, w: WorkerId, units: usize| {
            let e = per.entry((m, w)).or_default();
            e.0 += 1;
            e.1 += units as u64;
        };
        for c in &img.chunks {
            match c {
                Chunk::Text { model, records, .. } => {
                    for r in records {
                        for (w, _) in &r.tenants {
                            add(*model, *w, r.edge.len());
                        }
                    }
                }
                Chunk::Tokens { model, records, .. } => {
                    for r in records {
                        for (w, _) in &r.tenants {
                            add(*model, *w, r.edge.len());
                        }
                    }
                }
                Chunk::Hash { model, snapshot } => {
                    for r in &snapshot.records {
                        for (w, _) in &r.holders {
                            add(*model, *w, 0);
                        }
                    }
                }
            }
        }
        for (i, name) in img.header.models.iter().enumerate() {
            let workers = per
                .iter()
                .filter(|((m, _), _)| *m as usize == i)
                .map(|((_, w), (entries, units))| {
                    let stamp = img.header.workers.iter().find(|s| s.worker == *w);
                    WorkerSummary {
                        worker: w.to_string(),
                        url: stamp.map(|s| s.url.clone()),
                        startup_time: stamp.and_then(|s| s.startup_time),
                        entries: *entries,
                        units: *units,
                    }
                })
                .collect();
            models.push(ModelSummary {
                model: name.clone(),
                workers,
            });
        }
    }
    Ok(StoreSummary {
        path: store.path.display().to_string(),
        format_version: store.on_disk.unwrap_or(0),
        written_at: image.as_ref().map(|i| i.header.written_at),
        generation: image.as_ref().map(|i| i.header.generation),
        size_on_disk: store.size_on_disk(),
        models,
        registry,
    })
}

#[cfg(test)]
pub(crate) mod tests;
