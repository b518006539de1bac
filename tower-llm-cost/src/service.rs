//! [`CostService`] and [`CallBudget`]: the services of the two layers.

use std::sync::Arc;
use std::task::{Context, Poll};

use tower_llm_core::layer::AttemptLogExt as _;
use tower_llm_core::{AttemptLog, Budget, Cost, Failure, FailureClass, Link, Tenant};
use tower_service::Service;

use crate::future::{CostFuture, Reserving, State};
use crate::layer::Settings;
use crate::meter::{Estimate, Meter};
use crate::quota::Ask;
use crate::{CostAnswer, CostRequest, InputBound};

/// The service of a [`CostLayer`](crate::CostLayer).
#[derive(Clone)]
pub struct CostService<S> {
    inner: S,
    shared: Arc<Settings>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for CostService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CostService")
            .field("inner", &self.inner)
            .field("price", &self.shared.price)
            .finish_non_exhaustive()
    }
}

impl<S> CostService<S> {
    pub(crate) fn new(inner: S, shared: Arc<Settings>) -> Self {
        CostService { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, R> Service<R> for CostService<S>
where
    S: Service<R, Error = Failure> + Clone,
    S::Response: CostAnswer,
    R: CostRequest,
{
    type Response = S::Response;
    type Error = Failure;
    type Future = CostFuture<S, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: R) -> Self::Future {
        let shared = &self.shared;
        let cap = match (req.max_output_tokens(), shared.max_output_tokens) {
            (Some(own), Some(cap)) => Some(own.min(cap)),
            (own, cap) => own.or(cap),
        };
        let record = AttemptLog::of(&req).and_then(|log| Some((log.clone(), log.in_flight()?)));
        let link = if shared.metrics.is_enabled() && shared.link.is_none() {
            Link::of(&req).cloned().map(Box::new)
        } else {
            None
        };
        let budget = Budget::of(&req);
        if budget.is_none() && shared.quota.is_none() {
            // Priced only: nothing to hold; the input bound is computed
            // only if the answer brings no usage.
            let meter = Meter {
                shared: shared.clone(),
                estimate: Estimate {
                    input: req.input_bound_later(),
                    output: cap,
                    held: false,
                },
                budget: None,
                quota: None,
                record,
                link,
                sent: true,
                settled: false,
            };
            return CostFuture::new(State::Running {
                future: self.inner.call(req),
                meter: Some(meter),
            });
        }
        let input = req.input_tokens_bound();
        let mut meter = Meter {
            shared: shared.clone(),
            estimate: Estimate {
                input: InputBound::known(input),
                output: cap,
                held: true,
            },
            budget: None,
            quota: None,
            record,
            link,
            sent: false,
            settled: false,
        };
        let Some(output) = cap else {
            let class = if budget.is_some() {
                FailureClass::CostBudgetExhausted
            } else {
                FailureClass::TenantQuotaExhausted
            };
            drop(meter); // never sent: charges nothing
            return CostFuture::failed(Failure::new(class).with_message(
                "this attempt's cost has no bound: neither the request (max_tokens) \
                 nor the link caps its output tokens",
            ));
        };
        let output = u64::from(output);
        let ask = Ask {
            cost: shared.price.tokens(input, 0, output),
            tokens: input.saturating_add(output),
        };
        if let Some(budget) = budget {
            match budget.hold(ask.cost) {
                Ok(hold) => meter.budget = Some(hold),
                Err(left) => {
                    let failure = budget_refusal(ask.cost, left, budget.limit());
                    drop(meter); // never sent: charges nothing
                    return CostFuture::failed(failure);
                }
            }
        }
        // The provider can then neither generate nor bill more than held.
        if let Some(cap) = cap {
            req.cap_output_tokens(cap);
        }
        let Some(store) = &shared.quota else {
            meter.sent = true;
            return CostFuture::new(State::Running {
                future: self.inner.call(req),
                meter: Some(meter),
            });
        };
        let tenant = Tenant::of(&req)
            .cloned()
            .unwrap_or_else(|| Tenant::new(Vec::new()));
        let reserve = store.reserve(&tenant, ask);
        // The ready service goes with the request; a clone stays here.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        CostFuture::new(State::Reserving {
            reserving: Some(Box::new(Reserving {
                reserve,
                service: ready,
                req,
                meter,
            })),
        })
    }
}

/// The failure of an attempt the call's budget cannot cover.
fn budget_refusal(ask: Cost, left: Cost, limit: Cost) -> Failure {
    Failure::new(FailureClass::CostBudgetExhausted).with_message(format!(
        "this attempt may cost up to {ask} dollars; {left} of the call's budget of {limit} is left"
    ))
}

/// The service of a [`BudgetLayer`](crate::BudgetLayer).
#[derive(Debug, Clone)]
pub struct CallBudget<S> {
    inner: S,
    limit: Cost,
}

impl<S> CallBudget<S> {
    pub(crate) fn new(inner: S, limit: Cost) -> Self {
        CallBudget { inner, limit }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, R> Service<R> for CallBudget<S>
where
    S: Service<R>,
    R: tower_llm_core::LlmRequest,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: R) -> Self::Future {
        Budget::new(self.limit).store(&mut req);
        self.inner.call(req)
    }
}
