//! The gateway's HTTP face: reads requests, asks the selector for a worker, relays the
//! worker's answer, and maps every error the gateway itself answers with to one
//! OpenAI-style JSON body.

pub(crate) mod app;
pub(crate) mod auth;
pub(crate) mod error;
pub(crate) mod inference;
pub(crate) mod inspect;
pub(crate) mod intake;
pub(crate) mod proxy;
pub(crate) mod routes;
pub(crate) mod state;
