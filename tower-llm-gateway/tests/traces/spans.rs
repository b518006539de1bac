//! The gateway continues an inbound `traceparent` upstream. In a test
//! binary of its own: a test that installs a tracing subscriber must not
//! share a binary with tests that run without one (tracing's callsite
//! interest cache is process-wide).

use opentelemetry::trace::TracerProvider as _;
use tower_llm_providers::mock::Reply;
use tracing_subscriber::layer::SubscriberExt;

use crate::support::*;

#[tokio::test(start_paused = true)]
async fn the_inbound_traceparent_is_continued_upstream() {
    let tracer = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(tracer.tracer("test"))),
    );
    let h = start(Reply::openai_text("hi"), Reply::anthropic_text("b"), "").await;
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let a = h
        .send(
            "POST",
            "/v1/chat/completions",
            HELLO,
            &[("traceparent", &format!("00-{trace_id}-b7ad6b7169203331-01"))],
        )
        .await;
    assert_eq!(a.status, 200);
    let sent = h.primary.received()[0]
        .headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .expect("traceparent upstream")
        .to_owned();
    assert!(sent.starts_with(&format!("00-{trace_id}-")), "{sent}");
    assert!(!sent.contains("b7ad6b7169203331"));
}
