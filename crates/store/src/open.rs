//! Opening the store at startup: read once, and never a reason for kvgate not to start.

use std::path::Path;

use crate::db::{Store, StoreOptions};
use crate::error::StoreError;
use kvgate_core::clock::unix_now;

use crate::image::{EventsImage, Image, RegistryImage};

/// What opening the store at startup gave.
#[derive(Debug, Default)]
pub struct Opened {
    /// `None`: kvgate runs without persistence (see `problems`).
    pub store: Option<Store>,
    /// The last complete snapshot, read once.
    pub image: Option<Image>,
    /// The last complete snapshot of the KV-event chain index, read once.
    pub events: Option<EventsImage>,
    pub registry: RegistryImage,
    /// One line each, for the log.
    pub problems: Vec<String>,
}

/// Why the store could not be read, and its worker registry when that was still readable
/// (boxed: an error is rare and the registry large).
type LoadFailed = (StoreError, Option<Box<RegistryImage>>);

/// Opens and reads the store. When the snapshot is damaged, the error comes with the
/// worker registry if that could still be read: it is a separate key, and losing it would
/// bring back workers removed through the API and forget those added.
fn open_and_load(dir: &Path, options: StoreOptions) -> Result<(Store, Option<Image>), LoadFailed> {
    let store = Store::open_with(dir, options).map_err(|e| (e, None))?;
    match store.load() {
        Ok(image) => Ok((store, image)),
        Err(e) => {
            let kept = store.registry().ok().map(Box::new);
            Err((e, kept))
        }
    }
}

/// Opens the store and reads it once. A damaged or foreign-format store is moved aside
/// (`store.bad-<unix time>`) and a fresh one opened, so it never keeps kvgate from
/// starting; a store that cannot be reached for I/O reasons is left alone and kvgate runs
/// without persistence.
pub fn open_or_reset(dir: &Path) -> Opened {
    open_or_reset_with(dir, StoreOptions::default())
}

/// [`open_or_reset`] with `options`.
pub fn open_or_reset_with(dir: &Path, options: StoreOptions) -> Opened {
    let mut out = Opened::default();
    let (store, image) = match open_and_load(dir, options) {
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
            match Store::open_with(dir, options) {
                Ok(s) => {
                    let registry = match kept.filter(|r| **r != RegistryImage::default()) {
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
    // Without it the engines' replay rebuilds what it can: never a reason to reset.
    match store.load_events() {
        Ok(e) => out.events = e,
        Err(e) => out.problems.push(format!(
            "{e}; the KV-event index starts from the engines' replay alone"
        )),
    }
    out.image = image;
    out.store = Some(store);
    out
}
