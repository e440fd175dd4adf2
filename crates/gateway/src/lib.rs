//! kvgate's gateway: the HTTP API, the actors that own the worker registry and the policy
//! selector, and the proxy that relays requests (and SSE streams) to the chosen worker.
//!
//! The gateway parses only what routing needs from a request (model, stream flag, the
//! prompt as text or tokens), asks the selector actor for a worker, forwards the body
//! unchanged and reports completion back so in-flight counts stay right. It never blocks
//! the request path on disk or on another worker.
//!
//! Embedding it: build a [`GatewayConfig`] and start a [`Gateway`] on its own thread.
//!
//! ```no_run
//! use kvgate_gateway::{Gateway, GatewayConfig};
//!
//! let mut cfg = GatewayConfig::default();
//! cfg.port = 0; // let the OS pick
//! cfg.worker_urls = vec!["http://127.0.0.1:8000".into()];
//! let gw = Gateway::start(cfg).expect("gateway starts");
//! println!("listening on {}", gw.url());
//! gw.stop();
//! ```

mod config;
mod error;
mod index;
mod parse;
mod persist;
mod proxy;
mod registry;
mod routes;
mod selector;
mod server;
pub mod store;
mod upstream;

pub use config::{ConfigError, GatewayConfig, Overrides};
pub use error::ApiError;
pub use index::{
    ClearWorker, GetIndexStats, IndexActor, IndexConfig, IndexStats, MatchPrefix, RecordPrefix,
};
pub use parse::{Endpoint, request_facts};
pub use registry::{
    AddWorker, Fleet, FleetChanged, ListWorkers, RegistryActor, RegistryError, RemoveWorker,
    Runtime, WorkerRecord, WorkerSource, WorkerStatus, normalize_url,
};
pub use selector::{
    Booking, Dispatch, Explain, GetViews, Hold, Release, Select, SelectError, Selected,
    SelectorActor, Warmed, select,
};
pub use server::{Actors, Gateway, StartError};
