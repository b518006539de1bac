use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;
use tower_llm_core::{ChatClassifier, FailurePolicy, HttpClassifier, Link};

use crate::{
    Breaker, BreakerConfig, BreakerCount, BreakerHandle, BreakerStore, LinkKey, MemoryStore,
    Transition,
};

/// A callback for circuit state changes.
pub type Observer = Arc<dyn Fn(&Transition) + Send + Sync>;

/// Reports a state change: a tracing event (`warn` when a circuit opens,
/// `info` otherwise), then the layer's observer, if any.
pub(crate) fn announce(observer: Option<&Observer>, transition: Option<&Transition>) {
    let Some(t) = transition else {
        return;
    };
    let (provider, model) = (t.key.provider(), t.key.model());
    let (from, to) = (t.from.as_metric_label(), t.to.as_metric_label());
    let reason = t.reason.as_metric_label();
    if t.to == crate::CircuitState::Open {
        let open_ms = t.open_for.map(|d| d.as_millis());
        tracing::warn!(provider, model, from, to, reason, open_ms, "circuit opened");
    } else {
        tracing::info!(provider, model, from, to, reason, "circuit state changed");
    }
    if let Some(observer) = observer {
        observer(t);
    }
}

/// Why a [`BreakerConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidBreakerConfig(String);

impl fmt::Display for InvalidBreakerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid breaker config: {}", self.0)
    }
}

impl std::error::Error for InvalidBreakerConfig {}

/// A per-key circuit breaker: see the [crate docs](crate).
///
/// Every clone of a layer, and every service it builds, share one
/// [`BreakerStore`]: a circuit opened through one is open for all.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_breaker::{BreakerConfig, BreakerLayer};
///
/// let layer = BreakerLayer::new()                 // typed chat calls
///     .with_config(BreakerConfig {
///         consecutive_failures: 3,
///         cooldown: Duration::from_secs(10),
///         ..BreakerConfig::default()
///     })
///     .unwrap()
///     .on_transition(|t| eprintln!("{} {:?} -> {:?}", t.key, t.from, t.to));
/// let handle = layer.handle();                    // snapshot, isolate, close
/// assert!(handle.snapshot().is_empty());
/// ```
pub struct BreakerLayer<K = LinkKey, C = ChatClassifier> {
    pub(crate) config: BreakerConfig,
    pub(crate) store: Arc<dyn BreakerStore>,
    pub(crate) key_fn: K,
    pub(crate) classifier: C,
    pub(crate) failures: FailurePolicy,
    pub(crate) observer: Option<Observer>,
    pub(crate) link: Link,
}

impl<K: Clone, C: Clone> Clone for BreakerLayer<K, C> {
    fn clone(&self) -> Self {
        BreakerLayer {
            config: self.config,
            store: self.store.clone(),
            key_fn: self.key_fn.clone(),
            classifier: self.classifier.clone(),
            failures: self.failures,
            observer: self.observer.clone(),
            link: self.link.clone(),
        }
    }
}

impl<K: fmt::Debug, C: fmt::Debug> fmt::Debug for BreakerLayer<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerLayer")
            .field("config", &self.config)
            .field("store", &self.store)
            .field("key_fn", &self.key_fn)
            .field("classifier", &self.classifier)
            .field("link", &self.link)
            .finish_non_exhaustive()
    }
}

impl BreakerLayer<LinkKey, ChatClassifier> {
    /// A breaker for typed chat services, keyed by provider and model, with
    /// the defaults of [`BreakerConfig::default`].
    pub fn new() -> Self {
        BreakerLayer {
            config: BreakerConfig::default(),
            store: Arc::new(MemoryStore::default()),
            key_fn: LinkKey,
            classifier: ChatClassifier,
            failures: FailurePolicy::default(),
            observer: None,
            link: Link::new("default", ""),
        }
    }
}

impl Default for BreakerLayer<LinkKey, ChatClassifier> {
    fn default() -> Self {
        BreakerLayer::new()
    }
}

impl BreakerLayer<LinkKey, HttpClassifier> {
    /// A breaker for raw HTTP services, classifying answers by status.
    pub fn http() -> Self {
        BreakerLayer::new().with_classifier(HttpClassifier)
    }
}

impl<K, C> BreakerLayer<K, C> {
    /// Uses `classifier` to tell success from failure.
    pub fn with_classifier<C2>(self, classifier: C2) -> BreakerLayer<K, C2> {
        BreakerLayer {
            config: self.config,
            store: self.store,
            key_fn: self.key_fn,
            classifier,
            failures: self.failures,
            observer: self.observer,
            link: self.link,
        }
    }

    /// Uses `key_fn` to choose each request's circuit, for example to add
    /// a tenant or credential scope (see [`BreakerKey::with_scope`](crate::BreakerKey::with_scope)).
    pub fn with_key_fn<K2>(self, key_fn: K2) -> BreakerLayer<K2, C> {
        BreakerLayer {
            config: self.config,
            store: self.store,
            key_fn,
            classifier: self.classifier,
            failures: self.failures,
            observer: self.observer,
            link: self.link,
        }
    }

    /// Replaces the settings.
    ///
    /// # Errors
    ///
    /// When [`BreakerConfig::validate`] refuses them.
    pub fn with_config(mut self, config: BreakerConfig) -> Result<Self, InvalidBreakerConfig> {
        config.validate().map_err(InvalidBreakerConfig)?;
        self.config = config;
        Ok(self)
    }

    /// Which failure classes trip the breaker (default
    /// [`FailurePolicy::default`]: transient, rate limited, timeout, quota
    /// exhausted, invalid response).
    #[must_use]
    pub fn with_failure_policy(mut self, failures: FailurePolicy) -> Self {
        self.failures = failures;
        self
    }

    /// Counts every attempt ([`BreakerCount::Attempts`], the default) or
    /// one outcome per logical call per link ([`BreakerCount::Calls`]);
    /// the same as setting [`BreakerConfig::count`].
    #[must_use]
    pub fn with_count(mut self, count: BreakerCount) -> Self {
        self.config.count = count;
        self
    }

    /// The provider and model of requests that carry no [`Link`].
    #[must_use]
    pub fn with_link(mut self, link: Link) -> Self {
        self.link = link;
        self
    }

    /// Keeps circuits in `store` (default: a [`MemoryStore`] of up to
    /// 10,000 keys).
    #[must_use]
    pub fn with_store(mut self, store: Arc<dyn BreakerStore>) -> Self {
        self.store = store;
        self
    }

    /// Calls `observer` on every state change, after the change, outside
    /// any lock. Keep it quick: it runs on the request path.
    #[must_use]
    pub fn on_transition(mut self, observer: impl Fn(&Transition) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// The settings.
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// Manual control and snapshots of this layer's circuits.
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle {
            store: self.store.clone(),
            observer: self.observer.clone(),
        }
    }
}

impl<S, K: Clone, C: Clone> Layer<S> for BreakerLayer<K, C> {
    type Service = Breaker<S, K, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Breaker::new(inner, Arc::new(self.clone()))
    }
}
