//! The flags, as data that `cli` turns into the clap command and reads back into config
//! overrides: one row a flag, in three tables by concept (`serving`, `routing`,
//! `resilience`), and the reference gateway's flags that have no equivalent.

/// How a flag's value is read.
#[derive(Debug, Clone, Copy)]
pub(super) enum Kind {
    Int,
    Float,
    Text,
    /// One or more values, space-separated after the flag.
    Texts,
    /// Comma-separated integers.
    Ints,
    /// No value: present means true.
    Switch,
    /// Given once per value (`--api-key A --api-key B`).
    Repeated,
    /// One of these names: a wrong one is refused naming the flag and listing them.
    OneOf(&'static [&'static str]),
    /// Milliseconds, for a key in seconds (the reference gateway's `_ms` flags).
    Millis,
    /// Accepted for the reference gateway's scripts and without effect; the text says why,
    /// in the log at start.
    Accepted(&'static str),
    /// As `Accepted`, with a value.
    AcceptedValue(&'static str),
}

/// `--policy`'s values (`PolicyKind::ALL`'s names; a test keeps them in step).
pub(super) const POLICIES: &[&str] = &[
    "random",
    "round_robin",
    "power_of_two",
    "least_load",
    "cache_aware",
    "prefix_hash",
    "consistent_hashing",
];

/// One flag: `(flag, config key, kind, help)`. Flag names are the reference gateway's where
/// it has one.
pub(super) type Flag = (&'static str, &'static str, Kind, &'static str);

mod resilience;
mod routing;
mod serving;

/// Every flag, in the order `--help` lists them.
pub(super) fn all() -> impl Iterator<Item = &'static Flag> {
    serving::SERVING
        .iter()
        .chain(routing::ROUTING)
        .chain(resilience::RESILIENCE)
}

/// The reference gateway's flags with no kvgate equivalent, and what to use instead: a
/// migrating script that passes one is told so in one line, not by clap's guess.
pub(super) const NO_EQUIVALENT: &[(&str, &str)] = &[
    (
        "pd-disaggregation",
        "prefill/decode disaggregation is not served yet; list regular workers with --worker-urls",
    ),
    (
        "prefill",
        "prefill/decode disaggregation is not served yet; list regular workers with --worker-urls",
    ),
    (
        "decode",
        "prefill/decode disaggregation is not served yet; list regular workers with --worker-urls",
    ),
    (
        "prefill-policy",
        "prefill/decode disaggregation is not served yet; the one policy is --policy",
    ),
    (
        "decode-policy",
        "prefill/decode disaggregation is not served yet; the one policy is --policy",
    ),
    (
        "prefill-selector",
        "prefill/decode disaggregation is not served yet; pods are chosen by --selector",
    ),
    (
        "decode-selector",
        "prefill/decode disaggregation is not served yet; pods are chosen by --selector",
    ),
    (
        "worker-startup-timeout-secs",
        "a worker stays pending until it answers, checked every --health-check-interval-secs",
    ),
    (
        "worker-startup-check-interval",
        "a pending worker is checked every --health-check-interval-secs",
    ),
    (
        "model",
        "only the reference's OpenAI-backend mode used it; kvgate routes each model to the workers that list it",
    ),
    (
        "enable-igw",
        "not needed: each model is routed to the workers that serve it",
    ),
    (
        "cors-allowed-origins",
        "kvgate sends no CORS headers; a browser app reaches it through its own backend or ingress",
    ),
    (
        "reasoning-parser",
        "answers are relayed byte for byte; parse them in the client",
    ),
    (
        "tool-call-parser",
        "answers are relayed byte for byte; parse them in the client",
    ),
    (
        "chat-template",
        "the engine applies its own chat template; --tokenizer-path names the model's for matching",
    ),
];
