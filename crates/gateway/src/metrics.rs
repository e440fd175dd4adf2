//! The gateway's Prometheus metrics (`GET /metrics`), encoded by `prometheus-client`.
//!
//! Counters and histograms on the request path are atomics behind a label lookup; what
//! the actors know (workers, loads, circuits, the index, snapshots) is read when scraped,
//! so it costs the request path nothing. Labels are bounded: route, status class, model
//! (only models the fleet serves), policy, path, worker URL, rank; never request ids or
//! prompt text. Each metric is documented in `docs/metrics.md`.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, PoisonError, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use kvgate_policies::DecisionPath;

use kvgate_core::Endpoint;

mod process;
mod scrape;

use process::Process;
use scrape::Gauges;
pub(crate) use scrape::{Fleet, FleetWorker};

/// Seconds, for LLM latencies: 5 ms to 10 min.
const LATENCY_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// Seconds between streamed chunks and in the selector's mailbox: 0.1 ms to 10 s.
const SHORT_BUCKETS: [f64; 13] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 10.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: &'static str,
    pub status: &'static str,
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RouteLabels {
    pub route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DecisionLabels {
    pub policy: &'static str,
    pub path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DoorLabels {
    pub door: &'static str,
}

/// The front door a request came through: kvgate's own HTTP proxy, or the ext_proc
/// picker an Envoy-based gateway asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    Http,
    ExtProc,
}

impl Door {
    /// The `door` label value.
    pub const fn name(self) -> &'static str {
        match self {
            Door::Http => "http",
            Door::ExtProc => "ext_proc",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TransitionLabels {
    pub worker: String,
    pub to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReportLabels {
    pub reported: &'static str,
}

/// How many inference routes there are ([`Endpoint::ALL`]).
const ROUTES: usize = Endpoint::ALL.len();
const STATUSES: [&str; 4] = ["2xx", "4xx", "5xx", "other"];
/// Every `path` label value of a dispatched decision.
const PATHS: [&str; 11] = [
    "hit",
    "spill",
    "miss",
    "kv_pressure",
    "hash",
    "load",
    "round_robin",
    "random",
    "fallback",
    "pinned",
    "retry",
];
/// Where a dispatched path's counter is in [`PATHS`] (a match, not a string search).
fn path_slot(path: DecisionPath) -> Option<usize> {
    Some(match path {
        DecisionPath::Hit => 0,
        DecisionPath::Spill => 1,
        DecisionPath::Miss => 2,
        DecisionPath::KvPressure => 3,
        DecisionPath::Hash => 4,
        DecisionPath::Load => 5,
        DecisionPath::RoundRobin => 6,
        DecisionPath::Random => 7,
        DecisionPath::Fallback => 8,
        DecisionPath::Pinned => 9,
        // Never dispatched: no worker was chosen.
        DecisionPath::NoWorker | DecisionPath::Saturated => return None,
    })
}

fn same_model(a: Option<&Arc<str>>, b: Option<&Arc<str>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
        _ => false,
    }
}

/// Models with series of their own; any further one counts as `other`.
const MAX_MODELS: usize = 64;

/// Tells one `Metrics` from another in [`LAST_MODEL`] (tests run several gateways).
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// The id of a `Metrics`, a model's shared name (`None`: the request named none) and its
/// counters.
type LastModel = (u64, Option<Arc<str>>, ModelCounters);

thread_local! {
    /// The last model this thread counted a request for, and of which `Metrics`.
    static LAST_MODEL: std::cell::RefCell<Option<LastModel>> =
        const { std::cell::RefCell::new(None) };
}

/// One route's histograms, looked up once: a labelled lookup hashes its labels with
/// SipHash, which cost more than the observation itself on every request.
#[derive(Debug, Clone)]
pub struct RouteSeries {
    pub duration: Histogram,
    pub ttft: Histogram,
    pub between_chunks: Histogram,
}

/// A model's request counters, by route and status class, each made on its first use:
/// series of routes a fleet never sees would only lengthen every scrape.
type ModelCounters = Arc<ModelSeries>;

#[derive(Debug)]
struct ModelSeries {
    name: String,
    family: Family<RequestLabels, Counter>,
    cells: [[std::sync::OnceLock<Counter>; 4]; ROUTES],
}

impl ModelSeries {
    fn inc(&self, route: usize, status: usize) {
        self.cells[route][status]
            .get_or_init(|| {
                self.family
                    .get_or_create(&RequestLabels {
                        route: Endpoint::ALL[route].path(),
                        status: STATUSES[status],
                        model: self.name.clone(),
                    })
                    .clone()
            })
            .inc();
    }
}

/// A route's histogram families, whose series are made on first use (as the counters).
#[derive(Debug)]
struct RouteFamilies {
    duration: Histograms,
    ttft: Histograms,
    between_chunks: Histograms,
    series: [std::sync::OnceLock<RouteSeries>; ROUTES],
}

/// Every metric, registered once.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    id: u64,
    /// One scrape at a time sets the scrape-time gauges and encodes them.
    scrape: std::sync::Mutex<()>,
    routes: RouteFamilies,
    paths: [(&'static str, Counter); 11],
    /// Dispatched decisions per front door ([`Door`] order).
    doors: [Counter; 2],
    reported: [Counter; 2],
    /// Request counters per served model; bounded by the fleet's models.
    models: RwLock<HashMap<String, ModelCounters>>,
    pub requests: Family<RequestLabels, Counter>,
    pub retries: Counter,
    /// Retries the budget refused (`--retry-budget-*`).
    pub retries_refused: Counter,
    /// Decisions made in panic mode: most circuits open, all ready workers routed.
    pub panic_routed: Counter,
    pub predicted_cached: Counter,
    pub reported_cached: Counter,
    pub selector_wait: Histogram,
    pub snapshot_seconds: Histogram,
    /// Set when scraped.
    gauges: Gauges,
    health_transitions: Family<TransitionLabels, Counter>,
    /// The workers `health_transitions` has series of, so those of removed workers go.
    transition_workers: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The unprefixed `process_*` series.
    process_registry: Registry,
    process: Process,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

fn short_histogram() -> Histogram {
    Histogram::new(SHORT_BUCKETS)
}

type Histograms = Family<RouteLabels, Histogram, fn() -> Histogram>;

/// The help lines of the plain counters (kept here: `Metrics::new` stays short).
const RETRIES: &str =
    "Attempts on another worker after one failed before any byte reached the client";
const RETRIES_REFUSED: &str =
    "Retries the retry budget refused: the client got the failed attempt's answer";
const PANIC_ROUTED: &str = "Decisions made while more than half of the ready workers had open circuits, routed as if none were open";
const PREDICTED_CACHED_TOKENS: &str =
    "Cached tokens the index predicted for the chosen worker, over answers that reported theirs";
const REPORTED_CACHED_TOKENS: &str = "Cached tokens the engines reported in their answers";

/// A counter registered under `name`.
fn counter(r: &mut Registry, name: &str, help: &str) -> Counter {
    let c = Counter::default();
    r.register(name, help, c.clone());
    c
}

/// `front_door_decisions`, one counter per [`Door`], looked up once.
fn door_counters(r: &mut Registry) -> [Counter; 2] {
    let by_door = Family::<DoorLabels, Counter>::default();
    r.register(
        "front_door_decisions",
        "Dispatched routing decisions by the front door that asked (http, ext_proc)",
        by_door.clone(),
    );
    [Door::Http, Door::ExtProc].map(|d| {
        by_door
            .get_or_create(&DoorLabels { door: d.name() })
            .clone()
    })
}

/// `kvgate_build_info{version}`, 1.
fn register_build_info(r: &mut Registry) {
    let build = Family::<BuildLabels, Gauge>::default();
    r.register(
        "build_info",
        "1, labelled with the version of the running kvgate",
        build.clone(),
    );
    build
        .get_or_create(&BuildLabels {
            version: env!("CARGO_PKG_VERSION"),
        })
        .set(1);
}

impl Metrics {
    /// The metrics of a gateway running `policy` (the `policy` label of its decisions).
    pub fn new(policy: &'static str) -> Metrics {
        let mut r = Registry::with_prefix("kvgate");
        let requests = Family::<RequestLabels, Counter>::default();
        r.register(
            "requests",
            "Inference requests answered, by route, status class and model",
            requests.clone(),
        );
        let duration: Histograms = Family::new_with_constructor(latency_histogram);
        r.register(
            "request_duration_seconds",
            "Arrival to the end of the answer, at the gateway",
            duration.clone(),
        );
        let ttft: Histograms = Family::new_with_constructor(latency_histogram);
        r.register(
            "time_to_first_token_seconds",
            "Dispatch to the first byte of a streamed answer, at the gateway",
            ttft.clone(),
        );
        let between_chunks: Histograms = Family::new_with_constructor(short_histogram);
        r.register(
            "time_between_tokens_seconds",
            "Gaps between the chunks of a streamed answer, at the gateway",
            between_chunks.clone(),
        );
        let decisions = Family::<DecisionLabels, Counter>::default();
        r.register(
            "routing_decisions",
            "Routing decisions by policy and path (hit, spill, miss, kv_pressure, hash, load, fallback, retry...)",
            decisions.clone(),
        );
        let doors = door_counters(&mut r);
        let retries = counter(&mut r, "retries", RETRIES);
        let retries_refused = counter(&mut r, "retries_refused", RETRIES_REFUSED);
        let panic_routed = counter(&mut r, "panic_routed", PANIC_ROUTED);
        let cache_reports = Family::<ReportLabels, Counter>::default();
        r.register(
            "cache_reports",
            "Answers that did (yes) or did not (no) report cached tokens",
            cache_reports.clone(),
        );
        let predicted_cached = counter(&mut r, "predicted_cached_tokens", PREDICTED_CACHED_TOKENS);
        let reported_cached = counter(&mut r, "reported_cached_tokens", REPORTED_CACHED_TOKENS);
        let selector_wait = short_histogram();
        r.register(
            "selector_mailbox_wait_seconds",
            "Time a dispatch waited in the selector's mailbox",
            selector_wait.clone(),
        );
        let snapshot_seconds = Histogram::new(LATENCY_BUCKETS);
        r.register(
            "snapshot_duration_seconds",
            "An index snapshot, from its start until its commit is handed to the store's writer",
            snapshot_seconds.clone(),
        );
        let gauges = Gauges::register(&mut r);
        register_build_info(&mut r);
        let mut process_registry = Registry::default();
        let process = Process::register(&mut process_registry);
        let health_transitions = Family::<TransitionLabels, Counter>::default();
        r.register(
            "worker_health_transitions",
            "A worker became ready (to=healthy) or stopped being ready (to=unhealthy)",
            health_transitions.clone(),
        );
        let routes = RouteFamilies {
            duration,
            ttft,
            between_chunks,
            series: std::array::from_fn(|_| std::sync::OnceLock::new()),
        };
        let reported = ["yes", "no"].map(|reported| {
            cache_reports
                .get_or_create(&ReportLabels { reported })
                .clone()
        });
        Metrics {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            registry: r,
            scrape: std::sync::Mutex::new(()),
            routes,
            paths: PATHS.map(|path| {
                let c = decisions
                    .get_or_create(&DecisionLabels { policy, path })
                    .clone();
                (path, c)
            }),
            reported,
            doors,
            models: RwLock::new(HashMap::new()),
            requests,
            retries,
            retries_refused,
            panic_routed,
            predicted_cached,
            reported_cached,
            selector_wait,
            snapshot_seconds,
            gauges,
            health_transitions,
            transition_workers: std::sync::Mutex::default(),
            process_registry,
            process,
        }
    }

    /// The text exposition of every metric, with the scrape-time gauges set from `fleet`.
    pub fn encode(&self, fleet: &Fleet) -> Result<String, std::fmt::Error> {
        let _one = self
            .scrape
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.gauges.set(fleet);
        self.forget_removed(fleet);
        self.process.set();
        let mut out = String::with_capacity(8 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        // Two registries, one exposition: the first's end marker goes.
        if out.ends_with("# EOF\n") {
            out.truncate(out.len() - "# EOF\n".len());
        }
        prometheus_client::encoding::text::encode(&mut out, &self.process_registry)?;
        Ok(out)
    }

    /// Drops the per-worker counters of workers no longer in the fleet (the gauges are
    /// rebuilt from it at each scrape).
    fn forget_removed(&self, fleet: &Fleet) {
        let mut known = self
            .transition_workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        known.retain(|w| {
            let present = fleet.workers.iter().any(|f| &f.url == w);
            if !present {
                for to in ["healthy", "unhealthy"] {
                    self.health_transitions.remove(&TransitionLabels {
                        worker: w.clone(),
                        to,
                    });
                }
            }
            present
        });
    }

    /// The histograms of an inference route.
    pub fn route(&self, route: Endpoint) -> &RouteSeries {
        let f = &self.routes;
        f.series[route.index()].get_or_init(|| {
            let labels = RouteLabels {
                route: route.path(),
            };
            RouteSeries {
                duration: f.duration.get_or_create(&labels).clone(),
                ttft: f.ttft.get_or_create(&labels).clone(),
                between_chunks: f.between_chunks.get_or_create(&labels).clone(),
            }
        })
    }

    /// A dispatched decision that took `path`, asked for through `door`; a request's
    /// later attempts count as `retry` (and in `retries`) whatever their path.
    pub fn dispatched(&self, path: DecisionPath, attempt: u32, door: Door) {
        self.doors[door as usize].inc();
        let i = if attempt > 1 {
            self.retries.inc();
            Some(PATHS.len() - 1)
        } else {
            path_slot(path)
        };
        if let Some(i) = i {
            self.paths[i].1.inc();
        }
    }

    /// A worker became ready (`healthy`) or stopped being ready.
    pub fn health_transition(&self, worker: &str, healthy: bool) {
        self.transition_workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(worker.to_owned());
        self.health_transitions
            .get_or_create(&TransitionLabels {
                worker: worker.to_owned(),
                to: if healthy { "healthy" } else { "unhealthy" },
            })
            .inc();
    }

    /// Inference requests answered since start, all routes and statuses.
    pub fn requests_total(&self) -> u64 {
        self.models
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .flat_map(|m| m.cells.iter().flatten())
            .filter_map(|c| c.get().map(Counter::get))
            .sum()
    }

    /// Dispatched decisions since start, per path.
    pub fn decision_counts(&self) -> Vec<(&'static str, u64)> {
        self.paths.iter().map(|(p, c)| (*p, c.get())).collect()
    }

    /// A successful answer that did or did not report its cached tokens.
    pub fn cache_report(&self, reported: bool) {
        self.reported[usize::from(!reported)].inc();
    }

    /// An inference request answered with `status`; `model` is a model the fleet serves,
    /// by the selector's shared name.
    pub fn request(&self, route: Endpoint, status: u16, model: Option<&Arc<str>>) {
        let r = route.index();
        let s = match status {
            200..=299 => 0,
            400..=499 => 1,
            500..=599 => 2,
            _ => 3,
        };
        // Most requests of a thread name the model its last one named, by the same shared
        // name: that skips the map's SipHash and even the comparison of the text.
        let hit = LAST_MODEL.with(|last| match &*last.borrow() {
            Some((id, name, c)) if *id == self.id && same_model(name.as_ref(), model) => {
                c.inc(r, s);
                true
            }
            _ => false,
        });
        if hit {
            return;
        }
        let text = model.map_or("", |m| m);
        let known = self
            .models
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(text)
            .cloned();
        let counters = match known {
            Some(c) => c,
            None => self.model_counters(text),
        };
        counters.inc(r, s);
        LAST_MODEL.with(|last| *last.borrow_mut() = Some((self.id, model.cloned(), counters)));
    }

    fn model_counters(&self, model: &str) -> ModelCounters {
        let mut models = self.models.write().unwrap_or_else(PoisonError::into_inner);
        let name = if models.len() < MAX_MODELS || models.contains_key(model) {
            model
        } else {
            "other"
        };
        let make = || {
            Arc::new(ModelSeries {
                name: name.to_owned(),
                family: self.requests.clone(),
                cells: std::array::from_fn(|_| std::array::from_fn(|_| std::sync::OnceLock::new())),
            })
        };
        models.entry(name.to_owned()).or_insert_with(make).clone()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new("cache_aware")
    }
}

#[cfg(test)]
mod tests;
