//! A per-key circuit breaker for LLM calls that fails fast and cannot wedge.
//!
//! When a provider is down, every call that waits for its timeout burns the
//! caller's deadline. [`BreakerLayer`] makes a sick provider cost nothing:
//! its calls fail at once with a *circuit open* failure (so a fallback
//! layer moves on), while a few probes find out when it is back.
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass, Message};
//! use tower_llm_breaker::{BreakerConfig, BreakerLayer, CircuitState};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let layer = BreakerLayer::new()
//!     .with_config(BreakerConfig { consecutive_failures: 2, ..BreakerConfig::default() })
//!     .unwrap();
//! let handle = layer.handle();
//! let down = service_fn(|_: ChatRequest| async {
//!     Err::<ChatResponse, _>(Failure::new(FailureClass::Transient))
//! });
//! let svc = layer.layer(down);
//! let req = || ChatRequest::new("m", vec![Message::user("hi")]);
//!
//! for _ in 0..2 {
//!     assert!(svc.clone().oneshot(req()).await.unwrap_err().is_transient());
//! }
//! let err = svc.clone().oneshot(req()).await.unwrap_err();
//! assert!(err.is_circuit_open());                       // fails fast, inner not called
//! assert_eq!(err.retry_after(), Some(Duration::from_secs(30)));
//! assert_eq!(handle.snapshot()[0].state, CircuitState::Open);
//! # }
//! ```
//!
//! # States
//!
//! - **Closed**: calls flow. It opens when either trigger fires:
//!   `consecutive_failures` tripping failures in a row (default 5), or, if
//!   configured, a failure ratio over a rolling window with a minimum number
//!   of calls. An optional slow-call threshold counts slow successes as
//!   failures, for the breaker only.
//! - **Open**: calls fail fast with [`FailureClass::CircuitOpen`](tower_llm_core::FailureClass::CircuitOpen),
//!   `retry_after` = the rest of the cooldown; the inner service is not
//!   called. Cooldown 30 s, optionally growing on consecutive re-opens up to
//!   a cap. Opening an open circuit again only ever extends it.
//! - **Half-open** after the cooldown: exactly `half_open_probes` calls
//!   (default 1) are let through; the rest fail fast. That many successes
//!   close it; a failure re-opens it.
//! - **Isolated**: opened by hand ([`BreakerHandle::isolate`]) until closed
//!   by hand.
//!
//! # It cannot wedge
//!
//! A probe whose outcome never arrives (its future dropped: the caller went
//! away, the deadline fired) frees its slot on drop. A probe still
//! outstanding after a full cooldown is presumed lost and a fresh one is
//! admitted. So a half-open circuit always gets another probe.
//!
//! # What trips it, and what does not
//!
//! Trips (by default, from the [`FailurePolicy`](tower_llm_core::FailurePolicy)):
//! transient (5xx, 529 overloaded, connect error, reset), timeout, rate
//! limited, quota exhausted, invalid response. A call cut off by the retry
//! layer's per-attempt timeout counts as a timeout (the breaker reads the
//! attempt record as the call is dropped). Never: client errors (400,
//! 401/403, 404, context window, content filtered), cancellation, deadline
//! exceeded, or another breaker's refusal: they neither trip nor reset it.
//!
//! A 429 with a `Retry-After` of at least `min_rate_limit_hold` (1 s by
//! default) holds its key for that long (capped at 5 min; on by default):
//! new attempts on the key are refused without reaching the provider: as
//! *circuit open* when links follow in the fallback chain
//! ([`Link::has_alternates_after`](tower_llm_core::Link::has_alternates_after):
//! the call goes to the next link at once), and otherwise as *rate
//! limited* with the rest of the hold as their `retry_after`, which a
//! retry layer outside waits out when the call's deadline allows (a hold
//! only delays; the circuit is not open). Then everyone is let through
//! again. A hold is not a state
//! change: a healthy (closed) key never becomes a one-probe-at-a-time key
//! because of it, and a held 429 does not count toward opening. A shorter
//! `Retry-After` (`0` or a past date included) is the retry layer's business
//! alone (it waits at least its backoff before its next attempt); such a 429
//! counts as an ordinary rate-limited failure.
//!
//! # Keys
//!
//! One circuit per [`BreakerKey`]: by default provider and model of the
//! request's [`Link`](tower_llm_core::Link) (set by the fallback layer) or of
//! the layer's own. A key function can add a scope (credential, tenant,
//! region, endpoint): one tenant's revoked key must not open the circuit for
//! everyone. [`AuthorityKey`] keys raw HTTP calls by URI authority.
//!
//! # Where it goes, and why
//!
//! Inside the retry and fallback layers: `deadline → fallback → retry →
//! breaker → provider`. Inside fallback, so an open circuit makes the
//! fallback skip to the next link instead of failing the call; inside retry,
//! so each attempt is admitted or refused, and a refusal is never retried on
//! the same link (*circuit open* is not retryable; it fails over at once).
//!
//! # Attempts or calls
//!
//! Because it sits inside retry, the breaker sees every attempt, and by
//! default counts each one. The consequence, in numbers: with 3 attempts
//! per call and `consecutive_failures = 5`, the circuit opens on the 2nd
//! attempt of the 2nd failed call (3 + 2 = 5 failures), so 2 failed calls
//! open it, not 5; the 3rd attempt of that call is refused and the call
//! fails over. To count one outcome per logical call per link instead
//! (seed 000), set [`BreakerConfig::count`] to [`BreakerCount::Calls`]
//! (`count = "calls"`, or [`BreakerLayer::with_count`]): a call's first
//! failure on a link counts, its further failures there do not, a success
//! does; the same threshold then opens on the first attempt of the 5th
//! failed call (4 × 3 + 1 = 13 attempts).
//!
//! # Attempt records
//!
//! Inside a retry layer, the breaker reads the record the retry layer made
//! for the attempt. Without one (a `deadline → breaker` or `deadline →
//! fallback → breaker` stack), it writes the record of each attempt
//! itself: provider and model of the link, attempt number, outcome,
//! elapsed, HTTP status; a refusal is recorded as *circuit open*.
//!
//! # Errors, not responses
//!
//! A refusal is a [`Failure`](tower_llm_core::Failure) naming the provider
//! and model. Unlike a load-shed, `poll_ready` never refuses: the key is not
//! known before the request, so readiness is the inner service's and the
//! refusal happens in `call`.
//!
//! # Hot path
//!
//! Admission in the closed state and fail-fast in the open state are a few
//! atomic loads; the store is sharded (no global lock); no lock is ever held
//! across an `.await`. The [`BreakerStore`] trait lets another store be
//! plugged in without touching the layer.
//!
//! # Feature flags
//!
//! None.
//!
//! # Sharing circuits between replicas
//!
//! A store can share circuits with other processes (as
//! `tower-llm-breaker-redis` does through Redis) without touching the
//! layer: it makes its circuits with [`Circuit::with_events`], learns what
//! each counts through [`CircuitEvents`], gates half-open probes with
//! [`CircuitEvents::permit_probe`], and applies what other replicas decided
//! with [`Circuit::adopt_open`], [`adopt_closed`](Circuit::adopt_closed)
//! and [`adopt_isolated`](Circuit::adopt_isolated). A plain [`MemoryStore`]
//! pays one branch on `None` for it.

mod circuit;
mod config;
mod events;
mod future;
mod handle;
mod key;
mod layer;
mod service;
mod state;
mod store;

pub use circuit::Circuit;
pub use config::{BreakerConfig, BreakerCount, RatioTrigger};
pub use events::{CircuitEvent, CircuitEvents};
pub use future::ResponseFuture;
pub use handle::BreakerHandle;
pub use key::{AuthorityKey, BreakerKey, KeyFn, KeyView, LinkKey};
pub use layer::{BreakerLayer, InvalidBreakerConfig, Observer};
pub use service::Breaker;
pub use state::{CircuitSnapshot, CircuitState, Transition, TransitionReason};
pub use store::{BreakerStore, MemoryStore};
