//! Load polling for kvgate: asks each inference engine how loaded it is and turns the
//! answer into [`WorkerLoad`](kvgate_policies::WorkerLoad) reports for the policies.
//!
//! It owns the worker protocols for load (targets are named by `kvgate-core`'s
//! [`WorkerUrl`], re-exported here): SGLang's `GET /v1/loads` and, where an engine
//! lacks it (asked again every 30 polls), Prometheus `GET /metrics` from SGLang (`sglang:` and `sglang_` names) or
//! vLLM (`vllm:` names, with throughput derived from counters between two scrapes). The
//! [`LoadPoller`] actor polls every target each tick and sends each worker's
//! [`LoadsPolled`] to its sink as that poll ends. It never knows the gateway, its HTTP API or its policies' decisions, and it
//! never keeps an old report in place of a failed poll: that worker's load is `None`.
//!
//! The parsers are pure and can be used on their own:
//!
//! ```
//! use std::time::Duration;
//! use kvgate_poller::{CounterState, metrics_to_ranks, parse_prometheus, parse_v1_loads};
//!
//! let ranks = parse_v1_loads(br#"{"loads":[{"dp_rank":0,"num_running_reqs":3}]}"#)?;
//! assert_eq!(ranks[0].num_running_reqs, 3);
//!
//! let text = "sglang:num_running_reqs{dp_rank=\"1\"} 2\nsglang:gen_throughput{dp_rank=\"1\"} 40.5\n";
//! let samples = parse_prometheus(text)?;
//! let ranks = metrics_to_ranks(&samples, Duration::from_secs(1), &mut CounterState::new())?;
//! assert_eq!((ranks[0].dp_rank, ranks[0].num_running_reqs, ranks[0].gen_throughput), (1, 2, 40.5));
//! # Ok::<(), kvgate_poller::ParseError>(())
//! ```

mod actor;
mod config;
mod counters;
mod error;
mod fetch;
mod loads;
mod prometheus;
mod ranks;

pub use actor::{LoadPoller, LoadsPolled, MakeClient, PollNow, PollTarget, SetTargets};
pub use config::PollerConfig;
pub use counters::CounterState;
pub use error::{ConfigError, ParseError};
/// A worker's parsed base URL (from `kvgate-core`): poll targets are named by it.
pub use kvgate_core::{UrlError, WorkerUrl};
pub use loads::parse_v1_loads;
pub use prometheus::{Sample, parse_prometheus, parse_prometheus_where};
pub use ranks::{adapters_at_work, metrics_to_ranks};
