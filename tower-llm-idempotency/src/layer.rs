//! The idempotency layer and its service; a tenant function scopes its
//! keys.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tower_layer::Layer;
use tower_llm_core::layer::CallOwner;
use tower_llm_core::{Failure, FailureClass, IdempotencyKey, LlmRequest, Metrics};
use tower_service::Service;

use crate::answer::{IdempotentAnswer, IdempotentRequest};
use crate::config::{IDEMPOTENCY_KEY, IdempotencyConfig, InvalidIdempotencyConfig, Shared};
use crate::future::ResponseFuture;
use crate::store::{IdempotencyStore, MemoryStore};

/// Scopes keys by tenant: two tenants with the same key never share an
/// answer.
///
/// A tenant is opaque bytes: two tenants are the same only when their
/// bytes are, whatever their encoding (`café-lyon` in UTF-8, a Latin-1
/// byte, anything a header can carry). Any `Fn(&Req) -> Option<T>` with
/// `T: Into<Vec<u8>>` (a `String`, a `Vec<u8>`, a `&'static str`) is one.
///
/// ```
/// use tower_llm_idempotency::TenantFn;
///
/// // The raw bytes of a header: never `to_str().ok()`, which would put
/// // every tenant whose id is not ASCII in the unnamed tenant's space.
/// let by_header = |req: &http::Request<()>| {
///     req.headers().get("x-tenant-id").map(|v| v.as_bytes().to_vec())
/// };
/// let req = http::Request::builder()
///     .header("x-tenant-id", http::HeaderValue::from_bytes(b"caf\xe9").unwrap())
///     .body(())
///     .unwrap();
/// assert_eq!(by_header.tenant(&req), Some(b"caf\xe9".to_vec()));
/// ```
pub trait TenantFn<Req> {
    /// The tenant of `req` as bytes (`None`: the shared, unnamed tenant,
    /// which is never the same as any named one, the empty name included).
    fn tenant(&self, req: &Req) -> Option<Vec<u8>>;
}

/// No tenants: one scope for every key.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoTenant;

impl<Req> TenantFn<Req> for NoTenant {
    fn tenant(&self, _: &Req) -> Option<Vec<u8>> {
        None
    }
}

impl<Req, F, T> TenantFn<Req> for F
where
    F: Fn(&Req) -> Option<T>,
    T: Into<Vec<u8>>,
{
    fn tenant(&self, req: &Req) -> Option<Vec<u8>> {
        self(req).map(Into::into)
    }
}

/// A repeated request with the same key gets the stored answer; see the
/// [crate docs](crate).
#[derive(Clone)]
pub struct IdempotencyLayer<T = NoTenant> {
    shared: Arc<Shared>,
    tenant: T,
}

impl<T: fmt::Debug> fmt::Debug for IdempotencyLayer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.shared.config)
            .field("store", &self.shared.store)
            .field("tenant", &self.tenant)
            .finish()
    }
}

impl IdempotencyLayer {
    /// A layer with `config`, an in-process [`MemoryStore`] of
    /// `config.max_bytes`, no tenants, and the global metrics.
    ///
    /// # Errors
    ///
    /// When `config` does not [validate](IdempotencyConfig::validate).
    pub fn new(config: IdempotencyConfig) -> Result<Self, InvalidIdempotencyConfig> {
        config.validate()?;
        let store = MemoryStore::new(usize::try_from(config.max_bytes).unwrap_or(usize::MAX));
        Ok(IdempotencyLayer {
            shared: Arc::new(Shared {
                config,
                store: Arc::new(store),
                metrics: Metrics::global(),
            }),
            tenant: NoTenant,
        })
    }
}

impl<T> IdempotencyLayer<T> {
    /// Keeps answers in `store` instead (a store shared between replicas).
    #[must_use]
    pub fn with_store(self, store: Arc<dyn IdempotencyStore>) -> Self {
        self.with_shared(|s| s.store = store)
    }

    /// Counts replays on `metrics` instead of the global meter's.
    #[must_use]
    pub fn with_metrics(self, metrics: Metrics) -> Self {
        self.with_shared(|s| s.metrics = metrics)
    }

    /// Scopes keys by `tenant`.
    pub fn with_tenant<T2>(self, tenant: T2) -> IdempotencyLayer<T2> {
        IdempotencyLayer {
            shared: self.shared,
            tenant,
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn IdempotencyStore> {
        &self.shared.store
    }

    fn with_shared(self, change: impl FnOnce(&mut Shared)) -> Self {
        let mut shared = Shared {
            config: self.shared.config.clone(),
            store: self.shared.store.clone(),
            metrics: self.shared.metrics.clone(),
        };
        change(&mut shared);
        IdempotencyLayer {
            shared: Arc::new(shared),
            tenant: self.tenant,
        }
    }
}

impl<S, T: Clone> Layer<S> for IdempotencyLayer<T> {
    type Service = Idempotency<S, T>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency {
            inner,
            shared: self.shared.clone(),
            tenant: self.tenant.clone(),
        }
    }
}

/// The service built by [`IdempotencyLayer`].
#[derive(Clone)]
pub struct Idempotency<S, T> {
    inner: S,
    shared: Arc<Shared>,
    tenant: T,
}

impl<S: fmt::Debug, T> fmt::Debug for Idempotency<S, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, T> Idempotency<S, T> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// The call's key: its [`IdempotencyKey`], else its `Idempotency-Key`
/// header.
fn key_of<Req: LlmRequest>(req: &Req) -> Option<(Result<&str, ()>, Option<Duration>)> {
    if let Some(key) = IdempotencyKey::of(req) {
        return Some((Ok(key.key()), key.ttl()));
    }
    let value = req.headers()?.get(IDEMPOTENCY_KEY)?;
    Some((value.to_str().map_err(|_| ()), None))
}

/// The store's key: SHA-256 over the tenant and the key, hex (fixed
/// length, nothing the caller chose reaches the store as it is).
fn scoped(tenant: Option<&[u8]>, key: &str) -> Arc<str> {
    let mut hasher = Sha256::new();
    match tenant {
        Some(t) => {
            hasher.update([1]);
            hasher.update((t.len() as u64).to_be_bytes());
            hasher.update(t);
        }
        None => hasher.update([0]),
    }
    hasher.update(key.as_bytes());
    let digest: [u8; 32] = hasher.finalize().into();
    let mut hex = String::with_capacity(64);
    for b in digest {
        use std::fmt::Write;
        let _ = write!(hex, "{b:02x}");
    }
    Arc::from(hex)
}

impl<S, T, Req> Service<Req> for Idempotency<S, T>
where
    S: Service<Req, Error = Failure> + Clone,
    S::Response: IdempotentAnswer + tower_llm_core::RecordsAttempts,
    T: TenantFn<Req>,
    Req: IdempotentRequest,
{
    type Response = S::Response;
    type Error = Failure;
    type Future = ResponseFuture<S, Req>;

    #[inline]
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let Some((key, ttl)) = key_of(&req) else {
            // No key: nothing to do, nothing paid.
            return ResponseFuture::plain(self.inner.call(req));
        };
        let config = &self.shared.config;
        let key = match key {
            Ok(k)
                if !k.is_empty()
                    && k.len() <= config.max_key_bytes
                    && k.bytes().all(|b| (0x20..0x7f).contains(&b)) =>
            {
                k
            }
            _ => {
                return ResponseFuture::failed(
                    Failure::new(FailureClass::BadRequest)
                        .with_status(http::StatusCode::BAD_REQUEST)
                        .with_message(format!(
                            "invalid idempotency key: 1 to {} printable ASCII bytes",
                            config.max_key_bytes
                        )),
                );
            }
        };
        let store_key = scoped(self.tenant.tenant(&req).as_deref(), key);
        let ttl = ttl.unwrap_or_else(|| config.ttl());
        let fingerprint = req.fingerprint();
        let owner = CallOwner::install(&mut req, &self.shared.metrics);
        // The service was made ready for this call: it goes with the call
        // (which may first wait for another call's answer).
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        let begin = self.shared.store.begin(store_key.clone(), fingerprint);
        ResponseFuture::keyed(
            begin,
            service,
            req,
            self.shared.clone(),
            store_key,
            fingerprint,
            ttl,
            owner,
        )
    }
}
