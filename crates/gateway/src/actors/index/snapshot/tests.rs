use std::time::Instant;

use kvgate_kv_index::{HashIndex, HashSnapshot, SNAPSHOT_VERSION};
use kvgate_policies::{PolicyConfig, WorkerId};
use kvgate_store::testing::{header, text_chunk};
use kvgate_store::{Chunk, Image};

use super::super::{IndexActor, IndexConfig, hash_config};
use crate::config::SnapshotConfig;

#[test]
fn entries_of_a_worker_the_header_does_not_name_are_not_restored() {
    let cfg = IndexConfig::from_policy(&PolicyConfig::default(), &SnapshotConfig::default());
    let mut index = IndexActor::new(cfg, Instant::now(), None);
    // Worker 1 is in the header; worker 2 joined while the snapshot was written.
    index.restore(Image {
        header: header(3, 1),
        chunks: vec![text_chunk(&[("hello there", 1), ("general kenobi", 2)])],
    });
    let text = &index.models["m"].text;
    assert_eq!(text.tenants(), vec![WorkerId(1)]);
    assert!(text.tenant_units(WorkerId(1)) > 0);
    assert_eq!(text.tenant_units(WorkerId(2)), 0);
}

#[test]
fn a_hash_index_written_in_pieces_is_restored_whole() {
    let policy = PolicyConfig {
        cache_boundaries: vec![16, 64],
        ..PolicyConfig::default()
    };
    let cfg = IndexConfig::from_policy(&policy, &SnapshotConfig::default());
    let mut source: HashIndex<WorkerId> = HashIndex::new(hash_config(&cfg));
    let deepest = 64;
    for i in 0..50u32 {
        let tokens: Vec<u32> = (0..deepest as u32).map(|t| t ^ (i << 20)).collect();
        source.record(&tokens, 0, WorkerId(1), 1);
    }
    let pieces = [source.snapshot_part(0, 30), source.snapshot_part(30, 1000)];
    assert!(pieces[0].1.is_some() && pieces[1].1.is_none());
    let chunks = pieces
        .into_iter()
        .map(|(records, _)| Chunk::Hash {
            model: 0,
            snapshot: HashSnapshot {
                version: SNAPSHOT_VERSION,
                records,
            },
        })
        .collect();
    let mut index = IndexActor::new(cfg, Instant::now(), None);
    index.restore(Image {
        header: header(3, 2),
        chunks,
    });
    assert_eq!(index.models["m"].hash.key_count(), source.key_count());
    assert_eq!(index.models["m"].hash.holder_count(), source.holder_count());
}
