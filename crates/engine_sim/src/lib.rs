//! A simulated SGLang (0.5.23) or vLLM engine fleet for kvgate's tests, benchmarks and demo.
//!
//! Each engine is a real HTTP server on loopback that serves SGLang's wire shapes (`/generate`,
//! the OpenAI routes, `/v1/loads`, `/server_info`, `/metrics`, health, `/flush_cache`) and
//! behaves like an engine where routing can see it, with SGLang 0.5.23's defaults: a
//! prefix-stable word-piece tokenizer whose token count varies with the text ([`tokenizer`]);
//! per data-parallel rank a continuous-batching scheduler with running slots, a FIFO queue and
//! one KV pool (`max_total_num_tokens`) shared by running requests and a page-granular radix
//! prefix cache (page size 1 by default; unlocked prefixes evicted LRU to admit requests; a
//! finished request's prompt and answer are cached, so a conversation's next turn hits its
//! last answer; a prompt always recomputes its last token); requests spread over ranks round
//! robin unless they name `routed_dp_rank`; `gen_throughput` measured over windows of
//! `decode_log_interval` decode batches of wall time, kept while idle and zeroed only by a
//! prefill once stale, with `/health_generate`'s one-token generation counted in the window.
//! OpenAI usage carries `prompt_tokens_details` only with `enable_cache_report`, `/metrics`
//! exists on SGLang flavours only with `enable_metrics`, and `/v1/loads` reports its
//! cumulative prefill counters as 0 unless `report_prefill_counters` is set. Faults
//! ([`Fault`]) and counters ([`EngineStats`]) are reachable from Rust through
//! [`EngineHandle`] and over HTTP (`GET /sim/stats`, `POST /sim/fault`, `POST /sim/restart`).
//!
//! With `kv_events_port` set, each rank publishes its prefix cache's changes as SGLang
//! 0.5.23 KV events over ZMQ (PUB on the port plus the rank; blocks of one page, chained
//! engine hashes; `AllBlocksCleared` on a flush; after a restart a new publisher numbering
//! from 0 with an empty replay buffer, as a new engine process), optionally with a replay
//! ROUTER (`kv_events_replay_port`), and advertises them in `/server_info` `kv_events`.
//! With `load_publish_port` as well, each rank pushes SGLang `LoadStat` gauges (the
//! `/v1/loads` figures) on its own PUB socket every `load_publish_every_steps` scheduler
//! steps and at least every `load_heartbeat`, advertised as `load_endpoint_port_base` and
//! `load_topic` in the same descriptor.
//!
//! It owns nothing of the gateway and never imports it; it needs no GPU and no network
//! beyond the ports it binds.
//!
//! Routes per [`Flavor`]: all serve `/health`, `/v1/models`, `/v1/completions`,
//! `/v1/chat/completions` and the control routes; [`Flavor::Vllm`] always serves `/metrics`,
//! SGLang flavours only with `enable_metrics`; SGLang flavours add
//! `/health_generate`, `/ready`, `/server_info` (`/get_server_info`), `/model_info`
//! (`/get_model_info`; the legacy flavour has only these `get_` forms), `/generate`, `/flush_cache` (400 while requests are in flight, as in
//! SGLang) and `/abort_request`; only [`Flavor::Sglang`] serves `/v1/loads`; [`Flavor::Vllm`]
//! adds `/version` and `/reset_prefix_cache`. Control routes: `GET /sim/stats` answers
//! [`EngineStats`], `POST /sim/fault` takes a [`Fault`] in its tagged form and echoes it,
//! `POST /sim/restart` answers `{"startup_time": <new>}`.
//!
//! Simplifications: no sampling or stop strings (every request runs to its token limit,
//! finish reason `length`), so a request reserves pool room for all of `max_new_tokens` and
//! is refused when that could never fit; no chunked prefill or retraction; a streamed
//! `/generate` batch is a 400; error bodies have one shape for all routes.
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
mod events;
mod fault;
mod fleet;
mod load;
mod pushed_load;
mod routes;
mod scheduler;
mod scopes;
mod throughput;
pub mod tokenizer;
mod vocab;

pub use config::{Flavor, LoadBalanceMethod, SimConfig};
pub use engine::{EngineStats, engine_of};
pub use fault::Fault;
pub use fleet::{EngineControl, EngineHandle, SimFleet};
pub use tokenizer::Tokenizer;
