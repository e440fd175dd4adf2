//! The gateway's HTTP face: reads requests, asks the selector for a worker, relays the
//! worker's answer, and maps every error the gateway itself answers with to one
//! OpenAI-style JSON body.

pub mod app;
pub mod auth;
pub mod error;
pub mod inference;
pub mod inspect;
pub mod intake;
pub mod proxy;
pub mod routes;
pub mod state;
