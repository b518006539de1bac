//! The cache layer and its service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::HeaderMap;
use sha2::{Digest, Sha256};
use tower_layer::Layer;
use tower_llm_core::layer::MetricsExt;
use tower_llm_core::{
    AttemptLog, AttemptOutcome, CacheOutcome, CacheStatus, Deadline, Failure, FailureClass,
    LlmRequest, Metrics,
};
use tower_llm_idempotency::{IdempotentRequest, NoTenant, TenantFn};
use tower_service::Service;

use crate::answer::{CacheAnswer, Sink};
use crate::config::{CacheConfig, InvalidCacheConfig, RISK_HEADER};
use crate::control::CacheControl;
use crate::store::{CacheEntry, CacheStore, MemoryCache, StoreError};

/// Where the cache reads a request's `Cache-Control` and `x-llm-risk`
/// headers.
///
/// [`OwnHeaders`] (the default) reads an `http::Request`'s own headers
/// ([`LlmRequest::headers`]); a typed request carries none, so a server
/// that turns HTTP requests into typed ones passes a function that finds
/// the inbound headers it kept (any `for<'a> fn(&'a Req) -> Option<&'a
/// HeaderMap>`).
pub trait CacheHeaders<Req> {
    /// The request's inbound headers, if it has any.
    fn headers<'a>(&self, req: &'a Req) -> Option<&'a HeaderMap>;
}

/// Reads a request's own headers ([`LlmRequest::headers`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct OwnHeaders;

impl<Req: LlmRequest> CacheHeaders<Req> for OwnHeaders {
    fn headers<'a>(&self, req: &'a Req) -> Option<&'a HeaderMap> {
        req.headers()
    }
}

impl<Req> CacheHeaders<Req> for for<'a> fn(&'a Req) -> Option<&'a HeaderMap> {
    fn headers<'a>(&self, req: &'a Req) -> Option<&'a HeaderMap> {
        self(req)
    }
}

pub(crate) struct Shared {
    pub(crate) config: CacheConfig,
    pub(crate) store: Arc<dyn CacheStore>,
    pub(crate) metrics: Metrics,
    /// Set once a store error has been logged (one line per outage, not
    /// one per call).
    pub(crate) logged: AtomicBool,
    /// Background writes to the store in flight (bounded).
    pub(crate) writes: Arc<tokio::sync::Semaphore>,
}

/// A response cache for a route; see the [crate docs](crate).
#[derive(Clone)]
pub struct CacheLayer<T = NoTenant, H = OwnHeaders> {
    shared: Arc<Shared>,
    tenant: T,
    headers: H,
}

impl<T: fmt::Debug, H> fmt::Debug for CacheLayer<T, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheLayer")
            .field("config", &self.shared.config)
            .field("store", &self.shared.store)
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}

impl CacheLayer {
    /// A layer with `config`, a [`MemoryCache`] of 64 MiB of its own, no
    /// tenants, the request's own headers and the global metrics.
    ///
    /// # Errors
    ///
    /// When `config` does not [validate](CacheConfig::validate).
    pub fn new(config: CacheConfig) -> Result<Self, InvalidCacheConfig> {
        config.validate()?;
        Ok(CacheLayer {
            shared: Arc::new(Shared {
                config,
                store: Arc::new(MemoryCache::default()),
                metrics: Metrics::global(),
                logged: AtomicBool::new(false),
                writes: Arc::new(tokio::sync::Semaphore::new(crate::answer::MAX_WRITES)),
            }),
            tenant: NoTenant,
            headers: OwnHeaders,
        })
    }
}

impl<T, H> CacheLayer<T, H> {
    /// Keeps answers in `store` instead (one store for every route of a
    /// server, or one shared between replicas).
    #[must_use]
    pub fn with_store(self, store: Arc<dyn CacheStore>) -> Self {
        self.with_shared(|s| s.store = store)
    }

    /// Counts `ai_router_cache_total` on `metrics` instead of the global
    /// meter's.
    #[must_use]
    pub fn with_metrics(self, metrics: Metrics) -> Self {
        self.with_shared(|s| s.metrics = metrics)
    }

    /// Scopes answers by `tenant` (opaque bytes; see [`TenantFn`]): two
    /// tenants asking the same thing never share an answer.
    pub fn with_tenant<T2>(self, tenant: T2) -> CacheLayer<T2, H> {
        CacheLayer {
            shared: self.shared,
            tenant,
            headers: self.headers,
        }
    }

    /// Reads `Cache-Control` and `x-llm-risk` through `headers`.
    pub fn with_headers<H2>(self, headers: H2) -> CacheLayer<T, H2> {
        CacheLayer {
            shared: self.shared,
            tenant: self.tenant,
            headers,
        }
    }

    /// The settings.
    pub fn config(&self) -> &CacheConfig {
        &self.shared.config
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn CacheStore> {
        &self.shared.store
    }

    fn with_shared(self, change: impl FnOnce(&mut Shared)) -> Self {
        let mut shared = Shared {
            config: self.shared.config.clone(),
            store: self.shared.store.clone(),
            metrics: self.shared.metrics.clone(),
            logged: AtomicBool::new(false),
            writes: self.shared.writes.clone(),
        };
        change(&mut shared);
        CacheLayer {
            shared: Arc::new(shared),
            tenant: self.tenant,
            headers: self.headers,
        }
    }
}

impl<S, T: Clone, H: Clone> Layer<S> for CacheLayer<T, H> {
    type Service = Cache<S, T, H>;

    fn layer(&self, inner: S) -> Self::Service {
        Cache {
            inner,
            shared: self.shared.clone(),
            tenant: self.tenant.clone(),
            headers: self.headers.clone(),
        }
    }
}

/// The service built by [`CacheLayer`].
#[derive(Clone)]
pub struct Cache<S, T = NoTenant, H = OwnHeaders> {
    inner: S,
    shared: Arc<Shared>,
    tenant: T,
    headers: H,
}

impl<S: fmt::Debug, T, H> fmt::Debug for Cache<S, T, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, T, H> Cache<S, T, H> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// The store's key: SHA-256 over the tenant and the request's
/// fingerprint, hex (fixed length, nothing the caller chose reaches the
/// store as it is).
fn key_of(tenant: Option<&[u8]>, fingerprint: &[u8; 32]) -> Arc<str> {
    let mut hasher = Sha256::new();
    hasher.update(b"tower-llm-cache\0");
    match tenant {
        Some(t) => {
            hasher.update([1]);
            hasher.update((t.len() as u64).to_be_bytes());
            hasher.update(t);
        }
        None => hasher.update([0]),
    }
    hasher.update(fingerprint);
    let digest: [u8; 32] = hasher.finalize().into();
    let mut hex = String::with_capacity(64);
    for b in digest {
        use std::fmt::Write;
        let _ = write!(hex, "{b:02x}");
    }
    Arc::from(hex)
}

/// What one call may take from the cache and give it, from the route's
/// settings and the request's headers.
#[derive(Debug, Clone, Copy)]
struct Terms {
    /// Whether a fresh answer may be taken (not `no-cache`, a route with
    /// a freshness lifetime).
    hits: bool,
    /// The route's freshness lifetime: an answer younger than this is
    /// fresh (RFC 9111 §4.2).
    ttl: Duration,
    /// The oldest answer the request accepts (`max-age`, RFC 9111
    /// §5.2.1.1: an age greater than this is refused).
    max_age: Option<Duration>,
    /// The oldest answer served stale when every provider failed (`None`:
    /// no stale answers).
    stale: Option<Duration>,
    /// Whether the answer may be stored.
    store: bool,
}

impl Terms {
    fn of(config: &CacheConfig, headers: Option<&HeaderMap>) -> Self {
        let cc = headers.map(CacheControl::from_headers).unwrap_or_default();
        let ttl = config.ttl();
        let admitted = match &config.stale_for_risk {
            None => true,
            Some(risks) => headers
                .and_then(|h| h.get(RISK_HEADER))
                .is_some_and(|v| risks.iter().any(|r| r.as_bytes() == v.as_bytes())),
        };
        let window = cc
            .stale_if_error
            .map_or(config.stale(), |s| s.min(config.stale()));
        // `max-age` without `stale-if-error`: the client does not want a
        // stale answer (RFC 9111 §5.2.1.1).
        let refuses_stale = cc.max_age.is_some() && cc.stale_if_error.is_none();
        let stale =
            (admitted && !refuses_stale && !window.is_zero()).then(|| ttl.saturating_add(window));
        Terms {
            hits: !cc.no_cache && !ttl.is_zero(),
            ttl,
            max_age: cc.max_age,
            stale,
            store: !cc.no_store,
        }
    }

    /// `true` when an answer of `age` may be served as a hit.
    fn fresh(&self, age: Duration) -> bool {
        self.hits && age < self.ttl && self.max_age.is_none_or(|max| age <= max)
    }
}

/// `true` for failures meaning no provider could serve now, which the
/// stale-safe rung answers; never for a request refused on its merits
/// (bad request, auth, a budget, a content filter).
fn providers_down(class: FailureClass) -> bool {
    matches!(
        class,
        FailureClass::Transient
            | FailureClass::RateLimited
            | FailureClass::QuotaExhausted
            | FailureClass::Timeout
            | FailureClass::CircuitOpen
            | FailureClass::InvalidResponse
            | FailureClass::DeadlineExceeded
    )
}

/// `true` when the last failed attempt of the call (`log`) failed as an
/// outage: a degraded answer built after budgets, quotas, policies or the
/// request itself stopped every link is not answered stale. A call without
/// a log (no layer owns it: no budget, quota or policy layer either) is
/// taken as an outage.
fn last_failure_is_outage(log: Option<&AttemptLog>) -> bool {
    let Some(log) = log else {
        return true;
    };
    log.snapshot()
        .iter()
        .rev()
        .find_map(|r| match r.outcome {
            AttemptOutcome::Failed(class) => Some(providers_down(class)),
            AttemptOutcome::SkippedByPolicy => Some(false),
            _ => None,
        })
        .unwrap_or(false)
}

/// The response future of [`Cache`].
pub type ResponseFuture<R> = Pin<Box<dyn Future<Output = Result<R, Failure>> + Send>>;

impl<S, T, H, Req> Service<Req> for Cache<S, T, H>
where
    S: Service<Req, Error = Failure> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: CacheAnswer,
    T: TenantFn<Req>,
    H: CacheHeaders<Req>,
    Req: IdempotentRequest + Send + 'static,
{
    type Response = S::Response;
    type Error = Failure;
    type Future = ResponseFuture<S::Response>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let shared = self.shared.clone();
        let terms = Terms::of(&shared.config, self.headers.headers(&req));
        let key = key_of(self.tenant.tenant(&req).as_deref(), &req.fingerprint().0);
        let deadline = Deadline::of(&req);
        // The call's records: what the chain tried, read when it answers
        // with its degraded answer.
        let log = AttemptLog::of(&req).cloned();
        // The service was made ready for this call: it goes with the call
        // (which first looks the answer up).
        let clone = self.inner.clone();
        let mut service = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let found = if terms.hits || terms.stale.is_some() {
                // A store that does not answer gets at most half the
                // call's time left: the providers get the rest.
                let lookup = shared.store.get(key.clone());
                let looked_up = match deadline {
                    Some(d) => tokio::time::timeout(d.remaining() / 2, lookup)
                        .await
                        .unwrap_or_else(|_| {
                            Err(StoreError(
                                "the lookup took half the call's deadline".into(),
                            ))
                        }),
                    None => lookup.await,
                };
                match looked_up {
                    Ok(found) => {
                        shared.logged.store(false, Ordering::Relaxed);
                        found
                    }
                    Err(e) => {
                        if !shared.logged.swap(true, Ordering::Relaxed) {
                            tracing::warn!(error = %e.0, "response cache unavailable; calls go to providers");
                        }
                        None
                    }
                }
            } else {
                None
            };
            if let Some(CacheEntry { stored, age }) = &found {
                if terms.fresh(*age) {
                    if let Some(answer) =
                        S::Response::from_cache(stored, CacheOutcome::new(CacheStatus::Hit, *age))
                    {
                        shared.metrics.record_cache(CacheStatus::Hit);
                        return Ok(answer);
                    }
                }
            }
            // A candidate for the stale-safe rung: the answer found now,
            // if it is young enough.
            let found_at = tokio::time::Instant::now();
            let stale = found.filter(|e| terms.stale.is_some_and(|limit| e.age <= limit));
            let sink = Sink {
                store: shared.store.clone(),
                key,
                keep: shared.config.keep(),
                max_entry_bytes: usize::try_from(shared.config.max_entry_bytes)
                    .unwrap_or(usize::MAX),
                store_tool_calls: shared.config.store_tool_calls,
                writes: shared.writes.clone(),
            };
            let call = service.call(req);
            let result = match (&stale, deadline) {
                // With a stale answer in hand, the call ends at the
                // deadline with it rather than with the deadline's error
                // (an answer ready in the same poll as the deadline wins).
                (Some(_), Some(deadline)) => {
                    let mut call = std::pin::pin!(call);
                    let mut end = std::pin::pin!(tokio::time::sleep(deadline.remaining()));
                    std::future::poll_fn(|cx| {
                        if let Poll::Ready(r) = call.as_mut().poll(cx) {
                            return Poll::Ready(Some(r));
                        }
                        end.as_mut().poll(cx).map(|()| None)
                    })
                    .await
                }
                _ => Some(call.await),
            };
            let failed = match &result {
                // Every link failed and the fallback built its degraded
                // answer: an outage only if the last link failed as one
                // (not a budget, a quota, a policy or the request itself).
                Some(Ok(answer)) => answer.is_degraded() && last_failure_is_outage(log.as_ref()),
                Some(Err(f)) => providers_down(f.class()),
                None => true,
            };
            if failed {
                if let (Some(CacheEntry { stored, age }), Some(limit)) = (&stale, terms.stale) {
                    // Its age when served: the call has run since, and
                    // the limit holds then.
                    let age = age.saturating_add(found_at.elapsed());
                    if age > limit {
                        shared.metrics.record_cache(CacheStatus::Miss);
                        return match result {
                            Some(r) => r.map(|a| a.with_cache_outcome(CacheOutcome::MISS)),
                            None => Err(Failure::deadline_exceeded()),
                        };
                    }
                    let outcome = CacheOutcome::new(CacheStatus::Stale, age);
                    if let Some(answer) = S::Response::from_cache(stored, outcome) {
                        shared.metrics.record_cache(CacheStatus::Stale);
                        return Ok(answer);
                    }
                }
            }
            shared.metrics.record_cache(CacheStatus::Miss);
            match result {
                Some(Ok(answer)) if terms.store && !answer.is_degraded() => {
                    Ok(answer.store(sink).with_cache_outcome(CacheOutcome::MISS))
                }
                Some(Ok(answer)) => Ok(answer.with_cache_outcome(CacheOutcome::MISS)),
                Some(Err(f)) => Err(f),
                None => Err(Failure::deadline_exceeded()),
            }
        })
    }
}
