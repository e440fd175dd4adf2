//! Round trips, tolerance and refusals, on hand-built values (the real engine bytes are
//! checked in `tests/fixtures.rs`).

use proptest::prelude::*;
use rmpv::Value;

use super::*;
use crate::value::write;

fn k(s: &str) -> Value {
    Value::from(s)
}

fn payload(events: Vec<Value>, rank: Value) -> Vec<u8> {
    write(&Value::Array(vec![
        Value::F64(1.5),
        Value::Array(events),
        rank,
    ]))
}

fn stored(hashes: &[i64], parent: Option<i64>, tokens: Vec<u32>) -> BlockStored {
    BlockStored {
        block_hashes: hashes.iter().map(|&h| EngineHash::from_i64(h)).collect(),
        parent_block_hash: parent.map(EngineHash::from_i64),
        token_ids: tokens,
        block_size: 4,
        ..BlockStored::default()
    }
}

fn sample() -> EventBatch {
    EventBatch {
        ts: 1733140000.25,
        events: vec![
            KvEvent::BlockStored(stored(&[1, -2], None, (0..8).collect())),
            KvEvent::BlockStored(BlockStored {
                lora_id: Some(-3),
                medium: Some(Medium::Other("NVME".into())),
                cache_salt: Some("salt".into()),
                session_id: Some("s".into()),
                lora_name: Some("adapter".into()),
                ..stored(&[i64::MIN, i64::MAX], Some(-2), vec![u32::MAX; 8])
            }),
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![EngineHash::from_i64(1)],
                medium: Some(Medium::CpuPinned),
            }),
            KvEvent::BlockRemoved(BlockRemoved::default()),
            KvEvent::AllBlocksCleared,
        ],
        attn_dp_rank: None,
        unknown_events: 0,
    }
}

#[test]
fn payload_round_trip() {
    let b = sample();
    assert_eq!(decode_payload(&encode_payload(&b)).unwrap(), b);
    let ranked = EventBatch {
        attn_dp_rank: Some(3),
        ..b
    };
    assert_eq!(decode_payload(&encode_payload(&ranked)).unwrap(), ranked);
}

#[test]
fn message_round_trip() {
    let b = sample();
    let frames = encode_message(b"", u64::MAX - 1, &b);
    let m = decode_message(&frames).unwrap();
    assert_eq!((m.topic, m.seq, m.batch), (Vec::new(), u64::MAX - 1, b));
}

#[test]
fn unknown_keys_and_absent_fields() {
    let e = Value::Map(vec![
        (k("extra"), Value::Array(vec![Value::Nil])),
        (k("type"), k("BlockStored")),
        (k("block_hashes"), Value::Array(vec![Value::from(9)])),
        (Value::from(7), k("a non-string key")),
        (k("token_ids"), Value::Array(vec![Value::from(5)])),
    ]);
    let b = decode_payload(&payload(vec![e], Value::from(2))).unwrap();
    let want = BlockStored {
        block_hashes: vec![EngineHash::from_i64(9)],
        token_ids: vec![5],
        ..BlockStored::default()
    };
    assert_eq!(b.events, vec![KvEvent::BlockStored(want)]);
    assert_eq!(b.attn_dp_rank, Some(2));
    // A batch of two elements (no rank) is accepted too.
    let short = write(&Value::Array(vec![Value::from(3), Value::Array(vec![])]));
    let b = decode_payload(&short).unwrap();
    assert_eq!((b.ts, b.attn_dp_rank), (3.0, None));
}

#[test]
fn unknown_event_type_is_counted_and_skipped() {
    let events = vec![
        Value::Map(vec![
            (k("type"), k("BlockPinned")),
            (k("x"), Value::from(1)),
        ]),
        Value::Map(vec![(k("type"), k("AllBlocksCleared"))]),
        Value::Array(vec![k("SomethingNew"), Value::from(1)]),
    ];
    let b = decode_payload(&payload(events, Value::Nil)).unwrap();
    assert_eq!(b.events, vec![KvEvent::AllBlocksCleared]);
    assert_eq!(b.unknown_events, 2);
}

#[test]
fn bytes_and_negative_and_unsigned_hashes() {
    let vllm = [0xabu8; 32];
    let e = Value::Map(vec![
        (k("type"), k("BlockStored")),
        (
            k("block_hashes"),
            Value::Array(vec![
                Value::Binary(vllm.to_vec()),
                Value::from(-9_i64),
                Value::from(u64::MAX),
            ]),
        ),
        (k("parent_block_hash"), Value::Binary(vec![1, 2, 3])),
        (k("token_ids"), Value::Array(vec![])),
        (k("block_size"), Value::from(16)),
    ]);
    let b = decode_payload(&payload(vec![e], Value::Nil)).unwrap();
    let KvEvent::BlockStored(s) = &b.events[0] else {
        panic!("{b:?}")
    };
    assert_eq!(
        s.block_hashes,
        vec![
            EngineHash::from_bytes(&vllm),
            EngineHash::from_i64(-9),
            EngineHash::from_i64(-1),
        ]
    );
    assert_eq!(
        s.parent_block_hash,
        Some(EngineHash::from_bytes(&[1, 2, 3]))
    );
    assert_ne!(
        EngineHash::from_bytes(&vllm),
        EngineHash::from_bytes(&[0xab; 31])
    );
}

#[test]
fn positional_events() {
    let events = vec![
        Value::Array(vec![
            k("BlockStored"),
            Value::Array(vec![Value::from(1), Value::from(2)]),
            Value::from(-1),
            Value::Array((0..8).map(Value::from).collect()),
            Value::from(4),
            Value::Nil,
            k("GPU"),
            Value::Nil,
            Value::Nil,
            Value::Nil,
            k("future field"),
        ]),
        Value::Array(vec![k("BlockRemoved"), Value::Array(vec![Value::from(2)])]),
        Value::Array(vec![k("AllBlocksCleared")]),
    ];
    let b = decode_payload(&payload(events, Value::from(0))).unwrap();
    let want = vec![
        KvEvent::BlockStored(BlockStored {
            medium: Some(Medium::Gpu),
            ..stored(&[1, 2], Some(-1), (0..8).collect())
        }),
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![EngineHash::from_i64(2)],
            medium: None,
        }),
        KvEvent::AllBlocksCleared,
    ];
    assert_eq!(b.events, want);
}

#[test]
fn malformed_payloads() {
    let bad_event = |e: Value| decode_payload(&payload(vec![e], Value::Nil)).unwrap_err();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![], "not msgpack"),
        (vec![0xc1], "batch"), // rmpv reads the reserved marker as a value
        (vec![0x93, 0xcb, 0x41], "not msgpack"),
        (vec![0x90, 0x90], "after the msgpack value"),
        (write(&Value::from(5)), "batch"),
        (write(&Value::Array(vec![Value::F64(1.0)])), "batch"),
        (
            write(&Value::Array(vec![k("t"), Value::Array(vec![])])),
            "ts",
        ),
        (
            write(&Value::Array(vec![
                Value::F64(1.0),
                Value::Array(vec![]),
                Value::from(-1),
            ])),
            "attn_dp_rank",
        ),
        (vec![0x91; 10_000], "not msgpack"),
    ];
    for (bytes, want) in cases {
        let e = decode_payload(&bytes).unwrap_err();
        assert!(e.to_string().contains(want), "{bytes:02x?}: {e}");
    }
    let stored_with =
        |key: &str, v: Value| Value::Map(vec![(k("type"), k("BlockStored")), (k(key), v)]);
    for (e, want) in [
        (Value::from(1), "event"),
        (
            Value::Map(vec![(k("block_hashes"), Value::Array(vec![]))]),
            "type",
        ),
        (
            stored_with("token_ids", Value::Array(vec![Value::from(-1)])),
            "token_ids",
        ),
        (
            stored_with("token_ids", Value::Array(vec![Value::from(1u64 << 32)])),
            "token_ids",
        ),
        (
            stored_with("block_hashes", Value::Array(vec![k("x")])),
            "block hash",
        ),
        (stored_with("block_hashes", Value::from(3)), "block_hashes"),
        (stored_with("block_size", Value::F64(16.0)), "block_size"),
        (stored_with("lora_id", k("x")), "lora_id"),
        (stored_with("medium", Value::from(1)), "medium"),
        (Value::Array(vec![]), "event"),
    ] {
        let err = bad_event(e);
        assert!(err.to_string().contains(want), "{err}");
    }
}

#[test]
fn malformed_frames() {
    let p = encode_payload(&sample());
    let seq = 5u64.to_be_bytes();
    let e = decode_message(&[&b"t"[..], &seq]).unwrap_err();
    assert_eq!(
        e,
        DecodeError::Frames {
            expected: 3,
            found: 2
        }
    );
    let e = decode_message(&[&b"t"[..], &seq, &p, b""]).unwrap_err();
    assert_eq!(
        e,
        DecodeError::Frames {
            expected: 3,
            found: 4
        }
    );
    let e = decode_message(&[&b"t"[..], &seq[..7], &p]).unwrap_err();
    assert_eq!(e, DecodeError::Sequence { len: 7 });
    let e = decode_message(&[&b"t"[..], &seq, b"garbage"]).unwrap_err();
    assert!(
        matches!(e, DecodeError::Msgpack(_) | DecodeError::Trailing { .. }),
        "{e}"
    );
    assert!(decode_message::<&[u8]>(&[]).is_err());
}

#[test]
fn replay_protocol() {
    let req = encode_replay_request(17);
    assert_eq!(req, [Vec::new(), vec![0, 0, 0, 0, 0, 0, 0, 17]]);
    assert_eq!(decode_replay_request(&req).unwrap(), 17);
    assert_eq!(
        decode_replay_request(&[&b"x"[..], &[0; 8]]).unwrap_err(),
        DecodeError::Delimiter
    );
    assert_eq!(
        decode_replay_request(&[&b""[..], &[0; 4]]).unwrap_err(),
        DecodeError::Sequence { len: 4 }
    );
    assert!(decode_replay_request(&[&b""[..]]).is_err());

    let b = sample();
    let answer = encode_replay_batch(b"", 3, &encode_payload(&b));
    let ReplayFrame::Batch(m) = decode_replay_frame(&answer).unwrap() else {
        panic!("not a batch")
    };
    assert_eq!((m.topic.len(), m.seq, m.batch), (0, 3, b));

    let end = encode_replay_end();
    assert_eq!(end, [vec![], vec![], vec![0xff; 8], vec![]]);
    assert_eq!(decode_replay_frame(&end).unwrap(), ReplayFrame::End);
    assert_eq!(
        decode_replay_frame(&[&b"x"[..], b"", &[0xff; 8], b""]).unwrap_err(),
        DecodeError::Delimiter
    );
    // vLLM's form: no topic frame.
    let ReplayFrame::Batch(m) =
        decode_replay_frame(&answer[..1].iter().chain(&answer[2..]).collect::<Vec<_>>()).unwrap()
    else {
        panic!("not a batch")
    };
    assert_eq!((m.topic.len(), m.seq, m.batch), (0, 3, sample()));
    assert_eq!(
        decode_replay_frame(&[&b""[..], &[0xff; 8], b""]).unwrap(),
        ReplayFrame::End
    );
    // Without the delimiter, a topic first is no frame of either form.
    let topical = encode_replay_batch(b"kv", 3, &encode_payload(&sample()));
    assert_eq!(
        decode_replay_frame(&topical[1..]).unwrap_err(),
        DecodeError::Delimiter
    );
    assert!(decode_replay_frame(&answer[2..]).is_err());
    // A sequence of -1 with a payload is not the marker; that payload must then decode.
    assert!(decode_replay_frame(&[&b""[..], b"", &[0xff; 8], b"\xc1"]).is_err());
}

#[test]
fn load_stat_round_trip_and_extras() {
    let full = LoadStat {
        num_running_reqs: 3,
        num_waiting_reqs: 1,
        num_tokens: 4096,
        max_total_num_tokens: 1 << 20,
        attn_dp_rank: 1,
        num_waiting_uncached_tokens: Some(700),
        num_total_tokens: Some(5000),
        max_running_requests: Some(48),
        total_prefill_uncached_tokens: Some(123_456),
        total_prefill_busy_us: Some(9_999_999),
    };
    let six = LoadStat {
        num_waiting_uncached_tokens: None,
        num_total_tokens: None,
        max_running_requests: None,
        total_prefill_uncached_tokens: None,
        total_prefill_busy_us: None,
        ..full
    };
    let gap = LoadStat {
        num_total_tokens: Some(5),
        ..six
    };
    for s in [full, six, gap] {
        let frames = encode_load_message(b"load", 9, &s);
        let m = decode_load_message(&frames).unwrap();
        assert_eq!((m.topic.as_slice(), m.seq, m.stat), (&b"load"[..], 9, s));
    }
    assert_eq!(decode_load_stat(&encode_load_stat(&six)).unwrap(), six);
    // Positions past the known ones are ignored.
    let mut items: Vec<Value> = vec![k("LoadStat")];
    items.extend((1..=12).map(Value::from));
    let s = decode_load_stat(&write(&Value::Array(items))).unwrap();
    assert_eq!((s.num_running_reqs, s.attn_dp_rank), (1, 5));
    assert_eq!(s.total_prefill_busy_us, Some(10));
}

#[test]
fn load_stat_refusals() {
    let arr = |v: Vec<Value>| write(&Value::Array(v));
    let five = arr(vec![k("LoadStat"), 1.into(), 2.into(), 3.into(), 4.into()]);
    let wrong_tag = arr(vec![
        k("Other"),
        1.into(),
        2.into(),
        3.into(),
        4.into(),
        0.into(),
    ]);
    let negative = arr(vec![
        k("LoadStat"),
        (-1).into(),
        2.into(),
        3.into(),
        4.into(),
        0.into(),
    ]);
    for p in [five, wrong_tag, negative, vec![0xc1], vec![]] {
        assert!(decode_load_stat(&p).is_err(), "{p:02x?}");
    }
    let seq = 1u64.to_be_bytes();
    let e = decode_load_message(&[&b"load"[..], &seq]).unwrap_err();
    assert_eq!(
        e,
        DecodeError::Frames {
            expected: 3,
            found: 2
        }
    );
    let e = decode_load_message(&[&b"load"[..], &seq[..3], b""]).unwrap_err();
    assert_eq!(e, DecodeError::Sequence { len: 3 });
}

fn descriptor(json: serde_json::Value) -> KvEventsDescriptor {
    serde_json::from_value(json).unwrap()
}

#[test]
fn endpoints_per_rank() {
    let d = descriptor(serde_json::json!({
        "publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557, "topic": "",
        "block_size": 16, "dp_size": 2, "replay_endpoint_port_base": 5558,
        "load_endpoint_port_base": 5560, "load_topic": "load", "something_new": [1, 2]
    }));
    assert_eq!(d.block_size, Some(16));
    let e = rank_endpoints("http://10.0.0.1:8000", &d).unwrap();
    assert_eq!(
        e,
        vec![
            RankEndpoints {
                rank: 0,
                events: "tcp://10.0.0.1:5557".into(),
                replay: Some("tcp://10.0.0.1:5558".into()),
                load: Some("tcp://10.0.0.1:5560".into()),
            },
            RankEndpoints {
                rank: 1,
                events: "tcp://10.0.0.1:5558".into(),
                replay: Some("tcp://10.0.0.1:5559".into()),
                load: Some("tcp://10.0.0.1:5561".into()),
            },
        ]
    );
}

#[test]
fn endpoint_hosts() {
    let minimal = descriptor(serde_json::json!({"endpoint_port_base": 7000}));
    assert_eq!(minimal.topic, "");
    let check = |url: &str, host: Option<&str>, want: &str| {
        let d = KvEventsDescriptor {
            endpoint_host: host.map(str::to_owned),
            ..minimal.clone()
        };
        let e = rank_endpoints(url, &d).unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].events, want, "{url} {host:?}");
        assert_eq!((e[0].replay.as_ref(), e[0].load.as_ref()), (None, None));
    };
    check("http://Engine-1:8000/v1", None, "tcp://engine-1:7000");
    check("http://h:1", Some("0.0.0.0"), "tcp://h:7000");
    check("http://h", Some("::"), "tcp://h:7000");
    check("http://h", Some("*"), "tcp://h:7000");
    check("http://[::1]:30000", Some("*"), "tcp://[::1]:7000");
    check("http://user@h:1/p?q", Some(""), "tcp://h:7000");
    check("h:1", None, "tcp://h:7000");
    check("http://h", Some("10.1.2.3"), "tcp://10.1.2.3:7000");
    check("http://h", Some("fe80::1"), "tcp://[fe80::1]:7000");
}

#[test]
fn endpoint_refusals() {
    let d = descriptor(serde_json::json!({"endpoint_port_base": 65535, "dp_size": 2}));
    assert_eq!(
        rank_endpoints("http://h", &d).unwrap_err(),
        EndpointError::Port {
            base: 65535,
            rank: 1
        }
    );
    let none = KvEventsDescriptor {
        dp_size: Some(0),
        ..d.clone()
    };
    assert_eq!(
        rank_endpoints("http://h", &none).unwrap_err(),
        EndpointError::NoRank
    );
    let other = KvEventsDescriptor {
        publisher: Some("nats".into()),
        ..d.clone()
    };
    assert!(matches!(
        rank_endpoints("http://h", &other),
        Err(EndpointError::Publisher(_))
    ));
    assert!(matches!(
        rank_endpoints("http://", &d),
        Err(EndpointError::NoHost(_))
    ));
    assert!(matches!(
        rank_endpoints("http://[]:80", &d),
        Err(EndpointError::NoHost(_))
    ));
    let missing: Result<KvEventsDescriptor, _> =
        serde_json::from_value(serde_json::json!({"publisher": "zmq"}));
    assert!(missing.is_err());
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_payload(&bytes);
        let _ = decode_load_stat(&bytes);
        let _ = decode_message(&[&b"t"[..], &bytes[..bytes.len().min(8)], &bytes]);
        let _ = decode_replay_frame(&[&b""[..], b"", &bytes[..bytes.len().min(8)], &bytes]);
    }

    #[test]
    fn truncated_payloads_are_errors(cut in 0usize..1000) {
        let p = encode_payload(&sample());
        let cut = cut % p.len();
        prop_assert!(decode_payload(&p[..cut]).is_err());
    }
}

#[test]
fn vllm_carries_the_salt_in_the_first_blocks_extra_keys() {
    use crate::{VllmHashes, encode_payload_vllm};
    let salted = |lora: Option<&str>, parent: Option<i64>| BlockStored {
        lora_name: lora.map(str::to_owned),
        lora_id: lora.map(|_| 1),
        cache_salt: Some("tenant-a".into()),
        ..stored(&[1, 2], parent, vec![1, 2, 3, 4])
    };
    for lora in [None, Some("sql")] {
        let b = EventBatch {
            ts: 1.0,
            events: vec![KvEvent::BlockStored(salted(lora, None))],
            attn_dp_rank: None,
            unknown_events: 0,
        };
        // vLLM sends no cache_salt field: the salt comes back from extra_keys.
        let got = decode_payload(&encode_payload_vllm(&b, VllmHashes::Ints)).unwrap();
        let KvEvent::BlockStored(s) = &got.events[0] else {
            panic!("{got:?}")
        };
        assert_eq!(s.cache_salt.as_deref(), Some("tenant-a"), "{lora:?}");
        assert_eq!(s.lora_name.as_deref(), lora);
    }
    // Past the first block vLLM adds no salt: a continuation is salted by its chain.
    let later = EventBatch {
        ts: 1.0,
        events: vec![KvEvent::BlockStored(salted(Some("sql"), Some(9)))],
        attn_dp_rank: None,
        unknown_events: 0,
    };
    let got = decode_payload(&encode_payload_vllm(&later, VllmHashes::Ints)).unwrap();
    let KvEvent::BlockStored(s) = &got.events[0] else {
        panic!("{got:?}")
    };
    assert_eq!(s.cache_salt, None);
    // Keys of another shape (a multimodal pair first, no string) name no salt.
    let e = Value::Map(vec![
        (k("type"), k("BlockStored")),
        (k("block_hashes"), Value::Array(vec![Value::from(5)])),
        (k("parent_block_hash"), Value::Nil),
        (k("token_ids"), Value::Array(vec![Value::from(1)])),
        (k("block_size"), Value::from(1)),
        (k("lora_id"), Value::Nil),
        (
            k("extra_keys"),
            Value::Array(vec![Value::Array(vec![Value::Array(vec![
                k("img"),
                Value::from(0),
            ])])]),
        ),
    ]);
    let b = decode_payload(&payload(vec![e], Value::Nil)).unwrap();
    let KvEvent::BlockStored(s) = &b.events[0] else {
        panic!("{b:?}")
    };
    assert_eq!(s.cache_salt, None);
}

#[test]
fn vllms_array_layout_carries_the_adapter_and_the_salt() {
    // [tag, hashes, parent, tokens, block_size, lora_id, medium, lora_name, extra_keys]
    let e = Value::Array(vec![
        k("BlockStored"),
        Value::Array(vec![Value::from(7)]),
        Value::Nil,
        Value::Array(vec![Value::from(1), Value::from(2)]),
        Value::from(2),
        Value::from(3),
        k("GPU"),
        k("sql"),
        Value::Array(vec![Value::Array(vec![k("sql"), k("tenant-a")])]),
    ]);
    let b = decode_payload(&payload(vec![e], Value::Nil)).unwrap();
    let KvEvent::BlockStored(s) = &b.events[0] else {
        panic!("{b:?}")
    };
    assert_eq!(s.lora_name.as_deref(), Some("sql"));
    assert_eq!(s.lora_id, Some(3));
    assert_eq!(s.cache_salt.as_deref(), Some("tenant-a"));
}
