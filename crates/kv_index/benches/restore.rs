//! Snapshot and restore of a 1M-prompt text tree over 16 tenants, the size the gateway's
//! warm-restart target is set for: each prompt a ~1 KiB head shared by its group (4096
//! groups) plus a unique ~200-unit tail, routed by affinity with every 8th one spilled.
//!
//! `cargo bench -p kvgate-kv-index --bench restore`. Knobs (environment): `PROMPTS`
//! (1000000), `ROUNDS` (3).

mod common;

use std::num::NonZeroUsize;
use std::time::Instant;

use common::Workload;
use kvgate_kv_index::{RadixTree, TreeConfig};

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let prompts = knob("PROMPTS", 1_000_000);
    let rounds = knob("ROUNDS", 3).max(1);
    let mut w: Workload<u8> = Workload::new(11, 4096, (900, 1100), 1224, 48);
    let config = TreeConfig::paged(NonZeroUsize::MIN);
    let mut tree: RadixTree<u8, u64> = RadixTree::new(config.clone());
    let started = Instant::now();
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
    println!(
        "built {prompts} prompts in {:.2} s: {} nodes, {} tenant units",
        started.elapsed().as_secs_f64(),
        tree.node_count(),
        tree.total_units()
    );
    let now = prompts as u64;
    let mut times = Vec::new();
    for r in 0..rounds {
        let t0 = Instant::now();
        let snap = tree.snapshot();
        let t1 = Instant::now();
        let records = snap.records.len();
        let restored = match RadixTree::<u8, u64>::restore(snap, config.clone(), now) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("restore failed: {e}");
                std::process::exit(1);
            }
        };
        let t2 = Instant::now();
        assert_eq!(restored.node_count(), tree.node_count());
        assert_eq!(restored.total_units(), tree.total_units());
        println!(
            "round {r}: snapshot {:.3} s ({records} records), restore {:.3} s",
            (t1 - t0).as_secs_f64(),
            (t2 - t1).as_secs_f64()
        );
        times.push((t2 - t1).as_secs_f64());
        drop(restored);
    }
    times.sort_by(f64::total_cmp);
    println!("restore median {:.3} s", times[times.len() / 2]);
}
