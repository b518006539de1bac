//! Cost budgets and tenant quotas for LLM calls, as `tower` layers.
//!
//! - [`CostLayer`] (one per link, inside the retry layer and outside the
//!   circuit breaker) prices each attempt at its link's
//!   [`Price`](tower_llm_core::Price). Before the attempt is sent it
//!   *holds* the attempt's worst case on the call's
//!   [`Budget`](tower_llm_core::Budget) and on the tenant's quota (a
//!   [`QuotaStore`]); when the attempt ends it *settles* the hold to what
//!   the attempt cost. An attempt the budget or quota cannot cover is not
//!   sent: it fails with
//!   [`CostBudgetExhausted`](tower_llm_core::FailureClass::CostBudgetExhausted)
//!   or [`TenantQuotaExhausted`](tower_llm_core::FailureClass::TenantQuotaExhausted),
//!   never retried on its link, never counted by a breaker, and the
//!   fallback layer moves the call to the next (cheaper) link.
//! - [`BudgetLayer`] (outermost) gives each call its budget.
//! - [`MemoryQuota`]: quotas counted in this process;
//!   `tower-llm-cost-redis` shares them between replicas.
//!
//! # The worst case of an attempt
//!
//! Input: an upper bound from the request ([`CostRequest`]: one token per
//! byte of text sent, plus fixed framing and images). Output: the
//! request's `max_tokens`, or the layer's cap
//! ([`CostLayer::with_max_output_tokens`]), which is then written into
//! the request: the provider cannot generate (nor bill) more than was
//! held. Every attempt of a call (the first, a retry, the next link, a
//! hedge) holds its own worst case, so concurrent attempts together
//! never pass the budget.
//!
//! # What an attempt is charged
//!
//! | the attempt | charged |
//! |---|---|
//! | answered, with usage that can be right | its usage at the link's price |
//! | answered without usage, or with usage that cannot be right (more output than the cap, fewer output tokens than content pieces delivered, or, when held to a budget or quota, more input than the bound) | the whole estimate, flagged [`cost_estimated`](tower_llm_core::AttemptRecord::cost_estimated) |
//! | a stream cut (an error item, or dropped by its reader) before its usage came | the input estimate and one output token per byte delivered (at most the cap), flagged |
//! | an error status from the provider (4xx, 5xx, 429) | nothing: providers bill no generation for it |
//! | never sent (open circuit, refused by budget or quota) | nothing |
//! | no answer (timeout, reset, cancelled, a hedge that lost, the caller left) | the input estimate, flagged: the provider may have read the prompt |
//! | a success status whose body could not be read | the whole estimate, flagged |
//!
//! A charge is never more than the hold, and each attempt is settled
//! exactly once, on every path (a [`Meter`] settles when dropped): no
//! hold outlives its attempt.
//!
//! Per provider: OpenAI, Anthropic and Bedrock bill the tokens of a
//! completed answer (the usage they report) and nothing for a request
//! refused with an error status; for a request cut by the client they
//! bill what they generated before noticing, which this layer bounds by
//! what was delivered (streams) or by the input estimate (unary: an
//! underestimate when the provider finished generating an answer nobody
//! read; the record says it is an estimate).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tower::{Layer, ServiceExt, service_fn};
//! use tower_llm_core::{ChatRequest, ChatResponse, Cost, Message, Price, Tenant, Usage};
//! use tower_llm_cost::{CostLayer, Limits, MemoryQuota, QuotaConfig};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let quota = Arc::new(MemoryQuota::new(QuotaConfig::new(
//!     Duration::from_secs(86_400),
//!     Limits { max_cost: Cost::from_dollars(1.0), max_tokens: None },
//! )));
//! let price = Price::new(Cost::from_dollars(5.0).unwrap(), Cost::from_dollars(15.0).unwrap(), None).unwrap();
//! let provider = service_fn(|_: ChatRequest| async {
//!     Ok(ChatResponse::builder("m").text("ok").usage(Usage {
//!         prompt_tokens: 20, completion_tokens: 20, cached_input_tokens: 0,
//!     }).build())
//! });
//! let svc = CostLayer::new(price).with_max_output_tokens(1_000).with_quota(quota.clone()).layer(provider);
//! let mut req = ChatRequest::new("m", vec![Message::user("hello")]);
//! Tenant::new(&b"acme"[..]).store(&mut req);
//! svc.oneshot(req).await.unwrap();
//! let acme = Tenant::new(&b"acme"[..]);
//! // 20 input tokens at $5/M and 20 output tokens at $15/M.
//! assert_eq!(quota.used(&acme).cost, Cost::from_nanos(100_000 + 300_000));
//! # }
//! ```

mod answer;
mod estimate;
mod future;
mod layer;
mod memory;
mod meter;
mod quota;
mod service;

pub use answer::CostAnswer;
pub use estimate::{CostRequest, InputBound};
pub use future::CostFuture;
pub use layer::{BudgetLayer, CostLayer};
pub use memory::MemoryQuota;
pub use meter::Meter;
pub use quota::{
    Ask, Exhausted, InvalidQuota, Limits, OVERFLOW_TENANT, QuotaConfig, QuotaHold, QuotaRefusal,
    QuotaStore, Reserve,
};
pub use service::{CallBudget, CostService};
pub use tower_llm_core::{IMAGE_TOKENS, MESSAGE_OVERHEAD_TOKENS, REQUEST_OVERHEAD_TOKENS};
