//! Tracing through the gateway: spans, the subscriber-wide filter, and
//! W3C trace context continued to the providers (each test sets its own
//! thread-local subscriber).

#[path = "../metrics_support/mod.rs"]
mod metrics_support;
#[path = "../gateway_support/mod.rs"]
mod support;

mod filter;
mod propagation;
mod spans;
