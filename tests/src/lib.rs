//! Shared helpers for the integration tests in `tests/tests/`: start real
//! `sluiced` processes on free loopback ports, find the built binaries, and
//! speak raw protocol v1 over a socket when a test needs byte-level control.

pub mod raw;
pub mod support;
