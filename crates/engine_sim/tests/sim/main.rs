//! The simulator over real HTTP on loopback: route shapes, scheduling, faults.

mod faults;
mod routes;
mod scheduling;
mod support;
