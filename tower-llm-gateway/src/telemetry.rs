//! Tracing set-up for a gateway process: which spans the OpenTelemetry
//! layer builds.
//!
//! An OpenTelemetry span costs a few microseconds to build, enter, exit and
//! close (attributes, timings, its context), several times per call. The
//! binary samples only calls that arrive with a W3C `traceparent`
//! (`ParentBased(AlwaysOff)`): the spans of every other call are built and
//! then dropped unsampled. [`TracedCallsOnly`] is the per-layer filter that
//! skips them: give it to the OpenTelemetry layer and only calls that carry
//! a trace context build span data, while their trace still continues to
//! the providers unchanged.

use tracing::Metadata;
use tracing::level_filters::LevelFilter;
use tracing::subscriber::{Interest, Subscriber};
use tracing_subscriber::layer::{Context, Filter};
use tracing_subscriber::registry::LookupSpan;

/// The target of the gateway's span for a call that arrived with a W3C
/// trace context (`traceparent`); the span of any other call has the
/// target of the module that serves it.
pub const TRACED_CALL_TARGET: &str = "tower_llm_gateway::traced";

/// A per-layer filter (for the OpenTelemetry layer of a gateway process)
/// that enables spans and events at `INFO` and above only inside a call
/// that arrived with a trace context: the gateway's span of such a call
/// (target [`TRACED_CALL_TARGET`]) and everything inside it (the
/// `llm.call` and `llm.attempt` spans of the stack, and events).
///
/// Outside such calls nothing reaches the layer, so no span data is built
/// for spans a `ParentBased(AlwaysOff)` sampler would drop; do not use it
/// with a sampler that also samples calls without a parent (their spans
/// would not exist).
///
/// ```
/// use opentelemetry::trace::TracerProvider as _;
/// use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
/// use tower_llm_gateway::telemetry::TracedCallsOnly;
/// use tracing_subscriber::Layer as _;
/// use tracing_subscriber::layer::SubscriberExt;
///
/// let tracer = SdkTracerProvider::builder()
///     .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOff)))
///     .build();
/// let subscriber = tracing_subscriber::registry().with(
///     tracing_opentelemetry::layer()
///         .with_tracer(tracer.tracer("gateway"))
///         .with_filter(TracedCallsOnly),
/// );
/// # let _ = subscriber;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct TracedCallsOnly;

impl<S> Filter<S> for TracedCallsOnly
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn enabled(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool {
        if *meta.level() > LevelFilter::INFO {
            return false;
        }
        // `lookup_current` of a filtered context sees only the spans this
        // filter enabled: inside a traced call, there is one.
        (meta.is_span() && meta.target() == TRACED_CALL_TARGET) || cx.lookup_current().is_some()
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if *meta.level() > LevelFilter::INFO {
            Interest::never()
        } else {
            Interest::sometimes()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::INFO)
    }
}
