//! `--entry rls`: the drill's load as Envoy's `ShouldRateLimit` calls,
//! sent to the nodes' rate limit services (`sluiced --rls-port`),
//! followers included, as an Envoy whose rate limit cluster lists every
//! node would send them.
//!
//! The limits live in a rule file (envoyproxy/ratelimit's YAML, docs/ENVOY.md)
//! that the drill writes from its own policies ([`rules`]): one rule per
//! limit kind in the domain [`DOMAIN`], keyed by the kind's short name with
//! no value, so that each drill key (the descriptor's value) has a limit of
//! its own, kept under `rls/drill/KIND=KEY` ([`stored_key`]). Only what a
//! `rate_limit` can say is expressible: `requests_per_unit` per second,
//! minute, hour or day, by `algorithm` (Sluice's key): `fixed_window`,
//! `sliding_window` (the sliding counter), `sliding_log`, and
//! `token_bucket` with a burst of `requests_per_unit`. No concurrency.
//!
//! The client is tonic with Envoy's generated types, behind the cli
//! crate's `rls` feature: the drill is the one user of gRPC in this crate,
//! and tonic with envoy-types is the slowest part of the workspace to
//! build, so the default `sluice` goes without it (a hand-rolled gRPC over
//! h2 would have been protobuf by hand, for one call). `--entry rls`
//! without the feature is refused with a message that names it. The
//! tests crate turns it on.

use sluice_protocol::Limit;

/// The rule file's domain.
pub const DOMAIN: &str = "drill";

/// A unit of envoyproxy/ratelimit and its length in seconds: the ones the
/// drill writes.
const UNITS: [(&str, u64); 4] = [
    ("second", 1),
    ("minute", 60),
    ("hour", 3_600),
    ("day", 86_400),
];

/// `limit` as a rule's `rate_limit`, in flow style: `None` when a rule
/// cannot say it (a concurrency limit, a period that is not one unit, a
/// token bucket whose burst is not its count).
pub fn rate_limit(limit: &Limit) -> Option<String> {
    const NS_PER_S: u64 = 1_000_000_000;
    let (algorithm, n, period_ns) = match limit {
        Limit::TokenBucket(p) if p.burst == p.count => ("token_bucket", p.count, p.period_ns),
        Limit::FixedWindow(w) => ("fixed_window", w.limit, w.window_ns),
        Limit::SlidingCounter(w) => ("sliding_window", w.limit, w.window_ns),
        Limit::SlidingLog(w) => ("sliding_log", w.limit, w.window_ns),
        _ => return None,
    };
    let n = u32::try_from(n).ok()?;
    let unit = UNITS
        .iter()
        .find(|(_, s)| s.checked_mul(NS_PER_S) == Some(period_ns))?
        .0;
    Some(format!(
        "{{ unit: {unit}, requests_per_unit: {n}, algorithm: {algorithm} }}"
    ))
}

/// The rule file: for each `(short name, limit)`, a descriptor keyed by
/// the short name, with no value (one limit per drill key). `Err` names a
/// limit no rule can say.
pub fn rules(kinds: &[(&str, Limit)]) -> Result<String, String> {
    let mut out = format!(
        "# Written by `sluice drill --entry rls`: one rule per limit kind; a\n\
         # descriptor (KIND, KEY) is the drill key KEY under that kind's limit.\n\
         domain: {DOMAIN}\ndescriptors:\n"
    );
    for (short, limit) in kinds {
        let r = rate_limit(limit).ok_or_else(|| format!("a rate limit rule cannot say {limit}"))?;
        out.push_str(&format!("  - key: {short}\n    rate_limit: {r}\n"));
    }
    Ok(out)
}

/// The key sluiced keeps the descriptor `(kind, value)` of [`DOMAIN`]
/// under, and routes by: `rls/DOMAIN/KIND=VALUE`, each part with `%`, `/`
/// and `=` percent-escaped (the server's `rls::descriptor_key`).
pub fn stored_key(kind: &str, value: &str) -> String {
    let escape = |part: &str| {
        part.replace('%', "%25")
            .replace('/', "%2F")
            .replace('=', "%3D")
    };
    format!("rls/{}/{}={}", escape(DOMAIN), escape(kind), escape(value))
}

#[cfg(feature = "rls")]
pub use client::Client;

#[cfg(feature = "rls")]
mod client {
    use std::time::Duration;

    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use tonic::transport::{Channel, Endpoint};

    use super::super::load::Answer;
    use super::DOMAIN;

    /// How long a call waits for its answer (the v1 entry's deadline):
    /// past it, its outcome is unknown.
    pub const CALL_TIMEOUT: Duration = Duration::from_secs(1);
    /// How long opening the connection may take.
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

    /// One node's rate limit service: one HTTP/2 connection, every call a
    /// stream on it; opened on the first call, and again on the call after
    /// it failed (tonic's channel reconnects by itself).
    #[derive(Debug, Clone)]
    pub struct Client {
        inner: RateLimitServiceClient<Channel>,
    }

    impl Client {
        /// A client of the service at `addr` (`HOST:PORT`).
        pub fn new(addr: &str) -> Result<Client, String> {
            let channel = Endpoint::from_shared(format!("http://{addr}"))
                .map_err(|e| format!("{addr}: {e}"))?
                .connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true)
                .connect_lazy();
            Ok(Client {
                inner: RateLimitServiceClient::new(channel),
            })
        }

        /// `ShouldRateLimit` of the one descriptor `(kind, value)`, 1 hit.
        pub async fn ask(&self, kind: &str, value: &str) -> Answer {
            let request = RateLimitRequest {
                domain: DOMAIN.to_owned(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: kind.to_owned(),
                        value: value.to_owned(),
                    }],
                    ..Default::default()
                }],
                hits_addend: 1,
            };
            let mut request = tonic::Request::new(request);
            request.set_timeout(CALL_TIMEOUT);
            let mut client = self.inner.clone();
            match tokio::time::timeout(CALL_TIMEOUT, client.should_rate_limit(request)).await {
                Ok(Ok(r)) => match Code::try_from(r.into_inner().overall_code) {
                    Ok(Code::Ok) => Answer::Verdict(true),
                    Ok(Code::OverLimit) => Answer::Verdict(false),
                    // UNKNOWN: an answer the service never gives; read as
                    // the worst case.
                    _ => Answer::Failed {
                        maybe_applied: true,
                    },
                },
                Ok(Err(status)) => Answer::Failed {
                    maybe_applied: maybe_applied(&status),
                },
                Err(_) => Answer::Failed {
                    maybe_applied: true,
                },
            }
        }
    }

    /// Whether a failed call may have been applied. A status the service
    /// sent is a refusal (UNAVAILABLE: a follower or fenced primary, the
    /// owner group had no primary; RESOURCE_EXHAUSTED, ...) unless its
    /// text says the entry forwarded the call and heard nothing back
    /// (`outcome unknown`, `it may have been applied`, the forward's
    /// deadline or lost connection), or it is DEADLINE_EXCEEDED or
    /// CANCELLED. A status made here from a transport error may have been
    /// applied unless the connection never opened (tonic's ConnectError
    /// in its source chain): sent on a connection that then broke.
    pub fn maybe_applied(status: &tonic::Status) -> bool {
        use std::error::Error as _;
        if matches!(
            status.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ) {
            return true;
        }
        let Some(source) = status.source() else {
            let text = status.message();
            return [
                "outcome unknown",
                "may have been applied",
                "no answer within the deadline",
                "connection to the server was lost",
                // A shard's refusal, as `refused: {status:?}`.
                "OutcomeUnknown",
            ]
            .iter()
            .any(|t| text.contains(t));
        };
        let mut chain = Some(source);
        while let Some(e) = chain {
            if e.downcast_ref::<tonic::ConnectError>().is_some() {
                return false;
            }
            chain = e.source();
        }
        true
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn refusals_are_unapplied_and_silences_unknown() {
            let s = |code, text: &str| maybe_applied(&tonic::Status::new(code, text));
            let unavailable = tonic::Code::Unavailable;
            assert!(!s(unavailable, "not primary: the primary is 127.0.0.1:1"));
            assert!(!s(
                unavailable,
                "group g1 unavailable (last known primary 127.0.0.1:1): not applied"
            ));
            assert!(s(unavailable, "group g1 unavailable (last known primary 127.0.0.1:1): sent, no answer: it may have been applied"));
            assert!(s(unavailable, "no answer within the deadline of 500ms"));
            assert!(s(tonic::Code::DeadlineExceeded, "request timed out"));
            let mut refused = tonic::Status::unavailable("tcp connect error");
            refused.set_source(std::sync::Arc::new(tonic::ConnectError(
                std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
            )));
            assert!(!maybe_applied(&refused));
            let mut broken = tonic::Status::unknown("connection reset");
            broken.set_source(std::sync::Arc::new(std::io::Error::from(
                std::io::ErrorKind::ConnectionReset,
            )));
            assert!(maybe_applied(&broken));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_file_says_each_drill_limit() {
        let kinds: Vec<(&str, Limit)> = [
            ("tb", "token-bucket:20/s,burst=20"),
            ("fw", "fixed-window:20/1s"),
            ("sl", "sliding-log:20/1m"),
            ("sc", "sliding-counter:20/1h"),
        ]
        .iter()
        .map(|(s, l)| (*s, l.parse().unwrap()))
        .collect();
        let yaml = rules(&kinds).unwrap();
        assert!(yaml.contains("domain: drill\n"), "{yaml}");
        for line in [
            "  - key: tb\n    rate_limit: { unit: second, requests_per_unit: 20, algorithm: token_bucket }\n",
            "  - key: fw\n    rate_limit: { unit: second, requests_per_unit: 20, algorithm: fixed_window }\n",
            "  - key: sl\n    rate_limit: { unit: minute, requests_per_unit: 20, algorithm: sliding_log }\n",
            "  - key: sc\n    rate_limit: { unit: hour, requests_per_unit: 20, algorithm: sliding_window }\n",
        ] {
            assert!(yaml.contains(line), "{line} in {yaml}");
        }
        for spec in [
            "token-bucket:10/s,burst=20",
            "fixed-window:20/2s",
            "concurrency:4,lease=1s",
        ] {
            assert!(rules(&[("x", spec.parse().unwrap())]).is_err(), "{spec}");
        }
        assert_eq!(stored_key("tb", "a/b=c%"), "rls/drill/tb=a%2Fb%3Dc%25");
    }
}
