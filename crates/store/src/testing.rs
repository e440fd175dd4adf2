//! Small snapshots for tests of the store and of the crates that restore from it (the
//! `testing` feature).

use kvgate_core::WorkerId;
use kvgate_kv_index::{RadixTree, TreeConfig};

use crate::image::{Chunk, FORMAT_VERSION, ImageHeader, WorkerStamp};

/// A text chunk of model 0 holding `prompts`, each for its worker.
pub fn text_chunk(prompts: &[(&str, u64)]) -> Chunk {
    let mut t: RadixTree<u8, WorkerId> = RadixTree::new(TreeConfig::default());
    for (p, w) in prompts {
        t.insert(p.as_bytes(), WorkerId(*w), 10);
    }
    Chunk::Text {
        model: 0,
        page_size: 1,
        records: t.snapshot().records,
    }
}

/// The header of a one-model snapshot that names worker 1 (`http://a:1`, started at 5.0).
pub fn header(generation: u64, chunks: u32) -> ImageHeader {
    ImageHeader {
        format_version: FORMAT_VERSION,
        generation,
        written_at: 1.0,
        models: vec!["m".into()],
        workers: vec![WorkerStamp {
            worker: WorkerId(1),
            url: "http://a:1".into(),
            startup_time: Some(5.0),
        }],
        chunks,
    }
}

/// Creates a store under `dir` that records format `version`, as another kvgate would
/// have left it.
pub fn store_of_format(dir: &std::path::Path, version: u32) -> Result<(), crate::StoreError> {
    let path = dir.join("store");
    let p = path.display().to_string();
    let err = |e| crate::StoreError::backend(&p, e);
    let db = sled::open(&path).map_err(err)?;
    db.open_tree("meta")
        .map_err(err)?
        .insert("format_version", &version.to_be_bytes())
        .map_err(err)?;
    db.flush().map_err(err)?;
    Ok(())
}
