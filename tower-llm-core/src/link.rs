//! Which provider and model one attempt is going to.

use std::sync::Arc;

/// A small descriptor of the link being called: provider name, model and
/// its position in a fallback chain (0 = primary).
///
/// The fallback layer stores one in the request's [`Call`](crate::Call) for each link it
/// tries; retry and breaker read it for attempt records, metric labels and
/// breaker keys. Cloning is one reference-count increment.
///
/// ```
/// use tower_llm_core::Link;
///
/// let link = Link::new("anthropic", "claude-sonnet-4-5").with_position(1);
/// let mut req = http::Request::new(());
/// link.clone().store(&mut req);
/// assert_eq!(Link::of(&req), Some(&link));
/// assert_eq!(link.provider(), "anthropic");
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Link {
    inner: Arc<Parts>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Parts {
    provider: Arc<str>,
    model: Arc<str>,
    position: u8,
    /// Links follow this one in its fallback chain.
    alternates_after: bool,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("provider", &self.inner.provider)
            .field("model", &self.inner.model)
            .field("position", &self.inner.position)
            .finish()
    }
}

impl Link {
    /// A primary link (position 0).
    pub fn new(provider: impl Into<Arc<str>>, model: impl Into<Arc<str>>) -> Self {
        Link {
            inner: Arc::new(Parts {
                provider: provider.into(),
                model: model.into(),
                position: 0,
                alternates_after: false,
            }),
        }
    }

    /// Sets the position in the fallback chain.
    #[must_use]
    pub fn with_position(mut self, position: u8) -> Self {
        Arc::make_mut(&mut self.inner).position = position;
        self
    }

    /// The provider name, as used in metric labels (for example `"openai"`).
    pub fn provider(&self) -> &str {
        &self.inner.provider
    }

    /// The provider name as a shared string (cheap to clone).
    pub fn provider_arc(&self) -> &Arc<str> {
        &self.inner.provider
    }

    /// The model id.
    pub fn model(&self) -> &str {
        &self.inner.model
    }

    /// The model id as a shared string (cheap to clone).
    pub fn model_arc(&self) -> &Arc<str> {
        &self.inner.model
    }

    /// Notes whether links follow this one in its fallback chain (the
    /// fallback layer sets it). A layer inside can then prefer failing
    /// over to waiting: the breaker refuses an attempt during a 429's
    /// hold as *circuit open* (go to the next link now) when links
    /// follow, and as *rate limited* with the rest of the hold (wait it
    /// out) when none does.
    #[must_use]
    pub fn with_alternates_after(mut self, alternates_after: bool) -> Self {
        Arc::make_mut(&mut self.inner).alternates_after = alternates_after;
        self
    }

    /// `true` when links follow this one in its fallback chain.
    pub fn has_alternates_after(&self) -> bool {
        self.inner.alternates_after
    }

    /// The position in the fallback chain (0 = primary).
    pub fn position(&self) -> u8 {
        self.inner.position
    }
}
