//! The gateway's HTTP front door: reads requests and their facts, hands them to the
//! dispatch pipeline, proxies each attempt to its worker and relays the answer; serves the
//! admin and inspection routes; and maps every error the gateway itself answers with to
//! one OpenAI-style JSON body.

pub(crate) mod answers;
pub(crate) mod app;
pub(crate) mod auth;
pub(crate) mod error;
pub(crate) mod forwarded;
pub(crate) mod history;
pub(crate) mod inference;
pub(crate) mod inspect;
pub(crate) mod intake;
pub(crate) mod proxy;
pub(crate) mod routes;
pub(crate) mod state;
