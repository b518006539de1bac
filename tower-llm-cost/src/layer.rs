//! [`CostLayer`] (per link) and [`BudgetLayer`] (per call).

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;
use tower_llm_core::telemetry::Metrics;
use tower_llm_core::{Cost, Link, Price};

use crate::quota::QuotaStore;
use crate::service::{CallBudget, CostService};

/// Prices each attempt of a link and holds it to the call's
/// [`Budget`](tower_llm_core::Budget) and the tenant's quota: before the
/// attempt is sent its worst case is held, when it ends the hold is
/// settled to what it cost. See the [crate docs](crate).
///
/// Place it inside the retry layer (so each attempt is held and a
/// refusal, never retried on the link, moves the call to the next link)
/// and outside the circuit breaker (a refusal never counts against a
/// circuit).
///
/// ```
/// use tower::{ServiceExt, service_fn, Layer};
/// use tower_llm_core::{Budget, ChatRequest, ChatResponse, Cost, Message, Price, Usage};
/// use tower_llm_cost::CostLayer;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let price = Price::new(Cost::from_dollars(1.0).unwrap(), Cost::from_dollars(2.0).unwrap(), None).unwrap();
/// let provider = service_fn(|_req: ChatRequest| async {
///     Ok(ChatResponse::builder("m").text("hi").usage(Usage {
///         prompt_tokens: 10, completion_tokens: 5, cached_input_tokens: 0,
///     }).build())
/// });
/// let svc = CostLayer::new(price).with_max_output_tokens(100).layer(provider);
/// let mut req = ChatRequest::new("m", vec![Message::user("hello")]);
/// let budget = Budget::new(Cost::from_dollars(0.01).unwrap()).store(&mut req);
/// svc.oneshot(req).await.unwrap();
/// // 10 input tokens at $1/M and 5 output tokens at $2/M.
/// assert_eq!(budget.spent(), Cost::from_nanos(10_000 + 10_000));
/// # }
/// ```
#[derive(Clone)]
pub struct CostLayer {
    pub(crate) shared: Arc<Settings>,
}

pub(crate) struct Settings {
    pub(crate) price: Price,
    pub(crate) max_output_tokens: Option<u32>,
    pub(crate) quota: Option<Arc<dyn QuotaStore>>,
    pub(crate) metrics: Metrics,
    /// The labels of `ai_router_cost_total`, when the layer serves one
    /// link (else the carrier's link, per call).
    pub(crate) link: Option<Link>,
}

impl fmt::Debug for CostLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CostLayer")
            .field("price", &self.shared.price)
            .field("max_output_tokens", &self.shared.max_output_tokens)
            .field("quota", &self.shared.quota)
            .finish_non_exhaustive()
    }
}

impl CostLayer {
    /// Attempts priced at `price`, with no cap on output tokens of its
    /// own, no quota, no metrics.
    pub fn new(price: Price) -> Self {
        CostLayer {
            shared: Arc::new(Settings {
                price,
                max_output_tokens: None,
                quota: None,
                metrics: Metrics::disabled(),
                link: None,
            }),
        }
    }

    fn with(self, f: impl FnOnce(&mut Settings)) -> Self {
        let s = &self.shared;
        let mut settings = Settings {
            price: s.price,
            max_output_tokens: s.max_output_tokens,
            quota: s.quota.clone(),
            metrics: s.metrics.clone(),
            link: s.link.clone(),
        };
        f(&mut settings);
        CostLayer {
            shared: Arc::new(settings),
        }
    }

    /// Caps the output tokens of attempts held to a budget or a quota at
    /// `cap` (a request's own lower `max_tokens` stays): the worst case
    /// held is then known, and the provider cannot generate more. Without
    /// a cap, an attempt held to a budget or quota must carry its own
    /// `max_tokens`, or it is refused.
    #[must_use]
    pub fn with_max_output_tokens(self, cap: u32) -> Self {
        self.with(|s| s.max_output_tokens = Some(cap))
    }

    /// Holds each attempt to the quota of the call's
    /// [`Tenant`](tower_llm_core::Tenant) (the empty id when the call has
    /// none) in `store`.
    #[must_use]
    pub fn with_quota(self, store: Arc<dyn QuotaStore>) -> Self {
        self.with(|s| s.quota = Some(store))
    }

    /// Adds each attempt's cost to `ai_router_cost_total` on `metrics`,
    /// labelled with the link the call carrier names (see
    /// [`with_link`](Self::with_link)).
    #[must_use]
    pub fn with_metrics(self, metrics: Metrics) -> Self {
        self.with(|s| s.metrics = metrics)
    }

    /// Labels `ai_router_cost_total` with `link`'s provider and model
    /// (for a layer in front of one link, as a fallback chain's links
    /// are): no per-call copy of the carrier's link.
    #[must_use]
    pub fn with_link(self, link: Link) -> Self {
        self.with(|s| s.link = Some(link))
    }

    /// The price.
    pub fn price(&self) -> Price {
        self.shared.price
    }
}

impl<S> Layer<S> for CostLayer {
    type Service = CostService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CostService::new(inner, self.shared.clone())
    }
}

/// Gives each call a [`Budget`](tower_llm_core::Budget) of `limit`, or
/// keeps the lower one the call already has (a caller may lower a route's
/// budget, never raise it). Place it outermost, next to the deadline
/// layer: the budget covers every attempt inside.
///
/// ```
/// use tower::{ServiceExt, service_fn, Layer};
/// use tower_llm_core::{Budget, ChatRequest, Cost, Message};
/// use tower_llm_cost::BudgetLayer;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let seen = service_fn(|req: ChatRequest| async move {
///     Ok::<_, std::convert::Infallible>(Budget::of(&req).map(Budget::limit))
/// });
/// let svc = BudgetLayer::new(Cost::from_dollars(0.5).unwrap()).layer(seen);
/// let mut req = ChatRequest::new("m", vec![Message::user("hi")]);
/// assert_eq!(svc.clone().oneshot(req.clone()).await.unwrap(), Cost::from_dollars(0.5));
/// Budget::new(Cost::from_dollars(0.1).unwrap()).store(&mut req);
/// assert_eq!(svc.oneshot(req).await.unwrap(), Cost::from_dollars(0.1));
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct BudgetLayer {
    limit: Cost,
}

impl BudgetLayer {
    /// Calls held to `limit` each.
    pub fn new(limit: Cost) -> Self {
        BudgetLayer { limit }
    }
}

impl<S> Layer<S> for BudgetLayer {
    type Service = CallBudget<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CallBudget::new(inner, self.limit)
    }
}
