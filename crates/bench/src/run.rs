//! The binary's side: starting fleets, gateways and child servers, and driving load.

pub mod child;
pub mod driver;
pub mod inflight;
pub mod proxy;
pub mod soak;
pub mod workload;
