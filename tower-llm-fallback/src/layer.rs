use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower::ServiceExt;
use tower::util::BoxCloneSyncService;
use tower_layer::Layer;
use tower_llm_core::{BoxError, ChatClassifier, Failure, FailurePolicy, Metrics};
use tower_service::Service;

use crate::health::Health;
use crate::{Fallback, InvalidChain, LinkService, LinkSpec};

/// Builds a degraded answer when every link failed.
pub(crate) type Degrade<Res> = Arc<dyn Fn(&Failure) -> Res + Send + Sync>;

/// The chain shared by every service a layer builds.
pub(crate) struct Chain<Req, Res, C> {
    pub(crate) primary: LinkSpec<Req>,
    pub(crate) alternates: Vec<(LinkSpec<Req>, LinkService<Req, Res>)>,
    pub(crate) classifier: C,
    pub(crate) failures: FailurePolicy,
    /// One per alternate, when health-aware ordering is on.
    pub(crate) health: Option<Vec<Health>>,
    pub(crate) degrade: Option<Degrade<Res>>,
    pub(crate) metrics: Metrics,
}

impl<Req, Res, C> Chain<Req, Res, C> {
    /// The spec of link `i` (0 = primary).
    pub(crate) fn spec(&self, i: usize) -> Option<&LinkSpec<Req>> {
        match i {
            0 => Some(&self.primary),
            i => self.alternates.get(i - 1).map(|(spec, _)| spec),
        }
    }

    pub(crate) fn len(&self) -> usize {
        1 + self.alternates.len()
    }

    /// The alternates' indices (1-based) in the order to try them: as
    /// configured, or, with health-aware ordering, a stable sort by
    /// descending health score (a link with no data scores neutral; none
    /// is dropped). Called only when the call fails over.
    pub(crate) fn order(&self) -> Order {
        let Some(health) = &self.health else {
            return Order::Configured(self.len());
        };
        let mut order: Vec<usize> = (1..self.len()).collect();
        let scores: Vec<f64> = health.iter().map(Health::score).collect();
        order.sort_by(|a, b| scores[*b - 1].total_cmp(&scores[*a - 1]));
        Order::Sorted(order)
    }
}

/// The order to try a chain's alternates in.
#[derive(Debug)]
pub(crate) enum Order {
    /// As configured: links 1, 2, ... up to the chain's length (no
    /// allocation).
    Configured(usize),
    /// By health score.
    Sorted(Vec<usize>),
}

impl Order {
    /// The link to try `n`-th (0-based), if any.
    pub(crate) fn get(&self, n: usize) -> Option<usize> {
        match self {
            Order::Configured(len) => n.checked_add(1).filter(|j| j < len),
            Order::Sorted(order) => order.get(n).copied(),
        }
    }
}

/// Fails over along an ordered chain of links: see the [crate docs](crate).
///
/// Built with [`FallbackLayer::builder`]; wraps the primary link's service.
pub struct FallbackLayer<Req, Res, C = ChatClassifier> {
    chain: Arc<Chain<Req, Res, C>>,
}

impl<Req, Res, C> Clone for FallbackLayer<Req, Res, C> {
    fn clone(&self) -> Self {
        FallbackLayer {
            chain: self.chain.clone(),
        }
    }
}

impl<Req, Res, C: fmt::Debug> fmt::Debug for FallbackLayer<Req, Res, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let links: Vec<_> = (0..self.chain.len())
            .filter_map(|i| self.chain.spec(i).map(|s| s.link.clone()))
            .collect();
        f.debug_struct("FallbackLayer")
            .field("links", &links)
            .field("classifier", &self.chain.classifier)
            .finish_non_exhaustive()
    }
}

impl<Req, Res> FallbackLayer<Req, Res, ChatClassifier> {
    /// Starts a chain whose primary link is `primary` (its service is the
    /// one the layer wraps).
    pub fn builder(primary: LinkSpec<Req>) -> FallbackBuilder<Req, Res, ChatClassifier> {
        FallbackBuilder {
            primary,
            alternates: Vec::new(),
            classifier: ChatClassifier,
            failures: FailurePolicy::default(),
            health_window: None,
            degrade: None,
            metrics: Metrics::global(),
        }
    }
}

/// Builds a [`FallbackLayer`].
pub struct FallbackBuilder<Req, Res, C> {
    primary: LinkSpec<Req>,
    alternates: Vec<(LinkSpec<Req>, LinkService<Req, Res>)>,
    classifier: C,
    failures: FailurePolicy,
    health_window: Option<Duration>,
    degrade: Option<Degrade<Res>>,
    metrics: Metrics,
}

impl<Req, Res, C: fmt::Debug> fmt::Debug for FallbackBuilder<Req, Res, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FallbackBuilder")
            .field("primary", &self.primary)
            .field("alternates", &self.alternates.len())
            .field("classifier", &self.classifier)
            .finish_non_exhaustive()
    }
}

impl<Req, Res, C> FallbackBuilder<Req, Res, C> {
    /// Adds the next alternate link, served by `service` (usually its own
    /// retry → breaker → provider stack). Alternates are tried in the order
    /// added, each only if the one before failed over.
    #[must_use]
    pub fn or<S>(mut self, spec: LinkSpec<Req>, service: S) -> Self
    where
        S: Service<Req, Response = Res> + Clone + Send + Sync + 'static,
        S::Error: Into<BoxError> + 'static,
        S::Future: Send + 'static,
        Req: 'static,
    {
        let service = BoxCloneSyncService::new(service.map_err(Failure::from_inner));
        self.alternates.push((spec, service));
        self
    }

    /// Uses `classifier` to tell success from failure (for raw HTTP,
    /// [`HttpClassifier`](tower_llm_core::HttpClassifier): a 503 answer fails over).
    pub fn with_classifier<C2>(self, classifier: C2) -> FallbackBuilder<Req, Res, C2> {
        FallbackBuilder {
            primary: self.primary,
            alternates: self.alternates,
            classifier,
            failures: self.failures,
            health_window: self.health_window,
            degrade: self.degrade,
            metrics: self.metrics,
        }
    }

    /// Records the per-call metrics on `metrics` when this layer owns the
    /// call (no outer tower-llm layer does). Default:
    /// [`Metrics::global`] (a no-op until the host installs an
    /// OpenTelemetry SDK); [`Metrics::disabled`] for none.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Opt-in: when failing over, try the alternates healthiest first, by a
    /// score over the last `window` (success rate weighted 4:1 over
    /// latency). The sort is stable, a link with no data scores neutral,
    /// and no link is ever dropped. Off by default: the configured order
    /// holds.
    #[must_use]
    pub fn with_health_ordering(mut self, window: Duration) -> Self {
        self.health_window = Some(window);
        self
    }

    /// Opt-in: when every link failed, answer with `degrade(&last_failure)`
    /// instead, flagged as degraded (`ChatResponse::degraded`, or a
    /// [`Degraded`](tower_llm_core::Degraded) extension on an
    /// `http::Response`). Not used for a deadline or a terminal failure.
    #[must_use]
    pub fn with_degraded(
        mut self,
        degrade: impl Fn(&Failure) -> Res + Send + Sync + 'static,
    ) -> Self {
        self.degrade = Some(Arc::new(degrade));
        self
    }

    /// Which failure classes fail over (default [`FailurePolicy::default`]).
    #[must_use]
    pub fn with_failure_policy(mut self, failures: FailurePolicy) -> Self {
        self.failures = failures;
        self
    }

    /// Checks and builds the chain; link positions are set in order.
    ///
    /// # Errors
    ///
    /// When two links name the same provider and model, or the chain has
    /// more than 255 links.
    pub fn build(mut self) -> Result<FallbackLayer<Req, Res, C>, InvalidChain> {
        if self.alternates.len() >= usize::from(u8::MAX) {
            return Err(InvalidChain("more than 255 links".into()));
        }
        let mut seen = HashSet::new();
        let last = self.alternates.len();
        let specs = std::iter::once(&mut self.primary)
            .chain(self.alternates.iter_mut().map(|(spec, _)| spec));
        for (position, spec) in specs.enumerate() {
            let name = format!("{}/{}", spec.link.provider(), spec.link.model());
            if !seen.insert(name.clone()) {
                return Err(InvalidChain(format!("duplicate link {name}")));
            }
            spec.link = spec
                .link
                .clone()
                .with_position(u8::try_from(position).unwrap_or(u8::MAX))
                .with_alternates_after(position < last);
        }
        let health = self.health_window.map(|window| {
            self.alternates
                .iter()
                .map(|_| Health::new(window))
                .collect()
        });
        Ok(FallbackLayer {
            chain: Arc::new(Chain {
                primary: self.primary,
                alternates: self.alternates,
                classifier: self.classifier,
                failures: self.failures,
                health,
                degrade: self.degrade,
                metrics: self.metrics,
            }),
        })
    }
}

impl<S, Req, Res, C> Layer<S> for FallbackLayer<Req, Res, C> {
    type Service = Fallback<S, Req, Res, C>;

    fn layer(&self, primary: S) -> Self::Service {
        Fallback::new(primary, self.chain.clone())
    }
}
