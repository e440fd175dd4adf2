//! The pure parts of kvgate's benchmarks: seeded workload plans, the ideal hit rate a plan
//! allows, latency percentiles, `wrk` output parsing, a raw HTTP/1.1 client for latency at
//! one connection, result tables and a hand-written SVG chart.
//!
//! The `kvgate-bench` binary drives them: `workload` starts a fresh simulated fleet and
//! gateway per policy and replays a plan; `proxy` measures what a proxy hop adds. This
//! library starts nothing, binds nothing and never touches the gateway's internals; the
//! ideal it computes mirrors the simulator's chat template and 4-bytes-per-token tokenizer.
//!
//! ```
//! use kvgate_bench::{Plan, WorkloadKind, WorkloadSpec, ideal};
//!
//! let spec = WorkloadSpec { groups: 2, prompts_per_group: 4, ..WorkloadSpec::new(WorkloadKind::SharedPrefix) };
//! let plan = Plan::build(&spec);
//! assert_eq!(plan.len(), 8);
//! assert_eq!(plan, Plan::build(&spec)); // seeded
//! // All but the first prompt of each group could reuse its ~1000-token system prompt.
//! let best = ideal(&plan, 16).group.rate();
//! assert!(best > 0.7 && best < 0.75, "{best}");
//! ```

mod http1;
mod ideal;
mod report;
mod stats;
mod svg;
mod workload;
mod wrk;

pub use http1::{RawClient, RawResponse, socket_addr};
pub use ideal::{Ideal, Tokens, ideal, render_chat, token_count};
pub use report::{RunReport, Targets, reference_p99, table, workload_chart};
pub use stats::{Summary, percentile, split_ratio};
pub use svg::{Bar, Panel, chart, escape};
pub use workload::{
    BYTES_PER_TOKEN, Message, Plan, PlannedRequest, Session, UnknownWorkload, WorkloadKind,
    WorkloadSpec,
};
pub use wrk::{WrkParseError, WrkReport, lua_string, parse_wrk, post_script};

#[cfg(test)]
mod tests;
