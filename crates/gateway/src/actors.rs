//! The state owners. Each actor is the only owner of its data and talks to the others by
//! messages: the registry (workers and their health), the selector (the policy and the
//! fleet view every decision reads), the index (who holds which prefix, and its
//! snapshots), the events actor (the engines' KV events and the chain index they feed)
//! the tokenizer actor (each model's tokenizer, loaded off the request path) and the
//! discovery actor (worker pods from the Kubernetes API, fed to the registry). They
//! know no HTTP types; the load poller is an actor of its own crate (`kvgate-poller`).
//! Each actor's `MAILBOX` constant says how deep its mailbox is and why, by message.

#[cfg(feature = "fault-injection")]
pub(crate) mod crash;
pub(crate) mod discovery;
pub(crate) mod events;
pub(crate) mod index;
pub(crate) mod registry;
pub(crate) mod selector;
pub(crate) mod supervise;
pub(crate) mod tokenizers;
