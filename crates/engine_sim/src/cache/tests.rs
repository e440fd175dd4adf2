use std::time::Instant;

use super::*;

fn seq(start: u32, len: u32) -> Vec<u32> {
    (start..start + len).collect()
}

fn cat(a: &[u32], b: &[u32]) -> Vec<u32> {
    [a, b].concat()
}

#[test]
fn matches_whole_pages_of_a_stored_prefix() {
    let mut cache = PrefixCache::new(4);
    let prompt = seq(0, 10);
    assert_eq!(cache.match_prefix(&prompt).0, 0);
    cache.insert(&prompt);
    assert_eq!(cache.tokens(), 8);
    assert_eq!(cache.match_prefix(&prompt).0, 8);
    assert_eq!(cache.peek(&seq(0, 6)), 4);
    // The same tokens after a different first page share nothing.
    assert_eq!(cache.peek(&cat(&seq(100, 4), &seq(4, 4))), 0);
    // A divergence inside a page matches up to the page before it.
    assert_eq!(cache.peek(&cat(&seq(0, 6), &[99, 99])), 4);
}

#[test]
fn page_size_one_matches_token_by_token() {
    let mut cache = PrefixCache::new(1);
    cache.insert(&seq(0, 10));
    assert_eq!(cache.peek(&cat(&seq(0, 7), &[50])), 7);
    // A second branch splits the node; both stay reachable.
    cache.insert(&cat(&seq(0, 7), &[50, 51]));
    assert_eq!(cache.tokens(), 12);
    assert_eq!(cache.peek(&seq(0, 10)), 10);
    assert_eq!(cache.peek(&cat(&seq(0, 7), &[50, 51])), 9);
}

#[test]
fn evicts_least_recently_used_leaves_first() {
    let mut cache = PrefixCache::new(4);
    let (a, b, c) = (seq(0, 8), seq(100, 8), seq(200, 8));
    cache.insert(&a);
    cache.insert(&b);
    cache.match_prefix(&a); // a is now the most recent
    cache.insert(&c);
    assert_eq!(cache.evict(8), 8);
    assert_eq!((cache.peek(&a), cache.peek(&b), cache.peek(&c)), (8, 0, 8));
    assert_eq!(cache.tokens(), 16);
}

#[test]
fn eviction_trims_branches_and_keeps_prefixes_reachable() {
    let mut cache = PrefixCache::new(1);
    let shared = seq(0, 6);
    let (x, y) = (cat(&shared, &[70, 71]), cat(&shared, &[80, 81, 82]));
    cache.insert(&x);
    cache.insert(&y);
    // Leaves go first: x's branch (older), then y's; the shared trunk stays.
    assert_eq!(cache.evict(1), 2);
    assert_eq!((cache.peek(&x), cache.peek(&y)), (6, 9));
    assert_eq!(cache.evict(3), 3);
    assert_eq!((cache.peek(&y), cache.tokens()), (6, 6));
    assert_eq!(cache.evict(100), 6);
    assert_eq!(cache.tokens(), 0);
}

#[test]
fn locked_prefixes_are_never_evicted() {
    let mut cache = PrefixCache::new(1);
    let (a, b) = (seq(0, 5), seq(100, 5));
    cache.insert(&a);
    cache.insert(&b);
    let (matched, node) = cache.match_prefix(&seq(0, 3));
    assert_eq!(matched, 3);
    cache.lock(node);
    assert_eq!(cache.locked_tokens(), 3);
    // a's tail below the lock and all of b go; a's locked head stays.
    assert_eq!(cache.evict(100), 7);
    assert_eq!((cache.peek(&a), cache.peek(&b)), (3, 0));
    cache.unlock(node);
    assert_eq!(cache.locked_tokens(), 0);
    assert_eq!(cache.evict(100), 3);
}

#[test]
fn a_split_keeps_the_locks_of_the_node_it_cuts() {
    let mut cache = PrefixCache::new(1);
    let node = cache.insert(&seq(0, 8));
    cache.lock(node);
    // Another prompt diverging inside the locked node splits it.
    cache.insert(&cat(&seq(0, 4), &[90]));
    assert_eq!((cache.tokens(), cache.locked_tokens()), (9, 8));
    assert_eq!(cache.evict(100), 1);
    cache.unlock(node);
    assert_eq!(cache.locked_tokens(), 0);
    assert_eq!(cache.evict(100), 8);
}

#[test]
fn clear_empties_everything() {
    let mut cache = PrefixCache::new(4);
    cache.insert(&seq(0, 20));
    cache.clear();
    assert_eq!((cache.tokens(), cache.peek(&seq(0, 20))), (0, 0));
}

/// Cost stays linear: a cache of 200k single-token pages takes a 4000-token prompt fast.
/// Generous bounds, so a slow or shared machine still passes; a quadratic cost would not.
#[test]
fn long_prompts_at_page_size_one_stay_cheap() {
    let mut cache = PrefixCache::new(1);
    for i in 0..50 {
        cache.insert(&seq(i * 10_000, 4000));
    }
    assert_eq!(cache.tokens(), 200_000);
    let start = Instant::now();
    for round in 0..10 {
        let prompt = seq(1_000_000 + round * 10_000, 4000);
        cache.evict(4000);
        let node = cache.insert(&prompt);
        assert_eq!(cache.match_prefix(&prompt).0, 4000);
        cache.lock(node);
        cache.unlock(node);
        cache.evict(4000);
    }
    let per_round = start.elapsed() / 10;
    assert!(
        per_round.as_millis() < 20,
        "{per_round:?} per insert + match"
    );
}

#[test]
fn recorded_events_name_each_new_page_once_and_survive_splits() {
    use kvgate_kv_events::{EngineHash, KvEvent};

    let stored = |e: &KvEvent| match e {
        KvEvent::BlockStored(s) => s.clone(),
        other => panic!("not a store: {other:?}"),
    };
    let mut cache = PrefixCache::recording(2, Default::default());
    cache.insert(&seq(0, 7)); // pages [0,1] [2,3] [4,5]; token 6 is not a whole page
    let first = cache.take_events();
    assert_eq!(first.len(), 1);
    let a = stored(&first[0]);
    assert_eq!((a.block_hashes.len(), a.parent_block_hash), (3, None));
    assert_eq!((a.token_ids, a.block_size), (seq(0, 6), 2));
    // A branch after the second page splits the node: its parent is that page's hash.
    cache.insert(&cat(&seq(0, 4), &[9, 9]));
    let b = stored(&cache.take_events()[0]);
    assert_eq!(b.parent_block_hash, Some(a.block_hashes[1]));
    assert_eq!(b.token_ids, vec![9, 9]);
    // Inserting what is held stores nothing.
    cache.insert(&seq(0, 6));
    assert!(cache.take_events().is_empty());
    // Evicting both leaves removes exactly their pages; the shared pages stay.
    cache.evict(4);
    let removed: Vec<EngineHash> = cache
        .take_events()
        .iter()
        .flat_map(|e| match e {
            KvEvent::BlockRemoved(r) => r.block_hashes.clone(),
            other => panic!("not a removal: {other:?}"),
        })
        .collect();
    let mut want = vec![a.block_hashes[2], b.block_hashes[0]];
    want.sort();
    let mut got = removed;
    got.sort();
    assert_eq!(got, want);
    cache.clear();
    assert_eq!(cache.take_events(), vec![KvEvent::AllBlocksCleared]);
    // Without recording, nothing is kept.
    let mut plain = PrefixCache::new(2);
    plain.insert(&seq(0, 7));
    plain.clear();
    assert!(plain.take_events().is_empty());
}
