//! Memory per stored unit of a 1M-prompt tree, from the tree's own size accounting
//! (`size_bytes`) and, as a cross-check that includes allocator overhead, the growth of
//! the process's resident set.
//!
//! `cargo bench -p kvgate-kv-index --bench memory`

mod common;

use std::num::NonZeroUsize;
use std::time::Instant;

use common::{Workload, rss_bytes};
use kvgate_kv_index::{KeyUnit, RadixTree, TreeConfig};

fn measure<E: KeyUnit + common::Unit>(
    label: &str,
    mut w: Workload<E>,
    prompts: usize,
    page: usize,
) -> RadixTree<E, u64> {
    let rss0 = rss_bytes();
    let started = Instant::now();
    let mut tree: RadixTree<E, u64> = RadixTree::new(TreeConfig::paged(
        NonZeroUsize::new(page).unwrap_or(NonZeroUsize::MIN),
    ));
    for now in 0..prompts as u64 {
        let p = w.prompt();
        let mut pick = None;
        tree.match_and_insert(&p, now, |m| {
            pick = m.per_tenant.first().map(|x| x.0);
            None
        });
        let t = w.choose(pick);
        tree.insert(&p, t, now);
    }
    let build = started.elapsed();
    let rss = rss_bytes().saturating_sub(rss0);
    let bytes = tree.size_bytes();
    let distinct = tree.distinct_units();
    println!(
        "{label}: {prompts} prompts built in {:.2} s",
        build.as_secs_f64()
    );
    println!(
        "  nodes {}, distinct units {}, tenant units {}",
        tree.node_count(),
        distinct,
        tree.total_units()
    );
    println!(
        "  accounted {:.1} MiB = {:.3} B per distinct unit ({} B per unit payload), {:.3} B per tenant unit, {:.0} B per prompt",
        bytes as f64 / 1048576.0,
        bytes as f64 / distinct as f64,
        size_of::<E>(),
        bytes as f64 / tree.total_units() as f64,
        bytes as f64 / prompts as f64
    );
    println!(
        "  RSS growth {:.1} MiB = {:.3} B per distinct unit",
        rss as f64 / 1048576.0,
        rss as f64 / distinct as f64
    );
    tree
}

fn main() {
    // Criterion passes --bench; this binary takes no options.
    // Each tree is kept alive while the next is built, so that RSS growth is not hidden
    // by reuse of freed memory.
    let _text = measure::<u8>(
        "text, 1 KiB prompts, 64 heads of 256-512 B",
        Workload::new(11, 64, (256, 512), 1024, 48),
        1_000_000,
        1,
    );
    let _tokens = measure::<u32>(
        "tokens, 256-token prompts, 64 heads of 64-128, page 16",
        Workload::new(12, 64, (64, 128), 256, 32_000),
        1_000_000,
        16,
    );
}
