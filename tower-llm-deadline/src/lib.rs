//! One absolute deadline for a whole logical LLM call.
//!
//! [`DeadlineLayer`] is the outermost layer of a tower-llm stack. For each
//! call it computes the *effective deadline*, the earliest of
//!
//! - a [`Deadline`] already in the request's [`Call`](tower_llm_core::Call) (set by the caller
//!   or by an outer layer),
//! - now + the layer's budget,
//! - for [`http::Request`]s, an inbound `grpc-timeout` header (gRPC wire
//!   format) or an `x-request-timeout-ms` header,
//!
//! stores it in the request's [`Call`](tower_llm_core::Call), so every inner layer (retry sleeps,
//! per-attempt timeouts, the next fallback link) spends the same budget, and
//! returns a deadline-exceeded [`Failure`] the moment it passes, dropping
//! (cancelling) the inner call right then. It also installs the call's
//! [`AttemptLog`](tower_llm_core::AttemptLog) when no outer layer did, and
//! attaches the records to the response or the error when the call ends.
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_llm_core::{Deadline, Failure};
//! use tower_llm_deadline::DeadlineLayer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let slow = service_fn(|req: http::Request<()>| async move {
//!     // Inner layers see the deadline.
//!     assert!(Deadline::of(&req).is_some());
//!     tokio::time::sleep(Duration::from_secs(10)).await;
//!     Ok::<_, Failure>(http::Response::new(()))
//! });
//! let svc = ServiceBuilder::new()
//!     .layer(DeadlineLayer::new(Duration::from_secs(5)))
//!     .service(slow);
//!
//! let started = tokio::time::Instant::now();
//! let err = svc.oneshot(http::Request::new(())).await.unwrap_err();
//! assert!(err.is_deadline_exceeded());
//! assert_eq!(started.elapsed(), Duration::from_secs(5));
//! # }
//! ```
//!
//! # Errors, not responses
//!
//! The layer returns an error ([`Failure`], class
//! [`DeadlineExceeded`](tower_llm_core::FailureClass::DeadlineExceeded)), never a
//! synthesised response; inner errors are converted to [`Failure`] (a
//! `Failure` passes through unchanged). A gateway maps it to 504.
//!
//! # How it differs from `tower::timeout::Timeout`
//!
//! `Timeout` gives each call through it a fresh relative budget. A deadline
//! is absolute and shared: the caller's own deadline and inbound timeout
//! headers can only shorten it, and every retry and failover inside spends
//! from the same budget, so "3 attempts × 3 providers" can never outlive the
//! caller. Like `Timeout`, an answer ready in the same poll as the deadline
//! wins, readiness passes straight through, and nothing is boxed.
//!
//! # Panics
//!
//! Calling the service outside a tokio runtime with the time driver enabled
//! panics (as `tokio::time::sleep` does).
//!
//! # Feature flags
//!
//! None.

mod config;
mod future;
mod header;
mod layer;
mod service;

pub use config::DeadlineConfig;
pub use future::ResponseFuture;
pub use header::{
    GRPC_TIMEOUT, X_REQUEST_TIMEOUT_MS, header_timeout, parse_grpc_timeout,
    parse_request_timeout_ms,
};
pub use layer::DeadlineLayer;
pub use service::EnforceDeadline;
pub use tower_llm_core::{Deadline, Failure};
