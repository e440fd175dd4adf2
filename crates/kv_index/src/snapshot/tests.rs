use proptest::prelude::*;

use super::*;
use crate::tree::tests::{PropOp, config_strategy, key, lcp, page, prop_op, run_ops};
use crate::{decode, encode};

fn text_tree(keys: &[(&str, u64)]) -> RadixTree<u8, u64> {
    let mut tree = RadixTree::new(TreeConfig::default());
    for (i, (k, t)) in keys.iter().enumerate() {
        tree.insert(k.as_bytes(), *t, i as u64 + 1);
    }
    tree
}

fn round_trip(tree: &RadixTree<u8, u64>, config: TreeConfig, now: u64) -> RadixTree<u8, u64> {
    let bytes = encode(&tree.snapshot()).unwrap();
    let restored = RadixTree::restore(decode(&bytes).unwrap(), config, now).unwrap();
    restored.check_invariants();
    restored
}

/// Scenario 58: equal matches after snapshot → bytes → restore, and a shared head is
/// stored once.
#[test]
fn scenario_58_round_trip_and_size() {
    let head: String = (0..10_000)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    let keys: Vec<String> = (0..100).map(|i| format!("{head} request {i:03}")).collect();
    let mut tree: RadixTree<u8, u64> = RadixTree::new(TreeConfig::default());
    for (i, k) in keys.iter().enumerate() {
        tree.insert(k.as_bytes(), i as u64 % 5, i as u64);
    }
    let bytes = encode(&tree.snapshot()).unwrap();
    let flat: Vec<(&str, u64)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_str(), i as u64 % 5))
        .collect();
    let flat_bytes = encode(&flat).unwrap();
    assert!(
        bytes.len() * 2 < flat_bytes.len(),
        "{} vs flat {}",
        bytes.len(),
        flat_bytes.len()
    );

    let restored = RadixTree::restore(decode(&bytes).unwrap(), TreeConfig::default(), 500).unwrap();
    restored.check_invariants();
    for probe in keys
        .iter()
        .map(String::as_str)
        .chain([&head[..5000], "zzz", ""])
    {
        assert_eq!(
            holdings(&restored, probe.as_bytes()),
            holdings(&tree, probe.as_bytes())
        );
    }
    assert_eq!(restored.total_units(), tree.total_units());
    assert_eq!(restored.node_count(), tree.node_count());
}

#[test]
fn ages_survive_a_restart() {
    let tree = text_tree(&[("old", 1), ("mid", 2), ("new", 3)]);
    // Restored a million ticks later with room for two keys: "old" goes first.
    let config = TreeConfig {
        max_units: Some(6),
        ..TreeConfig::default()
    };
    let restored = round_trip(&tree, config, 1_000_000);
    assert_eq!(
        (
            restored.tenant_units(1),
            restored.tenant_units(2),
            restored.tenant_units(3)
        ),
        (0, 3, 3)
    );
    assert_eq!(restored.snapshot().records.len(), 2);
    let ages: Vec<u64> = restored
        .snapshot()
        .records
        .iter()
        .map(|r| r.tenants[0].1)
        .collect();
    assert_eq!(ages, vec![1, 0], "ages are relative to the new clock");
}

#[test]
fn chunks_concatenate_to_the_whole() {
    let tree = text_tree(&[
        ("abcdef", 1),
        ("abcxyz", 2),
        ("abq", 1),
        ("zz", 3),
        ("zzz", 2),
    ]);
    let whole = tree.snapshot();
    let mut cursor = tree.snapshot_cursor();
    let mut snap = TreeSnapshot::new(cursor.page_size());
    let mut chunks = 0;
    while !cursor.is_done() {
        let chunk = tree.snapshot_chunk(&mut cursor, 2);
        assert!(chunk.len() <= 2);
        snap.records.extend(chunk);
        chunks += 1;
    }
    assert_eq!(snap, whole);
    assert_eq!((whole.records.len(), chunks), (7, 4));
    assert_eq!(cursor.records_done(), whole.records.len());
    assert!(tree.snapshot_chunk(&mut cursor, 2).is_empty());
}

#[test]
fn chunks_bounded_by_units_hold_at_least_one_record_and_rebuild_the_tree() {
    let mut tree = text_tree(&[]);
    let long = |c: char, n: usize| c.to_string().repeat(n);
    for (i, p) in [long('a', 300), long('b', 50), long('c', 50), long('d', 700)]
        .iter()
        .enumerate()
    {
        tree.insert(p.as_bytes(), i as u64, i as u64);
    }
    let whole = tree.snapshot();
    let mut cursor = tree.snapshot_cursor();
    let mut snap = TreeSnapshot::new(cursor.page_size());
    let mut sizes = Vec::new();
    while !cursor.is_done() {
        let chunk = tree.snapshot_chunk_within(&mut cursor, 100, 100);
        assert!(!chunk.is_empty());
        sizes.push(chunk.iter().map(|r| r.edge.len()).collect::<Vec<_>>());
        snap.records.extend(chunk);
    }
    assert_eq!(snap, whole);
    // A chunk closes once it holds 100 units; a longer edge is a chunk of its own.
    assert_eq!(sizes, vec![vec![300], vec![50, 50], vec![700]]);
}

#[test]
fn restore_repairs_tenant_sets() {
    // Tenant 2 appears on the child only, as a fuzzy chunked snapshot can produce.
    let snap = TreeSnapshot {
        version: SNAPSHOT_VERSION,
        page_size: 1,
        records: vec![
            SnapshotRecord {
                parent: None,
                edge: b"ab".to_vec(),
                tenants: vec![(1, 5)],
            },
            SnapshotRecord {
                parent: Some(0),
                edge: b"cd".to_vec(),
                tenants: vec![(2, 3), (2, 9)],
            },
            SnapshotRecord {
                parent: Some(0),
                edge: b"x".to_vec(),
                tenants: vec![],
            },
        ],
    };
    let tree: RadixTree<u8, u64> = RadixTree::restore(snap, TreeConfig::default(), 10).unwrap();
    tree.check_invariants();
    assert_eq!(tree.peek_prefix(b"abcd").per_tenant, vec![(2, 4), (1, 2)]);
    assert_eq!(tree.node_count(), 2, "a record nobody holds is dropped");
    let ages: Vec<Vec<(u64, u64)>> = tree
        .snapshot()
        .records
        .into_iter()
        .map(|r| r.tenants)
        .collect();
    assert_eq!(ages, vec![vec![(1, 5), (2, 3)], vec![(2, 3)]]);
}

#[test]
fn bad_snapshots_are_refused() {
    fn rec(parent: Option<u32>, edge: &[u8]) -> SnapshotRecord<u8, u64> {
        SnapshotRecord {
            parent,
            edge: edge.to_vec(),
            tenants: vec![(1, 0)],
        }
    }
    type Case = (u32, usize, Vec<SnapshotRecord<u8, u64>>, &'static str);
    let cases: Vec<Case> = vec![
        (9, 1, vec![], "Version"),
        (SNAPSHOT_VERSION, 2, vec![], "PageSize"),
        (SNAPSHOT_VERSION, 1, vec![rec(Some(0), b"a")], "BadParent"),
        (SNAPSHOT_VERSION, 1, vec![rec(None, b"")], "BadEdge"),
        (
            SNAPSHOT_VERSION,
            1,
            vec![rec(None, b"ab"), rec(None, b"ac")],
            "DuplicateChild",
        ),
    ];
    for (version, page_size, records, want) in cases {
        let snap = TreeSnapshot {
            version,
            page_size,
            records,
        };
        let err = RadixTree::<u8, u64>::restore(snap, TreeConfig::default(), 0).unwrap_err();
        assert!(
            format!("{err:?}").starts_with(want),
            "{err:?} is not {want}"
        );
    }
    let snap = TreeSnapshot {
        version: SNAPSHOT_VERSION,
        page_size: 4,
        records: vec![rec(None, b"abc")],
    };
    let err = RadixTree::<u8, u64>::restore(snap, TreeConfig::paged(page(4)), 0).unwrap_err();
    assert!(matches!(err, SnapshotError::BadEdge { record: 0 }));

    let garbage = [0xffu8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 1];
    assert!(matches!(
        decode::<TreeSnapshot<u8, u64>>(&garbage),
        Err(SnapshotError::Codec(_))
    ));
    // A record count of 2^62 in a dozen bytes: refused, not preallocated.
    let huge = [2u8, 4, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40];
    assert!(matches!(
        decode::<TreeSnapshot<u8, u64>>(&huge),
        Err(SnapshotError::Codec(_))
    ));
    // Bytes after a whole snapshot are damage too.
    let mut long = encode(&TreeSnapshot::<u8, u64> {
        version: SNAPSHOT_VERSION,
        page_size: 1,
        records: Vec::new(),
    })
    .unwrap();
    assert!(decode::<TreeSnapshot<u8, u64>>(&long).is_ok());
    long.push(0);
    assert!(matches!(
        decode::<TreeSnapshot<u8, u64>>(&long),
        Err(SnapshotError::Codec(_))
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Round trip: equal matches, equal counts, and the same eviction order afterwards.
    #[test]
    fn round_trip_keeps_matches_and_order(
        config in config_strategy(),
        ops in prop::collection::vec(prop_op(), 0..60),
        probes in prop::collection::vec(key(), 0..20),
        budget in 0usize..30,
    ) {
        let mut tree = run_ops(config.clone(), &ops, |_, _, _| {});
        let unbounded = TreeConfig { max_units: None, max_tenant_units: None, ..config.clone() };
        let restored = round_trip(&tree, unbounded, tree.clock + 1000);
        for p in &probes {
            prop_assert_eq!(holdings(&restored, p), holdings(&tree, p));
        }
        for t in tree.tenants() {
            prop_assert_eq!(restored.tenant_units(t), tree.tenant_units(t));
        }
        // Evicting both to the same budget drops the same entries.
        let smaller = TreeConfig { max_units: Some(budget), max_tenant_units: None, ..config };
        let restored = round_trip(&tree, smaller, tree.clock + 5);
        tree.set_budgets(Some(budget), None);
        tree.evict();
        for p in &probes {
            prop_assert_eq!(holdings(&restored, p), holdings(&tree, p));
        }
        prop_assert_eq!(restored.total_units(), tree.total_units());
    }

    /// A chunked snapshot taken while the tree changes restores cleanly, and never claims
    /// a tenant holds more than some key it inserted at some point.
    #[test]
    fn fuzzy_chunks_stay_sound(
        config in config_strategy(),
        setup in prop::collection::vec(prop_op(), 0..40),
        during in prop::collection::vec((prop_op(), 1usize..4), 0..30),
        probes in prop::collection::vec(key(), 0..20),
    ) {
        let p = config.page_size.get();
        let mut inserted: Vec<(u64, Vec<u8>)> = Vec::new();
        for op in setup.iter().chain(during.iter().map(|d| &d.0)) {
            if let PropOp::Insert(k, t) | PropOp::Fused(k, Some(t)) = op {
                inserted.push((*t, k.clone()));
            }
        }
        let mut tree = run_ops(config.clone(), &setup, |_, _, _| {});
        let mut cursor = tree.snapshot_cursor();
        let mut snap = TreeSnapshot::new(p);
        let mut now = tree.clock;
        for (op, n) in &during {
            snap.records.extend(tree.snapshot_chunk(&mut cursor, *n));
            now += 1;
            match op {
                PropOp::Insert(k, t) | PropOp::Fused(k, Some(t)) => tree.insert(k, *t, now),
                PropOp::Fused(k, None) | PropOp::Match(k) => { tree.match_prefix(k, now); }
                PropOp::Remove(t) => { tree.remove_tenant(*t); }
                PropOp::Clear(t) => { tree.clear_tenant(*t); }
                PropOp::Evict => { tree.evict(); }
                PropOp::Observe(k) => { tree.observe(k); }
            }
        }
        while !cursor.is_done() {
            snap.records.extend(tree.snapshot_chunk(&mut cursor, 3));
        }
        let restored = RadixTree::<u8, u64>::restore(snap, TreeConfig::paged(config.page_size), now).unwrap();
        restored.check_invariants();
        for probe in &probes {
            for (t, n) in restored.peek_prefix(probe).per_tenant {
                let best = inserted.iter().filter(|(u, _)| *u == t).map(|(_, k)| lcp(k, probe)).max().unwrap_or(0);
                prop_assert!(n <= best, "tenant {} matches {} > {}", t, n, best);
            }
        }
    }
}

/// What a snapshot keeps of a match: who holds how much (traffic counts start afresh).
fn holdings(tree: &RadixTree<u8, u64>, key: &[u8]) -> (usize, usize, Vec<(u64, usize)>) {
    let m = tree.peek_prefix(key);
    (m.input_len, m.matched_len, m.per_tenant)
}
