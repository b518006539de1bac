//! OpenTelemetry metrics of a logical call, through the `opentelemetry` API
//! only: the host installs the SDK and an exporter; without one the global
//! meter is a no-op.
//!
//! The instruments and their closed label sets (seed 002 §1 item 14), by
//! their Prometheus names. Counters are OpenTelemetry instruments named
//! without the `_total` suffix (`ai_router_calls`, ...), which
//! OpenTelemetry's Prometheus exporters append, so a Prometheus scrape
//! reads exactly the names below; histograms carry no unit suffix.
//!
//! | instrument | kind | labels |
//! |---|---|---|
//! | `ai_router_calls_total` | counter, one per logical call | `provider`, `model`, `outcome` ∈ `succeeded`, `terminal_4xx`, `auth_error`, `all_failed` |
//! | `ai_router_retries_total` | counter, one per retried attempt | `provider`, `reason` ∈ `5xx`, `429`, `timeout`, `conn_reset` |
//! | `ai_router_failovers_total` | counter, one per switch to another link | `from`, `to` |
//! | `ai_router_latency_ms` | histogram, one per attempt | `provider`, `model` |
//! | `ai_router_deadline_exceeded_total` | counter | none |
//! | `ai_router_attempts_per_call` | histogram, one per logical call | `final_outcome` (as `outcome`) |
//! | `ai_router_hedges_total` | counter, one per hedge decision | `outcome` ∈ `won`, `lost`, `skipped_budget` |
//! | `ai_router_idempotent_replays_total` | counter, one per answer replayed from an idempotency store | none |
//! | `ai_router_cache_total` | counter, one per call a response cache saw | `status` ∈ `hit`, `miss`, `stale` |
//! | `ai_router_cost_total` | counter of dollars (a float), added as each priced attempt settles | `provider`, `model` |
//! | `ai_router_pool_moves_total` | counter, one per call a pool moved away from a deployment (its own fault) | `provider` (the deployment left), `reason` ∈ a failure class label, `paced` |
//!
//! They are recorded by the layer that owns the call's [`AttemptLog`] (the
//! outermost tower-llm layer), once, when the call ends (the hedge and
//! replay counters by the hedge and idempotency layers, when they act), from the call's
//! attempt records: so the counts of one call always agree with each other
//! and with the records returned to the caller. Provider and model labels
//! come from configuration only: the [`Link`](crate::Link) names given to
//! the layers (a closed set the operator configures), `unknown` for a call
//! that made no attempt; never the request's `model` (a client may have
//! chosen it) nor the model an upstream answer names. Outcome and reason
//! labels come from `as_metric_label()` on closed enums, never from `Debug`.
//!
//! [`GenAiMetrics`] are the OpenTelemetry GenAI client conventions
//! (`gen_ai.client.operation.duration`, `gen_ai.client.token.usage`),
//! recorded by the provider services.
//!
//! [`AttemptLog`]: crate::AttemptLog

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry::{KeyValue, Value};

use crate::{AttemptOutcome, AttemptRecord, Failure, FailureClass, NextStep, Usage};

/// The instrumentation scope name of every tower-llm instrument.
pub const METER_NAME: &str = "tower-llm";

/// The outcome label of a finished logical call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallOutcome {
    /// Served (by any link).
    Succeeded,
    /// Ended by a client-side 4xx (bad request, not found, context window,
    /// content filter) that no link can fix.
    Terminal4xx,
    /// Ended by an authentication or permission failure.
    AuthError,
    /// Every link tried failed (including the deadline running out).
    AllFailed,
}

impl CallOutcome {
    /// The outcome of a call that ended with `failure` (`None`: success).
    pub fn of(failure: Option<&Failure>) -> Self {
        let Some(failure) = failure else {
            return CallOutcome::Succeeded;
        };
        if failure.is_all_links_failed() {
            return CallOutcome::AllFailed;
        }
        CallOutcome::of_class(failure.class())
    }

    /// The outcome of a finished call from its result's error (`None` for
    /// `Ok`) and its attempt records: an `Ok` whose last attempt failed (an
    /// HTTP error answer handed back as it is, a degraded answer built
    /// when every link failed) is not a success, but the failure its last
    /// attempt was classified as.
    pub fn of_call(failure: Option<&Failure>, attempts: &[AttemptRecord]) -> Self {
        if failure.is_some() {
            return CallOutcome::of(failure);
        }
        match last_attempt(attempts).map(|r| r.outcome) {
            Some(AttemptOutcome::Failed(class)) => CallOutcome::of_class(class),
            _ => CallOutcome::Succeeded,
        }
    }

    fn of_class(class: FailureClass) -> Self {
        match class {
            FailureClass::Auth => CallOutcome::AuthError,
            FailureClass::BadRequest
            | FailureClass::NotFound
            | FailureClass::Conflict
            | FailureClass::ContextWindowExceeded
            | FailureClass::ContentFiltered => CallOutcome::Terminal4xx,
            _ => CallOutcome::AllFailed,
        }
    }

    /// `succeeded`, `terminal_4xx`, `auth_error` or `all_failed`.
    pub const fn as_metric_label(self) -> &'static str {
        match self {
            CallOutcome::Succeeded => "succeeded",
            CallOutcome::Terminal4xx => "terminal_4xx",
            CallOutcome::AuthError => "auth_error",
            CallOutcome::AllFailed => "all_failed",
        }
    }
}

/// The outcome label of `ai_router_hedges_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HedgeOutcome {
    /// A hedge was sent and answered first.
    Won,
    /// A hedge was sent and the first attempt answered first.
    Lost,
    /// A hedge was due but the hedge budget refused it.
    SkippedBudget,
}

impl HedgeOutcome {
    /// `won`, `lost` or `skipped_budget`.
    pub const fn as_metric_label(self) -> &'static str {
        match self {
            HedgeOutcome::Won => "won",
            HedgeOutcome::Lost => "lost",
            HedgeOutcome::SkippedBudget => "skipped_budget",
        }
    }
}

struct Instruments {
    hedges: Counter<u64>,
    replays: Counter<u64>,
    cache: Counter<u64>,
    calls: Counter<u64>,
    retries: Counter<u64>,
    failovers: Counter<u64>,
    latency: Histogram<f64>,
    deadline_exceeded: Counter<u64>,
    attempts_per_call: Histogram<u64>,
    cost: Counter<f64>,
    pool_moves: Counter<u64>,
}

/// The per-call router metrics (see the [module docs](self)); cheap to
/// clone.
///
/// ```
/// use tower_llm_core::telemetry::Metrics;
///
/// // Recorded through the global meter: a no-op until the host installs
/// // an OpenTelemetry SDK (install it before building the layers).
/// let metrics = Metrics::global();
/// // Or through a meter of your own, or not at all.
/// let meter = opentelemetry::global::meter("my-app");
/// let _ = (metrics, Metrics::new(&meter), Metrics::disabled());
/// ```
#[derive(Clone)]
pub struct Metrics {
    inner: Option<Arc<Instruments>>,
}

impl Metrics {
    /// The instruments, created on `meter`.
    pub fn new(meter: &Meter) -> Self {
        let instruments = Instruments {
            hedges: meter
                .u64_counter("ai_router_hedges")
                .with_description(
                    "Hedge decisions: a hedge that won, lost, or was refused by its budget",
                )
                .build(),
            replays: meter
                .u64_counter("ai_router_idempotent_replays")
                .with_description("Answers replayed from an idempotency store (no provider call)")
                .build(),
            cache: meter
                .u64_counter("ai_router_cache")
                .with_description(
                    "Calls a response cache saw: answered fresh (hit), by a provider (miss), or stale when every provider failed",
                )
                .build(),
            calls: meter
                .u64_counter("ai_router_calls")
                .with_description("Logical LLM calls, one per terminal decision")
                .build(),
            retries: meter
                .u64_counter("ai_router_retries")
                .with_description("Attempts retried on the same link, by reason")
                .build(),
            failovers: meter
                .u64_counter("ai_router_failovers")
                .with_description("Switches from one link of a fallback chain to the next")
                .build(),
            latency: meter
                .f64_histogram("ai_router_latency_ms")
                .with_description("Latency of each attempt, in milliseconds")
                .with_boundaries(vec![
                    5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1_000.0, 2_500.0, 5_000.0,
                    10_000.0, 30_000.0, 60_000.0, 120_000.0,
                ])
                .build(),
            deadline_exceeded: meter
                .u64_counter("ai_router_deadline_exceeded")
                .with_description("Logical calls ended by their deadline")
                .build(),
            attempts_per_call: meter
                .u64_histogram("ai_router_attempts_per_call")
                .with_description("Attempts made by each logical call")
                .with_boundaries(vec![1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0])
                .build(),
            cost: meter
                .f64_counter("ai_router_cost")
                .with_description("What priced attempts cost, in dollars of the price table")
                .build(),
            pool_moves: meter
                .u64_counter("ai_router_pool_moves")
                .with_description(
                    "Calls a pool moved from one deployment to another (the deployment's own fault)",
                )
                .build(),
        };
        Metrics {
            inner: Some(Arc::new(instruments)),
        }
    }

    /// The instruments on the global meter provider's [`METER_NAME`] meter
    /// (a no-op until the host installs an SDK; instruments are bound when
    /// created, so install the SDK first).
    pub fn global() -> Self {
        Metrics::new(&opentelemetry::global::meter(METER_NAME))
    }

    /// Records nothing.
    pub fn disabled() -> Self {
        Metrics { inner: None }
    }

    /// `false` for [`Metrics::disabled`].
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Adds what one attempt of `provider`'s `model` cost.
    pub(crate) fn count_cost(&self, provider: &crate::Link, cost: crate::Cost) {
        if let Some(m) = self.inner.as_deref() {
            m.cost.add(
                cost.dollars(),
                &[
                    KeyValue::new("provider", provider.provider_arc().clone()),
                    KeyValue::new("model", provider.model_arc().clone()),
                ],
            );
        }
    }

    /// Counts one call a pool moved away from deployment `from`.
    pub(crate) fn count_pool_move(&self, from: &std::sync::Arc<str>, reason: &'static str) {
        if let Some(m) = self.inner.as_deref() {
            m.pool_moves.add(
                1,
                &[
                    KeyValue::new("provider", from.clone()),
                    KeyValue::new("reason", reason),
                ],
            );
        }
    }

    /// Counts one answer replayed by an idempotency layer.
    pub(crate) fn count_idempotent_replay(&self) {
        if let Some(m) = self.inner.as_deref() {
            m.replays.add(1, &[]);
        }
    }

    /// Counts one call a response cache saw.
    pub(crate) fn count_cache(&self, status: crate::CacheStatus) {
        if let Some(m) = self.inner.as_deref() {
            m.cache.add(1, &[KeyValue::new("status", status.as_str())]);
        }
    }

    /// Counts one hedge decision.
    pub(crate) fn count_hedge(&self, outcome: HedgeOutcome) {
        if let Some(m) = self.inner.as_deref() {
            m.hedges
                .add(1, &[KeyValue::new("outcome", outcome.as_metric_label())]);
        }
    }

    /// Records a finished logical call: `failure` is its error (`None` on
    /// success), `attempts` its attempt records.
    pub(crate) fn count_call(&self, failure: Option<&Failure>, attempts: &[AttemptRecord]) {
        let Some(m) = self.inner.as_deref() else {
            return;
        };
        let outcome = CallOutcome::of_call(failure, attempts).as_metric_label();
        let mut made = 0u64;
        let mut previous: Option<&AttemptRecord> = None;
        // The provider and model labels of the latest timed record, reused
        // while the link stays the same (one reference count each, not one
        // per instrument).
        let mut labels: Option<(&AttemptRecord, [KeyValue; 2])> = None;
        for record in attempts {
            if record.outcome == AttemptOutcome::SkippedByPolicy {
                continue;
            }
            made += 1;
            if record.outcome == AttemptOutcome::CancelledByHedge {
                // Raced and lost: an upstream call, but neither a failover
                // nor "the last link" of the call.
                continue;
            }
            if let Some(prev) = previous {
                if prev.fallback_position != record.fallback_position {
                    m.failovers.add(
                        1,
                        &[
                            KeyValue::new("from", arc_value(&prev.provider)),
                            KeyValue::new("to", arc_value(&record.provider)),
                        ],
                    );
                }
            }
            previous = Some(record);
            if record.outcome == AttemptOutcome::Failed(FailureClass::CircuitOpen) {
                // Refused by the breaker: no provider call to time.
                continue;
            }
            if !labels.as_ref().is_some_and(|(r, _)| same_link(r, record)) {
                labels = Some((record, link_labels(record)));
            }
            let Some((_, link)) = &labels else {
                continue;
            };
            m.latency
                .record(record.elapsed.as_secs_f64() * 1_000.0, link);
            if record.next == NextStep::Retried {
                let reason = record.retry_reason().map_or("5xx", |r| r.as_metric_label());
                m.retries
                    .add(1, &[link[0].clone(), KeyValue::new("reason", reason)]);
            }
        }
        let [provider, model] = match (previous, labels) {
            (Some(last), Some((r, link))) if same_link(r, last) => link,
            (Some(last), _) => link_labels(last),
            // No attempt was made (the deadline had passed, say): no
            // link's names to use, and a failure's own provider and model
            // strings are not a closed set.
            (None, _) => [
                KeyValue::new("provider", "unknown"),
                KeyValue::new("model", "unknown"),
            ],
        };
        m.calls
            .add(1, &[provider, model, KeyValue::new("outcome", outcome)]);
        m.attempts_per_call
            .record(made, &[KeyValue::new("final_outcome", outcome)]);
        if failure.is_some_and(Failure::is_deadline_exceeded) {
            m.deadline_exceeded.add(1, &[]);
        }
    }
}

/// The last attempt a call made (skipped links are not attempts).
pub(crate) fn last_attempt(attempts: &[AttemptRecord]) -> Option<&AttemptRecord> {
    attempts.iter().rev().find(|r| {
        !matches!(
            r.outcome,
            AttemptOutcome::SkippedByPolicy | AttemptOutcome::CancelledByHedge
        )
    })
}

fn arc_value(s: &Arc<str>) -> Value {
    Value::from(s.clone())
}

/// Two records of the same provider and model (the same link's names).
fn same_link(a: &AttemptRecord, b: &AttemptRecord) -> bool {
    Arc::ptr_eq(&a.provider, &b.provider) && Arc::ptr_eq(&a.model, &b.model)
}

/// The `provider` and `model` labels of a record.
fn link_labels(record: &AttemptRecord) -> [KeyValue; 2] {
    [
        KeyValue::new("provider", arc_value(&record.provider)),
        KeyValue::new("model", arc_value(&record.model)),
    ]
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("enabled", &self.is_enabled())
            .finish()
    }
}

struct GenAiInstruments {
    duration: Histogram<f64>,
    tokens: Histogram<u64>,
}

/// The OpenTelemetry GenAI client metrics of a provider service:
/// `gen_ai.client.operation.duration` (seconds) and
/// `gen_ai.client.token.usage` (tokens, by `gen_ai.token.type` `input` /
/// `output`), with `gen_ai.operation.name`, `gen_ai.provider.name`,
/// `gen_ai.request.model` and, on failure, `error.type` (the failure
/// class label). The provider services label `gen_ai.request.model` with
/// the configured model of the call's [`Link`](crate::Link) (`unknown`
/// without one), never the request's free-form `model`.
#[derive(Clone)]
pub struct GenAiMetrics {
    inner: Option<Arc<GenAiInstruments>>,
}

impl GenAiMetrics {
    /// The instruments, created on `meter`.
    pub fn new(meter: &Meter) -> Self {
        GenAiMetrics {
            inner: Some(Arc::new(GenAiInstruments {
                duration: meter
                    .f64_histogram("gen_ai.client.operation.duration")
                    .with_unit("s")
                    .with_description("GenAI operation duration")
                    .with_boundaries(vec![
                        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                        40.96, 81.92,
                    ])
                    .build(),
                tokens: meter
                    .u64_histogram("gen_ai.client.token.usage")
                    .with_unit("{token}")
                    .with_description("Measures number of input and output tokens used")
                    .with_boundaries(vec![
                        1.0,
                        4.0,
                        16.0,
                        64.0,
                        256.0,
                        1_024.0,
                        4_096.0,
                        16_384.0,
                        65_536.0,
                        262_144.0,
                        1_048_576.0,
                        4_194_304.0,
                        16_777_216.0,
                        67_108_864.0,
                    ])
                    .build(),
            })),
        }
    }

    /// The instruments on the global meter provider (see
    /// [`Metrics::global`]).
    pub fn global() -> Self {
        GenAiMetrics::new(&opentelemetry::global::meter(METER_NAME))
    }

    /// Records nothing.
    pub fn disabled() -> Self {
        GenAiMetrics { inner: None }
    }

    /// Records one chat operation of `provider`'s `model` that took
    /// `duration`: its usage on success, its class on failure. `model`
    /// becomes a label: pass a configured name, never client input.
    pub fn record_chat(
        &self,
        provider: &'static str,
        model: &str,
        duration: Duration,
        result: Result<&Usage, &Failure>,
    ) {
        let tokens = result.map(|u| (u.prompt_tokens, Some(u.completion_tokens)));
        self.record("chat", provider, model, duration, tokens);
    }

    /// Records one embeddings operation (`gen_ai.operation.name` =
    /// `embeddings`) of `provider`'s `model` that took `duration`: its
    /// input tokens on success (an embedding has no output tokens), its
    /// class on failure. `model` becomes a label: pass a configured name,
    /// never client input.
    pub fn record_embeddings(
        &self,
        provider: &'static str,
        model: &str,
        duration: Duration,
        result: Result<u32, &Failure>,
    ) {
        let tokens = result.map(|input| (input, None));
        self.record("embeddings", provider, model, duration, tokens);
    }

    /// One operation: its duration, and its input (and output) tokens on
    /// success or its class on failure.
    fn record(
        &self,
        operation: &'static str,
        provider: &'static str,
        model: &str,
        duration: Duration,
        tokens: Result<(u32, Option<u32>), &Failure>,
    ) {
        let Some(m) = self.inner.as_deref() else {
            return;
        };
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", operation),
            KeyValue::new("gen_ai.provider.name", provider),
            KeyValue::new("gen_ai.request.model", model.to_owned()),
        ];
        match tokens {
            Ok((input, output)) => {
                m.duration.record(duration.as_secs_f64(), &attributes);
                attributes.push(KeyValue::new("gen_ai.token.type", "input"));
                m.tokens.record(u64::from(input), &attributes);
                if let (Some(output), Some(last)) = (output, attributes.last_mut()) {
                    *last = KeyValue::new("gen_ai.token.type", "output");
                    m.tokens.record(u64::from(output), &attributes);
                }
            }
            Err(failure) => {
                attributes.push(KeyValue::new(
                    "error.type",
                    failure.class().as_metric_label(),
                ));
                m.duration.record(duration.as_secs_f64(), &attributes);
            }
        }
    }
}

impl fmt::Debug for GenAiMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GenAiMetrics")
            .field("enabled", &self.inner.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes() {
        assert_eq!(CallOutcome::of(None).as_metric_label(), "succeeded");
        let auth = Failure::new(FailureClass::Auth);
        assert_eq!(CallOutcome::of(Some(&auth)), CallOutcome::AuthError);
        let bad = Failure::new(FailureClass::BadRequest);
        assert_eq!(CallOutcome::of(Some(&bad)), CallOutcome::Terminal4xx);
        let mut exhausted = Failure::new(FailureClass::BadRequest);
        exhausted.set_all_links_failed(None);
        assert_eq!(CallOutcome::of(Some(&exhausted)), CallOutcome::AllFailed);
        let late = Failure::deadline_exceeded();
        assert_eq!(CallOutcome::of(Some(&late)).as_metric_label(), "all_failed");
        // Disabled metrics accept anything.
        Metrics::disabled().count_call(Some(&late), &[]);
        assert!(format!("{:?}", Metrics::disabled()).contains("false"));
    }
}
