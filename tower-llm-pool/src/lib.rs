//! Pools: one model spread over several deployments (API keys, regions,
//! endpoints) behind one link, each paced under its own rate limits.
//!
//! - [`Pool`]: picks a deployment per call (power of two choices over a
//!   load score, weights honoured, optional sticky affinity), and moves a
//!   call that meets a deployment's own fault (429, 5xx, open circuit,
//!   quota, pacing) to another deployment at once.
//! - [`Pacer`]: one deployment's request and token buckets
//!   ([`PaceLimits`]); [`Pacer::with_shared`] adds the fleet's buckets
//!   of the deployment (a [`SharedPacing`] store, such as
//!   `tower-llm-pool-redis`'s), so replicas together stay within its
//!   limits.
//!
//! Place a pool where one provider service would be: inside the retry
//! (and cost) layers of a link, each deployment behind its own circuit
//! breaker and bulkhead.
//!
//! ```
//! use std::sync::Arc;
//! use tower::{ServiceExt, service_fn};
//! use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass, Link, Message};
//! use tower_llm_pool::{Deployment, Pool};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Two keys of one model: the first is rate limited, the call moves on.
//! let limited = service_fn(|_: ChatRequest| async {
//!     Err::<ChatResponse, _>(Failure::new(FailureClass::RateLimited))
//! });
//! let fine = service_fn(|req: ChatRequest| async move {
//!     let served_by = Link::of(&req).map(|l| l.provider().to_owned()).unwrap_or_default();
//!     Ok::<_, Failure>(ChatResponse::builder("gpt-4o").text(served_by).build())
//! });
//! let pool = Pool::new(vec![
//!     Deployment::new("key-a", tower::util::BoxCloneSyncService::new(limited)),
//!     Deployment::new("key-b", tower::util::BoxCloneSyncService::new(fine)),
//! ]);
//! let answer = pool.oneshot(ChatRequest::new("gpt-4o", vec![Message::user("hi")])).await.unwrap();
//! assert_eq!(answer.text(), "key-b");
//! # }
//! ```

mod headers;
mod load;
mod observe;
mod pacer;
mod pool;

pub use headers::{
    HeaderIssue, HeaderIssues, LimitHeaders, MAX_HEADER_COUNT, MAX_HEADER_WAIT, RateLimitHeaders,
};
pub use load::{DeploymentLoad, LoadSnapshot};
pub use observe::{ObserveFuture, ObserveRateLimits, ObserveRateLimitsLayer};
pub use pacer::{
    PaceLimits, PaceSnapshot, PaceTicket, Pacer, SharedPacing, SharedTake, SharedTicket,
};
pub use pool::{
    AffinityFn, Deployment, DeploymentStatus, MAX_DEPLOYMENTS, Pool, PoolAnswer, PoolFuture,
    PoolRequest, PoolStatus, Priority, PriorityFn,
};
