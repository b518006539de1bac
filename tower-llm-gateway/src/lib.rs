//! An OpenAI-compatible LLM gateway on the tower-llm stack: a library and
//! the `tower-llm-gateway` binary.
//!
//! A [`GatewayConfig`] file holds the library's
//! [`Policy`](tower_llm::config::Policy) (the providers, the routes: model
//! aliases with their fallback chains, and the settings of every layer)
//! and the gateway's own [`GatewaySettings`] (`listen`, `[server]`,
//! `[health]`, `[breaker_shared]`, `[idempotency_shared]`). The gateway
//! builds one stack per route (deadline → idempotency, with
//! `[idempotency]` → fallback → per link hedge, with `hedge` → retry →
//! breaker, shared through Redis with `[breaker_shared]` → provider),
//! serves OpenAI's chat completions API over it (unary and server-sent
//! events) with the `[server]` limits, reloads the file safely, probes the
//! providers, and exports Prometheus metrics.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tower_llm_gateway::{Gateway, GatewayConfig, GatewayServer, KeySource, Transport};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = GatewayConfig::from_toml(&std::fs::read_to_string("gateway.toml")?)?;
//! let keys: KeySource = Arc::new(|provider| provider.api_key_from_env());
//! let transport = Transport::per_thread(Duration::from_secs(5));
//! let gateway = Gateway::new(config, transport, keys)?;
//! let server = GatewayServer::new(gateway).bind("127.0.0.1:8080").await?;
//! server
//!     .serve(async {
//!         let _ = tokio::signal::ctrl_c().await;
//!     })
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! Endpoints: `POST /v1/chat/completions`, `GET /v1/models` and
//! `GET /v1/models/{id}` (the running policy's route aliases as OpenAI
//! model objects, sorted by id; a reload changes the list; an unknown id
//! is 404 `model_not_found`), `GET /metrics`, `GET /health`,
//! `GET /health/circuits` (and `POST` for manual control, behind
//! [`Gateway::set_admin_token`]), `GET /health/providers`, `GET /status`.
//! The binary is `clap` plus [`GatewayServer`]: the flags `--config`,
//! `--listen` and `--workers` (or `TOWER_LLM_GATEWAY_CONFIG`, `_LISTEN`,
//! `_WORKERS`), the file watcher ([`reload_on_change`]), the probe loop
//! ([`probe_loop`]), the admin token from `TOWER_LLM_GATEWAY_ADMIN_TOKEN`;
//! without `--config` it serves the embedded demo (feature `demo`).
//!
//! # Feature flags
//!
//! - `demo` (off): the embedded demo (`demo::embedded`: two in-process
//!   mock providers), for the binary without `--config`.
//!
//! The crate needs tokio, axum, tower-http, the OpenTelemetry SDK and
//! Prometheus: the library crates of tower-llm never build them for it.
//!
//! # Serving on every core
//!
//! [`GatewayServer`] (what the binary runs) starts one single-threaded
//! runtime per core, each serving its own listener on one port
//! (`SO_REUSEPORT`) with [`serve_with_slots`] and one shared
//! [`ConnectionSlots`] (so `[server] max_connections` holds for the
//! process), over a [`Transport::per_thread`] (each thread its own
//! provider connections): a call never leaves the thread that accepted
//! it. One [`Gateway`] is shared by all of them. The binary's subscriber
//! is filtered by [`telemetry::TracedCallsOnly`]. [`serve`] on one
//! listener of a multi-threaded runtime works as well, at more CPU per
//! call.

mod admin;
mod config;
#[cfg(feature = "demo")]
pub mod demo;
mod health;
mod http;
mod process;
mod reload;
mod routes;
mod server;
mod state;
mod status;
mod stores;
pub mod telemetry;
mod transport;

pub use config::{
    GatewayConfig, GatewaySettings, HealthPolicy, ServerPolicy, SharedBreakerPolicy,
    SharedIdempotencyPolicy, SharedQuotas, SharedRedis,
};
pub use health::probe_loop;
pub use http::MAX_REQUEST_BODY;
pub use process::{BoundServer, GatewayServer};
pub use reload::reload_on_change;
pub use routes::KeySource;
pub use server::{ConnectionSlots, serve, serve_with_slots};
pub use state::{Gateway, Probe};
pub use transport::Transport;
