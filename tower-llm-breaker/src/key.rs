//! Which circuit a request belongs to.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use tower_llm_core::{Link, LlmRequest};

/// The identity of one circuit: provider and model, plus an optional scope
/// (credential, tenant, region or endpoint).
///
/// Seed 004: one tenant's revoked key must not open the circuit for
/// everyone, so a key function can add the credential or tenant as the
/// scope. Cloning is three reference-count increments.
///
/// ```
/// use tower_llm_breaker::BreakerKey;
///
/// let key = BreakerKey::new("openai", "gpt-4o-mini").with_scope("tenant-42");
/// assert_eq!(key.to_string(), "openai/gpt-4o-mini#tenant-42");
/// ```
#[derive(Debug, Clone)]
pub struct BreakerKey {
    provider: Arc<str>,
    model: Arc<str>,
    scope: Option<Arc<str>>,
}

impl BreakerKey {
    /// The key of `provider` and `model`, unscoped.
    pub fn new(provider: impl Into<Arc<str>>, model: impl Into<Arc<str>>) -> Self {
        BreakerKey {
            provider: provider.into(),
            model: model.into(),
            scope: None,
        }
    }

    /// The key of a link (provider and model; no allocation).
    pub fn from_link(link: &Link) -> Self {
        BreakerKey {
            provider: link.provider_arc().clone(),
            model: link.model_arc().clone(),
            scope: None,
        }
    }

    /// Adds a scope: a credential id, tenant, region or endpoint. Never put
    /// a secret itself here (keys show in snapshots and logs): use an id or
    /// a hash of it. Keep the set of scopes bounded (ids you issue, not
    /// values callers choose freely): the store holds at most `max_keys`
    /// circuits, and a key beyond them gets a circuit that is not kept.
    #[must_use]
    pub fn with_scope(mut self, scope: impl Into<Arc<str>>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// The provider.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The model.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The scope, if any.
    pub fn scope(&self) -> Option<&str> {
        self.scope.as_deref()
    }

    /// The key as borrowed parts.
    pub fn view(&self) -> KeyView<'_> {
        KeyView {
            provider: &self.provider,
            model: &self.model,
            scope: self.scope.as_deref(),
        }
    }

    pub(crate) fn provider_arc(&self) -> &Arc<str> {
        &self.provider
    }

    pub(crate) fn model_arc(&self) -> &Arc<str> {
        &self.model
    }
}

/// A [`BreakerKey`] as borrowed parts: what a store looks a circuit up by,
/// so that finding an existing circuit copies nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyView<'a> {
    /// The provider.
    pub provider: &'a str,
    /// The model.
    pub model: &'a str,
    /// The scope, if any.
    pub scope: Option<&'a str>,
}

impl KeyView<'_> {
    /// An owned key with the same parts.
    pub fn to_key(&self) -> BreakerKey {
        BreakerKey {
            provider: Arc::from(self.provider),
            model: Arc::from(self.model),
            scope: self.scope.map(Arc::from),
        }
    }
}

/// Hash-map lookups of a [`BreakerKey`] by a [`KeyView`] (the `Borrow`
/// trick: both hash and compare through their view).
pub(crate) trait AsKey {
    fn view(&self) -> KeyView<'_>;
}

impl AsKey for BreakerKey {
    fn view(&self) -> KeyView<'_> {
        BreakerKey::view(self)
    }
}

impl AsKey for KeyView<'_> {
    fn view(&self) -> KeyView<'_> {
        *self
    }
}

impl<'a> Borrow<dyn AsKey + 'a> for BreakerKey {
    fn borrow(&self) -> &(dyn AsKey + 'a) {
        self
    }
}

impl Hash for dyn AsKey + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.view().hash(state);
    }
}

impl PartialEq for dyn AsKey + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.view() == other.view()
    }
}

impl Eq for dyn AsKey + '_ {}

impl Hash for BreakerKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.view().hash(state);
    }
}

impl PartialEq for BreakerKey {
    fn eq(&self, other: &Self) -> bool {
        self.view() == other.view()
    }
}

impl Eq for BreakerKey {}

impl fmt::Display for BreakerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.provider, self.model)?;
        if let Some(scope) = &self.scope {
            write!(f, "#{scope}")?;
        }
        Ok(())
    }
}

/// Chooses the circuit for a request.
///
/// `default` is the layer's own link (see
/// [`BreakerLayer::with_link`](crate::BreakerLayer::with_link)), for requests
/// that carry no [`Link`]. Closures `Fn(&Req, &Link) -> BreakerKey` are key
/// functions.
pub trait KeyFn<Req> {
    /// The key of `req`.
    fn key(&self, req: &Req, default: &Link) -> BreakerKey;

    /// Calls `f` with the key of `req` as borrowed parts. The default builds
    /// the owned key; a key function that can borrow its parts from the
    /// request (as [`LinkKey`] does) overrides it, so the request path
    /// copies nothing.
    fn with_key<R>(&self, req: &Req, default: &Link, f: impl FnOnce(KeyView<'_>) -> R) -> R {
        f(self.key(req, default).view())
    }
}

impl<Req, F> KeyFn<Req> for F
where
    F: Fn(&Req, &Link) -> BreakerKey,
{
    fn key(&self, req: &Req, default: &Link) -> BreakerKey {
        self(req, default)
    }
}

/// The default key: provider and model of the request's [`Link`] (set by
/// the fallback layer), or of the layer's own link. Allocation-free.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkKey;

impl<Req: LlmRequest> KeyFn<Req> for LinkKey {
    fn key(&self, req: &Req, default: &Link) -> BreakerKey {
        BreakerKey::from_link(Link::of(req).unwrap_or(default))
    }

    fn with_key<R>(&self, req: &Req, default: &Link, f: impl FnOnce(KeyView<'_>) -> R) -> R {
        let link = Link::of(req).unwrap_or(default);
        f(KeyView {
            provider: link.provider(),
            model: link.model(),
            scope: None,
        })
    }
}

/// For raw HTTP: the link's provider, scoped by the request URI's host and
/// port (never its `user:password@` part), one circuit per endpoint as
/// per-authority breakers do elsewhere. Allocates the scope string on
/// every call.
#[derive(Debug, Clone, Copy, Default)]
pub struct AuthorityKey;

impl<B> KeyFn<http::Request<B>> for AuthorityKey {
    fn key(&self, req: &http::Request<B>, default: &Link) -> BreakerKey {
        let key = BreakerKey::from_link(Link::of(req).unwrap_or(default));
        match req.uri().authority() {
            Some(a) => match a.port_u16() {
                Some(port) => key.with_scope(format!("{}:{port}", a.host())),
                None => key.with_scope(a.host()),
            },
            None => key,
        }
    }
}
