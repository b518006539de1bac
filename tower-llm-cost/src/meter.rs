//! [`Meter`]: one attempt's holds, settled exactly once whatever happens.

use std::fmt;
use std::sync::Arc;

use tower_llm_core::layer::{AttemptLogExt as _, MetricsExt as _};
use tower_llm_core::{AttemptLog, BudgetHold, Cost, Failure, FailureClass, Link, Usage};

use crate::estimate::InputBound;
use crate::layer::Settings;
use crate::quota::{Ask, QuotaHold};

/// The worst case of one attempt, as held: input tokens (an upper bound)
/// and output tokens (the cap), when known.
#[derive(Debug, Clone)]
pub(crate) struct Estimate {
    pub(crate) input: InputBound,
    pub(crate) output: Option<u32>,
    /// Held on a budget or quota: usage is checked against the input
    /// bound too (unheld, the provider's usage is what it bills).
    pub(crate) held: bool,
}

/// One attempt's holds (on the call's budget and the tenant's quota) and
/// what the attempt's cost goes to (its attempt record, the cost metric),
/// handed to the answer so it settles when it is whole: a unary answer at
/// once, a stream when it ends or is dropped.
///
/// Every path settles exactly once: [`settle_usage`](Self::settle_usage)
/// for a whole answer, [`settle_cut`](Self::settle_cut) for a stream that
/// ended early, and dropping the meter unsettled charges the attempt's
/// input estimate (an attempt dropped in flight, by a timeout, a hedge
/// that lost or a caller that left, may have reached the provider). What
/// is charged is never more than what was held.
pub struct Meter {
    /// The layer's settings: the price, the quota store, the metrics.
    pub(crate) shared: Arc<Settings>,
    pub(crate) estimate: Estimate,
    pub(crate) budget: Option<BudgetHold>,
    /// The quota's hold (boxed: only calls held to a quota pay its room).
    pub(crate) quota: Option<Box<QuotaHold>>,
    pub(crate) record: Option<(AttemptLog, usize)>,
    /// The link, for the metric's labels: only when metrics are on and
    /// the layer was given no link of its own (boxed: rare).
    pub(crate) link: Option<Box<Link>>,
    /// The request went to the inner service.
    pub(crate) sent: bool,
    pub(crate) settled: bool,
}

impl fmt::Debug for Meter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Meter")
            .field("price", &self.shared.price)
            .field("estimate", &self.estimate)
            .field("budget", &self.budget)
            .field("settled", &self.settled)
            .finish_non_exhaustive()
    }
}

/// What an attempt is charged: money, tokens, and whether it is an
/// estimate rather than the provider's usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Charge {
    cost: Cost,
    tokens: u64,
    estimated: bool,
}

impl Meter {
    /// The estimate of `output` output tokens (the cap when `None`).
    fn estimated(&self, output: Option<u64>) -> Charge {
        let output = output.or(self.estimate.output.map(u64::from)).unwrap_or(0);
        let input = self.estimate.input.get();
        Charge {
            cost: self.shared.price.tokens(input, 0, output),
            tokens: input.saturating_add(output),
            estimated: true,
        }
    }

    /// Settles a whole answer: its `usage`, if it has one that can be
    /// right, else the estimate. `delivered` is how many non-empty pieces
    /// of content (stream deltas; 1 for a unary answer with any content)
    /// the caller got: each took at least one output token, so usage
    /// reporting fewer is not believed.
    pub fn settle_usage(mut self, usage: Option<&Usage>, delivered: u64) -> Cost {
        let charge = match usage {
            Some(u) if self.believable(u, delivered) => Charge {
                cost: self.shared.price.cost(u),
                tokens: u64::from(u.prompt_tokens) + u64::from(u.completion_tokens),
                estimated: false,
            },
            _ => self.estimated(None),
        };
        self.finish(charge)
    }

    /// Settles a stream cut before its end (an error, or the caller
    /// dropped it) with no usage: its input estimate and one output token
    /// per byte of content delivered (at most the cap).
    pub fn settle_cut(mut self, delivered_bytes: u64) -> Cost {
        let output = self
            .estimate
            .output
            .map_or(delivered_bytes, |cap| u64::from(cap).min(delivered_bytes));
        let charge = self.estimated(Some(output));
        self.finish(charge)
    }

    /// Settles a failed attempt by what providers bill for it: nothing
    /// when it never reached the provider (an open circuit, a connect
    /// error) or the provider answered with an error status (4xx, 5xx,
    /// 429: no generation); the input estimate when it may have reached
    /// the provider and no answer came (a timeout, a reset, a
    /// cancellation); the whole estimate when a successful answer could
    /// not be read (generation happened, usage unknown).
    pub(crate) fn settle_failure(mut self, failure: &Failure) -> Cost {
        let status = failure.http_status();
        let charge = match (failure.class(), status) {
            (FailureClass::InvalidResponse, Some(s)) if s.is_success() => self.estimated(None),
            (_, Some(_)) => Charge {
                cost: Cost::ZERO,
                tokens: 0,
                estimated: false,
            },
            (
                FailureClass::CircuitOpen
                | FailureClass::CostBudgetExhausted
                | FailureClass::TenantQuotaExhausted,
                None,
            ) => Charge {
                cost: Cost::ZERO,
                tokens: 0,
                estimated: false,
            },
            (FailureClass::InvalidResponse, None) => self.estimated(None),
            _ => self.estimated(Some(0)),
        };
        self.finish(charge)
    }

    /// `true` when `usage` can be right: some usage at all, no more output
    /// than the cap, at least one output token per delivered piece and,
    /// for a held attempt, no more input than the bound.
    fn believable(&self, u: &Usage, delivered: u64) -> bool {
        let input = u64::from(u.prompt_tokens);
        let output = u64::from(u.completion_tokens);
        (input > 0 || output > 0)
            && self
                .estimate
                .output
                .is_none_or(|cap| output <= u64::from(cap))
            && output >= delivered
            && (!self.estimate.held || input <= self.estimate.input.get())
    }

    fn finish(&mut self, charge: Charge) -> Cost {
        self.settled = true;
        let cost = match self.budget.take() {
            Some(hold) => hold.settle(charge.cost),
            None => charge.cost,
        };
        let estimated = charge.estimated || cost < charge.cost;
        if let (Some(hold), Some(store)) = (self.quota.take(), &self.shared.quota) {
            let held = hold.held();
            let tokens = charge.tokens.min(held.tokens);
            store.settle(
                *hold,
                Ask {
                    cost: cost.min(held.cost),
                    tokens,
                },
            );
        }
        if let Some((log, index)) = self.record.take() {
            log.finish(index, |r| {
                r.cost = Some(cost);
                r.cost_estimated = estimated;
            });
        }
        if cost > Cost::ZERO && self.shared.metrics.is_enabled() {
            if let Some(link) = self.shared.link.as_ref().or(self.link.as_deref()) {
                self.shared.metrics.record_cost(link, cost);
            }
        }
        cost
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let charge = if self.sent {
            self.estimated(Some(0))
        } else {
            Charge {
                cost: Cost::ZERO,
                tokens: 0,
                estimated: false,
            }
        };
        self.finish(charge);
    }
}
