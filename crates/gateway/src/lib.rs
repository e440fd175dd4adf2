//! kvgate's gateway: the HTTP API, the actors that own the worker registry, the prefix
//! index and the policy selector, and the proxy that relays requests (and SSE streams) to
//! the chosen worker.
//!
//! The gateway parses only what routing needs from a request (model, stream flag, the
//! prompt as text or tokens), asks the selector actor for a worker, forwards the body
//! unchanged and reports completion back so in-flight counts stay right. It never blocks
//! the request path on disk or on another worker: snapshots go to the `kvgate-store`
//! writer thread, load reports come from the `kvgate-poller` actor.
//!
//! Embedding it: build a [`GatewayConfig`] and start a [`Gateway`] on its own thread. A
//! process that proxies long prompts should call [`keep_freed_memory`] first, as the
//! `kvgate` binary does.
//!
//! ```no_run
//! use kvgate_gateway::{Gateway, GatewayConfig};
//!
//! kvgate_gateway::keep_freed_memory();
//! let mut cfg = GatewayConfig::default();
//! cfg.port = 0; // let the OS pick
//! cfg.worker_urls = vec!["http://127.0.0.1:8000".into()];
//! let gw = Gateway::start(cfg).expect("gateway starts");
//! println!("listening on {}", gw.url());
//! gw.stop();
//! ```
//!
//! The `kvgate` binary (`crates/kvgate`) wraps this library with flags, a log subscriber,
//! signal handling and `--demo`'s simulated engines; the library links none of them.

mod actors;
mod alloc;
mod config;
mod facts;
mod http;
mod metrics;
mod picker;
mod pipeline;
mod server;
mod telemetry;
mod upstream;

pub use alloc::keep_freed_memory;
pub use config::{
    AccessConfig, AdmissionConfig, CircuitConfig, ConfigError, DiscoverySection, EventsConfigError,
    EventsSection, GatewayConfig, HealthConfig, Overrides, PickerConfig, RetryConfig, Section,
    SnapshotConfig, TlsConfig, TokenizerPaths,
};
pub use http::error::ApiError;
pub use kvgate_core::Secret;
pub use server::{Gateway, StartError};
pub use telemetry::TelemetryError;

/// The actors and request parsing, for the workspace's own end-to-end tests and
/// benchmarks. Not a stable API.
#[doc(hidden)]
pub mod testing {
    pub use crate::actors::index::{
        GetIndexStats, IndexActor, IndexConfig, IndexStats, MatchPrefix, RecordPrefix,
    };
    pub use crate::actors::registry::{
        AddDiscovered, Fleet, FleetChanged, PodRef, WorkerRecord, WorkerStatus,
    };
    pub use crate::actors::selector::{Explain, Explained, GetViews, SelectorActor};
    pub use crate::facts::request_facts;
    pub use crate::server::Actors;
    pub use kvgate_core::Endpoint;

    /// Messages that make an actor's next step panic, and the count of request
    /// bodies read for routing (feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub mod inject {
        pub use crate::actors::crash::ActorCrash;
        pub use crate::actors::index::Crash as IndexCrash;
        pub use crate::actors::index::HoldRebuild;
        pub use crate::actors::index::InjectPanic as IndexPanic;
        pub use crate::actors::selector::Crash as SelectorCrash;
        pub use crate::actors::selector::InjectPanic as SelectorPanic;
        pub use crate::facts::parsed as facts_parsed;

        /// The tokenizer loader is not among the addresses tests hold.
        pub fn crash_tokenizer(actors: &crate::server::Actors) {
            actors.loader.do_send(ActorCrash);
        }
    }
}
