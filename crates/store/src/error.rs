//! The store's errors. sled's own error type stays inside this crate: callers see what
//! went wrong and where, and reach the cause through `source()`.

use std::fmt;

use thiserror::Error;

use crate::image::FORMAT_VERSION;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("store at {path}: {source}")]
    Backend {
        path: String,
        #[source]
        source: BackendError,
    },
    #[error("store at {path} has format version {found}, this kvgate reads {FORMAT_VERSION}")]
    Version { path: String, found: u32 },
    #[error("store at {path} is damaged: {reason}")]
    Corrupt { path: String, reason: String },
    #[error("store at {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// An error of the embedded database, opaque to callers.
#[derive(Debug)]
pub struct BackendError(pub(crate) sled::Error);

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl StoreError {
    pub(crate) fn backend(path: &str, e: sled::Error) -> StoreError {
        StoreError::Backend {
            path: path.to_owned(),
            source: BackendError(e),
        }
    }

    /// Damage (or a format from another kvgate) that a fresh store fixes; as opposed to
    /// I/O trouble (permissions, a full disk, another process holding the lock), where
    /// moving the store aside would lose good state.
    pub(crate) fn fixed_by_reset(&self) -> bool {
        match self {
            StoreError::Version { .. } | StoreError::Corrupt { .. } => true,
            StoreError::Backend { source, .. } => !matches!(source.0, sled::Error::Io(_)),
            StoreError::Io { .. } => false,
        }
    }
}
