//! The chain index: scripted cases for each rule, and random event streams against the
//! structural invariants.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use super::*;

const BS: usize = 4;

impl<T: TenantId> ChainIndex<T> {
    /// Panics unless every structural invariant holds (tests only).
    fn check_invariants(&self) {
        let free_nodes: HashSet<u32> = self.free_nodes.iter().copied().collect();
        let free_holdings: HashSet<u32> = self.free_holdings.iter().copied().collect();
        let mut live_holdings = 0;
        for (i, n) in self.nodes.iter().enumerate() {
            let i = i as u32;
            if free_nodes.contains(&i) {
                continue;
            }
            assert_eq!(self.by_key.get(&n.key), Some(&i), "node {i} not keyed");
            assert!(
                !n.holders.is_empty() || !n.children.is_empty(),
                "node {i} is empty but live"
            );
            assert!(
                n.holders.windows(2).all(|w| w[0].0 < w[1].0),
                "holders unsorted"
            );
            if n.parent != NIL {
                let p = &self.nodes[n.parent as usize];
                assert!(
                    p.children.contains(&i),
                    "{i} not among its parent's children"
                );
            }
            for &c in n.children.iter() {
                assert_eq!(self.nodes[c as usize].parent, i);
            }
            for &(slot, h) in n.holders.iter() {
                live_holdings += 1;
                let hd = &self.holdings[h as usize];
                assert!(!free_holdings.contains(&h));
                assert_eq!((hd.slot, hd.node), (slot, i));
                assert_ne!(hd.tiers, 0);
                assert_eq!(self.holders[slot as usize].engine.get(&hd.engine), Some(&h));
                if n.parent != NIL {
                    assert!(
                        self.holder_index(n.parent, slot).is_some(),
                        "holding {h} below a block its rank does not hold"
                    );
                }
                let held = (n.children.iter())
                    .filter(|&&c| self.holder_index(c, slot).is_some())
                    .count();
                assert_eq!(hd.held_children as usize, held, "held_children of {h}");
            }
        }
        assert_eq!(
            live_holdings,
            self.holdings.len() - self.free_holdings.len()
        );
        let mapped: usize = self.holders.iter().map(|h| h.engine.len()).sum();
        assert_eq!(mapped, live_holdings);
        assert_eq!(self.by_key.len(), self.nodes.len() - self.free_nodes.len());
        // The leaf list holds exactly the holdings with no held child, linked both ways.
        let mut on_list = HashSet::new();
        let (mut cur, mut prev) = (self.head, NIL);
        while cur != NIL {
            let hd = &self.holdings[cur as usize];
            assert_eq!(hd.prev, prev);
            assert_eq!(hd.held_children, 0, "non-leaf {cur} on the leaf list");
            assert!(on_list.insert(cur), "cycle at {cur}");
            (prev, cur) = (cur, hd.next);
        }
        assert_eq!(self.tail, prev);
        let leaves = (self.nodes.iter().enumerate())
            .filter(|(i, _)| !free_nodes.contains(&(*i as u32)))
            .flat_map(|(_, n)| n.holders.iter())
            .filter(|(_, h)| self.holdings[*h as usize].held_children == 0)
            .count();
        assert_eq!(on_list.len(), leaves);
        if let Some(max) = self.config.max_blocks {
            assert!(
                live_holdings <= max,
                "{live_holdings} held over the cap {max}"
            );
        }
    }

    fn key_of(&self, worker: T, rank: u32, engine: u64) -> Option<u64> {
        let slot = *self.slots.get(&(worker, rank))?;
        let h = self.holding_of(slot, engine)?;
        Some(self.nodes[self.holdings[h as usize].node as usize].key)
    }
}

/// `n` blocks of distinct tokens, block `b` of sequence `seq`.
fn tokens(seq: u32, n: usize) -> Vec<u32> {
    (0..(n * BS) as u32).map(|i| seq * 10_000 + i).collect()
}

fn store<'a>(hashes: &'a [u64], parent: Option<u64>, toks: &'a [u32]) -> ChainStore<'a> {
    ChainStore {
        block_hashes: hashes,
        parent,
        token_ids: toks,
        block_size: BS,
        namespace: 0,
        tier: 0,
    }
}

fn index() -> ChainIndex<u64> {
    ChainIndex::new(ChainConfig::default())
}

/// Each (worker, rank)'s leading blocks of `toks`, deepest first.
fn matched(ix: &ChainIndex<u64>, toks: &[u32]) -> Vec<((u64, u32), usize)> {
    ix.check_invariants();
    ix.match_tokens(toks, BS, 0).per_rank
}

#[test]
fn chain_key_is_what_a_request_computes() {
    let mut ix = index();
    let t = tokens(1, 3);
    // Stored in two events, the second naming the first's last block as its parent.
    ix.apply_stored(7, 0, &store(&[-11i64 as u64, 22], None, &t[..2 * BS]));
    let a = ix.apply_stored(7, 0, &store(&[33], Some(22), &t[2 * BS..]));
    assert_eq!(
        a,
        ChainApply {
            applied: 1,
            ..ChainApply::default()
        }
    );
    let keys = chain_keys(&t, BS, 0);
    let stored: Vec<u64> = [-11i64 as u64, 22, 33]
        .iter()
        .map(|&h| ix.key_of(7, 0, h).unwrap())
        .collect();
    assert_eq!(stored, keys);
    assert_eq!(matched(&ix, &t), vec![((7, 0), 3)]);
    // A partial tail block is ignored; a longer request matches the held head.
    let mut longer = t.clone();
    longer.extend([1, 2, 3]);
    let m = ix.match_tokens(&longer, BS, 0);
    assert_eq!((m.blocks, m.matched_by(7, 0)), (3, 3));
    let mut other = t.clone();
    other.extend(tokens(2, 2));
    assert_eq!(ix.match_tokens(&other, BS, 0).per_rank, vec![((7, 0), 3)]);
    // A different second block diverges there.
    let mut fork = t.clone();
    fork[BS] += 1;
    assert_eq!(matched(&ix, &fork), vec![((7, 0), 1)]);
    assert_eq!(chain_keys(&t[..2 * BS], BS, 0), keys[..2]);
    assert!(chain_keys(&t, 0, 0).is_empty());
}

#[test]
fn same_content_on_two_workers_shares_keys() {
    let mut ix = index();
    let t = tokens(1, 3);
    ix.apply_stored(1, 0, &store(&[1, 2, 3], None, &t));
    // Another engine, its own hashes for the same blocks, two of them.
    ix.apply_stored(2, 0, &store(&[91, 92], None, &t[..2 * BS]));
    assert_eq!(matched(&ix, &t), vec![((1, 0), 3), ((2, 0), 2)]);
    assert_eq!(ix.stats().nodes, 3);
    assert_eq!(ix.stats().blocks, 5);
    assert_eq!(ix.blocks_per_rank(), vec![((1, 0), 3), ((2, 0), 2)]);
}

#[test]
fn one_engines_removal_never_evicts_anothers_prefix() {
    let mut ix = index();
    let t = tokens(1, 3);
    for (w, r) in [(1, 0), (1, 1), (2, 0)] {
        // SGLang hashes by content, so engines send the same hashes for the same blocks.
        ix.apply_stored(w, r, &store(&[1, 2, 3], None, &t));
    }
    let a = ix.apply_removed(1, 0, &[2], None);
    // Block 2 and, below it, block 3: rank (1, 0) could no longer serve 3 from its cache.
    assert_eq!(a.applied, 2);
    assert_eq!(
        matched(&ix, &t),
        vec![((1, 1), 3), ((2, 0), 3), ((1, 0), 1)]
    );
    assert_eq!(ix.blocks_of(1, 0), 1);
    // A removal by a rank that never held the hash does nothing but count.
    let a = ix.apply_removed(3, 0, &[1], None);
    assert_eq!((a.applied, a.unknown), (0, 1));
    let a = ix.apply_removed(1, 0, &[3], None);
    assert_eq!((a.applied, a.unknown), (0, 1));
    assert_eq!(ix.stats().unknown_removals, 2);
}

#[test]
fn all_blocks_cleared_wipes_only_that_rank() {
    let mut ix = index();
    let t = tokens(1, 2);
    for (w, r) in [(1, 0), (1, 1), (2, 1)] {
        ix.apply_stored(w, r, &store(&[1, 2], None, &t));
    }
    // Orphans and several chains go too.
    ix.apply_stored(1, 1, &store(&[5], Some(404), &tokens(2, 1)));
    ix.apply_stored(1, 1, &store(&[6], None, &tokens(3, 1)));
    assert_eq!(ix.blocks_per_worker(), vec![(1, 6), (2, 2)]);
    assert_eq!(ix.clear(1, 1), 4);
    assert_eq!(matched(&ix, &t), vec![((1, 0), 2), ((2, 1), 2)]);
    assert_eq!(ix.blocks_of(1, 1), 0);
    assert_eq!(ix.stats().nodes, 2);
    // The cleared rank starts over from what it stores next.
    ix.apply_stored(1, 1, &store(&[1], None, &t[..BS]));
    assert_eq!(
        matched(&ix, &t),
        vec![((1, 0), 2), ((2, 1), 2), ((1, 1), 1)]
    );
    assert_eq!(ix.clear(9, 0), 0);
    assert_eq!(ix.forget_worker(1), 3);
    assert_eq!(matched(&ix, &t), vec![((2, 1), 2)]);
}

#[test]
fn index_started_late_recovers_through_replay() {
    let mut ix = index();
    let t = tokens(1, 4);
    // The engine stored blocks 1, 2 before the index existed; it now stores 3 under 2.
    let a = ix.apply_stored(1, 0, &store(&[3], Some(2), &t[2 * BS..3 * BS]));
    assert_eq!((a.applied, a.unknown), (1, 1));
    assert_eq!(ix.stats().unknown_parents, 1);
    // The orphan is never matched: the engine holds it only after blocks 1 and 2.
    assert!(matched(&ix, &t).is_empty());
    assert!(matched(&ix, &t[2 * BS..3 * BS]).is_empty());
    // Its continuation attaches to it without another unknown parent.
    let a = ix.apply_stored(1, 0, &store(&[4], Some(3), &t[3 * BS..]));
    assert_eq!((a.applied, a.unknown), (1, 0));
    assert_eq!(ix.blocks_of(1, 0), 2);
    // Replay from sequence 0 brings the real parents; the re-stored hashes move over.
    ix.apply_stored(1, 0, &store(&[1, 2], None, &t[..2 * BS]));
    ix.apply_stored(1, 0, &store(&[3], Some(2), &t[2 * BS..3 * BS]));
    ix.apply_stored(1, 0, &store(&[4], Some(3), &t[3 * BS..]));
    assert_eq!(matched(&ix, &t), vec![((1, 0), 4)]);
    assert_eq!(ix.stats().nodes, 4, "the orphan chain is gone");
    assert_eq!(ix.blocks_of(1, 0), 4);
}

#[test]
fn removals_apply_to_orphan_chains() {
    let mut ix = index();
    ix.apply_stored(1, 0, &store(&[3, 4], Some(2), &tokens(1, 2)));
    let a = ix.apply_removed(1, 0, &[4], None);
    assert_eq!((a.applied, a.unknown), (1, 0));
    assert_eq!(ix.apply_removed(1, 0, &[3], None).applied, 1);
    assert_eq!(
        ix.stats(),
        ChainStats {
            unknown_parents: 1,
            ..ChainStats::default()
        }
    );
}

#[test]
fn block_size_or_namespace_mismatch_matches_nothing() {
    let mut ix = index();
    let t = tokens(1, 4);
    ix.apply_stored(1, 0, &store(&[1, 2, 3, 4], None, &t));
    for bs in [1, 2, 8, 16] {
        let m = ix.match_tokens(&t, bs, 0);
        assert!(m.per_rank.is_empty(), "block size {bs}");
    }
    assert!(ix.match_tokens(&t, 0, 0).per_rank.is_empty());
    assert!(ix.match_tokens(&t, BS, 1).per_rank.is_empty());
    assert!(ix.match_tokens(&t[..BS - 1], BS, 0).per_rank.is_empty());
    assert!(ix.match_tokens(&[], BS, 0).per_rank.is_empty());
    // Stored under a namespace, matched under it.
    let ns = ChainStore {
        namespace: 77,
        ..store(&[5], None, &t[..BS])
    };
    ix.apply_stored(2, 0, &ns);
    assert_eq!(ix.match_tokens(&t, BS, 77).per_rank, vec![((2, 0), 1)]);
    // Tokens that are not whole blocks store what they cover.
    let a = ix.apply_stored(3, 0, &store(&[8, 9], None, &t[..BS + 1]));
    assert_eq!((a.applied, a.skipped), (1, 1));
    let a = ix.apply_stored(
        3,
        0,
        &ChainStore {
            block_size: 0,
            ..store(&[8], None, &t)
        },
    );
    assert_eq!((a.applied, a.skipped), (0, 1));
}

#[test]
fn tiers() {
    let mut ix = index();
    let t = tokens(1, 2);
    ix.apply_stored(1, 0, &store(&[1, 2], None, &t));
    // Backed up to host memory (tier 1), then dropped from the GPU (tier 0).
    ix.apply_stored(
        1,
        0,
        &ChainStore {
            tier: 1,
            ..store(&[1, 2], None, &t)
        },
    );
    assert_eq!(ix.apply_removed(1, 0, &[1, 2], Some(0)).applied, 0);
    assert_eq!(matched(&ix, &t), vec![((1, 0), 2)]);
    assert_eq!(ix.apply_removed(1, 0, &[2], Some(1)).applied, 1);
    assert_eq!(matched(&ix, &t), vec![((1, 0), 1)]);
    // A removal naming no tier removes from all.
    ix.apply_stored(
        1,
        0,
        &ChainStore {
            tier: 200,
            ..store(&[2], Some(1), &t[BS..])
        },
    );
    assert_eq!(ix.apply_removed(1, 0, &[1], None).applied, 2);
    assert!(matched(&ix, &t).is_empty());
}

#[test]
fn engine_hash_reused_for_other_content() {
    let mut ix = index();
    ix.apply_stored(1, 0, &store(&[1, 2], None, &tokens(1, 2)));
    // Hash 1 now names another block: the old 1 (and 2 under it) is gone.
    ix.apply_stored(1, 0, &store(&[1], None, &tokens(2, 1)));
    assert!(matched(&ix, &tokens(1, 2)).is_empty());
    assert_eq!(matched(&ix, &tokens(2, 1)), vec![((1, 0), 1)]);
    // A chain re-stored with a hash of its own parent in the middle.
    // The third block's hash drops the first (and the second under it), so the third
    // starts an orphan chain.
    ix.apply_stored(1, 0, &store(&[5, 6, 5], None, &tokens(3, 3)));
    assert!(matched(&ix, &tokens(3, 3)).is_empty());
    assert_eq!(ix.blocks_of(1, 0), 2);
}

#[test]
fn cap_is_respected_oldest_chains_first() {
    let mut ix = ChainIndex::new(ChainConfig {
        max_blocks: Some(10),
    });
    let mut evicted = 0;
    for seq in 0..5u64 {
        let t = tokens(seq as u32, 4);
        let h: Vec<u64> = (0..4).map(|b| seq * 10 + b).collect();
        evicted += ix.apply_stored(seq % 2, 0, &store(&h, None, &t)).evicted;
        ix.check_invariants();
        assert!(ix.stats().blocks <= 10);
    }
    assert_eq!(evicted, 10);
    assert_eq!(ix.stats().evicted, 10);
    // The newest two chains whole, the one before cut from its end.
    let held: Vec<usize> = (0..5)
        .map(|s| {
            ix.match_tokens(&tokens(s, 4), BS, 0)
                .per_rank
                .first()
                .map_or(0, |x| x.1)
        })
        .collect();
    assert_eq!(held, vec![0, 0, 2, 4, 4]);
    // A chain announced again has its end made young again.
    ix.apply_stored(0, 0, &store(&[20, 21], None, &tokens(2, 2)));
    ix.apply_stored(1, 0, &store(&[99], None, &tokens(9, 1)));
    ix.check_invariants();
    assert_eq!(
        ix.match_tokens(&tokens(2, 4), BS, 0).per_rank,
        vec![((0, 0), 2)]
    );
}

#[test]
fn wide_fanout_uses_the_map() {
    let mut ix = index();
    let head = tokens(1, 1);
    ix.apply_stored(1, 0, &store(&[1], None, &head));
    for c in 0..20u32 {
        let t: Vec<u32> = (0..BS as u32).map(|i| 50_000 + c * 100 + i).collect();
        ix.apply_stored(1 + u64::from(c % 3), 0, &store(&[1], None, &head));
        ix.apply_stored(
            1 + u64::from(c % 3),
            0,
            &store(&[100 + u64::from(c)], Some(1), &t),
        );
    }
    let mut req = head.clone();
    req.extend((0..BS as u32).map(|i| 50_000 + 13 * 100 + i));
    assert_eq!(
        matched(&ix, &req),
        vec![((2, 0), 2), ((1, 0), 1), ((3, 0), 1)]
    );
}

#[test]
fn long_chains_across_hash_groups() {
    let mut ix = index();
    let t = tokens(1, 100);
    let hashes: Vec<u64> = (0..100).collect();
    // Worker d holds the first d blocks.
    for d in [1usize, 31, 32, 33, 64, 65, 99, 100] {
        ix.apply_stored(d as u64, 0, &store(&hashes[..d], None, &t[..d * BS]));
    }
    let want: Vec<((u64, u32), usize)> = [100usize, 99, 65, 64, 33, 32, 31, 1]
        .iter()
        .map(|&d| ((d as u64, 0), d))
        .collect();
    assert_eq!(matched(&ix, &t), want);
    // A request diverging after 40 blocks.
    let mut fork = t.clone();
    fork[40 * BS] += 1;
    let m = ix.match_tokens(&fork, BS, 0);
    assert_eq!(m.matched_by(100, 0), 40);
    assert_eq!(m.matched_by(33, 0), 33);
    assert_eq!(m.matched_by(1, 0), 1);
    assert_eq!(ix.match_tokens(&t[..70 * BS], BS, 0).matched_by(99, 0), 70);
}

/// One event of a random stream: few workers, ranks, chains and hashes, so they collide.
#[derive(Debug, Clone)]
enum Op {
    Store {
        w: u64,
        r: u32,
        seq: u32,
        from: usize,
        n: usize,
        parent_known: bool,
        tier: u8,
    },
    Remove {
        w: u64,
        r: u32,
        seq: u32,
        block: usize,
        tier: Option<u8>,
    },
    Clear {
        w: u64,
        r: u32,
    },
    Forget {
        w: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3u64, 0..2u32, 0..4u32, 0..4usize, 1..4usize, any::<bool>(), 0..2u8).prop_map(
            |(w, r, seq, from, n, parent_known, tier)| Op::Store { w, r, seq, from, n, parent_known, tier }
        ),
        3 => (0..3u64, 0..2u32, 0..4u32, 0..6usize, proptest::option::of(0..2u8))
            .prop_map(|(w, r, seq, block, tier)| Op::Remove { w, r, seq, block, tier }),
        1 => (0..3u64, 0..2u32).prop_map(|(w, r)| Op::Clear { w, r }),
        1 => (0..3u64).prop_map(|w| Op::Forget { w }),
    ]
}

/// SGLang-like hashes: one per (sequence, position), the same on every engine.
fn engine_hash(seq: u32, block: usize) -> u64 {
    u64::from(seq) * 100 + block as u64
}

/// A fresh index holding what `ix` exports, rank by rank.
fn exported(ix: &ChainIndex<u64>) -> ChainIndex<u64> {
    let mut out = ChainIndex::new(ix.config().clone());
    for ((w, r), n) in ix.blocks_per_rank() {
        let blocks = ix.export_rank(w, r);
        assert_eq!(blocks.len(), n, "export of ({w}, {r})");
        assert_eq!(out.restore_rank(w, r, &blocks), n, "restore of ({w}, {r})");
    }
    out.check_invariants();
    out
}

#[test]
fn export_and_restore_keep_chains_orphans_tiers_and_engine_hashes() {
    let mut ix = index();
    let t = tokens(1, 4);
    ix.apply_stored(1, 0, &store(&[11, 12], None, &t[..2 * BS]));
    ix.apply_stored(1, 0, &store(&[13, 14], Some(12), &t[2 * BS..]));
    ix.apply_stored(2, 1, &store(&[11, 12], None, &t[..2 * BS]));
    // An orphan chain (its parent never seen) and a block in a second tier.
    let o = tokens(2, 2);
    ix.apply_stored(1, 0, &store(&[21, 22], Some(99), &o));
    ix.apply_stored(
        1,
        0,
        &ChainStore {
            tier: 1,
            ..store(&[11], None, &t[..BS])
        },
    );
    let back = exported(&ix);
    assert_eq!(matched(&back, &t), matched(&ix, &t));
    assert_eq!(back.blocks_per_rank(), ix.blocks_per_rank());
    assert_eq!(back.key_of(1, 0, 22), ix.key_of(1, 0, 22));
    // Removals by engine hash, tiers and continuations apply to restored holdings as to
    // the originals.
    let mut copy = exported(&ix);
    for x in [&mut ix, &mut copy] {
        x.apply_removed(1, 0, &[11], Some(0));
        assert_eq!(
            x.blocks_of(1, 0),
            6,
            "the tier-1 copy keeps block 11 and its chain"
        );
        x.apply_stored(1, 0, &store(&[23], Some(22), &tokens(2, 3)[2 * BS..]));
        assert_eq!(x.blocks_of(1, 0), 7, "the orphan chain goes on");
        x.apply_removed(2, 1, &[12], None);
        assert_eq!(x.blocks_of(2, 1), 1);
        x.check_invariants();
    }
    // A block whose parent the rank does not hold is not restored.
    let mut lone = index();
    let child = ChainBlock {
        key: ix.key_of(1, 0, 14).unwrap_or_default(),
        parent: ix.key_of(1, 0, 13),
        engine: 14,
        tiers: 1,
    };
    assert_eq!(lone.restore_rank(1, 0, &[child]), 0);
    lone.check_invariants();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_streams_keep_the_invariants(
        ops in proptest::collection::vec(op(), 1..60),
        cap in proptest::option::of(1..12usize),
    ) {
        let mut ix: ChainIndex<u64> = ChainIndex::new(ChainConfig { max_blocks: cap });
        for op in ops {
            match op {
                Op::Store { w, r, seq, from, n, parent_known, tier } => {
                    let t = tokens(seq, from + n);
                    let h: Vec<u64> = (from..from + n).map(|b| engine_hash(seq, b)).collect();
                    let parent = (from > 0)
                        .then(|| if parent_known { engine_hash(seq, from - 1) } else { 9_999 });
                    let s = ChainStore { tier, ..store(&h, parent, &t[from * BS..]) };
                    ix.apply_stored(w, r, &s);
                }
                Op::Remove { w, r, seq, block, tier } => {
                    ix.apply_removed(w, r, &[engine_hash(seq, block)], tier);
                }
                Op::Clear { w, r } => { ix.clear(w, r); }
                Op::Forget { w } => { ix.forget_worker(w); }
            }
            ix.check_invariants();
            // No match reports more than the request has or the rank holds.
            for seq in 0..4 {
                let t = tokens(seq, 6);
                let m = ix.match_tokens(&t, BS, 0);
                let mut seen = HashMap::new();
                for &((w, r), n) in &m.per_rank {
                    prop_assert!(n >= 1 && n <= m.blocks);
                    prop_assert!(n <= ix.blocks_of(w, r));
                    prop_assert!(seen.insert((w, r), n).is_none());
                    // Exactly the leading blocks it holds by content.
                    let keys = chain_keys(&t, BS, 0);
                    let slot = ix.slots[&(w, r)];
                    let holds = |k: &u64| ix.by_key.get(k)
                        .is_some_and(|&nd| ix.holder_index(nd, slot).is_some());
                    prop_assert_eq!(keys.iter().take_while(|k| holds(k)).count(), n);
                }
            }
        }
        // What a restarted process restores from the export matches the same way.
        let back = exported(&ix);
        prop_assert_eq!(back.blocks_per_rank(), ix.blocks_per_rank());
        for seq in 0..4 {
            let t = tokens(seq, 6);
            prop_assert_eq!(back.match_tokens(&t, BS, 0), ix.match_tokens(&t, BS, 0));
        }
    }
}
