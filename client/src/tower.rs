//! [`RateLimitLayer`]: a tower layer that asks Sluice, for every HTTP
//! request, whether its client may spend, and answers 429 when it may not
//! (feature `tower`).
//!
//! Per request, the layer reads three things from the request's head
//! ([`http::request::Parts`], so one layer serves any body type): the
//! client's routing key ([`header_key`], an API key, a peer address...),
//! the [`Plan`] to decide against (inline limits or a server tier; `None`
//! leaves the request unlimited), and the cost (1 unless set). It hands them
//! to a [`Limiter`] (an `Arc<dyn Limiter>`; [`Client`] is one) and then:
//!
//! - allowed: calls the inner service and adds the headers to its response;
//! - denied: answers 429 Too Many Requests with an empty body, without
//!   calling the inner service, with `Retry-After` and the headers;
//! - the limiter failed (timeout, store down): [`OnError::FailOpen`] calls
//!   the inner service and adds no headers; [`OnError::FailClosed`] answers
//!   503 Service Unavailable;
//! - no key: [`MissingKey::Reject`] answers that status (401 by default)
//!   without deciding; [`MissingKey::PassThrough`] calls the inner service.
//!
//! # Headers
//!
//! [`HeaderStyle::Ietf`] (the default) follows the IETF httpapi draft
//! "RateLimit header fields for HTTP", draft-ietf-httpapi-ratelimit-headers-10
//! (the editor's copy after it has the same syntax): two structured-field
//! Lists of one Item each, the Item a String naming the policy:
//!
//! ```text
//! RateLimit-Policy: "token-bucket:5/m,burst=5";q=5;w=60
//! RateLimit: "token-bucket:5/m,burst=5";r=4;t=12
//! ```
//!
//! - `q` is the limit's quota, [`Limit::limit`] (a token bucket's burst);
//! - `w` is the window in seconds: a window kind's window; for a token
//!   bucket the time it takes to refill all of `q` (`burst x period /
//!   count`, its period when burst = count). It is left out when it is not a
//!   whole number of seconds (the draft has no sub-second windows), for a
//!   concurrency limit, and for a tier (the client does not know a tier's
//!   limits);
//! - `r` is what could still be spent now, after this request;
//! - `t` is the seconds until the quota is fully restored (the verdict's
//!   `reset_after_ns`, rounded up).
//!
//! [`HeaderStyle::Legacy`] emits the older `X-RateLimit-Limit` (`q`),
//! `X-RateLimit-Remaining` (`r`) and `X-RateLimit-Reset` (`t`, seconds from
//! now, not a timestamp) instead.
//!
//! A denial also carries `Retry-After`: the decision's `retry_after_ns` in
//! whole seconds, rounded up, and never 0 (PROTOCOL.md, "DECIDE"). It is
//! when the same request would be admitted, which for a token bucket is
//! sooner than `t`; the draft says a client MUST let `Retry-After` take
//! precedence over `t`.
//!
//! A plan of several limits is summed up by one of them, as the `sluice`
//! command line does: the first that denied, else the one with the least
//! `remaining` (PROTOCOL.md, "DECIDE"). The policy's name is the limit's
//! spec (`token-bucket:5/m,burst=5`) for an unnamed inline plan, the plan's
//! name or the tier's name otherwise, with `/INDEX` added when the plan has
//! several limits. Characters a structured-field String cannot hold (outside
//! printable ASCII) become `?`.
//!
//! A concurrency limit in a plan acquires a lease that the layer does not
//! release: it frees itself when the lease expires. Use rate limits here.

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode};
use sluice_protocol::message::{DecideOk, Limits, Mode};
use sluice_protocol::{Limit, Priority, Reserved, Reserves};
use tower_layer::Layer;
use tower_service::Service;

use crate::client::{inline_limits, inline_reserved, Client};
use crate::error::Error;

/// Nanoseconds per second, for the headers' whole seconds.
const NS_PER_S: u64 = 1_000_000_000;
/// The largest Integer a structured field holds (RFC 9651, 3.3.1: at most
/// 15 digits); larger numbers are sent as this.
pub const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// A boxed, sendable future: what [`Limiter`] returns, so that it can be a
/// trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a request is decided against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Limits sent with the request (1..=8, checked by [`Plan::inline`]).
    Inline {
        /// The policy's name in the headers; `None` names each limit by its
        /// spec.
        name: Option<Arc<str>>,
        /// The limits, in order.
        limits: Arc<[Limit]>,
        /// Each limit's reserves ([`Plan::reserved`]); empty for none.
        reserves: Arc<[Reserves]>,
    },
    /// A tier of the server's configuration, by name.
    Tier(Arc<str>),
}

impl Plan {
    /// Inline `limits`, each named by its spec in the headers;
    /// [`Error::Invalid`] unless there are 1..=8 valid limits.
    pub fn inline(limits: Vec<Limit>) -> Result<Plan, Error> {
        check_inline(&limits)?;
        Ok(Plan::Inline {
            name: None,
            limits: limits.into(),
            reserves: Arc::new([]),
        })
    }

    /// Inline limits with their reserves (`reserve=CLASS:P%` in their
    /// specs), named `name` in the headers (`None`: by each limit's spec);
    /// a request's class ([`RateLimitLayer::priority_fn`]) decides which
    /// reserves it may spend.
    pub fn reserved(name: Option<&str>, limits: Vec<Reserved>) -> Result<Plan, Error> {
        let bare: Vec<Limit> = limits.iter().map(|r| r.limit).collect();
        check_inline(&bare)?;
        for (i, r) in limits.iter().enumerate() {
            r.reserves
                .validate()
                .map_err(|e| Error::Invalid(format!("limit {i}: {e}")))?;
        }
        Ok(Plan::Inline {
            name: name.map(Into::into),
            limits: bare.into(),
            reserves: limits.iter().map(|r| r.reserves).collect(),
        })
    }

    /// Inline `limits`, named `name` in the headers.
    pub fn named(name: &str, limits: Vec<Limit>) -> Result<Plan, Error> {
        check_inline(&limits)?;
        Ok(Plan::Inline {
            name: Some(name.into()),
            limits: limits.into(),
            reserves: Arc::new([]),
        })
    }

    /// The server's tier `name` (the server resolves it; an unknown tier is
    /// a limiter error).
    pub fn tier(name: &str) -> Plan {
        Plan::Tier(name.into())
    }
}

fn check_inline(limits: &[Limit]) -> Result<(), Error> {
    inline_limits(limits)?;
    for (i, limit) in limits.iter().enumerate() {
        limit
            .validate()
            .map_err(|e| Error::Invalid(format!("limit {i}: {e}")))?;
    }
    Ok(())
}

/// The combined verdict of one spend, with what the headers need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether every limit admitted (and so the cost was spent).
    pub allowed: bool,
    /// The summing-up limit's quota (`q`, `X-RateLimit-Limit`).
    pub limit: u64,
    /// What it could still spend now (`r`, `X-RateLimit-Remaining`).
    pub remaining: u64,
    /// When every limit would admit the same request; 0 when allowed.
    pub retry_after_ns: u64,
    /// When the summing-up limit is full again (`t`, `X-RateLimit-Reset`).
    pub reset_after_ns: u64,
    /// The policy's name (the Item of both IETF fields).
    pub policy: String,
    /// The policy's window (`w`), when known.
    pub window_ns: Option<u64>,
}

impl Decision {
    /// Sums up a DECIDE_OK of `plan` (see the module documentation).
    pub fn summarize(ok: &DecideOk, plan: &Plan) -> Decision {
        let index = ok.summary_index();
        let verdict = ok
            .verdicts
            .get(index)
            .map(|v| v.verdict)
            .unwrap_or_default();
        let count = ok.verdicts.len();
        let named = |name: &str| {
            if count > 1 {
                format!("{name}/{index}")
            } else {
                name.to_owned()
            }
        };
        let (policy, window_ns) = match plan {
            Plan::Inline { name, limits, .. } => {
                let limit = limits.get(index);
                let policy = match (name, limit) {
                    (Some(name), _) => named(name),
                    (None, Some(limit)) => limit.to_string(),
                    (None, None) => named("sluice"),
                };
                (policy, limit.and_then(window_ns))
            }
            Plan::Tier(name) => (named(name), None),
        };
        Decision {
            allowed: ok.allowed,
            limit: verdict.limit,
            remaining: verdict.remaining,
            retry_after_ns: ok.retry_after_ns,
            reset_after_ns: verdict.reset_after_ns,
            policy,
            window_ns,
        }
    }
}

/// The window `w` of `limit`: the time over which its quota `limit()`
/// applies (see the module documentation); `None` for a concurrency limit.
pub fn window_ns(limit: &Limit) -> Option<u64> {
    match limit {
        Limit::TokenBucket(p) => {
            let ns = u128::from(p.burst) * u128::from(p.period_ns);
            let count = u128::from(p.count);
            if count == 0 || ns % count != 0 {
                return None;
            }
            u64::try_from(ns / count).ok()
        }
        Limit::FixedWindow(w) | Limit::SlidingLog(w) | Limit::SlidingCounter(w) => {
            Some(w.window_ns)
        }
        Limit::Concurrency(_) => None,
    }
}

/// Decides a spend. [`Client`] is one; a test or a local fallback can be
/// another.
pub trait Limiter: Send + Sync + 'static {
    /// Spends `cost` units of `plan` for `key`, all or nothing.
    fn spend<'a>(
        &'a self,
        key: &'a [u8],
        plan: &'a Plan,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, Error>>;

    /// [`Limiter::spend`] for a request of class `priority` (reserves);
    /// by default the class is ignored.
    fn spend_as<'a>(
        &'a self,
        key: &'a [u8],
        plan: &'a Plan,
        cost: u64,
        priority: Priority,
    ) -> BoxFuture<'a, Result<Decision, Error>> {
        let _ = priority;
        self.spend(key, plan, cost)
    }
}

/// A plan's limits as a DECIDE names them.
fn plan_limits(plan: &Plan) -> Result<Limits<'_>, Error> {
    Ok(match plan {
        Plan::Inline {
            limits, reserves, ..
        } if !reserves.is_empty() => {
            let all: Vec<Reserved> = limits
                .iter()
                .zip(reserves.iter())
                .map(|(&limit, &reserves)| Reserved { limit, reserves })
                .collect();
            inline_reserved(&all)?
        }
        Plan::Inline { limits, .. } => inline_limits(limits)?,
        Plan::Tier(name) => Limits::Tier(name),
    })
}

impl Limiter for Client {
    fn spend<'a>(
        &'a self,
        key: &'a [u8],
        plan: &'a Plan,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, Error>> {
        self.spend_as(key, plan, cost, Priority::Normal)
    }

    fn spend_as<'a>(
        &'a self,
        key: &'a [u8],
        plan: &'a Plan,
        cost: u64,
        priority: Priority,
    ) -> BoxFuture<'a, Result<Decision, Error>> {
        Box::pin(async move {
            let limits = plan_limits(plan)?;
            let ok = Client::decide_as(self, key, limits, Mode::Spend, cost, priority).await?;
            Ok(Decision::summarize(&ok, plan))
        })
    }
}

/// A cluster decides through the key's group (failover, local fallback);
/// the verdict's source is not in the headers (a gateway that wants it
/// uses [`crate::Cluster`] directly).
impl Limiter for crate::Cluster {
    fn spend<'a>(
        &'a self,
        key: &'a [u8],
        plan: &'a Plan,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, Error>> {
        self.spend_as(key, plan, cost, Priority::Normal)
    }

    fn spend_as<'a>(
        &'a self,
        key: &'a [u8],
        plan: &'a Plan,
        cost: u64,
        priority: Priority,
    ) -> BoxFuture<'a, Result<Decision, Error>> {
        Box::pin(async move {
            let limits = plan_limits(plan)?;
            let failure = self.failure();
            let v = self
                .decide_as(key, limits, Mode::Spend, cost, failure, priority)
                .await?;
            Ok(Decision::summarize(&v.decision, plan))
        })
    }
}

/// Which rate-limit header fields responses carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
    #[default]
    Ietf,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    Legacy,
}

/// What to do when the limiter fails (timeout, store unreachable).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnError {
    /// Serve the request, unlimited and without headers.
    #[default]
    FailOpen,
    /// Answer 503 Service Unavailable.
    FailClosed,
}

/// What to do with a request whose key cannot be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MissingKey {
    /// Answer this status without deciding (the default: 401).
    Reject(StatusCode),
    /// Serve it, unlimited.
    PassThrough,
}

impl Default for MissingKey {
    fn default() -> Self {
        MissingKey::Reject(StatusCode::UNAUTHORIZED)
    }
}

/// Reads a request's routing key.
type KeyFn = dyn Fn(&Parts) -> Option<Vec<u8>> + Send + Sync;
/// Picks a request's plan (`None`: not limited).
type PlanFn = dyn Fn(&Parts) -> Option<Plan> + Send + Sync;
/// Prices a request.
type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;
/// Picks a request's class.
type PriorityFn = dyn Fn(&Parts) -> Priority + Send + Sync;

/// What every service of one layer shares.
struct Shared {
    /// Decides each spend.
    limiter: Arc<dyn Limiter>,
    /// Names the client.
    key: Box<KeyFn>,
    /// Picks the limits.
    plan: Box<PlanFn>,
    /// Prices the request.
    cost: Box<CostFn>,
    /// Classes the request (which reserves it may spend).
    priority: Box<PriorityFn>,
    /// Which headers to add.
    headers: HeaderStyle,
    /// What a limiter error does.
    on_error: OnError,
    /// What a missing key does.
    missing_key: MissingKey,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("headers", &self.headers)
            .field("on_error", &self.on_error)
            .field("missing_key", &self.missing_key)
            .finish_non_exhaustive()
    }
}

/// The tower layer: wraps a service in a [`RateLimitService`].
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    /// The configuration, shared by every service the layer makes.
    shared: Arc<Shared>,
}

/// The key read from the header `name` (`x-api-key`, ...), if present and
/// not empty.
pub fn header_key(name: HeaderName) -> impl Fn(&Parts) -> Option<Vec<u8>> + Send + Sync {
    move |parts: &Parts| {
        parts
            .headers
            .get(&name)
            .map(|v| v.as_bytes().to_vec())
            .filter(|k| !k.is_empty())
    }
}

impl RateLimitLayer {
    /// Spends one unit of `plan` per request, for the client `key` names;
    /// IETF headers, fail open, 401 without a key.
    pub fn new(
        limiter: Arc<dyn Limiter>,
        key: impl Fn(&Parts) -> Option<Vec<u8>> + Send + Sync + 'static,
        plan: Plan,
    ) -> RateLimitLayer {
        RateLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                key: Box::new(key),
                plan: Box::new(move |_: &Parts| Some(plan.clone())),
                cost: Box::new(|_: &Parts| 1),
                priority: Box::new(|_: &Parts| Priority::Normal),
                headers: HeaderStyle::default(),
                on_error: OnError::default(),
                missing_key: MissingKey::default(),
            }),
        }
    }

    fn with(self, change: impl FnOnce(&mut Shared)) -> RateLimitLayer {
        RateLimitLayer {
            shared: configure(self.shared, "RateLimitLayer", change),
        }
    }

    /// Picks the plan per request (by route, method, tier header...);
    /// `None` leaves the request unlimited.
    pub fn plan_fn(
        self,
        plan: impl Fn(&Parts) -> Option<Plan> + Send + Sync + 'static,
    ) -> RateLimitLayer {
        self.with(|s| s.plan = Box::new(plan))
    }

    /// Prices each request (default 1).
    pub fn cost_fn(self, cost: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> RateLimitLayer {
        self.with(|s| s.cost = Box::new(cost))
    }

    /// Classes each request (default normal): its class decides which
    /// reserves of the plan's limits it may spend
    /// ([`crate::shed::priority_header`] reads a header).
    pub fn priority_fn(
        self,
        priority: impl Fn(&Parts) -> Priority + Send + Sync + 'static,
    ) -> RateLimitLayer {
        self.with(|s| s.priority = Box::new(priority))
    }

    /// Which header fields to add.
    pub fn headers(self, style: HeaderStyle) -> RateLimitLayer {
        self.with(|s| s.headers = style)
    }

    /// What a limiter error does.
    pub fn on_error(self, on_error: OnError) -> RateLimitLayer {
        self.with(|s| s.on_error = on_error)
    }

    /// What a request without a key gets.
    pub fn on_missing_key(self, missing_key: MissingKey) -> RateLimitLayer {
        self.with(|s| s.missing_key = missing_key)
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> RateLimitService<S> {
        RateLimitService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] makes.
#[derive(Clone, Debug)]
pub struct RateLimitService<S> {
    /// The service a request that may go on is handed to.
    inner: S,
    /// The layer's configuration.
    shared: Arc<Shared>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service polled ready is the one to call; leave a clone in its
        // place for the next request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let Some(plan) = (shared.plan)(&parts) else {
                return inner.call(Request::from_parts(parts, body)).await;
            };
            let Some(key) = (shared.key)(&parts) else {
                return match shared.missing_key {
                    MissingKey::Reject(status) => Ok(status_only(status)),
                    MissingKey::PassThrough => inner.call(Request::from_parts(parts, body)).await,
                };
            };
            let cost = (shared.cost)(&parts);
            let priority = (shared.priority)(&parts);
            let decision = match shared.limiter.spend_as(&key, &plan, cost, priority).await {
                Ok(decision) => decision,
                Err(_) if shared.on_error == OnError::FailOpen => {
                    return inner.call(Request::from_parts(parts, body)).await;
                }
                Err(_) => return Ok(status_only(StatusCode::SERVICE_UNAVAILABLE)),
            };
            if !decision.allowed {
                return Ok(too_many_requests(&decision, shared.headers));
            }
            let mut response = inner.call(Request::from_parts(parts, body)).await?;
            insert_headers(response.headers_mut(), &decision, shared.headers);
            Ok(response)
        })
    }
}

/// A layer's configuration, changed by a builder method: only before the
/// layer is cloned (its services share it).
pub(crate) fn configure<T>(shared: Arc<T>, layer: &str, change: impl FnOnce(&mut T)) -> Arc<T> {
    let mut shared = Arc::try_unwrap(shared).unwrap_or_else(|_| {
        panic!("configure a {layer} before cloning it");
    });
    change(&mut shared);
    Arc::new(shared)
}

/// An empty response with `status`.
fn status_only<B: Default>(status: StatusCode) -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = status;
    response
}

/// The 429 answer to a denied `decision`.
pub fn too_many_requests<B: Default>(decision: &Decision, style: HeaderStyle) -> Response<B> {
    let mut response = status_only(StatusCode::TOO_MANY_REQUESTS);
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_s(decision)));
    insert_headers(headers, decision, style);
    response
}

/// `Retry-After` of a denial: whole seconds, rounded up, at least 1.
pub fn retry_after_s(decision: &Decision) -> u64 {
    ceil_s(decision.retry_after_ns).max(1)
}

/// Whole seconds, rounded up (so waiting that long is always enough).
fn ceil_s(ns: u64) -> u64 {
    ns.div_ceil(NS_PER_S)
}

/// Adds `decision`'s header fields in `style` to `headers`, replacing any
/// the inner service set.
pub fn insert_headers(headers: &mut HeaderMap, decision: &Decision, style: HeaderStyle) {
    for (name, value) in rate_limit_headers(decision, style) {
        // Digits, `;=`, and an `sf_string`: printable ASCII only.
        let value = HeaderValue::try_from(value).expect("a header value is printable ASCII");
        headers.insert(name, value);
    }
}

/// `decision`'s header fields in `style` (see the module documentation).
pub fn rate_limit_headers(decision: &Decision, style: HeaderStyle) -> Vec<(HeaderName, String)> {
    let quota = decision.limit.min(SF_INTEGER_MAX);
    let remaining = decision.remaining.min(SF_INTEGER_MAX);
    let reset_s = ceil_s(decision.reset_after_ns).min(SF_INTEGER_MAX);
    match style {
        HeaderStyle::Ietf => {
            let name = sf_string(&decision.policy);
            let mut policy = format!("{name};q={quota}");
            if let Some(w) = decision.window_ns.filter(|w| *w > 0 && w % NS_PER_S == 0) {
                let _ = write!(policy, ";w={}", (w / NS_PER_S).min(SF_INTEGER_MAX));
            }
            vec![
                (HeaderName::from_static("ratelimit-policy"), policy),
                (
                    HeaderName::from_static("ratelimit"),
                    format!("{name};r={remaining};t={reset_s}"),
                ),
            ]
        }
        HeaderStyle::Legacy => vec![
            (
                HeaderName::from_static("x-ratelimit-limit"),
                quota.to_string(),
            ),
            (
                HeaderName::from_static("x-ratelimit-remaining"),
                remaining.to_string(),
            ),
            (
                HeaderName::from_static("x-ratelimit-reset"),
                reset_s.to_string(),
            ),
        ],
    }
}

/// `text` as a structured-field String (RFC 9651, 3.3.3): quoted, `"` and
/// `\` escaped, anything outside printable ASCII replaced by `?`.
pub fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use sluice_protocol::message::LimitVerdict;
    use sluice_protocol::{Kind, Verdict};

    use super::*;

    fn decision(allowed: bool) -> Decision {
        Decision {
            allowed,
            limit: 5,
            remaining: if allowed { 4 } else { 0 },
            retry_after_ns: if allowed { 0 } else { 11_000_000_001 },
            reset_after_ns: 59_000_000_001,
            policy: "token-bucket:5/m,burst=5".into(),
            window_ns: Some(60 * NS_PER_S),
        }
    }

    fn text(headers: Vec<(HeaderName, String)>) -> Vec<String> {
        headers
            .into_iter()
            .map(|(n, v)| format!("{}: {v}", n.as_str()))
            .collect()
    }

    #[test]
    fn ietf_headers_are_the_drafts_structured_fields() {
        assert_eq!(
            text(rate_limit_headers(&decision(true), HeaderStyle::Ietf)),
            [
                r#"ratelimit-policy: "token-bucket:5/m,burst=5";q=5;w=60"#,
                r#"ratelimit: "token-bucket:5/m,burst=5";r=4;t=60"#,
            ]
        );
        // No `w` unless the window is known and whole seconds.
        let mut d = decision(false);
        d.window_ns = Some(1_500_000_000);
        d.policy = "free".into();
        assert_eq!(
            text(rate_limit_headers(&d, HeaderStyle::Ietf)),
            [
                r#"ratelimit-policy: "free";q=5"#,
                r#"ratelimit: "free";r=0;t=60"#
            ]
        );
        d.window_ns = None;
        assert_eq!(
            text(rate_limit_headers(&d, HeaderStyle::Ietf))[0],
            r#"ratelimit-policy: "free";q=5"#
        );
    }

    #[test]
    fn legacy_headers_are_plain_numbers() {
        assert_eq!(
            text(rate_limit_headers(&decision(true), HeaderStyle::Legacy)),
            [
                "x-ratelimit-limit: 5",
                "x-ratelimit-remaining: 4",
                "x-ratelimit-reset: 60",
            ]
        );
    }

    #[test]
    fn numbers_fit_a_structured_field_integer() {
        let mut d = decision(true);
        d.limit = u64::MAX;
        d.remaining = u64::MAX;
        d.reset_after_ns = u64::MAX;
        for (_, value) in rate_limit_headers(&d, HeaderStyle::Ietf) {
            assert!(
                !value.contains(&(SF_INTEGER_MAX + 1).to_string()),
                "{value}"
            );
            assert!(value.contains(&SF_INTEGER_MAX.to_string()), "{value}");
        }
    }

    #[test]
    fn policy_names_are_escaped_sf_strings() {
        assert_eq!(sf_string("free"), r#""free""#);
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("tier\u{e9}\n"), r#""tier??""#);
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        let mut d = decision(false);
        for (ns, s) in [
            (0, 1),
            (1, 1),
            (NS_PER_S, 1),
            (NS_PER_S + 1, 2),
            (11 * NS_PER_S + 1, 12),
        ] {
            d.retry_after_ns = ns;
            assert_eq!(retry_after_s(&d), s, "{ns} ns");
        }
    }

    #[test]
    fn windows_are_the_time_the_quota_applies_to() {
        let w = |spec: &str| window_ns(&spec.parse().unwrap());
        assert_eq!(w("token-bucket:5/m"), Some(60 * NS_PER_S));
        assert_eq!(w("token-bucket:10/s,burst=20"), Some(2 * NS_PER_S));
        assert_eq!(w("token-bucket:3/s"), Some(NS_PER_S));
        assert_eq!(w("token-bucket:3/s,burst=1"), None);
        assert_eq!(w("fixed-window:100/h"), Some(3_600 * NS_PER_S));
        assert_eq!(w("sliding-log:10/250ms"), Some(250_000_000));
        assert_eq!(w("concurrency:4"), None);
    }

    fn verdict(allowed: bool, limit: u64, remaining: u64, reset_s: u64) -> LimitVerdict {
        LimitVerdict {
            kind: Kind::TokenBucket,
            verdict: Verdict {
                allowed,
                limit,
                remaining,
                retry_after_ns: if allowed { 0 } else { NS_PER_S },
                reset_after_ns: reset_s * NS_PER_S,
            },
            lease_id: 0,
        }
    }

    #[test]
    fn a_composite_is_summed_up_by_the_denial_or_the_least_remaining() {
        let limits: Vec<Limit> = ["token-bucket:5/s", "fixed-window:100/m"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let plan = Plan::inline(limits.clone()).unwrap();
        let ok = DecideOk {
            allowed: true,
            denied_index: None,
            retry_after_ns: 0,
            verdicts: vec![verdict(true, 5, 3, 1), verdict(true, 100, 2, 60)],
            priority: sluice_protocol::Priority::Normal,
        };
        let d = Decision::summarize(&ok, &plan);
        assert_eq!(
            (d.allowed, d.limit, d.remaining, d.reset_after_ns),
            (true, 100, 2, 60 * NS_PER_S)
        );
        assert_eq!(d.policy, "fixed-window:100/m");
        assert_eq!(d.window_ns, Some(60 * NS_PER_S));
        let denied = DecideOk {
            allowed: false,
            denied_index: Some(0),
            retry_after_ns: 7 * NS_PER_S,
            verdicts: vec![verdict(false, 5, 0, 1), verdict(true, 100, 2, 60)],
            priority: sluice_protocol::Priority::Normal,
        };
        let d = Decision::summarize(&denied, &Plan::named("api", limits).unwrap());
        assert_eq!((d.allowed, d.limit, d.remaining), (false, 5, 0));
        assert_eq!(d.retry_after_ns, 7 * NS_PER_S, "the composite wait");
        assert_eq!((d.policy.as_str(), d.window_ns), ("api/0", Some(NS_PER_S)));
        // A tier: its name, no window.
        let d = Decision::summarize(&denied, &Plan::tier("free"));
        assert_eq!((d.policy.as_str(), d.window_ns), ("free/0", None));
        let one = DecideOk {
            verdicts: vec![verdict(true, 5, 3, 1)],
            ..ok
        };
        assert_eq!(
            Decision::summarize(&one, &Plan::tier("free")).policy,
            "free"
        );
    }

    #[test]
    fn plans_are_checked_when_made() {
        assert!(Plan::inline(vec![]).is_err());
        let limit: Limit = "token-bucket:5/s".parse().unwrap();
        assert!(Plan::inline(vec![limit; 9]).is_err());
        assert!(Plan::inline(vec![limit; 8]).is_ok());
    }

    /// A limiter that answers what it is told and records what it was asked.
    struct Fake {
        answer: Result<Decision, ()>,
        asked: Mutex<Vec<(Vec<u8>, Plan, u64)>>,
        classes: Mutex<Vec<Priority>>,
    }

    impl Limiter for Fake {
        fn spend<'a>(
            &'a self,
            key: &'a [u8],
            plan: &'a Plan,
            cost: u64,
        ) -> BoxFuture<'a, Result<Decision, Error>> {
            self.spend_as(key, plan, cost, Priority::Normal)
        }

        fn spend_as<'a>(
            &'a self,
            key: &'a [u8],
            plan: &'a Plan,
            cost: u64,
            priority: Priority,
        ) -> BoxFuture<'a, Result<Decision, Error>> {
            self.classes.lock().unwrap().push(priority);
            self.asked
                .lock()
                .unwrap()
                .push((key.to_vec(), plan.clone(), cost));
            let answer = self.answer.clone().map_err(|()| Error::Disconnected);
            Box::pin(async move { answer })
        }
    }

    /// An inner service that counts its calls and answers 200 "hello".
    #[derive(Clone)]
    struct Hello(Arc<AtomicUsize>);

    impl Service<Request<String>> for Hello {
        type Response = Response<String>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Response<String>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<String>) -> Self::Future {
            self.0.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(Response::new("hello".into())))
        }
    }

    struct Setup {
        fake: Arc<Fake>,
        calls: Arc<AtomicUsize>,
    }

    fn setup(answer: Result<Decision, ()>) -> Setup {
        Setup {
            fake: Arc::new(Fake {
                answer,
                asked: Mutex::new(Vec::new()),
                classes: Mutex::new(Vec::new()),
            }),
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    impl Setup {
        fn layer(&self) -> RateLimitLayer {
            let limit: Limit = "token-bucket:5/m".parse().unwrap();
            RateLimitLayer::new(
                self.fake.clone(),
                header_key(HeaderName::from_static("x-api-key")),
                Plan::inline(vec![limit]).unwrap(),
            )
        }

        async fn send(&self, layer: RateLimitLayer, key: Option<&str>) -> Response<String> {
            let mut service = layer.layer(Hello(self.calls.clone()));
            let mut request = Request::builder().uri("/hello");
            if let Some(key) = key {
                request = request.header("x-api-key", key);
            }
            let request = request.body(String::new()).unwrap();
            match service.call(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        }

        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }

        fn asked(&self) -> usize {
            self.fake.asked.lock().unwrap().len()
        }
    }

    fn header<'a>(response: &'a Response<String>, name: &str) -> Option<&'a str> {
        response.headers().get(name).map(|v| v.to_str().unwrap())
    }

    /// The class a request is decided for comes from `priority_fn`
    /// (normal without one), and a reserved plan sends its reserves.
    #[tokio::test]
    async fn the_class_and_the_reserves_reach_the_limiter() {
        let s = setup(Ok(decision(true)));
        let by_header = || {
            s.layer()
                .priority_fn(crate::shed::priority_header(HeaderName::from_static(
                    "x-priority",
                )))
        };
        s.send(s.layer(), Some("alice")).await;
        let mut service = by_header().layer(Hello(s.calls.clone()));
        for class in ["critical", "low", "vip"] {
            let request = Request::builder()
                .header("x-api-key", "alice")
                .header("x-priority", class)
                .body(String::new())
                .unwrap();
            match service.call(request).await {
                Ok(r) => assert_eq!(r.status(), StatusCode::OK),
                Err(never) => match never {},
            }
        }
        assert_eq!(
            *s.fake.classes.lock().unwrap(),
            [
                Priority::Normal,
                Priority::Critical,
                Priority::Low,
                Priority::Normal
            ]
        );
        let spec: Reserved = "concurrency:10,reserve=critical:20%".parse().unwrap();
        let plan = Plan::reserved(Some("backend"), vec![spec]).unwrap();
        let Limits::Inline(set) = plan_limits(&plan).unwrap() else {
            panic!("inline")
        };
        assert_eq!(set.reserved(0), Some(spec));
        let bare = Plan::inline(vec![spec.limit]).unwrap();
        let Limits::Inline(set) = plan_limits(&bare).unwrap() else {
            panic!("inline")
        };
        assert!(!set.has_reserves());
        let over: Reserved = "concurrency:10".parse().unwrap();
        let over = Reserved {
            reserves: Reserves {
                critical_bp: 10_001,
                normal_bp: 0,
            },
            ..over
        };
        assert!(Plan::reserved(None, vec![over]).is_err());
    }

    #[tokio::test]
    async fn allowed_calls_the_inner_service_and_adds_the_headers() {
        let s = setup(Ok(decision(true)));
        let response = s.send(s.layer(), Some("alice")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.body(), "hello");
        assert_eq!(s.calls(), 1);
        let asked = s.fake.asked.lock().unwrap()[0].clone();
        assert_eq!((asked.0.as_slice(), asked.2), (&b"alice"[..], 1));
        assert_eq!(
            header(&response, "ratelimit"),
            Some(r#""token-bucket:5/m,burst=5";r=4;t=60"#)
        );
        assert_eq!(
            header(&response, "ratelimit-policy"),
            Some(r#""token-bucket:5/m,burst=5";q=5;w=60"#)
        );
        assert_eq!(header(&response, "retry-after"), None);
    }

    #[tokio::test]
    async fn denied_answers_429_without_calling_the_inner_service() {
        let s = setup(Ok(decision(false)));
        let response = s.send(s.layer(), Some("alice")).await;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(s.calls(), 0);
        assert_eq!(response.body(), "");
        assert_eq!(header(&response, "retry-after"), Some("12"));
        assert_eq!(
            header(&response, "ratelimit"),
            Some(r#""token-bucket:5/m,burst=5";r=0;t=60"#)
        );
        assert!(header(&response, "ratelimit-policy").is_some());
        let legacy = s
            .send(s.layer().headers(HeaderStyle::Legacy), Some("alice"))
            .await;
        assert_eq!(legacy.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&legacy, "retry-after"), Some("12"));
        assert_eq!(header(&legacy, "x-ratelimit-remaining"), Some("0"));
        assert_eq!(header(&legacy, "x-ratelimit-limit"), Some("5"));
        assert_eq!(header(&legacy, "x-ratelimit-reset"), Some("60"));
        assert_eq!(header(&legacy, "ratelimit"), None);
    }

    #[tokio::test]
    async fn a_limiter_error_fails_open_or_closed_as_configured() {
        let s = setup(Err(()));
        let open = s.send(s.layer(), Some("alice")).await;
        assert_eq!(open.status(), StatusCode::OK);
        assert_eq!(s.calls(), 1);
        assert_eq!(header(&open, "ratelimit"), None);
        let closed = s
            .send(s.layer().on_error(OnError::FailClosed), Some("alice"))
            .await;
        assert_eq!(closed.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(s.calls(), 1);
    }

    #[tokio::test]
    async fn a_request_without_a_key_is_rejected_or_passed_through() {
        let s = setup(Ok(decision(true)));
        let rejected = s.send(s.layer(), None).await;
        assert_eq!(rejected.status(), StatusCode::UNAUTHORIZED);
        assert_eq!((s.calls(), s.asked()), (0, 0));
        let empty = s.send(s.layer(), Some("")).await;
        assert_eq!(empty.status(), StatusCode::UNAUTHORIZED);
        let passed = s
            .send(s.layer().on_missing_key(MissingKey::PassThrough), None)
            .await;
        assert_eq!(passed.status(), StatusCode::OK);
        assert_eq!((s.calls(), s.asked()), (1, 0));
    }

    #[tokio::test]
    async fn the_plan_and_cost_are_picked_per_request() {
        let s = setup(Ok(decision(true)));
        let layer = s
            .layer()
            .plan_fn(|parts| (parts.uri.path() != "/health").then(|| Plan::tier("free")))
            .cost_fn(|_| 3);
        let response = s.send(layer, Some("bob")).await;
        assert_eq!(response.status(), StatusCode::OK);
        let asked = s.fake.asked.lock().unwrap()[0].clone();
        assert_eq!((asked.1, asked.2), (Plan::tier("free"), 3));
        // An unlimited route is never decided, key or not.
        let unlimited = s.layer().plan_fn(|_| None);
        let response = s.send(unlimited, None).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(s.asked(), 1);
    }
}
