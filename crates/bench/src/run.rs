//! The binary's side: starting fleets, gateways and child servers, and driving load.

pub(crate) mod child;
pub(crate) mod driver;
pub(crate) mod fleet;
pub(crate) mod inflight;
pub(crate) mod proxy;
pub(crate) mod soak;
pub(crate) mod workload;
