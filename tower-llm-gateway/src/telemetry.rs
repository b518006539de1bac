//! Tracing set-up for a gateway process: which spans exist at all.
//!
//! A span costs a few microseconds to create, enter, exit and close, and an
//! OpenTelemetry span more (attributes, timings, its context), several
//! times per call. The binary samples only calls that arrive with a W3C
//! `traceparent` (`ParentBased(AlwaysOff)`), and logs no span: the spans of
//! every other call would be built and then dropped. [`TracedCallsOnly`] is
//! the subscriber-wide filter that keeps them from being created, while the
//! spans of a call with a trace context, and its trace's continuation to
//! the providers, stay as they are.

use tracing::Metadata;
use tracing::level_filters::LevelFilter;
use tracing::subscriber::{Interest, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The target of the gateway's span for a call that arrived with a W3C
/// trace context (`traceparent`); the span of any other call has the
/// target of the module that serves it.
pub const TRACED_CALL_TARGET: &str = "tower_llm_gateway::traced";

/// A subscriber-wide filter (a [`Layer`] that only filters) for a gateway
/// process: spans at `INFO` and above exist only inside a call that arrived
/// with a trace context (the gateway's span of such a call, target
/// [`TRACED_CALL_TARGET`], and the stack's `llm.call` and `llm.attempt`
/// spans inside it); spans below `INFO` never. Events are left to the other
/// layers' own filters.
///
/// Add it to the subscriber itself, not as a per-layer filter: a per-layer
/// filter hides a span from its layer, but the registry still creates it.
/// Do not use it with a sampler that also samples calls without a parent
/// (their spans would not exist).
///
/// ```
/// use opentelemetry::trace::TracerProvider as _;
/// use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
/// use tower_llm_gateway::telemetry::TracedCallsOnly;
/// use tracing_subscriber::layer::SubscriberExt;
///
/// let tracer = SdkTracerProvider::builder()
///     .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOff)))
///     .build();
/// let subscriber = tracing_subscriber::registry()
///     .with(TracedCallsOnly)
///     .with(tracing_opentelemetry::layer().with_tracer(tracer.tracer("gateway")));
/// # let _ = subscriber;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct TracedCallsOnly;

impl<S> Layer<S> for TracedCallsOnly
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if !meta.is_span() {
            Interest::always()
        } else if *meta.level() > LevelFilter::INFO {
            Interest::never()
        } else {
            Interest::sometimes()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, cx: Context<'_, S>) -> bool {
        if !meta.is_span() {
            return true;
        }
        // Inside a traced call there is a current span: no other exists.
        *meta.level() <= LevelFilter::INFO
            && (meta.target() == TRACED_CALL_TARGET || cx.lookup_current().is_some())
    }
}
