//! The hedge layers.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;
use tower_llm_core::{Link, Metrics};
use tower_llm_retry::Budget;

use crate::latency::Learned;
use crate::{Hedge, HedgeConfig, InvalidHedgeConfig};

/// What every clone of one hedge layer shares.
pub(crate) struct Shared {
    pub(crate) config: HedgeConfig,
    pub(crate) learned: Option<Learned>,
    pub(crate) budget: Arc<dyn Budget + Send + Sync>,
    pub(crate) metrics: Metrics,
}

impl Shared {
    /// The delay in force: the learned one once there is one, else the
    /// configured one.
    pub(crate) fn delay(&self) -> Duration {
        self.learned
            .as_ref()
            .and_then(Learned::delay)
            .unwrap_or_else(|| self.config.delay())
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgeSettings")
            .field("config", &self.config)
            .field("delay", &self.delay())
            .finish_non_exhaustive()
    }
}

/// Hedges each call to the same service (a second connection to the same
/// link): see the [crate docs](crate).
///
/// One layer learns one latency distribution and holds one budget, shared
/// by its clones: build one per link.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_hedge::{HedgeConfig, HedgeLayer};
///
/// let layer = HedgeLayer::new(HedgeConfig {
///     quantile: Some(0.95),
///     ..HedgeConfig::default()
/// })
/// .unwrap();
/// assert_eq!(layer.delay(), Duration::from_millis(500)); // until it has learned
/// ```
#[derive(Debug, Clone)]
pub struct HedgeLayer {
    shared: Arc<Shared>,
}

impl HedgeLayer {
    /// A layer with `config`, a hedge budget of `config.budget_ratio` of
    /// the calls over 10 s (at least `budget_min_per_sec`), and the global
    /// metrics.
    ///
    /// # Errors
    ///
    /// When `config` does not [validate](HedgeConfig::validate).
    pub fn new(config: HedgeConfig) -> Result<Self, InvalidHedgeConfig> {
        config.validate()?;
        let budget = config.budget()?;
        Ok(HedgeLayer {
            shared: Arc::new(Shared {
                learned: config
                    .quantile
                    .map(|q| Learned::new(q, config.floor(), config.min_samples)),
                config,
                budget: Arc::new(budget),
                metrics: Metrics::global(),
            }),
        })
    }

    /// Uses `budget` (shared as it is) instead of the configured ratio.
    #[must_use]
    pub fn with_budget(self, budget: Arc<dyn Budget + Send + Sync>) -> Self {
        self.rebuild(|s| s.budget = budget)
    }

    /// Counts `ai_router_hedges_total` on `metrics` instead of the global
    /// meter's.
    #[must_use]
    pub fn with_metrics(self, metrics: Metrics) -> Self {
        self.rebuild(|s| s.metrics = metrics)
    }

    /// Hedges to `service` instead, as `link` (a cross-provider hedge: the
    /// next link of a fallback chain, say). The hedge's request carries
    /// `link`, so its attempt records, breaker key and metrics name it.
    pub fn to<B>(self, link: Link, service: B) -> CrossHedgeLayer<B> {
        CrossHedgeLayer {
            shared: self.shared,
            link,
            backup: service,
        }
    }

    /// The hedge delay in force now.
    pub fn delay(&self) -> Duration {
        self.shared.delay()
    }

    fn rebuild(self, change: impl FnOnce(&mut Shared)) -> Self {
        let shared = match Arc::try_unwrap(self.shared) {
            Ok(mut shared) => {
                change(&mut shared);
                shared
            }
            Err(arc) => {
                // Shared with clones already: a fresh copy (the learned
                // latencies start over).
                let mut shared = Shared {
                    config: arc.config.clone(),
                    learned: arc
                        .config
                        .quantile
                        .map(|q| Learned::new(q, arc.config.floor(), arc.config.min_samples)),
                    budget: arc.budget.clone(),
                    metrics: arc.metrics.clone(),
                };
                change(&mut shared);
                shared
            }
        };
        HedgeLayer {
            shared: Arc::new(shared),
        }
    }
}

impl<S: Clone> Layer<S> for HedgeLayer {
    type Service = Hedge<S, S>;

    fn layer(&self, inner: S) -> Self::Service {
        Hedge::new(inner.clone(), inner, None, self.shared.clone())
    }
}

/// Hedges each call to another service (built by [`HedgeLayer::to`]).
#[derive(Debug, Clone)]
pub struct CrossHedgeLayer<B> {
    shared: Arc<Shared>,
    link: Link,
    backup: B,
}

impl<B> CrossHedgeLayer<B> {
    /// The hedge delay in force now.
    pub fn delay(&self) -> Duration {
        self.shared.delay()
    }
}

impl<S, B: Clone> Layer<S> for CrossHedgeLayer<B> {
    type Service = Hedge<S, B>;

    fn layer(&self, inner: S) -> Self::Service {
        Hedge::new(
            inner,
            self.backup.clone(),
            Some(self.link.clone()),
            self.shared.clone(),
        )
    }
}
