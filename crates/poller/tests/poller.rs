//! The poller actor against fake engines served by actix-web on loopback.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a broken harness should panic"
)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::{Actor, Addr, Context, Handler};
use actix_web::{App, HttpResponse, HttpServer, web};
use kvgate_policies::{RankLoad, WorkerId, WorkerLoad};
use kvgate_poller::{
    LoadPoller, LoadsPolled, PollNow, PollTarget, PollerConfig, SetTargets, WorkerUrl,
};
use tokio::sync::mpsc;

/// How a route answers.
#[derive(Clone)]
enum Reply {
    Ok(String),
    Status(u16),
    Hang,
}

struct Routes {
    loads: Reply,
    metrics: Reply,
    auth_seen: Option<String>,
    query_seen: Option<String>,
    /// When the last request reached each route.
    loads_arrived: Option<Instant>,
    metrics_arrived: Option<Instant>,
}

/// A fake engine: the test sets each route's reply and reads how often it was hit.
struct Engine {
    url: String,
    routes: Arc<Mutex<Routes>>,
    loads_hits: Arc<AtomicUsize>,
    metrics_hits: Arc<AtomicUsize>,
}

impl Engine {
    fn start(loads: Reply, metrics: Reply) -> Engine {
        let routes = Arc::new(Mutex::new(Routes {
            loads,
            metrics,
            auth_seen: None,
            query_seen: None,
            loads_arrived: None,
            metrics_arrived: None,
        }));
        let loads_hits = Arc::new(AtomicUsize::new(0));
        let metrics_hits = Arc::new(AtomicUsize::new(0));
        let (r, lh, mh) = (routes.clone(), loads_hits.clone(), metrics_hits.clone());
        let server = HttpServer::new(move || {
            let (r1, r2, lh, mh) = (r.clone(), r.clone(), lh.clone(), mh.clone());
            App::new()
                .route(
                    "/v1/loads",
                    web::get().to(move |req: actix_web::HttpRequest| {
                        let (r, lh) = (r1.clone(), lh.clone());
                        async move {
                            lh.fetch_add(1, Ordering::SeqCst);
                            let reply = {
                                let mut g = r.lock().unwrap();
                                g.loads_arrived = Some(Instant::now());
                                g.query_seen = Some(req.query_string().to_owned());
                                g.auth_seen = req
                                    .headers()
                                    .get("authorization")
                                    .and_then(|v| v.to_str().ok())
                                    .map(str::to_owned);
                                g.loads.clone()
                            };
                            answer(reply).await
                        }
                    }),
                )
                .route(
                    "/metrics",
                    web::get().to(move || {
                        let (r, mh) = (r2.clone(), mh.clone());
                        async move {
                            mh.fetch_add(1, Ordering::SeqCst);
                            let reply = {
                                let mut g = r.lock().unwrap();
                                g.metrics_arrived = Some(Instant::now());
                                g.metrics.clone()
                            };
                            answer(reply).await
                        }
                    }),
                )
        })
        .workers(1)
        .bind(("127.0.0.1", 0))
        .unwrap();
        let port = server.addrs()[0].port();
        #[expect(
            clippy::disallowed_methods,
            reason = "a test engine on the test's runtime, gone with it"
        )]
        actix_rt::spawn(server.run());
        Engine {
            url: format!("http://127.0.0.1:{port}"),
            routes,
            loads_hits,
            metrics_hits,
        }
    }

    fn set(&self, loads: Reply, metrics: Reply) {
        let mut g = self.routes.lock().unwrap();
        g.loads = loads;
        g.metrics = metrics;
    }

    fn hits(&self) -> (usize, usize) {
        (
            self.loads_hits.load(Ordering::SeqCst),
            self.metrics_hits.load(Ordering::SeqCst),
        )
    }
}

async fn answer(reply: Reply) -> HttpResponse {
    match reply {
        Reply::Ok(body) => HttpResponse::Ok().body(body),
        Reply::Status(code) => {
            HttpResponse::build(actix_web::http::StatusCode::from_u16(code).unwrap()).finish()
        }
        Reply::Hang => {
            actix_rt::time::sleep(Duration::from_secs(3600)).await;
            HttpResponse::Ok().finish()
        }
    }
}

/// Forwards every report to the test.
struct Sink(mpsc::UnboundedSender<LoadsPolled>);

impl Actor for Sink {
    type Context = Context<Self>;
}

impl Handler<LoadsPolled> for Sink {
    type Result = ();
    fn handle(&mut self, msg: LoadsPolled, _: &mut Context<Self>) {
        let _ = self.0.send(msg);
    }
}

struct Harness {
    poller: Addr<LoadPoller>,
    reports: mpsc::UnboundedReceiver<LoadsPolled>,
    epoch: Instant,
}

impl Harness {
    /// A poller that only polls on `PollNow` (its interval is an hour) unless told otherwise.
    fn start(cfg: PollerConfig) -> Harness {
        let (tx, reports) = mpsc::unbounded_channel();
        let sink = Sink(tx).start();
        let epoch = Instant::now();
        let poller = LoadPoller::new(cfg, epoch, sink.recipient()).start();
        Harness {
            poller,
            reports,
            epoch,
        }
    }

    fn manual() -> Harness {
        Harness::start(PollerConfig {
            interval: Duration::from_secs(3600),
            timeout: Duration::from_secs(5),
            api_key: None,
        })
    }

    async fn targets(&self, engines: &[(u64, &Engine)]) {
        let targets = engines
            .iter()
            .map(|(id, e)| PollTarget {
                worker: WorkerId(*id),
                url: WorkerUrl::parse(&e.url).unwrap(),
                api_key: None,
            })
            .collect();
        self.poller.send(SetTargets(targets)).await.unwrap();
    }

    async fn next(&mut self) -> LoadsPolled {
        tokio::time::timeout(Duration::from_secs(30), self.reports.recv())
            .await
            .expect("no report within 30 s")
            .expect("sink closed")
    }

    /// One manual tick, and the single-worker report it produced.
    async fn poll_one(&mut self) -> Option<WorkerLoad> {
        let before = self.epoch.elapsed();
        self.poller.send(PollNow).await.unwrap();
        let mut msg = self.next().await;
        let after = self.epoch.elapsed();
        let load = msg.load.take();
        if let Some(l) = &load {
            // Stamped with the send time of this tick's request, on the shared epoch.
            assert!(before <= l.sampled_at && l.sampled_at <= after);
        }
        load
    }
}

fn fixture() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/sglang-0.5.23/v1_loads_two_ranks.json");
    std::fs::read_to_string(path).unwrap()
}

const SGLANG_LEGACY: &str = "\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name=\"m\",dp_rank=\"0\"} 4
sglang:num_queue_reqs{model_name=\"m\",dp_rank=\"0\"} 1
sglang:token_usage{model_name=\"m\",dp_rank=\"0\"} 0.5
sglang:gen_throughput{model_name=\"m\",dp_rank=\"0\"} 120.5
sglang:cache_hit_rate{model_name=\"m\",dp_rank=\"0\"} 0.25
";

fn vllm_metrics(gen_tokens: u64) -> String {
    format!(
        "# TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} 2.0\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} 3.0\n\
         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} 0.125\n\
         vllm:generation_tokens_total{{engine=\"0\",model_name=\"m\"}} {gen_tokens}.0\n"
    )
}

#[actix_rt::test]
async fn v1_loads_fixture_is_reported_per_rank() {
    let engine = Engine::start(Reply::Ok(fixture()), Reply::Status(500));
    let mut h = Harness::start(PollerConfig {
        interval: Duration::from_secs(3600),
        timeout: Duration::from_secs(5),
        api_key: Some("sk-test".into()),
    });
    h.targets(&[(7, &engine)]).await;
    h.poller.send(PollNow).await.unwrap();
    let msg = h.next().await;
    assert_eq!(msg.worker, WorkerId(7));
    let load = msg.load.as_ref().unwrap();
    assert_eq!(load.ranks.len(), 2);
    assert_eq!(
        (
            load.ranks[0].num_running_reqs,
            load.ranks[0].num_waiting_reqs
        ),
        (3, 2)
    );
    assert_eq!(load.ranks[0].num_waiting_uncached_tokens, 4096);
    assert_eq!(load.ranks[0].gen_throughput, 812.5);
    assert_eq!(load.ranks[1].dp_rank, 1);
    assert_eq!(load.ranks[1].gen_throughput, 0.35);
    assert_eq!(engine.hits(), (1, 0));
    let routes = engine.routes.lock().unwrap();
    assert_eq!(routes.auth_seen.as_deref(), Some("Bearer sk-test"));
    assert_eq!(routes.query_seen.as_deref(), Some("include=core"));
    // Stamped when the request was sent, so before the engine even saw it.
    assert!(h.epoch + load.sampled_at <= routes.loads_arrived.unwrap());
}

#[actix_rt::test]
async fn missing_v1_loads_falls_back_to_sglang_metrics_and_is_remembered() {
    let engine = Engine::start(Reply::Status(404), Reply::Ok(SGLANG_LEGACY.into()));
    let mut h = Harness::manual();
    h.targets(&[(1, &engine)]).await;
    let want = vec![RankLoad {
        dp_rank: 0,
        num_running_reqs: 4,
        num_waiting_reqs: 1,
        token_usage: 0.5,
        gen_throughput: 120.5,
        cache_hit_rate: 0.25,
        ..RankLoad::default()
    }];
    let first = h.poll_one().await.unwrap();
    assert_eq!(first.ranks, want);
    assert_eq!(engine.hits(), (1, 1));
    {
        // The sample is stamped with the /metrics request, sent after /v1/loads answered.
        let routes = engine.routes.lock().unwrap();
        let sent = h.epoch + first.sampled_at;
        assert!(routes.loads_arrived.unwrap() <= sent);
        assert!(sent <= routes.metrics_arrived.unwrap());
    }
    // Memoised: the second poll goes straight to /metrics.
    assert_eq!(h.poll_one().await.unwrap().ranks, want);
    assert_eq!(engine.hits(), (1, 2));
    // A failing /metrics is unknown, not the previous report.
    engine.set(Reply::Status(404), Reply::Status(503));
    assert_eq!(h.poll_one().await, None);
    assert_eq!(engine.hits(), (1, 3));
}

#[actix_rt::test]
async fn unparseable_200_and_405_also_mean_no_v1_loads() {
    for loads in [
        Reply::Ok("<html>hello</html>".into()),
        Reply::Status(405),
        Reply::Status(501),
    ] {
        let engine = Engine::start(loads, Reply::Ok(SGLANG_LEGACY.into()));
        let mut h = Harness::manual();
        h.targets(&[(1, &engine)]).await;
        assert!(h.poll_one().await.is_some());
        assert!(h.poll_one().await.is_some());
        assert_eq!(engine.hits(), (1, 2));
    }
}

#[actix_rt::test]
async fn v1_loads_is_asked_again_after_thirty_polls_on_metrics() {
    // An error page where /v1/loads should be, as a proxy might answer during a restart.
    let engine = Engine::start(
        Reply::Ok("<html>starting</html>".into()),
        Reply::Ok(SGLANG_LEGACY.into()),
    );
    let mut h = Harness::manual();
    h.targets(&[(1, &engine)]).await;
    for _ in 0..31 {
        assert!(h.poll_one().await.is_some());
    }
    assert_eq!(
        engine.hits(),
        (1, 31),
        "remembered: 30 polls on /metrics alone"
    );
    engine.set(Reply::Ok(fixture()), Reply::Status(500));
    let load = h.poll_one().await.unwrap();
    assert_eq!(
        load.ranks.len(),
        2,
        "the fixture's two ranks, from /v1/loads"
    );
    assert_eq!(engine.hits(), (2, 31));
    // And /v1/loads is used from then on.
    assert!(h.poll_one().await.is_some());
    assert_eq!(engine.hits(), (3, 31));
}

#[actix_rt::test]
async fn server_errors_are_unknown_and_not_remembered() {
    let engine = Engine::start(Reply::Ok(fixture()), Reply::Ok(SGLANG_LEGACY.into()));
    let mut h = Harness::manual();
    h.targets(&[(1, &engine)]).await;
    assert_eq!(h.poll_one().await.unwrap().ranks.len(), 2);
    engine.set(Reply::Status(500), Reply::Ok(SGLANG_LEGACY.into()));
    assert_eq!(h.poll_one().await, None);
    // An empty rank list is a failed poll too, not a missing endpoint.
    engine.set(
        Reply::Ok(r#"{"loads":[]}"#.into()),
        Reply::Ok(SGLANG_LEGACY.into()),
    );
    assert_eq!(h.poll_one().await, None);
    engine.set(Reply::Ok(fixture()), Reply::Ok(SGLANG_LEGACY.into()));
    assert_eq!(h.poll_one().await.unwrap().ranks.len(), 2);
    // /v1/loads was asked every time; /metrics never.
    assert_eq!(engine.hits(), (4, 0));
}

#[actix_rt::test]
async fn vllm_two_scrapes_give_a_throughput() {
    let engine = Engine::start(Reply::Status(404), Reply::Ok(vllm_metrics(1000)));
    let mut h = Harness::manual();
    h.targets(&[(1, &engine)]).await;
    let first = h.poll_one().await.unwrap();
    assert_eq!(
        first.ranks,
        vec![RankLoad {
            dp_rank: 0,
            num_running_reqs: 2,
            num_waiting_reqs: 3,
            token_usage: 0.125,
            gen_throughput: 0.0,
            ..RankLoad::default()
        }]
    );
    engine.set(Reply::Status(404), Reply::Ok(vllm_metrics(1600)));
    let second = h.poll_one().await.unwrap();
    let secs = (second.sampled_at - first.sampled_at).as_secs_f64();
    let want = 600.0 / secs;
    let got = second.ranks[0].gen_throughput;
    assert!((got - want).abs() <= want * 1e-9, "got {got}, want {want}");
}

#[actix_rt::test]
async fn a_hung_worker_times_out_to_unknown() {
    let engine = Engine::start(Reply::Hang, Reply::Hang);
    let mut h = Harness::start(PollerConfig {
        interval: Duration::from_secs(3600),
        timeout: Duration::from_millis(200),
        api_key: None,
    });
    h.targets(&[(1, &engine)]).await;
    assert_eq!(h.poll_one().await, None);
}

#[actix_rt::test]
async fn a_hung_worker_does_not_hold_back_the_others() {
    let hung = Engine::start(Reply::Hang, Reply::Hang);
    let fast = Engine::start(Reply::Ok(fixture()), Reply::Status(500));
    // The hung poll only ends at its timeout, long after the fast one's report is due.
    let mut h = Harness::start(PollerConfig {
        interval: Duration::from_secs(3600),
        timeout: Duration::from_secs(600),
        api_key: None,
    });
    h.targets(&[(1, &hung), (2, &fast)]).await;
    h.poller.send(PollNow).await.unwrap();
    let first = h.next().await;
    assert_eq!(first.worker, WorkerId(2), "{first:?}");
    assert!(first.load.is_some());
    // And the hung worker was polled in that same tick (its request may land a moment
    // after the fast answer).
    let polled = Instant::now();
    while hung.hits().0 == 0 && polled.elapsed() < Duration::from_secs(30) {
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(hung.hits().0, 1);
}

#[actix_rt::test]
async fn a_running_poll_is_not_started_again() {
    let hung = Engine::start(Reply::Hang, Reply::Hang);
    let fast = Engine::start(Reply::Ok(fixture()), Reply::Status(500));
    let mut h = Harness::start(PollerConfig {
        interval: Duration::from_secs(3600),
        timeout: Duration::from_secs(2),
        api_key: None,
    });
    h.targets(&[(1, &hung)]).await;
    h.poller.send(PollNow).await.unwrap();
    // Same URL, so worker 1's running poll is kept; the second tick polls worker 2 only.
    h.targets(&[(1, &hung), (2, &fast)]).await;
    h.poller.send(PollNow).await.unwrap();
    let mut got = [h.next().await, h.next().await];
    got.sort_by_key(|m| m.worker);
    assert_eq!(got[0].worker, WorkerId(1));
    assert_eq!(got[0].load, None);
    assert_eq!(got[1].worker, WorkerId(2));
    assert!(got[1].load.is_some());
    assert!(hung.hits().0 <= 1);
}

#[actix_rt::test]
async fn removed_workers_are_not_reported() {
    let hung = Engine::start(Reply::Hang, Reply::Hang);
    let fast = Engine::start(Reply::Ok(fixture()), Reply::Status(500));
    let mut h = Harness::start(PollerConfig {
        interval: Duration::from_secs(3600),
        timeout: Duration::from_millis(300),
        api_key: None,
    });
    h.targets(&[(1, &hung), (2, &fast)]).await;
    h.poller.send(PollNow).await.unwrap();
    h.targets(&[(2, &fast)]).await;
    let msg = h.next().await;
    assert_eq!(msg.worker, WorkerId(2));
}

#[actix_rt::test]
async fn the_interval_polls_without_being_asked() {
    let engine = Engine::start(Reply::Ok(fixture()), Reply::Status(500));
    let mut h = Harness::start(PollerConfig {
        interval: Duration::from_millis(20),
        timeout: Duration::from_secs(5),
        api_key: None,
    });
    h.targets(&[(3, &engine)]).await;
    let a = h.next().await;
    let b = h.next().await;
    for msg in [a, b] {
        assert!(msg.load.is_some());
    }
}
