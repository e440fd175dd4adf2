//! kvgate's shared vocabulary: the few types every other kvgate crate speaks in, and
//! nothing else. It depends on no kvgate crate and does no I/O; any crate may use it.
//!
//! - [`WorkerId`]: a worker's (or one data-parallel rank's) stable identity.
//! - [`WorkerUrl`]: a worker's base URL, parsed once; [`split_url`] is the one URL
//!   splitter (the KV-event endpoints use it too).
//! - [`Secret`]: a key that is never printed and is compared in constant time.
//! - [`Endpoint`]: the inference routes kvgate proxies, and [`BodyShape`], how each body is read.
//! - [`secs`]: durations in config files, as seconds.
//! - [`clock`]: wall-clock time, read in one place.
//!
//! ```
//! use kvgate_core::{Secret, WorkerId, WorkerUrl};
//!
//! let url = WorkerUrl::parse("http://Engine-1:8000/")?;
//! let id = WorkerId::from_url(url.as_str());
//! assert_eq!(id, WorkerId::from_url("http://engine-1:8000"));
//! assert!(Secret::new("k1").matches(b"k1"));
//! assert_eq!(format!("{:?}", Secret::new("k1")), "<redacted>");
//! # Ok::<(), kvgate_core::UrlError>(())
//! ```

pub mod clock;
mod endpoint;
mod id;
mod secret;
pub mod secs;
mod url;

pub use endpoint::{BodyShape, Endpoint};
pub use id::WorkerId;
pub use secret::Secret;
pub use url::{UrlError, UrlParts, WorkerUrl, split_url};
