//! The KV-event subscriber against a publisher on the real libzmq (pyzmq, as SGLang's own
//! publisher is), sending SGLang 0.5.23's own encoded batches (the fixture stream): every
//! batch arrives, in order, the first half by replay, and the gateway's holdings equal
//! those of the stream applied directly to a chain index. Without pyzmq the test says so
//! and passes, unless `CI_ZMQ_INTEROP` is set (as `.ci/run` sets it): there it fails.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use kvgate_gateway::Gateway;
use kvgate_kv_events::{KvEvent, decode_payload};
use kvgate_kv_index::{ChainConfig, ChainIndex, ChainStore};
use kvgate_tests::{get, test_config};
use serde_json::Value;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/fixtures/sglang-0.5.23/kv_stream_40_batches.json"
);
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pyzmq_engine.py");

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The fixture's blocks applied straight to a chain index, as one worker's rank 0.
fn expected_blocks() -> usize {
    let json: Value =
        serde_json::from_slice(&std::fs::read(FIXTURE).expect("fixture")).expect("json");
    let mut index: ChainIndex<u8> = ChainIndex::new(ChainConfig::default());
    for f in json["frames"].as_array().expect("frames") {
        let batch = decode_payload(&unhex(f["payload_hex"].as_str().expect("hex"))).expect("batch");
        for e in batch.events {
            match e {
                KvEvent::BlockStored(s) => {
                    let hashes: Vec<u64> = s.block_hashes.iter().map(|h| h.as_u64()).collect();
                    index.apply_stored(
                        0,
                        0,
                        &ChainStore {
                            block_hashes: &hashes,
                            parent: s.parent_block_hash.map(|h| h.as_u64()),
                            token_ids: &s.token_ids,
                            block_size: s.block_size as usize,
                            namespace: 0,
                            tier: 0,
                        },
                    );
                }
                KvEvent::BlockRemoved(r) => {
                    let hashes: Vec<u64> = r.block_hashes.iter().map(|h| h.as_u64()).collect();
                    index.apply_removed(0, 0, &hashes, None);
                }
                KvEvent::AllBlocksCleared => {
                    index.clear(0, 0);
                }
            }
        }
    }
    index.blocks_of(0, 0)
}

#[actix_rt::test]
async fn a_libzmq_publisher_with_sglangs_own_batches_is_followed_whole() {
    let have = Command::new("python3")
        .args(["-c", "import zmq"])
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        assert!(
            std::env::var_os("CI_ZMQ_INTEROP").is_none(),
            "CI_ZMQ_INTEROP is set but python3 cannot import zmq"
        );
        eprintln!("skipped: no pyzmq (pip install pyzmq)");
        return;
    }
    let mut engine = Command::new("python3")
        .args([SCRIPT, FIXTURE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut line = String::new();
    BufReader::new(engine.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("its URL");
    let url = serde_json::from_str::<Value>(&line).expect("json")["url"]
        .as_str()
        .expect("url")
        .to_owned();
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = vec![url.clone()];
    let gw = Gateway::start(cfg).expect("gateway");
    let want = expected_blocks();
    // The stream ends holding 13 blocks: a count of 0 would say nothing.
    assert!(want > 0);
    let mut events = Value::Null;
    for _ in 0..500 {
        let ws = get(&format!("{}/workers", gw.url())).await.json();
        events = ws["workers"][0]["events"].clone();
        if events["batches"] == 40 {
            break;
        }
        actix_rt::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(events["batches"], 40, "{events}");
    assert_eq!(events["malformed"], 0, "{events}");
    assert_eq!(events["state"], "live", "{events}");
    assert!(events["replays"].as_u64() >= Some(1), "{events}");
    assert_eq!(events["blocks"].as_u64(), Some(want as u64), "{events}");
    gw.stop();
    drop(engine.stdin.take());
    let _ = engine.kill();
    let _ = engine.wait();
}
