//! The state owners. Each actor is the only owner of its data and talks to the others by
//! messages: the registry (workers and their health), the selector (the policy and the
//! fleet view every decision reads) and the index (who holds which prefix, and its
//! snapshots). They know no HTTP types; the load poller, the fourth actor, is its own
//! crate (`kvgate-poller`).

pub(crate) mod events;
pub(crate) mod index;
pub(crate) mod registry;
pub(crate) mod selector;
pub(crate) mod tokenizers;
