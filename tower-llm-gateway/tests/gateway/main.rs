//! The gateway in-process over loopback HTTP: its chat endpoint, bad
//! and hostile input, its policy-driven layers, reloads, the model list,
//! the status page and the transport. One test binary
//! (one link of the gateway) for all of them.

#[path = "../gateway_support/mod.rs"]
mod support;

mod bad_input;
mod cache;
mod chat;
mod cost;
mod dashboards;
mod examples;
mod hostile;
mod inbound;
mod layers;
mod models;
mod named_policies;
mod pool_limits;
mod pools;
mod recovery;
mod reload_on_signal;
mod status_page;
mod transport;
