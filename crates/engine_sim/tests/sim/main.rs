//! The simulator over real HTTP on loopback: route shapes, scheduling, faults.

// The helpers are test code too, outside `#[test]` fns: a panic there is a failed test.
#![expect(clippy::unwrap_used, reason = "test code")]
#![expect(
    clippy::disallowed_methods,
    reason = "tests spawn their own clients and servers; nothing outlives the test"
)]

mod events;
mod faults;
mod model_tokenizer;
mod pool;
mod pushed_load;
mod ranks;
mod reports;
mod routes;
mod scheduling;
mod support;
mod throughput;
