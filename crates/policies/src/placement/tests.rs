//! The rendezvous key and ranking.

use super::*;
use crate::testkit::*;

fn cfg() -> PolicyConfig {
    PolicyConfig::default()
}

fn prompt(head: u32, len: u32) -> RequestFacts {
    RequestFacts {
        key: RoutingText::Tokens(
            (0..len)
                .map(|i| i.wrapping_mul(31).wrapping_add(head))
                .collect(),
        ),
        ..RequestFacts::default()
    }
}

#[test]
fn the_key_is_the_first_block_past_the_deepest_match() {
    let c = cfg();
    let block = c.min_match_tokens;
    assert_eq!(boundary(0, block, 10_000), block);
    assert_eq!(boundary(block - 1, block, 10_000), block);
    assert_eq!(boundary(block, block, 10_000), 2 * block);
    assert_eq!(
        boundary(5 * block + 3, block, 100),
        100,
        "capped at the prompt"
    );
    // Two prompts with one head and different tails: one key while nothing is matched.
    let mut a = (0..1000u32).collect::<Vec<_>>();
    let mut b = a.clone();
    a[500] = 7;
    b[500] = 8;
    let (a, b) = (
        RequestFacts {
            key: RoutingText::Tokens(a),
            ..RequestFacts::default()
        },
        RequestFacts {
            key: RoutingText::Tokens(b),
            ..RequestFacts::default()
        },
    );
    assert_eq!(key(&a, 0, &c), key(&b, 0, &c));
    // Past a shared 480-token match, the block that holds their difference: two keys.
    assert_ne!(key(&a, 480, &c), key(&b, 480, &c));
    // Different heads: different keys (for these two; a hash can collide).
    assert_ne!(key(&prompt(1, 100), 0, &c), key(&prompt(2, 100), 0, &c));
    assert_eq!(key(&RequestFacts::default(), 0, &c), None);
    assert_eq!(key(&tokens(0), 0, &c), None);
    // Text: the block is min_match_tokens tokens' worth of bytes.
    let bytes = (block as f64 * c.bytes_per_token) as usize;
    let head = "x".repeat(bytes);
    let (t1, t2) = (text(&format!("{head}one")), text(&format!("{head}two")));
    assert_eq!(key(&t1, 0, &c), key(&t2, 0, &c));
    assert_ne!(key(&t1, bytes, &c), key(&t2, bytes, &c));
}

#[test]
fn weights_follow_urls_not_ids_or_order() {
    let k = 0x1234_5678;
    let a = fleet(5);
    // The same URLs under other ids, in reverse order: a replica that registered them
    // differently.
    let b: Vec<WorkerView> = a
        .iter()
        .rev()
        .enumerate()
        .map(|(i, v)| WorkerView::new(id(100 + i as u64), v.url.clone()))
        .collect();
    let (wa, wb) = (weights(k, &a), weights(k, &b));
    for (i, v) in a.iter().enumerate() {
        let j = b.iter().position(|x| x.url == v.url).expect("same URLs");
        assert_eq!(wa[i], wb[j], "{}", v.url);
    }
    // Ranks are a permutation of 0..n.
    let set: Vec<usize> = (0..a.len()).collect();
    let mut r = ranks(&wa, &set);
    r.sort_unstable();
    assert_eq!(r, (0..a.len() as u32).collect::<Vec<_>>());
    // Ranks of data-parallel ranks sharing one URL differ too.
    let dp = vec![w(1), WorkerView::new(id(2), "http://w1:8000")];
    let wd = weights(k, &dp);
    assert_ne!(wd[0], wd[1]);
}

#[test]
fn every_worker_is_first_choice_for_about_its_share_of_keys() {
    let workers = fleet(4);
    let set: Vec<usize> = (0..4).collect();
    let mut firsts = [0usize; 4];
    for k in 0..4000u64 {
        let r = ranks(&weights(xxh3_64(&k.to_le_bytes()), &workers), &set);
        let first = r.iter().position(|&x| x == 0).expect("a first choice");
        firsts[first] += 1;
    }
    for f in firsts {
        assert!((850..=1150).contains(&f), "{firsts:?}");
    }
}
