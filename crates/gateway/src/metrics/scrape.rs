//! What the actors know, set as gauges when scraped: the request path never touches them.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct WorkerLabels {
    pub worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StateLabels {
    pub worker: String,
    pub state: &'static str,
}

/// `worker_circuit_state`'s codes, in order.
const CIRCUIT_STATES: [&str; 3] = ["closed", "half_open", "open"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RankLabels {
    pub worker: String,
    pub rank: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct IndexLabels {
    pub model: String,
    pub worker: String,
    /// `bytes` (text trees) or `tokens` (token trees).
    pub unit: &'static str,
}

/// The scrape-time gauges.
#[derive(Debug)]
pub(super) struct Gauges {
    worker_up: Family<WorkerLabels, Gauge>,
    worker_in_flight: Family<WorkerLabels, Gauge>,
    circuit_open: Family<WorkerLabels, Gauge>,
    circuit_states: Family<StateLabels, Gauge>,
    rank_running: Family<RankLabels, Gauge>,
    rank_waiting: Family<RankLabels, Gauge>,
    rank_kv_usage: Family<RankLabels, FloatGauge>,
    rank_gen_throughput: Family<RankLabels, FloatGauge>,
    index_units: Family<IndexLabels, Gauge>,
    snapshots_written: Counter,
    snapshot_failures: Counter,
    snapshot_pending: Gauge,
    events_state: Family<WorkerLabels, Gauge>,
    event_blocks: Family<WorkerLabels, Gauge>,
}

impl Gauges {
    pub(super) fn register(r: &mut Registry) -> Gauges {
        let worker_up = Family::<WorkerLabels, Gauge>::default();
        r.register(
            "worker_healthy",
            "1 while the worker is ready and receives traffic",
            worker_up.clone(),
        );
        let worker_in_flight = Family::<WorkerLabels, Gauge>::default();
        r.register(
            "worker_in_flight",
            "Requests the gateway has in flight on the worker",
            worker_in_flight.clone(),
        );
        let circuit_open = Family::<WorkerLabels, Gauge>::default();
        r.register(
            "worker_circuit_state",
            "The worker's circuit breaker as a code: 0 closed, 1 half open, 2 open (kvgate_worker_circuit has one 0/1 series per state)",
            circuit_open.clone(),
        );
        let circuit_states = Family::<StateLabels, Gauge>::default();
        r.register(
            "worker_circuit",
            "1 for the worker's circuit breaker state (state=closed, half_open or open), 0 for the other two",
            circuit_states.clone(),
        );
        let rank_running = Family::<RankLabels, Gauge>::default();
        r.register(
            "worker_running_requests",
            "Running requests in the worker's last load report, per data-parallel rank",
            rank_running.clone(),
        );
        let rank_waiting = Family::<RankLabels, Gauge>::default();
        r.register(
            "worker_waiting_requests",
            "Waiting requests in the worker's last load report, per rank",
            rank_waiting.clone(),
        );
        let rank_kv_usage = Family::<RankLabels, FloatGauge>::default();
        r.register(
            "worker_kv_usage_ratio",
            "KV pool usage in the worker's last load report, per rank (0 to 1)",
            rank_kv_usage.clone(),
        );
        let rank_gen_throughput = Family::<RankLabels, FloatGauge>::default();
        r.register(
            "worker_gen_throughput_tokens_per_second",
            "gen_throughput in the worker's last load report, per rank (stale on an idle rank)",
            rank_gen_throughput.clone(),
        );
        let index_units = Family::<IndexLabels, Gauge>::default();
        r.register(
            "index_units",
            "What the prefix index holds per model and worker, in its unit: bytes of text (unit=bytes) or tokens (unit=tokens)",
            index_units.clone(),
        );
        let snapshots_written = Counter::default();
        r.register(
            "snapshots_written",
            "Index snapshots written to the store since start",
            snapshots_written.clone(),
        );
        let snapshot_failures = Counter::default();
        r.register(
            "snapshot_write_failures",
            "Index snapshot writes that failed since start",
            snapshot_failures.clone(),
        );
        let snapshot_pending = Gauge::default();
        r.register(
            "snapshot_changes_pending",
            "1 while the index has changes no committed snapshot holds",
            snapshot_pending.clone(),
        );
        let events_state = Family::<WorkerLabels, Gauge>::default();
        r.register(
            "worker_kv_events_state",
            "The worker's KV events: 0 off, 1 connecting, 2 live, 3 stalled, 4 refused (routing falls back to the approximate index unless live)",
            events_state.clone(),
        );
        let event_blocks = Family::<WorkerLabels, Gauge>::default();
        r.register(
            "worker_kv_event_blocks",
            "Blocks the chain index holds for the worker, from its KV events",
            event_blocks.clone(),
        );
        Gauges {
            worker_up,
            worker_in_flight,
            circuit_open,
            circuit_states,
            rank_running,
            rank_waiting,
            rank_kv_usage,
            rank_gen_throughput,
            index_units,
            snapshots_written,
            snapshot_failures,
            snapshot_pending,
            events_state,
            event_blocks,
        }
    }

    /// Sets every gauge from `fleet`.
    pub(super) fn set(&self, fleet: &Fleet) {
        // Cleared first, so a worker that left has no series.
        for f in [&self.worker_up, &self.worker_in_flight, &self.circuit_open] {
            f.clear();
        }
        self.circuit_states.clear();
        for f in [&self.rank_running, &self.rank_waiting] {
            f.clear();
        }
        for f in [&self.rank_kv_usage, &self.rank_gen_throughput] {
            f.clear();
        }
        self.index_units.clear();
        self.events_state.clear();
        self.event_blocks.clear();
        for w in &fleet.workers {
            let l = WorkerLabels {
                worker: w.url.clone(),
            };
            self.worker_up.get_or_create(&l).set(i64::from(w.healthy));
            self.worker_in_flight
                .get_or_create(&l)
                .set(w.in_flight as i64);
            self.circuit_open.get_or_create(&l).set(w.circuit);
            for (code, state) in CIRCUIT_STATES.into_iter().enumerate() {
                let l = StateLabels {
                    worker: w.url.clone(),
                    state,
                };
                let on = i64::try_from(code).is_ok_and(|c| c == w.circuit);
                self.circuit_states.get_or_create(&l).set(i64::from(on));
            }
            self.events_state.get_or_create(&l).set(w.events_state);
            self.event_blocks
                .get_or_create(&l)
                .set(w.event_blocks as i64);
            for (rank, r) in w.ranks.iter().enumerate() {
                let l = RankLabels {
                    worker: w.url.clone(),
                    rank: r.dp_rank.max(rank as u32),
                };
                self.rank_running
                    .get_or_create(&l)
                    .set(r.num_running_reqs as i64);
                self.rank_waiting
                    .get_or_create(&l)
                    .set(r.num_waiting_reqs as i64);
                self.rank_kv_usage.get_or_create(&l).set(r.token_usage);
                self.rank_gen_throughput
                    .get_or_create(&l)
                    .set(r.gen_throughput);
            }
        }
        for (model, worker, unit, units) in &fleet.index {
            self.index_units
                .get_or_create(&IndexLabels {
                    model: model.clone(),
                    worker: worker.clone(),
                    unit,
                })
                .set(*units as i64);
        }
        // Counts since start, read from the store's writer: each counter moves up to it.
        for (c, total) in [
            (&self.snapshots_written, fleet.snapshots_written),
            (&self.snapshot_failures, fleet.snapshot_failures),
        ] {
            c.inc_by(total.saturating_sub(c.get()));
        }
        self.snapshot_pending.set(i64::from(fleet.snapshot_pending));
    }
}

/// What the actors know, read for one scrape.
#[derive(Debug, Default)]
pub struct Fleet {
    pub workers: Vec<FleetWorker>,
    /// (model, worker URL, units) of the prefix index.
    /// Per model, worker and unit (`bytes`, `tokens`), what the index holds.
    pub index: Vec<(String, String, &'static str, usize)>,
    pub snapshots_written: u64,
    pub snapshot_failures: u64,
    pub snapshot_pending: bool,
}

/// One worker as a scrape sees it.
#[derive(Debug)]
pub struct FleetWorker {
    pub url: String,
    pub healthy: bool,
    pub in_flight: u64,
    /// 0 closed, 1 half open, 2 open.
    pub circuit: i64,
    /// 0 off, 1 connecting, 2 live, 3 stalled.
    pub events_state: i64,
    pub event_blocks: usize,
    pub ranks: Vec<kvgate_policies::RankLoad>,
}
