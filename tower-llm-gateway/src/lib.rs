//! An OpenAI-compatible LLM gateway on the tower-llm stack: a library and
//! the `tower-llm-gateway` binary.
//!
//! A [`Policy`](tower_llm::config::Policy) file names the providers and
//! the routes (model aliases with their fallback chains) and the settings
//! of every layer; the gateway builds one stack per route (deadline →
//! idempotency, with `[idempotency]` → fallback → per link hedge, with
//! `hedge` → retry → breaker, shared through Redis with
//! `[breaker_shared]` → provider), serves OpenAI's chat
//! completions API over it (unary and server-sent events) with the
//! `[server]` limits, reloads the file safely, probes the providers, and
//! exports Prometheus metrics.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tower_llm::config::Policy;
//! use tower_llm_gateway::{Gateway, KeySource, Transport};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = Policy::from_toml(&std::fs::read_to_string("gateway.toml")?)?;
//! let keys: KeySource = Arc::new(|provider| provider.api_key_from_env());
//! let transport = Transport::per_thread(Duration::from_secs(5));
//! let limits = policy.server;
//! let gateway = Gateway::new(policy, transport, keys)?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! tower_llm_gateway::serve(listener, gateway.router(), limits, async {
//!     let _ = tokio::signal::ctrl_c().await;
//!     Duration::from_secs(30) // how long calls in flight may finish
//! })
//! .await;
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
//! The binary adds the flags `--config`, `--listen` and `--workers` (or
//! `TOWER_LLM_GATEWAY_CONFIG`, `_LISTEN`, `_WORKERS`), the file watcher
//! ([`reload_on_change`]), the probe loop ([`probe_loop`]), the admin
//! token from `TOWER_LLM_GATEWAY_ADMIN_TOKEN` and graceful shutdown;
//! without `--config` it serves [`demo::embedded`].
//!
//! # Feature flags
//!
//! None. The crate needs tokio, axum, tower-http, the OpenTelemetry SDK
//! and Prometheus: the library crates of tower-llm never build them for
//! it.
//!
//! # Serving on every core
//!
//! The binary runs one single-threaded runtime per core, each serving its
//! own listener on one port (`SO_REUSEPORT`) with [`serve_with_slots`]
//! and one shared [`ConnectionSlots`] (so `[server] max_connections`
//! holds for the process), over a [`Transport::per_thread`] (each thread
//! its own provider connections): a call never leaves the thread that
//! accepted it. One [`Gateway`] is shared by all of them. Its subscriber
//! is filtered by [`telemetry::TracedCallsOnly`]. [`serve`] on a
//! multi-threaded runtime works as well, at more CPU per call.

mod admin;
pub mod demo;
mod health;
mod http;
mod routes;
mod server;
mod state;
mod status;
pub mod telemetry;
mod transport;

pub use health::{Probe, probe_loop};
pub use http::MAX_REQUEST_BODY;
pub use server::{ConnectionSlots, serve, serve_with_slots};
pub use state::{Gateway, KeySource, Transport, reload_on_change};
