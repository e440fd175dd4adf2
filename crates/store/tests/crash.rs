//! A writer killed at any moment leaves a store that loads: the last committed snapshot,
//! whole, never a header whose chunks did not all reach the disk.
//!
//! The writer is this test binary run again as a child (`crash_writer`, ignored in normal
//! runs); the parent kills it with SIGKILL at several points after its first commit.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use kvgate_core::WorkerId;
use kvgate_kv_index::{RadixTree, TreeConfig};
use kvgate_store::{Chunk, FORMAT_VERSION, ImageHeader, Store, WorkerStamp};

const CHILD_DIR: &str = "CRASH_WRITER_DIR";
const CHUNKS: u32 = 6;

/// The chunks of generation `g`: prompts that name their generation, so a header and
/// chunks of different generations cannot pass for each other.
fn chunks_for(g: u64) -> Vec<Chunk> {
    (0..CHUNKS)
        .map(|seq| {
            let mut t: RadixTree<u8, WorkerId> = RadixTree::new(TreeConfig::default());
            for i in 0..1500 {
                let prompt = format!("generation {g} chunk {seq} prompt {i} {}", "x".repeat(64));
                t.insert(prompt.as_bytes(), WorkerId(1 + u64::from(seq % 2)), 10);
            }
            Chunk::Text {
                model: 0,
                page_size: 1,
                records: t.snapshot().records,
            }
        })
        .collect()
}

fn header_for(g: u64) -> ImageHeader {
    ImageHeader {
        format_version: FORMAT_VERSION,
        generation: g,
        written_at: g as f64,
        models: vec!["m".into()],
        workers: vec![WorkerStamp {
            worker: WorkerId(1),
            url: "http://a:1".into(),
            startup_time: Some(1.0),
        }],
        chunks: CHUNKS,
    }
}

/// The child: writes generation after generation, as the gateway's writer thread does,
/// and says on stdout when each is committed.
#[test]
#[ignore = "the child process of a_writer_killed_at_any_moment_leaves_a_loadable_store"]
fn crash_writer() {
    let dir = std::env::var(CHILD_DIR).expect("run by the crash test");
    let store = Store::open(Path::new(&dir)).expect("store");
    for g in 1u64.. {
        for (seq, c) in chunks_for(g).iter().enumerate() {
            store.put_chunk(g, seq as u32, c).expect("chunk");
        }
        store.commit(&header_for(g)).expect("commit");
        store.drop_uncommitted().expect("clean up");
        println!("committed {g}");
    }
}

#[test]
fn a_writer_killed_at_any_moment_leaves_a_loadable_store() {
    let exe = std::env::current_exe().expect("test binary");
    for delay_ms in [0u64, 15, 40, 80, 130, 200] {
        let dir = tempfile::tempdir().expect("dir");
        let mut child = Command::new(&exe)
            .args([
                "--ignored",
                "--exact",
                "crash_writer",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_DIR, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the writer");
        // Bounded by the child: it commits its first generation or exits (and the
        // stream ends).
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = lines.find(|l| l.as_deref().is_ok_and(|l| l.starts_with("committed ")));
        assert!(first.is_some(), "the writer committed a first generation");
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().expect("kill");
        child.wait().expect("reap");

        let store = Store::open(dir.path()).expect("the store opens after the kill");
        let image = store
            .load()
            .unwrap_or_else(|e| panic!("killed {delay_ms} ms after a commit: {e}"))
            .expect("a committed snapshot survives");
        let g = image.header.generation;
        assert!(g >= 1);
        assert_eq!(image.header, header_for(g), "after {delay_ms} ms");
        assert!(
            image.chunks == chunks_for(g),
            "generation {g}'s chunks are whole"
        );
    }
}
