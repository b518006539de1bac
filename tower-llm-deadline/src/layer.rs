use std::time::Duration;

use tower_layer::Layer;

use crate::EnforceDeadline;

/// Applies one absolute deadline to every call: see the [crate docs](crate).
///
/// Cheap to clone; holds only the budget.
#[derive(Debug, Clone, Copy)]
pub struct DeadlineLayer {
    budget: Duration,
}

impl DeadlineLayer {
    /// A layer giving each call at most `budget` (less when the request
    /// already carries an earlier deadline or a tighter timeout header).
    ///
    /// A zero budget fails every call at once with deadline exceeded; a
    /// budget too large for the clock means "about 30 years".
    pub const fn new(budget: Duration) -> Self {
        DeadlineLayer { budget }
    }

    /// The budget given to each call.
    pub const fn budget(&self) -> Duration {
        self.budget
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = EnforceDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        EnforceDeadline::new(inner, self.budget)
    }
}
