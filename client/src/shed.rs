//! [`LoadShedLayer`]: the gateway's own load shedder (feature `tower`).
//! It needs no store: it watches this process's requests and, when the
//! gateway is overloaded, answers `low` requests with 503 and
//! `Retry-After` first, then `normal` ones, before a `critical` request is
//! ever refused.
//!
//! Two signals, both of this layer's own requests:
//!
//! - **in flight**: requests it let through that have not been answered;
//! - **queueing delay**: how long the oldest request still waiting for the
//!   inner service to become ready has waited (0 when none waits). The
//!   layer is always ready itself and waits for the inner service inside
//!   each request, so a service under it that is not ready while busy (a
//!   concurrency limit, a pool) turns its backlog into this delay.
//!
//! Each class has [`Thresholds`]: a request of that class is shed when
//! either signal is at or above its threshold. `low`'s thresholds must be
//! at most `normal`'s and `normal`'s at most `critical`'s, which are
//! optional (by default critical requests are never shed): so whenever a
//! class is shed, every class below it is too. A request's class comes from
//! a closure over its head ([`priority_header`] reads a header); `normal`
//! by default.
//!
//! The decision is made when the request is called, from the counters at
//! that instant, so a burst of requests is judged one by one in the order
//! they arrive. [`LoadShedLayer::stats`] counts what was let through and
//! shed by class; with the feature `metrics`, every shed request is also
//! `sluice_client_shed_total{class}`.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use sluice_protocol::{Clock, MonotonicClock, Priority};
use tower_layer::Layer;
use tower_service::Service;

use crate::error::Error;

/// When a class is shed: at `in_flight` requests in flight, or at a
/// queueing delay of `queue_delay`, whichever comes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// Requests in flight (let through, not yet answered).
    pub in_flight: usize,
    /// How long the oldest request waiting for the inner service has
    /// waited.
    pub queue_delay: Duration,
}

/// The thresholds of each class, and what a shed request is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShedConfig {
    /// Shed `low` requests from here.
    pub low: Thresholds,
    /// Shed `normal` requests from here.
    pub normal: Thresholds,
    /// Shed `critical` requests from here; `None` (the default): never.
    pub critical: Option<Thresholds>,
    /// `Retry-After` of a shed request, in whole seconds (rounded up, at
    /// least 1).
    pub retry_after: Duration,
}

impl Default for ShedConfig {
    /// Low from 256 in flight or 50 ms of queueing, normal from 512 or
    /// 200 ms, critical never; retry after 1 s.
    fn default() -> ShedConfig {
        ShedConfig {
            low: Thresholds {
                in_flight: 256,
                queue_delay: Duration::from_millis(50),
            },
            normal: Thresholds {
                in_flight: 512,
                queue_delay: Duration::from_millis(200),
            },
            critical: None,
            retry_after: Duration::from_secs(1),
        }
    }
}

impl ShedConfig {
    /// Checks that a class is never shed while a lower one is let through:
    /// low's thresholds at most normal's, normal's at most critical's.
    pub fn validate(&self) -> Result<(), Error> {
        let ordered = |lower: &Thresholds, higher: &Thresholds| {
            lower.in_flight <= higher.in_flight && lower.queue_delay <= higher.queue_delay
        };
        if !ordered(&self.low, &self.normal) {
            return Err(Error::Invalid(
                "low's shedding thresholds must be at most normal's".into(),
            ));
        }
        if let Some(critical) = &self.critical {
            if !ordered(&self.normal, critical) {
                return Err(Error::Invalid(
                    "normal's shedding thresholds must be at most critical's".into(),
                ));
            }
        }
        Ok(())
    }

    /// The thresholds of `class`; `None` when it is never shed.
    fn of(&self, class: Priority) -> Option<&Thresholds> {
        match class {
            Priority::Low => Some(&self.low),
            Priority::Normal => Some(&self.normal),
            Priority::Critical => self.critical.as_ref(),
        }
    }
}

/// Picks a request's class.
type PriorityFn = dyn Fn(&Parts) -> Priority + Send + Sync;

/// The class named by the header `name` (`critical`, `normal` or `low`,
/// any case); `normal` when it is absent or names none.
pub fn priority_header(name: HeaderName) -> impl Fn(&Parts) -> Priority + Send + Sync {
    move |parts: &Parts| {
        parts
            .headers
            .get(&name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().to_ascii_lowercase().parse().ok())
            .unwrap_or_default()
    }
}

/// What the layer's services share: the configuration and the signals.
struct Shared {
    config: ShedConfig,
    priority: Box<PriorityFn>,
    clock: Arc<dyn Clock + Send + Sync>,
    /// Requests let through and not yet answered (or dropped).
    in_flight: AtomicUsize,
    /// Requests waiting for the inner service: (since when, id).
    waiting: Mutex<BTreeSet<(u64, u64)>>,
    next_id: AtomicU64,
    /// By class rank (low, normal, critical): let through, shed.
    admitted: [AtomicU64; 3],
    shed: [AtomicU64; 3],
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// How long the oldest waiting request has waited, at `now_ns`.
    fn queue_delay(&self, now_ns: u64) -> Duration {
        let waiting = self.waiting.lock().expect("not poisoned");
        let since = waiting.first().map_or(now_ns, |&(since, _)| since);
        Duration::from_nanos(now_ns.saturating_sub(since))
    }

    /// Whether a request of `class` goes through now.
    fn admits(&self, class: Priority, now_ns: u64) -> bool {
        let Some(t) = self.config.of(class) else {
            return true;
        };
        self.in_flight.load(Ordering::Relaxed) < t.in_flight
            && self.queue_delay(now_ns) < t.queue_delay
    }
}

/// Counts, since the layer was made, by class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShedStats {
    /// Requests let through, by class rank (low, normal, critical).
    pub admitted: [u64; 3],
    /// Requests shed (503), by class rank.
    pub shed: [u64; 3],
    /// Requests in flight now.
    pub in_flight: usize,
    /// The queueing delay now.
    pub queue_delay: Duration,
}

impl ShedStats {
    /// Requests of `class` let through.
    pub fn admitted(&self, class: Priority) -> u64 {
        self.admitted[usize::from(class.rank())]
    }

    /// Requests of `class` shed.
    pub fn shed(&self, class: Priority) -> u64 {
        self.shed[usize::from(class.rank())]
    }
}

/// The tower layer: wraps a service in a [`LoadShedService`].
#[derive(Clone, Debug)]
pub struct LoadShedLayer {
    shared: Arc<Shared>,
}

impl LoadShedLayer {
    /// A shedder with `config` (checked: [`ShedConfig::validate`]); every
    /// request `normal` until [`LoadShedLayer::priority_fn`] says otherwise.
    pub fn new(config: ShedConfig) -> Result<LoadShedLayer, Error> {
        config.validate()?;
        Ok(LoadShedLayer {
            shared: Arc::new(Shared {
                config,
                priority: Box::new(|_: &Parts| Priority::Normal),
                clock: Arc::new(MonotonicClock::new()),
                in_flight: AtomicUsize::new(0),
                waiting: Mutex::default(),
                next_id: AtomicU64::new(0),
                admitted: Default::default(),
                shed: Default::default(),
            }),
        })
    }

    fn with(self, change: impl FnOnce(&mut Shared)) -> LoadShedLayer {
        LoadShedLayer {
            shared: crate::tower::configure(self.shared, "LoadShedLayer", change),
        }
    }

    /// Picks each request's class (for example [`priority_header`]).
    pub fn priority_fn(
        self,
        priority: impl Fn(&Parts) -> Priority + Send + Sync + 'static,
    ) -> LoadShedLayer {
        self.with(|s| s.priority = Box::new(priority))
    }

    /// Where queueing delays are measured from (a manual clock in tests).
    pub fn clock(self, clock: Arc<dyn Clock + Send + Sync>) -> LoadShedLayer {
        self.with(|s| s.clock = clock)
    }

    /// The counts so far, and the signals now.
    pub fn stats(&self) -> ShedStats {
        let s = &self.shared;
        let load = |a: &[AtomicU64; 3]| a.each_ref().map(|c| c.load(Ordering::Relaxed));
        ShedStats {
            admitted: load(&s.admitted),
            shed: load(&s.shed),
            in_flight: s.in_flight.load(Ordering::Relaxed),
            queue_delay: s.queue_delay(s.clock.now_ns()),
        }
    }
}

impl<S> Layer<S> for LoadShedLayer {
    type Service = LoadShedService<S>;

    fn layer(&self, inner: S) -> LoadShedService<S> {
        LoadShedService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service [`LoadShedLayer`] makes.
#[derive(Clone, Debug)]
pub struct LoadShedService<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// A request counted in flight until it is answered or dropped.
struct InFlight(Arc<Shared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request on the waiting list until it leaves it (ready, or dropped).
struct Waiting<'a> {
    shared: &'a Shared,
    entry: (u64, u64),
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut waiting = self.shared.waiting.lock().expect("not poisoned");
        waiting.remove(&self.entry);
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for LoadShedService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<ResBody>, S::Error>>;

    /// Always ready: a request that cannot be served soon is shed, not
    /// held back; the wait for the inner service happens per request.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = self.shared.clone();
        let (parts, body) = request.into_parts();
        let class = (shared.priority)(&parts);
        let rank = usize::from(class.rank());
        let now_ns = shared.clock.now_ns();
        if !shared.admits(class, now_ns) {
            shared.shed[rank].fetch_add(1, Ordering::Relaxed);
            crate::metrics::shed(class);
            let response = unavailable(shared.config.retry_after);
            return Box::pin(async move { Ok(response) });
        }
        shared.admitted[rank].fetch_add(1, Ordering::Relaxed);
        shared.in_flight.fetch_add(1, Ordering::Relaxed);
        let in_flight = InFlight(shared.clone());
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = (now_ns, id);
        shared.waiting.lock().expect("not poisoned").insert(entry);
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let _in_flight = in_flight;
            {
                let _waiting = Waiting {
                    shared: &shared,
                    entry,
                };
                std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            }
            inner.call(Request::from_parts(parts, body)).await
        })
    }
}

/// 503 with `Retry-After` (whole seconds, at least 1) and an empty body.
fn unavailable<B: Default>(retry_after: Duration) -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let secs = retry_after.as_nanos().div_ceil(1_000_000_000).max(1);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(secs as u64));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_protocol::ManualClock;
    use std::convert::Infallible;
    use tokio_util::sync::PollSemaphore;

    /// A backend that serves `permits` requests at once, each taking
    /// `work`, and is not ready while all are taken (as a concurrency
    /// limit makes any service).
    struct Backend {
        permits: PollSemaphore,
        held: Option<tokio::sync::OwnedSemaphorePermit>,
        work: Duration,
    }

    impl Backend {
        fn new(permits: usize, work: Duration) -> Backend {
            Backend {
                permits: PollSemaphore::new(Arc::new(tokio::sync::Semaphore::new(permits))),
                held: None,
                work,
            }
        }
    }

    impl Clone for Backend {
        /// A clone holds no permit of its own.
        fn clone(&self) -> Backend {
            Backend {
                permits: self.permits.clone(),
                held: None,
                work: self.work,
            }
        }
    }

    impl Service<Request<()>> for Backend {
        type Response = Response<()>;
        type Error = Infallible;
        type Future = BoxFuture<Result<Response<()>, Infallible>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            if self.held.is_none() {
                match self.permits.poll_acquire(cx) {
                    Poll::Ready(permit) => self.held = permit,
                    Poll::Pending => return Poll::Pending,
                }
            }
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            let permit = self.held.take().expect("called when ready");
            let work = self.work;
            Box::pin(async move {
                tokio::time::sleep(work).await;
                drop(permit);
                Ok(Response::new(()))
            })
        }
    }

    /// A request's answer to come.
    type Answer = BoxFuture<Result<Response<()>, Infallible>>;

    fn request(class: Priority) -> Request<()> {
        Request::builder()
            .header("x-priority", class.name())
            .body(())
            .unwrap()
    }

    fn config(low: usize, normal: usize, low_ms: u64, normal_ms: u64) -> ShedConfig {
        ShedConfig {
            low: Thresholds {
                in_flight: low,
                queue_delay: Duration::from_millis(low_ms),
            },
            normal: Thresholds {
                in_flight: normal,
                queue_delay: Duration::from_millis(normal_ms),
            },
            critical: None,
            retry_after: Duration::from_millis(1_500),
        }
    }

    fn layer(config: ShedConfig, clock: &Arc<ManualClock>) -> LoadShedLayer {
        LoadShedLayer::new(config)
            .unwrap()
            .priority_fn(priority_header(HeaderName::from_static("x-priority")))
            .clock(clock.clone())
    }

    #[test]
    fn thresholds_must_shed_lower_classes_first() {
        assert!(config(10, 20, 5, 10).validate().is_ok());
        assert!(config(30, 20, 5, 10).validate().is_err());
        assert!(config(10, 20, 50, 10).validate().is_err());
        let mut c = config(10, 20, 5, 10);
        c.critical = Some(Thresholds {
            in_flight: 15,
            queue_delay: Duration::from_secs(1),
        });
        assert!(c.validate().is_err());
        c.critical = Some(Thresholds {
            in_flight: 40,
            queue_delay: Duration::from_secs(1),
        });
        assert!(c.validate().is_ok());
    }

    #[test]
    fn the_class_comes_from_the_header_and_defaults_to_normal() {
        let read = priority_header(HeaderName::from_static("x-priority"));
        let parts = |v: Option<&str>| {
            let mut b = Request::builder();
            if let Some(v) = v {
                b = b.header("x-priority", v);
            }
            b.body(()).unwrap().into_parts().0
        };
        assert_eq!(read(&parts(Some("Critical"))), Priority::Critical);
        assert_eq!(read(&parts(Some(" low "))), Priority::Low);
        assert_eq!(read(&parts(Some("urgent"))), Priority::Normal);
        assert_eq!(read(&parts(None)), Priority::Normal);
    }

    /// In flight: with low shed from 4 and normal from 8, a burst of 30
    /// requests (low, normal, critical in turn) against a backend that
    /// answers none yet lets through exactly what the counts allow, and
    /// every critical one.
    #[tokio::test]
    async fn a_burst_is_shed_by_class_as_the_counts_reach_each_threshold() {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let layer = layer(config(4, 8, 1_000, 2_000), &clock);
        let mut service = layer.layer(Backend::new(100, Duration::from_secs(3_600)));
        let classes = [Priority::Low, Priority::Normal, Priority::Critical];
        let mut pending = Vec::new();
        let mut shed = Vec::new();
        for i in 0..30 {
            let class = classes[i % 3];
            let mut f = service.call(request(class));
            // A shed answer is ready at once; a let-through one waits for
            // the backend's hour of work.
            match futures_poll(&mut f) {
                Some(r) => shed.push((class, r.unwrap())),
                None => pending.push((class, f)),
            }
        }
        let stats = layer.stats();
        // Low while fewer than 4 are in flight (requests 0 and 3), normal
        // while fewer than 8 (requests 1, 4 and 7: after request 8 there
        // are 8), critical always.
        assert_eq!(stats.admitted, [2, 3, 10], "{stats:?}");
        assert_eq!(stats.shed, [8, 7, 0]);
        assert_eq!(stats.in_flight, 15);
        for (class, r) in &shed {
            assert_ne!(*class, Priority::Critical);
            assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(r.headers()[RETRY_AFTER], "2", "1.5 s rounds up");
        }
        // Answered or dropped, a request leaves the count.
        drop(pending);
        assert_eq!(layer.stats().in_flight, 0);
    }

    /// Queueing delay: a backend busy with 2 requests keeps the next
    /// waiting; as the manual clock moves on, low is shed once the oldest
    /// waiter has waited 50 ms, normal at 200 ms, critical never; when the
    /// queue drains, the delay is 0 again.
    #[tokio::test]
    async fn queueing_delay_sheds_low_then_normal_never_critical() {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let layer = layer(config(1_000, 1_000, 50, 200), &clock);
        let mut service = layer.layer(Backend::new(2, Duration::from_secs(3_600)));
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut f = service.call(request(Priority::Normal));
            assert!(futures_poll(&mut f).is_none());
            held.push(f);
        }
        // Two hold the backend; the third waits (since now).
        assert_eq!(layer.stats().queue_delay, Duration::ZERO);
        // Whether a request of `class` goes through now, and if so its
        // (waiting) future, to keep it in flight.
        fn admits(
            service: &mut LoadShedService<Backend>,
            class: Priority,
        ) -> (bool, Option<Answer>) {
            let mut f = service.call(request(class));
            match futures_poll(&mut f) {
                Some(r) => {
                    assert_eq!(r.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
                    (false, None)
                }
                None => (true, Some(f)),
            }
        }
        clock.advance(49_000_000);
        let (ok, f) = admits(&mut service, Priority::Low);
        assert!(ok, "49 ms of queueing: low still goes");
        held.extend(f);
        clock.advance(1_000_000);
        assert_eq!(layer.stats().queue_delay, Duration::from_millis(50));
        for (class, expect) in [
            (Priority::Low, false),
            (Priority::Normal, true),
            (Priority::Critical, true),
        ] {
            let (ok, f) = admits(&mut service, class);
            assert_eq!(ok, expect, "{class} at 50 ms");
            held.extend(f);
        }
        clock.advance(150_000_000);
        for (class, expect) in [
            (Priority::Low, false),
            (Priority::Normal, false),
            (Priority::Critical, true),
        ] {
            let (ok, f) = admits(&mut service, class);
            assert_eq!(ok, expect, "{class} at 200 ms");
            held.extend(f);
        }
        held.clear();
        let stats = layer.stats();
        assert_eq!((stats.in_flight, stats.queue_delay), (0, Duration::ZERO));
        assert_eq!(stats.shed, [2, 1, 0]);
        let (ok, _) = admits(&mut service, Priority::Low);
        assert!(ok, "the queue drained: low goes again");
    }

    /// Under load, in real time: a backend that serves 4 at once, 20 ms
    /// each (200 a second), offered 1,000 a second for 300 ms, a third of
    /// each class. Critical is never refused; low is shed the most; every
    /// shed answer is 503 with Retry-After.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_backend_under_load_keeps_critical_and_sheds_low_first() {
        let layer = LoadShedLayer::new(config(8, 16, 20, 60))
            .unwrap()
            .priority_fn(priority_header(HeaderName::from_static("x-priority")));
        let service = layer.layer(Backend::new(4, Duration::from_millis(20)));
        let classes = [Priority::Low, Priority::Normal, Priority::Critical];
        let mut tasks = tokio::task::JoinSet::new();
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        for i in 0..300 {
            tick.tick().await;
            let class = classes[i % 3];
            let mut s = service.clone();
            let f = s.call(request(class));
            tasks.spawn(async move { (class, f.await.unwrap()) });
        }
        let mut ok = [0u64; 3];
        while let Some(done) = tasks.join_next().await {
            let (class, r) = done.unwrap();
            if r.status() == StatusCode::OK {
                ok[usize::from(class.rank())] += 1;
            } else {
                assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
                assert!(r.headers().contains_key(RETRY_AFTER));
            }
        }
        let stats = layer.stats();
        assert_eq!(ok, stats.admitted);
        assert_eq!(stats.admitted[2], 100, "critical is never shed: {stats:?}");
        assert!(stats.shed[0] > 0, "low was shed: {stats:?}");
        assert!(stats.shed[0] >= stats.shed[1], "{stats:?}");
        assert_eq!(stats.in_flight, 0);
    }

    /// A waker that does nothing: the tests poll by hand.
    struct Noop;

    impl std::task::Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }

    /// Polls a future once, with a waker that does nothing.
    fn futures_poll<F: Future + Unpin>(f: &mut F) -> Option<F::Output> {
        let waker = std::task::Waker::from(Arc::new(Noop));
        let mut cx = Context::from_waker(&waker);
        match Pin::new(f).poll(&mut cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        }
    }
}
