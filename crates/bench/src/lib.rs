//! The pure parts of kvgate's benchmarks: seeded workload plans, the ideal hit rate a plan
//! allows, latency percentiles, `wrk` output parsing, a raw HTTP/1.1 client for latency at
//! one connection, result tables and a hand-written SVG chart.
//!
//! The `kvgate-bench` binary drives them: `workload` starts a fresh simulated fleet and
//! gateway per policy and replays a plan; `proxy` measures what a proxy hop adds. This
//! library starts nothing, binds nothing and never touches the gateway's internals. The
//! ideal is computed in the engines' own tokens, from what a run sent and received
//! ([`EngineTokens`] gives them: the simulator's stand-in tokenizer and template, or a
//! model's).
//!
//! ```
//! use kvgate_bench::{EngineShape, EngineTokens, Plan, Sent, WorkloadKind, WorkloadSpec, upper_bound};
//! use kvgate_engine_sim::Tokenizer;
//!
//! let spec = WorkloadSpec { groups: 2, prompts_per_group: 4, ..WorkloadSpec::new(WorkloadKind::SharedPrefix) };
//! let plan = Plan::build(&spec);
//! assert_eq!(plan.len(), 8);
//! assert_eq!(plan, Plan::build(&spec)); // seeded
//! let engines = EngineTokens::load(Tokenizer::FourBytes, None)?;
//! let sent = plan
//!     .requests()
//!     .map(|r| Ok(Sent { prompt: engines.chat(&r.messages)?, answer: Vec::new() }))
//!     .collect::<Result<Vec<Sent>, kvgate_bench::EncodeError>>()?;
//! let shape = EngineShape { page_size: 1, pool_tokens: 200_000 };
//! // All but the first prompt of each group could reuse its ~1000-token system prompt.
//! let best = upper_bound(&sent, shape).rate();
//! assert!(best > 0.7 && best < 0.76, "{best}");
//! # Ok::<(), kvgate_bench::EncodeError>(())
//! ```

mod http1;
mod ideal;
mod report;
mod stats;
mod svg;
mod tokens;
mod workload;
mod wrk;

pub use http1::{RawClient, RawResponse, socket_addr};
pub use ideal::{EngineShape, Sent, Tokens, render_chat, upper_bound, upper_bound_after};
pub use report::{RunReport, Targets, reference_p99, table, workload_chart};
pub use stats::{Summary, percentile, split_ratio};
pub use svg::{Bar, Panel, chart, escape};
pub use tokens::{EncodeError, EngineTokens};
pub use workload::{
    Message, Plan, PlannedRequest, Session, UnknownWorkload, WORD_BYTES, WorkloadKind, WorkloadSpec,
};
pub use wrk::{WrkParseError, WrkReport, lua_string, parse_wrk, post_script};

#[cfg(test)]
mod tests;
