//! Shared helpers for the integration tests in `tests/tests/`: start real
//! `sluiced` processes on free loopback ports, find the built binaries, and
//! speak raw protocol v1 over a socket when a test needs byte-level control;
//! primary/follower pairs, a TCP proxy that can be severed, and the spend
//! workload the replication tests share.

pub mod etcd;
pub mod raw;
pub mod repl;
pub mod support;
pub mod tls;
