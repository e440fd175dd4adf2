//! The library's unit tests, one file per concept.

mod ideal;
mod plans;
mod report;
mod wire;
