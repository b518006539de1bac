//! `TracedCallsOnly`: no span exists for a call without a trace context
//! (a layer without a filter of its own sees none), every span of a call
//! with one does, and the trace still continues upstream. In a test binary of its own (tracing's
//! callsite interest cache is process-wide).

use std::sync::{Arc, Mutex};

use opentelemetry::trace::TracerProvider as _;
use tower_llm_gateway::telemetry::TracedCallsOnly;
use tower_llm_providers::mock::Reply;
use tracing::Subscriber;
use tracing::span::{Attributes, Id};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use crate::support::*;

/// Names of the spans created.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<&'static str>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Seen {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        self.0
            .lock()
            .expect("not poisoned")
            .push(attrs.metadata().name());
    }
}

impl Seen {
    fn take(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.0.lock().expect("not poisoned"))
    }
}

#[tokio::test(start_paused = true)]
async fn only_calls_with_a_trace_context_build_spans_and_their_trace_continues() {
    let tracer = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_sampler(opentelemetry_sdk::trace::Sampler::ParentBased(Box::new(
            opentelemetry_sdk::trace::Sampler::AlwaysOff,
        )))
        .build();
    let seen = Seen::default();
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::registry()
            .with(TracedCallsOnly)
            .with(seen.clone())
            .with(tracing_opentelemetry::layer().with_tracer(tracer.tracer("test"))),
    );
    let h = start(Reply::openai_text("hi"), Reply::anthropic_text("b"), "").await;

    let plain = h.chat(HELLO).await;
    assert_eq!(plain.status, 200);
    assert_eq!(seen.take(), Vec::<&str>::new());
    assert!(h.primary.received()[0].headers.get("traceparent").is_none());

    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let traced = h
        .send(
            "POST",
            "/v1/chat/completions",
            HELLO,
            &[("traceparent", &format!("00-{trace_id}-b7ad6b7169203331-01"))],
        )
        .await;
    assert_eq!(traced.status, 200);
    assert_eq!(seen.take(), ["gateway.chat", "llm.call", "llm.attempt"]);
    let sent = h.primary.received()[1]
        .headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .expect("traceparent upstream")
        .to_owned();
    assert!(sent.starts_with(&format!("00-{trace_id}-")), "{sent}");
    assert!(
        !sent.contains("b7ad6b7169203331"),
        "a span of ours is the parent"
    );

    // And an untraced call after it builds nothing either.
    assert_eq!(h.chat(HELLO).await.status, 200);
    assert_eq!(seen.take(), Vec::<&str>::new());
}
