//! The `sluice` command-line tool's library half: what it prints for each
//! reply, and the load generator behind `sluice bench`. Kept out of
//! `sluice-client` so that a gateway linking the client library compiles
//! neither clap, serde_json nor hdrhistogram.
//!
//! Layout:
//! - [`report`]: what the `sluice` command line prints for each reply.
//! - [`bench`]: `sluice bench`, the closed-loop load generator (Sluice or
//!   Redis + Lua).
//! - [`drill`]: `sluice drill`, failover drills and their report.

pub mod bench;
pub mod drill;
pub mod report;
