//! kvgate's persistent state: snapshots of the prefix index and of the KV-event chain index,
//! and the image of the worker registry, kept in sled under `--data-dir` so that a
//! restarted gateway routes prefixes back to the engines that hold them.
//!
//! The crate owns the on-disk layout (the only code of kvgate that touches sled), the
//! commit protocol (every chunk of a snapshot, a flush, then its header in one insert: a
//! crash at any point leaves the last committed snapshot whole), the startup read
//! ([`open_or_reset`], which moves a damaged store aside rather than refuse to start),
//! the writer thread that owns the store at run time ([`spawn`], fed through a
//! [`Persister`] that never blocks its caller) and the offline [`inspect`]. It knows
//! nothing of HTTP, actors or routing: the gateway produces the [`Chunk`]s and restores
//! from the [`Image`].
//!
//! ```no_run
//! use kvgate_store::{open_or_reset, spawn};
//!
//! let opened = open_or_reset(std::path::Path::new("./kvgate-data"));
//! for problem in &opened.problems {
//!     eprintln!("{problem}");
//! }
//! if let Some(image) = &opened.image {
//!     println!("snapshot {} with {} chunks", image.header.generation, image.chunks.len());
//! }
//! if let Some(store) = opened.store {
//!     let (persister, writer) = spawn(store).expect("writer thread");
//!     // Hand it `Persist::Chunk`s, then a `Persist::Commit`; dropping every
//!     // `Persister` ends the thread once its queue is written.
//!     persister.flush();
//!     drop(persister);
//!     writer.join().expect("writer");
//! }
//! ```

mod db;
mod error;
mod image;
mod inspect;
mod open;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod writer;

pub use db::{DEFAULT_CACHE_BYTES, Store, StoreOptions};
pub use error::{BackendError, StoreError};
pub use image::{
    ChainChunk, Chunk, EventsHeader, EventsImage, FORMAT_VERSION, Image, ImageHeader, RankStamp,
    RegistryImage, WorkerStamp,
};
pub use inspect::{EventsSummary, ModelSummary, RankSummary, StoreSummary, WorkerSummary, inspect};
pub use open::{Opened, open_or_reset, open_or_reset_with};
pub use writer::{Loaded, Persist, PersistStats, Persister, SHUTDOWN_WAIT, spawn};
