//! The seed's burst on engines whose idle `gen_throughput` gauges differ, as real SGLang
//! engines' do: one left at a health-probe residual, one at 0, one at a stale busy rate.
//! A policy that trusts an idle gauge sends the whole burst to one engine (the unit-level
//! replay in `kvgate-policies`' wait tests shows the formula the seed replaced doing it).

use kvgate_engine_sim::SimConfig;
use kvgate_gateway::testing::GetViews;
use kvgate_policies::PolicyKind;
use kvgate_poller::PollNow;
use kvgate_tests::{Harness, wait_for_async};

fn engine(gauge: f64) -> SimConfig {
    SimConfig {
        max_running_requests: 16,
        initial_gen_throughput: gauge,
        enable_cache_report: true,
        ..SimConfig::default()
    }
}

/// A gateway over two idle engines whose gauges read `gauges`, once it has seen them.
async fn fleet(gauges: [f64; 2], policy: PolicyKind) -> Harness {
    let h = Harness::start_each(gauges.iter().map(|&g| engine(g)).collect(), |c| {
        c.policy.kind = policy;
        c.seed = Some(11);
    });
    h.gw.actors().poller.do_send(PollNow);
    let sel = h.gw.actors().selector.clone();
    let want: Vec<(String, f64)> = h.fleet.urls().into_iter().zip(gauges).collect();
    wait_for_async(10, "both engines' stale gauges", || {
        let (sel, want) = (sel.clone(), want.clone());
        async move {
            sel.send(GetViews).await.is_ok_and(|views| {
                want.iter().all(|(url, g)| {
                    views.iter().any(|v| {
                        *v.url == **url
                            && v.load.as_ref().is_some_and(|l| {
                                l.ranks
                                    .iter()
                                    .all(|r| r.num_running_reqs == 0 && r.gen_throughput == *g)
                            })
                    })
                })
            })
        }
    })
    .await;
    h
}

#[actix_rt::test]
async fn a_burst_splits_evenly_whatever_the_idle_engines_gauges_say() {
    for gauges in [[0.35, 0.0], [0.0, 0.35], [8000.0, 0.0]] {
        for policy in [
            PolicyKind::CacheAware,
            PolicyKind::LeastLoad,
            PolicyKind::PowerOfTwo,
        ] {
            let h = fleet(gauges, policy).await;
            h.burst(32).await;
            let split = h.split();
            assert_eq!(split.iter().sum::<u64>(), 32);
            assert!(
                split.iter().all(|&n| (14..=18).contains(&n)),
                "{policy}, gauges {gauges:?}: {split:?}"
            );
        }
    }
}
