//! The idempotency layer, its settings and its service.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tower_layer::Layer;
use tower_llm_core::layer::CallOwner;
use tower_llm_core::{Failure, FailureClass, IdempotencyKey, LlmRequest, Metrics};
use tower_service::Service;

use crate::answer::{IdempotentAnswer, IdempotentRequest};
use crate::future::ResponseFuture;
use crate::store::{IdempotencyStore, MemoryStore};

/// The `Idempotency-Key` request header.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// What a call does when another call with its key is producing the
/// answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Concurrent {
    /// Wait for that answer (up to the call's own deadline) and return it;
    /// if that call fails or is dropped, one waiter goes ahead.
    #[default]
    Wait,
    /// Refuse at once: a `Conflict` failure (409,
    /// `idempotency_key_in_use`), the HTTP `Idempotency-Key` draft's
    /// behaviour.
    Reject,
}

/// The idempotency layer's settings. Field names are the policy file's.
///
/// ```
/// use tower_llm_idempotency::{Concurrent, IdempotencyConfig};
///
/// let config: IdempotencyConfig = toml::from_str("ttl_ms = 3600000\nconcurrent = \"reject\"").unwrap();
/// assert_eq!(config.concurrent, Concurrent::Reject);
/// config.validate().unwrap();
/// assert!(toml::from_str::<IdempotencyConfig>("ttl = 5").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyConfig {
    /// How long an answer is kept, in milliseconds, unless the call's
    /// [`IdempotencyKey`] says otherwise. Default 24 h.
    pub ttl_ms: u64,
    /// The in-process store's bound, in bytes of stored answers (oldest
    /// out first), counted as [`Stored::held_bytes`](crate::Stored::held_bytes):
    /// what the answers hold in memory, a stream's chunks as one compact
    /// buffer ([`StreamFrames`](crate::StreamFrames)). The process's
    /// resident memory grows by at most 2 × this (1.4 × measured with 96
    /// stored streams of 10,000 tokens against 16 MiB; the rest is the
    /// allocator's slack). Default 64 MiB.
    pub max_bytes: u64,
    /// The largest answer kept, in bytes (as `max_bytes` counts them); a
    /// larger one is returned but not stored. Default 1 MiB.
    pub max_entry_bytes: u64,
    /// Waiting for, or refusing, a concurrent duplicate. Default `wait`.
    pub concurrent: Concurrent,
    /// The longest key accepted, in bytes; a longer, empty or
    /// non-printable key is refused as a bad request. Default 255.
    pub max_key_bytes: usize,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig {
            ttl_ms: 24 * 3_600_000,
            max_bytes: 64 << 20,
            max_entry_bytes: 1 << 20,
            concurrent: Concurrent::Wait,
            max_key_bytes: 255,
        }
    }
}

impl IdempotencyConfig {
    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A zero `ttl_ms`, `max_bytes`, `max_entry_bytes` or `max_key_bytes`,
    /// or a `max_entry_bytes` over `max_bytes`; the error names the field.
    pub fn validate(&self) -> Result<(), InvalidIdempotencyConfig> {
        let invalid = |field, reason| Err(InvalidIdempotencyConfig { field, reason });
        if self.ttl_ms == 0 {
            return invalid("ttl_ms", "must be at least 1");
        }
        if self.max_bytes == 0 {
            return invalid("max_bytes", "must be at least 1");
        }
        if self.max_entry_bytes == 0 || self.max_entry_bytes > self.max_bytes {
            return invalid("max_entry_bytes", "must be between 1 and max_bytes");
        }
        if self.max_key_bytes == 0 {
            return invalid("max_key_bytes", "must be at least 1");
        }
        Ok(())
    }

    /// The default time to keep an answer.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }
}

/// An [`IdempotencyConfig`] that [`validate`](IdempotencyConfig::validate)
/// refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidIdempotencyConfig {
    field: &'static str,
    reason: &'static str,
}

impl InvalidIdempotencyConfig {
    /// The offending field, by its policy-file name.
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for InvalidIdempotencyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid idempotency config: `{}` {}",
            self.field, self.reason
        )
    }
}

impl std::error::Error for InvalidIdempotencyConfig {}

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

pub(crate) struct Shared {
    pub(crate) config: IdempotencyConfig,
    pub(crate) store: Arc<dyn IdempotencyStore>,
    pub(crate) metrics: Metrics,
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
