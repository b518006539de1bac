use std::time::Duration;

use tower_layer::Layer;
use tower_llm_core::Metrics;

use crate::EnforceDeadline;

/// Applies one absolute deadline to every call: see the [crate docs](crate).
///
/// Cheap to clone: the budget and the metrics handle.
#[derive(Debug, Clone)]
pub struct DeadlineLayer {
    budget: Duration,
    metrics: Metrics,
}

impl DeadlineLayer {
    /// A layer giving each call at most `budget` (less when the request
    /// already carries an earlier deadline or a tighter timeout header).
    ///
    /// A zero budget fails every call at once with deadline exceeded; a
    /// budget too large for the clock means "about 30 years".
    ///
    /// When this layer owns the call (no outer tower-llm layer does), it
    /// records the call's [`Metrics`] on the global meter (a no-op until
    /// the host installs an OpenTelemetry SDK); see
    /// [`with_metrics`](Self::with_metrics).
    pub fn new(budget: Duration) -> Self {
        DeadlineLayer {
            budget,
            metrics: Metrics::global(),
        }
    }

    /// Records the per-call metrics on `metrics` instead
    /// ([`Metrics::disabled`] for none).
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The budget given to each call.
    pub const fn budget(&self) -> Duration {
        self.budget
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = EnforceDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        EnforceDeadline::new(inner, self.budget).with_metrics(self.metrics.clone())
    }
}
