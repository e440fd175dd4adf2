//! A simulated SGLang (0.5.23) or vLLM engine fleet for kvgate's tests, benchmarks and demo.
//!
//! Each engine is a real HTTP server on loopback that serves SGLang's wire shapes (`/generate`,
//! the OpenAI routes, `/v1/loads`, `/server_info`, `/metrics`, health, `/flush_cache`) and
//! behaves like an engine where routing can see it: a prefix-stable tokenizer, a per-rank
//! continuous-batching scheduler with running slots and a FIFO queue, and a page-granular LRU
//! prefix cache, so `cached_tokens`, queue depths and `gen_throughput` respond to the
//! requests it is sent. Faults ([`Fault`]) and counters ([`EngineStats`]) are reachable from
//! Rust through [`EngineHandle`] and over HTTP (`GET /sim/stats`, `POST /sim/fault`,
//! `POST /sim/restart`).
//!
//! It owns nothing of the gateway and never imports it; it needs no GPU and no network
//! beyond the ports it binds.
//!
//! Routes per [`Flavor`]: all serve `/health`, `/v1/models`, `/v1/completions`,
//! `/v1/chat/completions`, `/metrics` and the control routes; SGLang flavours add
//! `/health_generate`, `/ready`, `/server_info` (`/get_server_info`), `/model_info`
//! (`/get_model_info`; the legacy flavour has only these `get_` forms), `/generate`, `/flush_cache` (400 while requests are in flight, as in
//! SGLang) and `/abort_request`; only [`Flavor::Sglang`] serves `/v1/loads`; [`Flavor::Vllm`]
//! adds `/version` and `/reset_prefix_cache`. Control routes: `GET /sim/stats` answers
//! [`EngineStats`], `POST /sim/fault` takes a [`Fault`] in its tagged form and echoes it,
//! `POST /sim/restart` answers `{"startup_time": <new>}`.
//!
//! Simplifications: a batch of prompts (`/v1/completions`, `/generate`) runs as one job per
//! prompt, but a streamed `/generate` batch is a 400; no sampling or stop strings
//! (every request runs to its token limit, finish reason `length`), the prefix cache keeps
//! prompt pages only, and KV held by running requests is reported but never evicts it.
//!
//! ```
//! use kvgate_engine_sim::{Fault, SimConfig, SimFleet};
//!
//! let fleet = SimFleet::start(2, SimConfig { dp_size: 2, ..SimConfig::default() })?;
//! assert_eq!(fleet.len(), 2);
//! assert!(fleet.urls()[0].starts_with("http://127.0.0.1:"));
//! fleet.engine(1).set_fault(Fault::HealthDown);
//! assert_eq!(fleet.engine(0).stats().requests, 0);
//! fleet.stop();
//! # Ok::<(), std::io::Error>(())
//! ```

mod api;
mod cache;
mod config;
mod engine;
mod error;
mod fault;
mod fleet;
mod load;
mod routes;
mod scheduler;
mod tokenizer;

pub use config::{Flavor, SimConfig};
pub use engine::EngineStats;
pub use fault::Fault;
pub use fleet::{EngineControl, EngineHandle, SimFleet};
