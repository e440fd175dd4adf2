//! The tree against a brute-force model: scripted cases and property tests side by side
//! (over 600 lines because every case is a short table of steps through one `check`).

use std::collections::BTreeMap;
use std::num::NonZeroUsize;

use proptest::prelude::*;

use super::*;
use crate::prefix_match::PrefixMatch;

impl<E: KeyUnit, T: TenantId> RadixTree<E, T> {
    /// Panics unless every structural invariant holds (tests only).
    pub(crate) fn check_invariants(&self) {
        use std::collections::HashMap;
        let page = self.page();
        let mut units: HashMap<T, usize> = HashMap::new();
        let mut entries = 0;
        let mut live = 0;
        for (i, n) in self.nodes.iter().enumerate() {
            let i = i as u32;
            if i != ROOT && n.parent == NIL {
                continue; // free slot
            }
            if i != ROOT {
                live += 1;
                assert!(
                    !n.edge.is_empty() && n.edge.len() % page == 0,
                    "edge of {i}"
                );
                assert!(!n.tenants.is_empty(), "node {i} has no tenant");
                let p = &self.nodes[n.parent as usize];
                assert!(
                    p.children.iter().any(|c| c.1 == i),
                    "{i} not a child of its parent"
                );
                let (now, h) = (self.lookups, self.config.traffic_half_life);
                let (mine, theirs) = (n.traffic.entered_at(now, h), p.traffic.entered_at(now, h));
                assert!(
                    mine <= theirs * (1.0 + 1e-4) + 1e-4,
                    "node {i} has more traffic ({mine}) than its parent ({theirs})"
                );
                for (t, _) in &n.tenants {
                    if n.parent != ROOT {
                        assert!(p.tenants.iter().any(|x| x.0 == *t), "tenant not on parent");
                    }
                }
            } else {
                assert!(n.tenants.is_empty());
            }
            assert!(
                n.tenants.windows(2).all(|w| w[0].0 < w[1].0),
                "tenants unsorted"
            );
            assert!(
                n.children.windows(2).all(|w| w[0].0 <= w[1].0),
                "children unsorted"
            );
            for (j, &(u, c)) in n.children.iter().enumerate() {
                let ce = &self.nodes[c as usize];
                assert_eq!(ce.parent, i);
                assert_eq!(self.child_key(&ce.edge), u);
                for &(_, d) in &n.children[j + 1..] {
                    assert!(
                        self.nodes[d as usize].edge[..page] != ce.edge[..page],
                        "dup page"
                    );
                }
            }
            for &(t, e) in &n.tenants {
                let en = self.lru.get(e);
                assert_eq!(en.node, i);
                assert_eq!(self.slots[en.tslot as usize].id, t);
                *units.entry(t).or_default() += n.edge.len();
                entries += 1;
            }
        }
        assert_eq!(live, self.node_count());
        let edges: usize = self.nodes.iter().map(|n| n.edge.len()).sum();
        assert_eq!(edges, self.edge_units);
        assert_eq!(entries, self.lru.live());
        let mut total = 0;
        for (&t, &ts) in &self.index {
            let u = self.slots[ts as usize].list.units;
            assert_eq!(u, units.get(&t).copied().unwrap_or(0), "units of {t:?}");
            total += u;
        }
        assert_eq!(
            units.len(),
            units.keys().filter(|t| self.index.contains_key(t)).count()
        );
        assert_eq!(total, self.total_units);
        // Recency order: stamps never decrease, and a child's entry precedes its parent's.
        let mut seen: HashMap<(u32, T), usize> = HashMap::new();
        let mut last = 0;
        for (pos, en) in self.lru.iter().enumerate() {
            assert!(en.stamp >= last, "stamps decrease");
            last = en.stamp;
            let t = self.slots[en.tslot as usize].id;
            for &(_, c) in &self.nodes[en.node as usize].children {
                if self.nodes[c as usize].tenants.iter().any(|x| x.0 == t) {
                    assert!(
                        seen.contains_key(&(c, t)),
                        "parent entry before child entry"
                    );
                }
            }
            seen.insert((en.node, t), pos);
        }
        assert_eq!(seen.len(), entries);
    }
}

/// One step of a scripted scenario on a byte tree; time advances by one per step.
#[derive(Debug, Clone, Copy)]
enum Op<'a> {
    Insert(&'a str, u64),
    /// Expected per-tenant match, deepest first.
    Match(&'a str, &'a [(u64, usize)]),
    Evict,
    Units(u64, usize),
    Total(usize),
    Nodes(usize),
    Remove(u64),
    Clear(u64),
}

fn check(config: TreeConfig, ops: &[Op<'_>]) -> RadixTree<u8, u64> {
    let mut tree = RadixTree::new(config);
    for (now, op) in ops.iter().enumerate() {
        let now = now as u64 + 1;
        match *op {
            Op::Insert(k, t) => tree.insert(k.as_bytes(), t, now),
            Op::Match(k, want) => {
                let m = tree.match_prefix(k.as_bytes(), now);
                assert_eq!(m.per_tenant, want, "match {k:?} at step {now}");
                assert_eq!(m.input_len, k.len());
                assert_eq!(m.matched_len, want.first().map_or(0, |w| w.1));
            }
            Op::Evict => {
                tree.evict();
            }
            Op::Units(t, n) => assert_eq!(tree.tenant_units(t), n, "units of {t} at step {now}"),
            Op::Total(n) => assert_eq!(tree.total_units(), n, "total at step {now}"),
            Op::Nodes(n) => assert_eq!(tree.node_count(), n, "nodes at step {now}"),
            Op::Remove(t) => {
                tree.remove_tenant(t);
            }
            Op::Clear(t) => {
                tree.clear_tenant(t);
            }
        }
        tree.check_invariants();
    }
    tree
}

fn budget(
    max_units: Option<usize>,
    max_tenant_units: Option<usize>,
    on_insert: bool,
) -> TreeConfig {
    TreeConfig {
        max_units,
        max_tenant_units,
        evict_on_insert: on_insert,
        ..TreeConfig::default()
    }
}

pub(crate) fn page(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap()
}

#[test]
fn reports_every_tenant_with_partial_edges() {
    use Op::*;
    check(
        TreeConfig::default(),
        &[
            Insert("hello world", 1),
            Insert("hello there", 2),
            Insert("help", 3),
            Match("hello world!", &[(1, 11), (2, 6), (3, 3)]),
            Match("hel", &[(1, 3), (2, 3), (3, 3)]),
            Match("hello wx", &[(1, 7), (2, 6), (3, 3)]),
            Match("xyz", &[]),
            Match("", &[]),
            Units(1, 11),
            Units(2, 11),
            Units(3, 4),
            Total(26),
            // "hel" → {"lo " → {"world", "there"}, "p"}
            Nodes(5),
        ],
    );
}

#[test]
fn same_key_twice_counts_once() {
    use Op::*;
    check(
        TreeConfig::default(),
        &[
            Insert("abc", 1),
            Insert("abc", 1),
            Insert("ab", 1),
            Units(1, 3),
            Nodes(2),
            Match("abcd", &[(1, 3)]),
        ],
    );
}

#[test]
fn removal_clear_and_retain() {
    use Op::*;
    let mut tree = check(
        TreeConfig::default(),
        &[
            Insert("shared head one", 1),
            Insert("shared head two", 2),
            Remove(1),
            Units(1, 0),
            Units(2, 15),
            Nodes(2),
            Match("shared head one", &[(2, 12)]),
            Insert("other", 3),
            Clear(3),
            Units(3, 0),
            Total(15),
        ],
    );
    assert_eq!(tree.tenants(), vec![2, 3], "clear keeps the tenant listed");
    tree.insert(b"x", 4, 100);
    assert_eq!(tree.retain_tenants(|t| t == 4), 2);
    assert_eq!(tree.tenants(), vec![4]);
    assert_eq!(tree.total_units(), 1);
    tree.check_invariants();
}

#[test]
fn fused_match_then_insert_records_only_the_choice() {
    let mut tree: RadixTree<u8, u64> = RadixTree::new(TreeConfig::default());
    tree.insert(b"prompt A", 1, 1);
    let (m, chosen) = tree.match_and_insert(b"prompt B", 2, |m| {
        assert_eq!(
            m.per_tenant,
            vec![(1, 7)],
            "the match is taken before the insert"
        );
        Some(2)
    });
    assert_eq!((m.matched_len, chosen), (7, Some(2)));
    assert_eq!(
        tree.peek_prefix(b"prompt B").per_tenant,
        vec![(2, 8), (1, 7)]
    );
    let (_, none) = tree.match_and_insert(b"prompt C", 3, |_| None);
    assert_eq!(none, None);
    assert_eq!(tree.peek_prefix(b"prompt C").matched_len, 7);
    assert_eq!(tree.total_units(), 16);
    tree.check_invariants();
}

#[test]
fn char_keys_share_the_implementation() {
    let mut tree: RadixTree<char, u64> = RadixTree::new(TreeConfig::default());
    let a: Vec<char> = "héllo wörld".chars().collect();
    let b: Vec<char> = "héllo wéird".chars().collect();
    tree.insert(&a, 1, 1);
    tree.insert(&b, 2, 2);
    let m = tree.match_prefix(&b, 3);
    assert_eq!(m.per_tenant, vec![(2, 11), (1, 7)]);
    tree.check_invariants();
}

/// Scenario 35: 16-token pages.
#[test]
fn scenario_35_token_pages() {
    let mut tree: RadixTree<u32, u64> = RadixTree::new(TreeConfig::paged(page(16)));
    let five = [1, 2, 3, 4, 5];
    tree.insert(&five, 1, 1);
    assert_eq!(tree.node_count(), 0, "a sub-page key is not stored");
    let m = tree.match_prefix(&five, 2);
    assert_eq!((m.matched_len, m.input_len), (0, 5));

    let three: Vec<u32> = (0..48).collect();
    tree.insert(&three, 1, 3);
    tree.insert(&three[..16], 2, 4);
    assert_eq!(tree.node_count(), 2, "split at the page boundary");
    assert_eq!(
        tree.nodes[tree.find_child(ROOT, &three).unwrap() as usize]
            .edge
            .len(),
        16
    );
    let m = tree.match_prefix(&three, 5);
    assert_eq!(m.per_tenant, vec![(1, 48), (2, 16)]);

    // A partial page never matches; a divergence mid-page matches only whole pages.
    let mut odd = three.clone();
    odd[40] = 999;
    assert_eq!(tree.match_prefix(&odd, 6).matched_by(1), 32);
    assert_eq!(tree.match_prefix(&three[..47], 7).matched_by(1), 32);
    // Siblings that share a first token but differ within the first page.
    let mut sib = three.clone();
    sib[3] = 777;
    tree.insert(&sib, 3, 8);
    assert_eq!(tree.match_prefix(&sib, 9).per_tenant, vec![(3, 48)]);
    assert_eq!(
        tree.match_prefix(&three, 10).per_tenant,
        vec![(1, 48), (2, 16)]
    );
    tree.check_invariants();
}

/// Scenario 55: budget 5; T2's newer "world" survives, T1's older "hello" goes.
#[test]
fn scenario_55_global_budget() {
    use Op::*;
    for on_insert in [false, true] {
        check(
            budget(Some(5), None, on_insert),
            &[
                Insert("hello", 1),
                Insert("hello", 2),
                Insert("world", 2),
                Evict,
                Units(1, 0),
                Units(2, 5),
                Total(5),
                Match("world", &[(2, 5)]),
                Match("hello", &[]),
            ],
        );
    }
}

/// Scenario 56: 8 tenants × 10 chars, budget 40: the 4 oldest go entirely.
#[test]
fn scenario_56_oldest_tenants_go_first() {
    for on_insert in [false, true] {
        let mut tree: RadixTree<u8, u64> = RadixTree::new(budget(Some(40), None, on_insert));
        for t in 0..8u64 {
            let key = format!("tenant-{t}..");
            tree.insert(key.as_bytes(), t, t + 1);
        }
        tree.evict();
        tree.check_invariants();
        for t in 0..8u64 {
            let want = if t < 4 { 0 } else { 10 };
            assert_eq!(
                tree.tenant_units(t),
                want,
                "tenant {t}, on_insert {on_insert}"
            );
        }
    }
}

/// Scenario 57: leaf-first; a 3-page path evicted to 2 pages keeps A and B.
#[test]
fn scenario_57_leaf_first() {
    let mut tree: RadixTree<u32, u64> = RadixTree::new(TreeConfig {
        max_units: Some(32),
        evict_on_insert: false,
        ..TreeConfig::paged(page(16))
    });
    let abc: Vec<u32> = (0..48).collect();
    tree.insert(&abc[..16], 7, 1);
    tree.insert(&abc[..32], 7, 2);
    tree.insert(&abc, 7, 3);
    // A later match of A alone must not save C: C is the leaf.
    tree.match_prefix(&abc[..16], 4);
    let stats = tree.evict();
    assert_eq!(
        stats,
        EvictStats {
            entries: 1,
            units: 16,
            nodes: 1
        }
    );
    assert_eq!(tree.match_prefix(&abc, 5).per_tenant, vec![(7, 32)]);
    tree.check_invariants();
}

#[test]
fn recency_decides_between_leaves() {
    use Op::*;
    check(
        budget(Some(8), None, false),
        &[
            Insert("aaaa", 1),
            Insert("bbbb", 1),
            Insert("cccc", 1),
            Match("aaaa", &[(1, 4)]), // touches "aaaa": "bbbb" is now the oldest
            Evict,
            Match("bbbb", &[]),
            Match("aaaa", &[(1, 4)]),
            Match("cccc", &[(1, 4)]),
        ],
    );
}

#[test]
fn per_tenant_budget_leaves_others_alone() {
    use Op::*;
    for on_insert in [false, true] {
        check(
            budget(None, Some(6), on_insert),
            &[
                Insert("abc", 1),
                Insert("xyz", 2),
                Insert("def", 1),
                Insert("ghi", 1),
                Evict,
                Units(1, 6),
                Units(2, 3),
                Match("abc", &[]),
                Match("ghi", &[(1, 3)]),
            ],
        );
    }
}

#[test]
fn evict_on_insert_never_overshoots() {
    let mut tree: RadixTree<u8, u64> = RadixTree::new(budget(Some(20), Some(12), true));
    for i in 0..200u64 {
        let key = format!("shared-{}-{}", i % 7, i * 31 % 101);
        tree.insert(key.as_bytes(), i % 3, i);
        assert!(tree.total_units() <= 20);
        for t in 0..3 {
            assert!(tree.tenant_units(t) <= 12);
        }
    }
    tree.check_invariants();
    assert!(tree.evicted_total().units > 0);
}

#[test]
fn size_estimate_grows_with_content() {
    let mut tree: RadixTree<u8, u64> = RadixTree::new(TreeConfig::default());
    let empty = tree.size_bytes();
    tree.insert(&[7u8; 4096], 1, 1);
    assert!(tree.size_bytes() >= empty + 4096);
}

// ---- property tests ----

#[derive(Debug, Clone)]
pub(crate) enum PropOp {
    Insert(Vec<u8>, u64),
    Fused(Vec<u8>, Option<u64>),
    Match(Vec<u8>),
    Remove(u64),
    Clear(u64),
    Evict,
    Observe(Vec<u8>),
}

pub(crate) fn key() -> impl Strategy<Value = Vec<u8>> {
    // A tiny alphabet so that keys share prefixes and split edges often.
    prop::collection::vec(0u8..3, 0..14)
}

pub(crate) fn prop_op() -> impl Strategy<Value = PropOp> {
    prop_oneof![
        4 => (key(), 0u64..4).prop_map(|(k, t)| PropOp::Insert(k, t)),
        2 => (key(), prop::option::of(0u64..4)).prop_map(|(k, t)| PropOp::Fused(k, t)),
        2 => key().prop_map(PropOp::Match),
        2 => key().prop_map(PropOp::Observe),
        1 => (0u64..4).prop_map(PropOp::Remove),
        1 => (0u64..4).prop_map(PropOp::Clear),
        1 => Just(PropOp::Evict),
    ]
}

pub(crate) fn lcp(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The brute-force answer: per tenant, the longest page-truncated common prefix with any
/// key it inserted.
fn model_match(model: &BTreeMap<u64, Vec<Vec<u8>>>, key: &[u8], page: usize) -> Vec<(u64, usize)> {
    let key = &key[..key.len() - key.len() % page];
    let mut out: Vec<(u64, usize)> = model
        .iter()
        .filter_map(|(&t, keys)| {
            let best = keys.iter().map(|k| lcp(k, key)).max().unwrap_or(0);
            let best = best - best % page;
            (best > 0).then_some((t, best))
        })
        .collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    out
}

pub(crate) fn run_ops(
    config: TreeConfig,
    ops: &[PropOp],
    mut on_match: impl FnMut(&RadixTree<u8, u64>, &[u8], &PrefixMatch<u64>),
) -> RadixTree<u8, u64> {
    let mut tree = RadixTree::new(config.clone());
    let page = config.page_size.get();
    for (now, op) in ops.iter().enumerate() {
        let now = now as u64;
        match op {
            PropOp::Fused(k, t) => {
                let before = tree.peek_prefix(k);
                let (m, chosen) = tree.match_and_insert(k, now, |_| *t);
                assert_eq!(m, before);
                assert_eq!(chosen, *t);
                on_match(&tree, k, &m);
            }
            PropOp::Match(k) => {
                let m = tree.match_prefix(k, now);
                assert!(m.matched_len <= k.len() - k.len() % page);
                assert!(
                    m.per_tenant
                        .iter()
                        .all(|&(_, n)| n > 0 && n <= m.matched_len)
                );
                assert!(m.per_tenant.iter().all(|&(_, n)| n % page == 0));
                on_match(&tree, k, &m);
            }
            PropOp::Observe(k) => {
                let before = tree.peek_prefix(k);
                let m = tree.observe(k);
                assert_eq!(m, before);
                // Traffic never grows with depth, and no prefix outdraws the whole.
                let counts: Vec<f32> = m.traffic.iter().map(|t| t.1).collect();
                assert!(
                    counts
                        .windows(2)
                        .all(|w| w[1] <= w[0] * (1.0 + 1e-4) + 1e-4)
                );
                assert!(
                    counts
                        .iter()
                        .all(|&c| c <= m.traffic_total * (1.0 + 1e-4) + 1e-4)
                );
            }
            PropOp::Insert(..) | PropOp::Remove(_) | PropOp::Clear(_) => apply(&mut tree, op, now),
            PropOp::Evict => {
                apply(&mut tree, op, now);
                within_budget(&tree, &config);
            }
        }
        if config.evict_on_insert {
            within_budget(&tree, &config);
        }
        tree.check_invariants();
    }
    tree
}

fn within_budget(tree: &RadixTree<u8, u64>, config: &TreeConfig) {
    if let Some(max) = config.max_units {
        assert!(tree.total_units() <= max);
    }
    if let Some(max) = config.max_tenant_units {
        for t in tree.tenants() {
            assert!(tree.tenant_units(t) <= max);
        }
    }
}

pub(crate) fn config_strategy() -> impl Strategy<Value = TreeConfig> {
    (
        prop_oneof![Just(1usize), Just(2), Just(4)],
        prop::option::of(0usize..40),
        prop::option::of(0usize..20),
        any::<bool>(),
    )
        .prop_map(
            |(p, max_units, max_tenant_units, evict_on_insert)| TreeConfig {
                page_size: page(p),
                max_units,
                max_tenant_units,
                evict_on_insert,
                ..TreeConfig::default()
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Counts stay consistent with the tree and budgets hold, under any sequence.
    #[test]
    fn invariants_hold(config in config_strategy(), ops in prop::collection::vec(prop_op(), 0..60)) {
        run_ops(config, &ops, |_, _, _| {});
    }

    /// Without budgets the tree answers exactly what a brute-force model answers.
    #[test]
    fn matches_equal_the_model(p in prop_oneof![Just(1usize), Just(3)], ops in prop::collection::vec(prop_op(), 0..60)) {
        let mut model: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
        let mut tree: RadixTree<u8, u64> = RadixTree::new(TreeConfig::paged(page(p)));
        for (now, op) in ops.iter().enumerate() {
            let now = now as u64;
            match op {
                PropOp::Insert(k, t) | PropOp::Fused(k, Some(t)) => {
                    let (m, _) = tree.match_and_insert(k, now, |_| Some(*t));
                    prop_assert_eq!(m.per_tenant, model_match(&model, k, p));
                    if k.len() >= p {
                        model.entry(*t).or_default().push(k.clone());
                    }
                }
                PropOp::Fused(k, None) | PropOp::Match(k) => {
                    let m = tree.match_prefix(k, now);
                    prop_assert_eq!(m.per_tenant, model_match(&model, k, p));
                }
                PropOp::Observe(k) => {
                    let m = tree.observe(k);
                    prop_assert_eq!(m.per_tenant, model_match(&model, k, p));
                }
                PropOp::Remove(t) | PropOp::Clear(t) => {
                    tree.remove_tenant(*t);
                    model.remove(t);
                }
                PropOp::Evict => { tree.evict(); }
            }
            let units: usize = model.keys().map(|&t| tree.tenant_units(t)).sum();
            prop_assert_eq!(units, tree.total_units());
        }
        tree.check_invariants();
    }
}

#[test]
fn traffic_counts_lookups_through_each_prefix() {
    let mut tree: RadixTree<u8, u64> = RadixTree::new(TreeConfig::default());
    tree.insert(b"sys:a1", 1, 1);
    // Inserts alone are not traffic.
    assert_eq!(tree.peek_prefix(b"sys:a1").traffic_total, 0.0);
    // Four lookups share "sys:", two of them also "sys:a"; one goes elsewhere.
    let first = tree.observe(b"sys:a1");
    assert_eq!(
        first.traffic,
        vec![(6, 0.0)],
        "counts from before the lookup"
    );
    tree.observe(b"sys:a2");
    tree.observe(b"sys:b");
    tree.observe(b"other");
    let near = |a: f32, b: f32| (a - b).abs() < 0.01 * b.max(1.0);
    let m = tree.peek_prefix(b"sys:a3");
    assert!(near(m.traffic_total, 4.0), "{m:?}");
    // One node "sys:a1" so far: three lookups entered it.
    assert_eq!(m.traffic.len(), 1);
    assert!(near(m.traffic_at(5), 3.0), "{m:?}");
    // A split gives the head every lookup that entered the edge, and the tail those that
    // did not end inside it: "sys:b" and "sys:a2" both ended inside, so the tail keeps
    // only "sys:a1" (exact when lookups diverge where the split falls, as conversations
    // sharing a system prompt do).
    tree.insert(b"sys:b", 2, 2);
    let m = tree.peek_prefix(b"sys:a3");
    assert_eq!(
        m.traffic.iter().map(|t| t.0).collect::<Vec<_>>(),
        vec![4, 5]
    );
    assert!(near(m.traffic_at(4), 3.0), "{m:?}");
    assert!(near(m.traffic_at(5), 1.0), "{m:?}");
    assert_eq!(m.traffic_at(6), 0.0, "past the matched path");
    // Lookups that touch recency (match_prefix) and peeks are not traffic either;
    // match_and_insert is.
    tree.match_prefix(b"sys:a3", 5);
    assert_eq!(tree.peek_prefix(b"sys:a3").traffic, m.traffic);
    tree.match_and_insert(b"sys:a3", 6, |_| Some(1));
    assert!(near(tree.peek_prefix(b"sys:a3").traffic_at(5), 2.0));
}

#[test]
fn traffic_halves_every_half_life_lookups() {
    let mut tree: RadixTree<u8, u64> = RadixTree::new(TreeConfig {
        traffic_half_life: 4,
        ..TreeConfig::default()
    });
    tree.insert(b"hot prefix", 1, 1);
    tree.observe(b"hot prefix");
    for i in 0..4u8 {
        tree.observe(&[b'x', i]);
    }
    let m = tree.peek_prefix(b"hot prefix");
    let total = 0.5 + (0..4).map(|k| 0.5f32.powf(k as f32 / 4.0)).sum::<f32>();
    assert!((m.traffic_at(3) - 0.5).abs() < 1e-4, "{m:?}");
    assert!((m.traffic_total - total).abs() < 1e-4, "{m:?}");
}

#[test]
fn forget_undoes_one_record_and_keeps_what_the_tenant_held_before() {
    let mut t: RadixTree<u8, u64> = RadixTree::new(TreeConfig::default());
    t.insert(b"shared head, then one", 1, 1);
    t.insert(b"shared head, then one", 2, 1);
    let before = t.peek_prefix(b"shared head, then two").matched_by(1);
    assert_eq!(before, 18);
    t.insert(b"shared head, then two", 1, 2);
    assert_eq!(t.peek_prefix(b"shared head, then two").matched_by(1), 21);
    // The failed attempt's record goes; the first key and the other tenant stay whole.
    assert_eq!(t.forget(b"shared head, then two", 1, before), 3);
    assert_eq!(t.peek_prefix(b"shared head, then two").matched_by(1), 18);
    assert_eq!(t.peek_prefix(b"shared head, then one").matched_by(1), 21);
    assert_eq!(t.peek_prefix(b"shared head, then one").matched_by(2), 21);
    // A tenant that held nothing loses the whole key, but not a node it needs below.
    t.insert(b"new prompt", 3, 3);
    t.insert(b"new prompt, longer", 3, 3);
    assert_eq!(
        t.forget(b"new prompt", 3, 0),
        0,
        "its longer key passes there"
    );
    assert_eq!(t.forget(b"new prompt, longer", 3, 0), 18);
    assert_eq!(t.tenant_units(3), 0);
    // An unknown tenant or a key it never held changes nothing.
    assert_eq!(t.forget(b"shared head, then one", 9, 0), 0);
    assert_eq!(t.tenant_units(1), 21);
}

proptest! {
    #[test]
    fn common_prefix_agrees_with_unit_by_unit_at_every_block_edge(
        len in 0usize..10_000,
        cut in 0usize..10_000,
        tail in 0usize..100,
    ) {
        let a: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut b = a.clone();
        if cut < len {
            b[cut] ^= 1;
        }
        b.truncate(len.saturating_sub(tail));
        prop_assert_eq!(super::key::common_prefix(&a, &b), lcp(&a, &b));
        let ta: Vec<u32> = a.iter().map(|&x| u32::from(x)).collect();
        let tb: Vec<u32> = b.iter().map(|&x| u32::from(x)).collect();
        prop_assert_eq!(super::key::common_prefix(&ta, &tb), lcp(&a, &b));
    }
}

#[test]
fn recent_matches_count_only_entries_stamped_since() {
    let mut t: RadixTree<u8, u64> = RadixTree::new(TreeConfig::default());
    t.insert(b"system prompt, first question", 1, 10);
    t.insert(b"system prompt, second question", 2, 100);
    let key = b"system prompt, first question and more";
    let m = t.peek_since(key, 50);
    assert_eq!(m.per_tenant, vec![(1, 29), (2, 15)]);
    assert_eq!(m.recent, vec![(2, 15)], "tenant 1 recorded before 50");
    assert!(t.peek_prefix(key).recent.is_empty(), "asked for nothing");
    // A later record of the head for tenant 1 stamps its path: the shared head is recent
    // for tenant 1 now, its own tail is not.
    t.insert(b"system prompt, ", 1, 200);
    assert_eq!(t.peek_since(key, 150).recent, vec![(1, 15)]);
    assert_eq!(
        t.observe_for_insert(key, Some(0)).0.recent,
        vec![(1, 29), (2, 15)]
    );
    t.check_invariants();
}

/// One of [`PropOp`] on `tree`, without run_ops's checks.
fn apply(tree: &mut RadixTree<u8, u64>, op: &PropOp, now: u64) {
    match op {
        PropOp::Insert(k, t) => tree.insert(k, *t, now),
        PropOp::Fused(k, t) => {
            tree.match_and_insert(k, now, |_| *t);
        }
        PropOp::Match(k) => {
            tree.match_prefix(k, now);
        }
        PropOp::Observe(k) => {
            tree.observe(k);
        }
        PropOp::Remove(t) => {
            tree.remove_tenant(*t);
        }
        PropOp::Clear(t) => {
            tree.clear_tenant(*t);
        }
        PropOp::Evict => {
            tree.evict();
        }
    }
}

/// Everything a tree answers or keeps in order: matches, counts and the recency list.
type Shape = (
    Vec<(usize, usize, Vec<(u64, usize)>)>,
    Vec<(u64, Vec<u8>, u64)>,
    [usize; 3],
);

fn shape(t: &RadixTree<u8, u64>, probes: &[Vec<u8>]) -> Shape {
    let matches = probes
        .iter()
        .map(|p| {
            let m = t.peek_prefix(p);
            (m.input_len, m.matched_len, m.per_tenant)
        })
        .collect();
    let order = t
        .lru
        .iter()
        .map(|e| {
            let node = &t.nodes[e.node as usize];
            (t.slots[e.tslot as usize].id, node.edge.clone(), e.stamp)
        })
        .collect();
    (
        matches,
        order,
        [t.total_units(), t.distinct_units(), t.node_count()],
    )
}

#[test]
fn an_insert_resumes_where_its_match_ended_unless_the_path_changed() {
    let mut t = RadixTree::<u8, u64>::new(TreeConfig::default());
    t.insert(b"abcdef", 1, 1);
    let key = b"abcxyz";
    let (m, seen) = t.observe_for_insert(key, None);
    assert_eq!(m.matched_len, 3);
    let mut path = Vec::new();
    assert!(t.resume(key, key.len(), &seen, &mut path).is_some());
    // A split on its path since: the match is walked again.
    t.insert(b"abq", 2, 2);
    assert!(t.resume(key, key.len(), &seen, &mut path).is_none());
    t.insert_observed(key, 3, 3, &seen);
    t.check_invariants();
    assert_eq!(t.peek_prefix(key).per_tenant, vec![(3, 6), (1, 3), (2, 2)]);
    // A child grown where a match stopped between nodes: walked again too.
    let (_, seen) = t.observe_for_insert(b"abcdQQ", None);
    assert!(
        t.resume(b"abcdQQ", b"abcdQQ".len(), &seen, &mut path)
            .is_some()
    );
    t.insert(b"abcdQQ", 4, 4);
    assert!(
        t.resume(b"abcdQQ", b"abcdQQ".len(), &seen, &mut path)
            .is_none()
    );
    // Another tree's, or another key length's, is never used.
    let other = RadixTree::<u8, u64>::new(TreeConfig::default());
    assert!(
        other
            .resume(b"abcdQQ", b"abcdQQ".len(), &seen, &mut path)
            .is_none()
    );
    assert!(
        t.resume(b"abcdQ", b"abcdQ".len(), &seen, &mut path)
            .is_none()
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// An insert resumed from its key's match leaves the tree as a plain insert does,
    /// whatever happened to the tree in between.
    #[test]
    fn an_insert_resumed_from_its_match_is_a_plain_insert(
        config in config_strategy(),
        setup in prop::collection::vec(prop_op(), 0..40),
        key in key(),
        tenant in 0u64..4,
        between in prop::collection::vec(prop_op(), 0..4),
        probes in prop::collection::vec(key(), 0..12),
    ) {
        let mut a = run_ops(config.clone(), &setup, |_, _, _| {});
        let mut b = run_ops(config.clone(), &setup, |_, _, _| {});
        let mut now = setup.len() as u64;
        let (ma, seen) = a.observe_for_insert(&key, None);
        prop_assert_eq!(ma, b.observe(&key));
        for op in &between {
            apply(&mut a, op, now);
            apply(&mut b, op, now);
            now += 1;
        }
        a.insert_observed(&key, tenant, now, &seen);
        b.insert(&key, tenant, now);
        a.check_invariants();
        let mut probes = probes;
        probes.push(key);
        prop_assert_eq!(shape(&a, &probes), shape(&b, &probes));
    }
}

/// A key given as runs cut at `cuts` (the positions where a new run starts).
struct Runs<'a> {
    units: &'a [u8],
    cuts: Vec<usize>,
}

impl KeyRuns<u8> for Runs<'_> {
    fn units(&self) -> usize {
        self.units.len()
    }

    fn run(&self, pos: usize) -> &[u8] {
        let end = self
            .cuts
            .iter()
            .copied()
            .find(|&c| c > pos)
            .unwrap_or(self.units.len());
        &self.units[pos..end.min(self.units.len())]
    }
}

fn runs<'a>(units: &'a [u8], cuts: &[usize]) -> Runs<'a> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (units.len() + 1)).collect();
    cuts.sort_unstable();
    Runs { units, cuts }
}

#[test]
fn a_key_in_runs_matches_and_inserts_as_its_one_slice() {
    let mut t: RadixTree<u32, u64> = RadixTree::new(TreeConfig {
        page_size: page(4),
        ..TreeConfig::default()
    });
    let flat: Vec<u32> = (0..16).collect();
    t.insert(&flat, 1, 1);
    // Runs of 3: every page but the first straddles two of them.
    struct Threes<'a>(&'a [u32]);
    impl KeyRuns<u32> for Threes<'_> {
        fn units(&self) -> usize {
            self.0.len()
        }
        fn run(&self, pos: usize) -> &[u32] {
            &self.0[pos..(pos / 3 * 3 + 3).min(self.0.len())]
        }
    }
    let mut other = flat.clone();
    other[13] = 99;
    other.extend([20, 21, 22, 23, 24]);
    assert_eq!(t.peek_prefix(&Threes(&other)).matched_by(1), 12);
    t.insert(&Threes(&other), 2, 2);
    t.check_invariants();
    assert_eq!(t.peek_prefix(&other[..]).per_tenant, vec![(2, 20), (1, 12)]);
    assert_eq!(t.forget(&Threes(&other), 2, 12), 8);
    assert_eq!(t.peek_prefix(&other[..]).per_tenant, vec![(1, 12), (2, 12)]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Every keyed operation answers and leaves the tree the same whether its key comes as
    /// one slice or cut into runs anywhere.
    #[test]
    fn a_key_in_runs_is_its_one_slice(
        config in config_strategy(),
        setup in prop::collection::vec(prop_op(), 0..30),
        steps in prop::collection::vec(
            (key(), prop::collection::vec(0usize..15, 0..5), 0u64..4, 0u8..5),
            1..12,
        ),
        probes in prop::collection::vec(key(), 0..8),
    ) {
        let mut a = run_ops(config.clone(), &setup, |_, _, _| {});
        let mut b = run_ops(config.clone(), &setup, |_, _, _| {});
        let mut probes = probes;
        for (now, (key, cuts, tenant, op)) in (setup.len() as u64..).zip(&steps) {
            let cut = runs(key, cuts);
            match op {
                0 => {
                    a.insert(&cut, *tenant, now);
                    b.insert(&key[..], *tenant, now);
                }
                1 => prop_assert_eq!(a.match_prefix(&cut, now), b.match_prefix(&key[..], now)),
                2 => {
                    let (ma, seen) = a.observe_for_insert(&cut, Some(0));
                    let (mb, _) = b.observe_for_insert(&key[..], Some(0));
                    prop_assert_eq!(ma, mb);
                    a.insert_observed(&cut, *tenant, now, &seen);
                    b.insert(&key[..], *tenant, now);
                }
                3 => {
                    let keep = cuts.first().copied().unwrap_or(0) % (key.len() + 1);
                    prop_assert_eq!(a.forget(&cut, *tenant, keep), b.forget(&key[..], *tenant, keep));
                }
                _ => {
                    let (ma, ca) = a.match_and_insert(&cut, now, |_| Some(*tenant));
                    let (mb, cb) = b.match_and_insert(&key[..], now, |_| Some(*tenant));
                    prop_assert_eq!((ma, ca), (mb, cb));
                }
            }
            prop_assert_eq!(a.peek_since(&cut, 0), b.peek_since(&key[..], 0));
            a.check_invariants();
            probes.push(key.clone());
        }
        prop_assert_eq!(shape(&a, &probes), shape(&b, &probes));
    }
}
