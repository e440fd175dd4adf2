use kvgate_core::WorkerId;

use super::*;
use crate::inspect::inspect;
use crate::open::open_or_reset;
use crate::testing::{header, text_chunk};

fn write(store: &Store, generation: u64, chunks: &[Chunk]) {
    for (i, c) in chunks.iter().enumerate() {
        store.put_chunk(generation, i as u32, c).unwrap();
    }
    store
        .commit(&header(generation, chunks.len() as u32))
        .unwrap();
}

#[test]
fn a_snapshot_round_trips_and_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let c = text_chunk(&[("hello world", 1), ("hello there", 2)]);
    {
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.load().unwrap(), None);
        write(&s, 1, std::slice::from_ref(&c));
        s.put_registry(&RegistryImage {
            added: vec!["http://x:1".into()],
            removed: vec![],
            kv_events: Default::default(),
        })
        .unwrap();
    }
    let s = Store::open(dir.path()).unwrap();
    let img = s.load().unwrap().unwrap();
    assert_eq!(img.header, header(1, 1));
    assert_eq!(img.chunks, vec![c]);
    assert_eq!(s.registry().unwrap().added, vec!["http://x:1"]);
}

#[test]
fn an_interrupted_snapshot_leaves_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let first = text_chunk(&[("first", 1)]);
    {
        let s = Store::open(dir.path()).unwrap();
        write(&s, 1, std::slice::from_ref(&first));
        // Generation 2 dies between its chunks and its commit (a kill -9 at that moment).
        s.put_chunk(2, 0, &text_chunk(&[("second", 2)])).unwrap();
        s.put_chunk(2, 1, &text_chunk(&[("more", 2)])).unwrap();
    }
    let s = Store::open(dir.path()).unwrap();
    let img = s.load().unwrap().unwrap();
    assert_eq!(img.header.generation, 1);
    assert_eq!(img.chunks, vec![first]);
    // After the next commit the abandoned chunks are cleared.
    write(&s, 3, &[text_chunk(&[("third", 1)])]);
    s.drop_uncommitted().unwrap();
    assert_eq!(s.index.len(), 1);
}

/// A chunk whose encoding spans several pieces: distinct long prompts on a few workers.
fn big_chunk(seed: u64) -> Chunk {
    let prompts: Vec<(String, u64)> = (0..400)
        .map(|i| {
            (
                format!("{seed} {i} {}", "long shared text ".repeat(20)),
                i % 3,
            )
        })
        .collect();
    let refs: Vec<(&str, u64)> = prompts.iter().map(|(p, w)| (p.as_str(), *w)).collect();
    text_chunk(&refs)
}

#[test]
fn chunks_larger_than_a_piece_come_back_whole_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let chunks: Vec<Chunk> = (0..12).map(big_chunk).collect();
    let encoded = kvgate_kv_index::encode(&chunks[0]).unwrap().len();
    assert!(encoded > 3 * PIECE, "the chunk spans {encoded} bytes");
    {
        let s = Store::open(dir.path()).unwrap();
        write(&s, 4, &chunks);
        // Pieces, not one value per chunk.
        assert!(s.index.len() > 3 * chunks.len());
    }
    let s = Store::open(dir.path()).unwrap();
    let img = s.load().unwrap().unwrap();
    assert_eq!(img.header, header(4, 12));
    assert_eq!(img.chunks, chunks);
}

#[test]
fn a_snapshot_larger_than_the_page_cache_comes_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let small = StoreOptions {
        cache_bytes: 1 << 20,
    };
    let chunks: Vec<Chunk> = (0..40).map(big_chunk).collect();
    let bytes: usize = chunks
        .iter()
        .map(|c| kvgate_kv_index::encode(c).unwrap().len())
        .sum();
    assert!(bytes as u64 > small.cache_bytes, "{bytes} bytes");
    {
        let s = Store::open_with(dir.path(), small).unwrap();
        write(&s, 2, &chunks);
    }
    let s = Store::open_with(dir.path(), small).unwrap();
    assert_eq!(s.load().unwrap().unwrap().chunks, chunks);
}

#[test]
fn a_store_of_an_older_format_is_refused_naming_its_version() {
    // Formats 1 and 2 held bincode bytes, which this build does not read.
    for old in [1u32, 2] {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            write(&s, 3, &[big_chunk(9)]);
            s.meta.insert("format_version", &old.to_be_bytes()).unwrap();
            s.db.flush().unwrap();
        }
        for e in [Store::open(dir.path()).err(), inspect(dir.path()).err()] {
            assert!(
                matches!(e, Some(StoreError::Version { found, .. }) if found == old),
                "{e:?}"
            );
        }
    }
}

#[test]
fn a_lost_piece_is_reported_as_damage() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    write(&s, 1, &[big_chunk(1)]);
    s.index.remove(piece_key(1, 0, 1)).unwrap();
    let e = s.load().unwrap_err();
    assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
}

#[test]
fn a_damaged_snapshot_is_moved_aside_but_the_registry_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let registry = RegistryImage {
        added: vec!["http://a:1".into()],
        removed: vec!["http://b:2".into()],
        kv_events: Default::default(),
    };
    {
        let s = Store::open(dir.path()).unwrap();
        s.put_registry(&registry).unwrap();
        write(&s, 1, &[big_chunk(1)]);
        s.index.remove(piece_key(1, 0, 1)).unwrap();
        s.db.flush().unwrap();
    }
    let opened = open_or_reset(dir.path());
    assert!(opened.image.is_none());
    assert_eq!(opened.registry, registry);
    assert!(
        opened.problems[0].contains("moved it to")
            && opened.problems[0].contains("registry was kept"),
        "{:?}",
        opened.problems
    );
    // It is in the fresh store, so it survives the next start as well.
    drop(opened);
    assert_eq!(open_or_reset(dir.path()).registry, registry);
}

#[test]
fn a_header_naming_missing_chunks_is_reported_as_damage() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    s.commit(&header(7, 2)).unwrap();
    let e = s.load().unwrap_err();
    assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
}

#[test]
fn wrong_versions_and_garbage_are_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Store::open(dir.path()).unwrap();
        write(&s, 1, &[text_chunk(&[("x", 1)])]);
        s.meta
            .insert("format_version", &99u32.to_be_bytes())
            .unwrap();
        s.db.flush().unwrap();
    }
    let e = Store::open(dir.path()).unwrap_err();
    assert!(e.to_string().contains("format version 99"), "{e}");
    let opened = open_or_reset(dir.path());
    let problem = &opened.problems[0];
    assert!(
        problem.contains("format version 99") && problem.contains("moved it to"),
        "{problem}"
    );
    assert_eq!(opened.image, None);
    let s = opened.store.unwrap();
    assert_eq!(s.load().unwrap(), None, "a fresh store");
    let moved = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("store.bad-"))
        .count();
    assert_eq!(moved, 1);
    drop(s);

    // Random bytes where sled's files should be.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("store")).unwrap();
    std::fs::write(dir.path().join("store").join("conf"), b"\xff\xfe garbage").unwrap();
    std::fs::write(dir.path().join("store").join("db"), vec![0xAB; 4096]).unwrap();
    let opened = open_or_reset(dir.path());
    assert_eq!(opened.problems.len(), 1);
    assert!(opened.store.is_some());
}

#[test]
fn a_store_held_by_another_process_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let live = Store::open(dir.path()).unwrap();
    write(&live, 1, &[text_chunk(&[("kept", 1)])]);
    // sled's lock makes a second open fail with an I/O error: the live store stays put.
    let opened = open_or_reset(dir.path());
    assert!(opened.store.is_none());
    assert!(
        opened.problems[0].contains("left as it is"),
        "{:?}",
        opened.problems
    );
    drop(live);
    let moved = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().starts_with("store.bad"));
    assert!(!moved);
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(s.load().unwrap().unwrap().header.generation, 1);
}

#[test]
fn inspect_counts_entries_per_model_and_worker() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Store::open(dir.path()).unwrap();
        write(
            &s,
            4,
            &[text_chunk(&[("hello world", 1), ("hello there", 2)])],
        );
    }
    let sum = inspect(dir.path()).unwrap();
    assert_eq!(sum.generation, Some(4));
    assert_eq!(sum.models.len(), 1);
    let w: Vec<(String, u64, u64)> = sum.models[0]
        .workers
        .iter()
        .map(|w| (w.worker.clone(), w.entries, w.units))
        .collect();
    // "hello " is shared: each worker holds it plus its own tail.
    assert_eq!(
        w,
        vec![
            (WorkerId(1).to_string(), 2, 11),
            (WorkerId(2).to_string(), 2, 11)
        ]
    );
    assert_eq!(sum.models[0].workers[0].url.as_deref(), Some("http://a:1"));
}

fn chain_chunk(worker: u64, rank: u32, n: u64) -> ChainChunk {
    let blocks = (0..n)
        .map(|i| kvgate_kv_index::ChainBlock {
            key: 1000 * worker + i,
            parent: i.checked_sub(1).map(|p| 1000 * worker + p),
            engine: 7 * i,
            tiers: 1,
        })
        .collect();
    ChainChunk {
        worker: WorkerId(worker),
        rank,
        blocks,
    }
}

fn events_header(generation: u64, chunks: u32) -> EventsHeader {
    EventsHeader {
        format_version: FORMAT_VERSION,
        generation,
        written_at: 2.0,
        ranks: vec![crate::image::RankStamp {
            worker: WorkerId(1),
            url: "http://a:1".into(),
            startup_time: Some(5.0),
            rank: 0,
            next_seq: 42,
            block_size: Some(16),
        }],
        chunks,
    }
}

#[test]
fn the_chain_index_snapshot_has_generations_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    // A large rank spans several pieces.
    let big = chain_chunk(1, 0, 5000);
    let other = chain_chunk(2, 1, 3);
    {
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(
            s.load_events().unwrap(),
            None,
            "none yet, as in an older store"
        );
        write(&s, 1, &[text_chunk(&[("prompt", 1)])]);
        s.put_events_chunk(1, 0, &big).unwrap();
        s.put_events_chunk(1, 1, &other).unwrap();
        s.commit_events(&events_header(1, 2)).unwrap();
        // The next one dies before its commit.
        s.drop_uncommitted_events().unwrap();
        s.put_events_chunk(2, 0, &chain_chunk(3, 0, 1)).unwrap();
    }
    let s = Store::open(dir.path()).unwrap();
    let e = s.load_events().unwrap().unwrap();
    assert_eq!(e.header, events_header(1, 2));
    assert_eq!(e.chunks, vec![big, other]);
    // The prefix index's snapshot is untouched by the other family, and the other way.
    assert_eq!(s.load().unwrap().unwrap().header, header(1, 1));
    write(&s, 2, &[text_chunk(&[("next", 1)])]);
    s.drop_uncommitted().unwrap();
    assert_eq!(s.load_events().unwrap().unwrap().chunks.len(), 2);
    s.drop_uncommitted_events().unwrap();
    assert_eq!(s.load_events().unwrap().unwrap().header.generation, 1);
    drop(s);
    let opened = open_or_reset(dir.path());
    assert!(opened.problems.is_empty(), "{:?}", opened.problems);
    assert_eq!(opened.events.map(|e| e.header.generation), Some(1));
}

#[test]
fn a_damaged_chain_snapshot_is_reported_and_the_rest_still_opens() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Store::open(dir.path()).unwrap();
        write(&s, 1, &[text_chunk(&[("prompt", 1)])]);
        // A header naming a chunk that was never written.
        s.commit_events(&events_header(4, 1)).unwrap();
    }
    let opened = open_or_reset(dir.path());
    assert!(opened.events.is_none());
    assert_eq!(opened.problems.len(), 1, "{:?}", opened.problems);
    assert!(
        opened.problems[0].contains("replay"),
        "{:?}",
        opened.problems
    );
    assert_eq!(opened.image.map(|i| i.header.generation), Some(1));
}
