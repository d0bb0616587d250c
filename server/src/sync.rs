//! The one place the server takes its thread-sync primitives from.
//!
//! Normal builds use `std`; under `--cfg sluice_loom` the same names come
//! from loom, so that `loom-tests/` can model-check every structure built on
//! them (the shard inbox above all). Nothing in the server names
//! `std::sync` directly.

#[cfg(sluice_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(sluice_loom)]
pub(crate) use loom::sync::{mpsc, Arc, Mutex};

#[cfg(not(sluice_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(sluice_loom))]
pub(crate) use std::sync::{mpsc, Arc, Mutex};
