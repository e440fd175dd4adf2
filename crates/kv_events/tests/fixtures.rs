//! The decoder against real SGLang 0.5.23 bytes (`tests/fixtures/sglang-0.5.23`, encoded by
//! SGLang's own msgspec structs; the expected values are those of the fixtures' README).

#![expect(clippy::unwrap_used, reason = "test code")]

use kvgate_kv_events::{
    BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent, Medium, decode_message,
    decode_payload, encode_message, encode_payload,
};

const DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/sglang-0.5.23/"
);

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{DIR}{name}")).unwrap()
}

fn hashes(h: &[i64]) -> Vec<EngineHash> {
    h.iter().map(|&h| EngineHash::from_i64(h)).collect()
}

/// Decodes `name`, checks it against `want`, and checks that encoding gives SGLang's bytes
/// back exactly.
fn check(name: &str, want: EventBatch) {
    let bytes = fixture(name);
    let got = decode_payload(&bytes).unwrap();
    assert_eq!(got, want, "{name}");
    assert_eq!(encode_payload(&got), bytes, "{name} re-encoded");
    // The same payload as the third frame of a published message.
    let frames = [b"kv-events".to_vec(), 7u64.to_be_bytes().to_vec(), bytes];
    let m = decode_message(&frames).unwrap();
    assert_eq!(
        (m.topic.as_slice(), m.seq, m.batch),
        (&b"kv-events"[..], 7, want)
    );
}

#[test]
fn stored_chain() {
    check(
        "kv_batch_stored_chain.msgpack",
        EventBatch {
            ts: 1733140000.5,
            events: vec![
                KvEvent::BlockStored(BlockStored {
                    block_hashes: hashes(&[1111, 2222]),
                    parent_block_hash: None,
                    token_ids: (1..=32).collect(),
                    block_size: 16,
                    lora_id: None,
                    ..BlockStored::default()
                }),
                KvEvent::BlockStored(BlockStored {
                    block_hashes: hashes(&[3333]),
                    parent_block_hash: Some(EngineHash::from_i64(2222)),
                    token_ids: (33..=48).collect(),
                    block_size: 16,
                    lora_id: None,
                    medium: Some(Medium::Gpu),
                    ..BlockStored::default()
                }),
            ],
            attn_dp_rank: Some(0),
            unknown_events: 0,
        },
    );
}

#[test]
fn removed() {
    check(
        "kv_batch_removed.msgpack",
        EventBatch {
            ts: 1733140001.0,
            events: vec![KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: hashes(&[3333]),
                medium: None,
            })],
            attn_dp_rank: Some(0),
            unknown_events: 0,
        },
    );
}

#[test]
fn cleared_rank1() {
    check(
        "kv_batch_cleared_rank1.msgpack",
        EventBatch {
            ts: 1733140002.0,
            events: vec![KvEvent::AllBlocksCleared],
            attn_dp_rank: Some(1),
            unknown_events: 0,
        },
    );
}

#[test]
fn stored_full_fields() {
    check(
        "kv_batch_stored_full_fields.msgpack",
        EventBatch {
            ts: 1733140003.25,
            events: vec![KvEvent::BlockStored(BlockStored {
                block_hashes: hashes(&[-5, 7]),
                parent_block_hash: Some(EngineHash::from_i64(-9)),
                token_ids: (100..=131).collect(),
                block_size: 16,
                lora_id: Some(3),
                medium: Some(Medium::CpuPinned),
                cache_salt: Some("tenant-a".into()),
                session_id: Some("s1".into()),
                lora_name: Some("adapter".into()),
            })],
            attn_dp_rank: None,
            unknown_events: 0,
        },
    );
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn stream_of_40_batches() {
    let json: serde_json::Value =
        serde_json::from_slice(&fixture("kv_stream_40_batches.json")).unwrap();
    let topic = json["topic"].as_str().unwrap();
    assert_eq!(topic, "kv-events");
    let frames = json["frames"].as_array().unwrap();
    assert_eq!(frames.len(), 40);
    let (mut stored, mut removed, mut cleared, mut blocks) = (0, 0, 0, 0);
    for (i, f) in frames.iter().enumerate() {
        let payload = unhex(f["payload_hex"].as_str().unwrap());
        let seq = f["seq"].as_u64().unwrap();
        assert_eq!(seq, i as u64);
        let wire = [
            topic.as_bytes().to_vec(),
            seq.to_be_bytes().to_vec(),
            payload,
        ];
        let m = decode_message(&wire).unwrap();
        assert_eq!(m.seq, seq);
        assert_eq!(m.batch.unknown_events, 0);
        assert_eq!(m.batch.attn_dp_rank, Some(0));
        // SGLang's bytes come back from the encoder unchanged.
        assert_eq!(
            encode_message(topic.as_bytes(), seq, &m.batch),
            wire,
            "seq {seq}"
        );
        for e in &m.batch.events {
            match e {
                KvEvent::BlockStored(s) => {
                    stored += 1;
                    blocks += s.block_hashes.len();
                    assert_eq!(s.block_size, 16);
                    assert_eq!(s.token_ids.len(), 16 * s.block_hashes.len());
                }
                KvEvent::BlockRemoved(_) => removed += 1,
                KvEvent::AllBlocksCleared => cleared += 1,
            }
        }
    }
    // Event counts cross-checked by counting the type names in the hex.
    assert_eq!((stored, blocks, removed, cleared), (66, 125, 18, 11));

    // The first batch, read by hand from its hex: a removal of hash 1, then 1 stored at the
    // root, then 2, 3, 4 stored under 1.
    let first = decode_payload(&unhex(frames[0]["payload_hex"].as_str().unwrap())).unwrap();
    let shape: Vec<(Vec<EngineHash>, Option<EngineHash>, usize)> = first
        .events
        .iter()
        .map(|e| match e {
            KvEvent::BlockStored(s) => (
                s.block_hashes.clone(),
                s.parent_block_hash,
                s.token_ids.len(),
            ),
            KvEvent::BlockRemoved(r) => (r.block_hashes.clone(), None, 0),
            KvEvent::AllBlocksCleared => (vec![], None, 0),
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            (hashes(&[1]), None, 0),
            (hashes(&[1]), None, 16),
            (hashes(&[2, 3, 4]), Some(EngineHash::from_i64(1)), 48),
        ]
    );
    assert!(matches!(first.events[0], KvEvent::BlockRemoved(_)));
    let KvEvent::BlockStored(s) = &first.events[1] else {
        panic!()
    };
    assert_eq!(&s.token_ids[..3], &[0x892f, 0x1818, 0x5d9d]);
}
