//! The cluster client's counters through the `metrics` facade (feature
//! `metrics`), for whatever exporter a gateway installs
//! (`metrics-exporter-prometheus`, a statsd one, ...). Without the feature
//! these are empty functions: nothing on the call path.
//!
//! | name | labels | counts |
//! |---|---|---|
//! | `sluice_client_calls_total` | | decisions asked of the cluster |
//! | `sluice_client_verdicts_total` | `source` (store, local, open, closed) | verdicts by where they came from |
//! | `sluice_client_outcome_unknown_total` | | calls sent with no answer (may have been applied) |
//! | `sluice_client_failovers_total` | `group` | times a group moved to another primary |
//! | `sluice_client_errors_total` | `kind` (timeout, disconnected, connect, protocol, server, invalid) | errors from the store, retried or not |
//! | `sluice_client_shed_total` | `class` (low, normal, critical) | requests the gateway's load shedder answered 503 (feature `tower`) |
//!
//! `Cluster::stats` keeps the same counts (all but errors) as atomics for
//! gateways without a metrics library.

use crate::cluster::Source;
use crate::error::Error;

/// One call.
#[inline]
pub(crate) fn call() {
    #[cfg(feature = "metrics")]
    metrics::counter!("sluice_client_calls_total").increment(1);
}

/// One verdict, from `source`.
#[inline]
pub(crate) fn verdict(source: Source) {
    #[cfg(feature = "metrics")]
    {
        let source = match source {
            Source::Store => "store",
            Source::Local => "local",
            Source::Open => "open",
            Source::Closed => "closed",
        };
        metrics::counter!("sluice_client_verdicts_total", "source" => source).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = source;
}

/// A call sent that got no answer.
#[inline]
pub(crate) fn outcome_unknown() {
    #[cfg(feature = "metrics")]
    metrics::counter!("sluice_client_outcome_unknown_total").increment(1);
}

/// Group `group` moved to another primary.
#[inline]
pub(crate) fn failover(group: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("sluice_client_failovers_total", "group" => group.to_owned()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = group;
}

/// An error from the store.
#[inline]
pub(crate) fn error(e: &Error) {
    #[cfg(feature = "metrics")]
    {
        let kind = match e {
            Error::Timeout(_) => "timeout",
            Error::Disconnected => "disconnected",
            Error::Connect { .. } => "connect",
            Error::Protocol(_) => "protocol",
            Error::Server { .. } => "server",
            Error::Invalid(_) => "invalid",
            Error::Unavailable { .. } => "unavailable",
        };
        metrics::counter!("sluice_client_errors_total", "kind" => kind).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = e;
}

/// The load shedder answered a request of `class` 503.
#[cfg(feature = "tower")]
#[inline]
pub(crate) fn shed(class: sluice_protocol::Priority) {
    #[cfg(feature = "metrics")]
    metrics::counter!("sluice_client_shed_total", "class" => class.name()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = class;
}
