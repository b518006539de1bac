//! Telemetry that needs a tracing subscriber: W3C propagation
//! (`traceparent` and `tracestate`, seed AC 17) to all three providers, the
//! `llm.call` / `llm.attempt` spans and their fields, the sev-1 auth event
//! and the sev-2 events (404, attempts cap). A binary of its own: tests that install a
//! subscriber must not share one with tests that run without (tracing's
//! callsite interest cache is process-wide). Metrics are read through
//! OpenTelemetry's Prometheus exporter.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm::Metrics;
use tower_llm::prelude::*;
use tower_llm::retry::FixedFraction;
use tower_llm_providers::mock::{MockServer, Reply, ScriptedTransport};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

use crate::metrics_support::{prometheus, sample, scrape};

#[tokio::test(start_paused = true)]
async fn seed_ac17_outbound_traceparent_continues_the_inbound_trace() {
    let tracer_provider = SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(tracer_provider.tracer("test")));
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = MockServer::start(Reply::openai_text("hi"))
        .await
        .expect("server");
    let client = tower_llm::providers::https::client_with_connect_timeout(Duration::from_secs(5));
    let provider = tower_llm::providers::OpenAi::new(
        client,
        tower_llm::providers::OpenAiConfig::new(tower_llm::providers::ApiKey::new("k"))
            .with_base_url(&server.url()),
    );
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_retry(RetryLayer::new())
        .service(provider);

    // The inbound request's trace context, as a gateway extracts it.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let inbound_span_id = "00f067aa0ba902b7";
    let remote = SpanContext::new(
        TraceId::from_hex(trace_id).expect("trace id"),
        SpanId::from_hex(inbound_span_id).expect("span id"),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    let inbound = tracing::info_span!("inbound");
    let _ = inbound.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    svc.oneshot(ChatRequest::new("m", vec![Message::user("hi")]))
        .instrument(inbound)
        .await
        .expect("answer");

    let received = server.received();
    let traceparent = received[0]
        .headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .expect("a traceparent header");
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00");
    assert_eq!(parts[1], trace_id, "same trace");
    assert_ne!(parts[2], inbound_span_id, "a child span");
    assert_ne!(parts[2], "0000000000000000");
    assert_eq!(parts[3], "01");
}

/// Records the events a subscriber sees as `level fields` lines.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!(" {}={:?}", field.name(), value));
            }
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                self.0.push_str(&format!(" {}={}", field.name(), value));
            }
        }
        let mut fields = Fields(event.metadata().level().to_string());
        event.record(&mut fields);
        self.0.lock().expect("lock").push(fields.0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_401_emits_one_sev1_error_event_and_never_the_key() {
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let t = ScriptedTransport::new(Reply::openai_error(
        401,
        "invalid_request_error",
        "Incorrect API key provided: mock",
    ));
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_retry(RetryLayer::new())
        .service(t.openai());
    let err = svc
        .oneshot(ChatRequest::new("gpt-4o-mini", vec![Message::user("hi")]))
        .await
        .unwrap_err();
    assert!(err.is_auth());
    let events = capture.0.lock().expect("lock").clone();
    let sev1: Vec<_> = events
        .iter()
        .filter(|e| e.contains("severity=sev-1"))
        .collect();
    assert_eq!(sev1.len(), 1, "{events:#?}");
    assert!(sev1[0].starts_with("ERROR"));
    assert!(sev1[0].contains("status=401"));
    assert!(!events.iter().any(|e| e.contains("Bearer")));
}

/// A raw HTTP service answering `status` every time.
fn answering(
    status: u16,
) -> impl tower::Service<
    http::Request<()>,
    Response = http::Response<()>,
    Error = Failure,
    Future = impl Send,
> + Clone
+ Send {
    tower::service_fn(move |_req: http::Request<()>| async move {
        Ok::<_, Failure>(
            http::Response::builder()
                .status(status)
                .body(())
                .expect("response"),
        )
    })
}

#[tokio::test(start_paused = true)]
async fn http_error_answers_handed_back_count_as_their_failure_not_success() {
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let (meter_provider, registry) = prometheus();
    let meter = meter_provider.meter("tower-llm");
    for status in [401, 503, 400] {
        let svc = ServiceBuilder::new()
            .layer(DeadlineLayer::new(Duration::from_secs(30)).with_metrics(Metrics::new(&meter)))
            .llm_retry(RetryLayer::http().with_rng(FixedFraction(0.5)))
            .service(answering(status));
        let res = svc
            .oneshot(http::Request::new(()))
            .await
            .expect("the answer comes back as it is");
        assert_eq!(res.status(), status);
    }
    let text = scrape(&registry);
    let calls = |outcome| sample(&text, "ai_router_calls_total", &[("outcome", outcome)]);
    assert_eq!(calls("auth_error"), 1.0);
    assert_eq!(calls("all_failed"), 1.0);
    assert_eq!(calls("terminal_4xx"), 1.0);
    assert_eq!(calls("succeeded"), 0.0);
    let events = capture.0.lock().expect("lock").clone();
    let sev1: Vec<_> = events
        .iter()
        .filter(|e| e.contains("severity=sev-1"))
        .collect();
    assert_eq!(sev1.len(), 1, "{events:#?}");
    assert!(sev1[0].contains("status=401"));
}

/// The events of `capture` carrying `severity=sev-2`.
fn sev2(capture: &Capture) -> Vec<String> {
    capture
        .0
        .lock()
        .expect("lock")
        .iter()
        .filter(|e| e.contains("severity=sev-2"))
        .cloned()
        .collect()
}

/// Seed 002 §1 item 9: a 404 (model not found) is a configuration drift
/// the operator must see: one sev-2 event, next to the sev-1 on auth.
#[tokio::test(start_paused = true)]
async fn a_404_emits_one_sev2_event() {
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let t = ScriptedTransport::new(Reply::openai_error(
        404,
        "invalid_request_error",
        "The model `gpt-99` does not exist or you do not have access to it.",
    ));
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_retry(RetryLayer::new())
        .service(t.openai());
    let err = svc
        .oneshot(ChatRequest::new("gpt-99", vec![Message::user("hi")]))
        .await
        .unwrap_err();
    assert!(err.is_not_found());
    let sev2 = sev2(&capture);
    assert_eq!(sev2.len(), 1, "{sev2:#?}");
    assert!(sev2[0].starts_with("WARN"), "{}", sev2[0]);
    assert!(sev2[0].contains("status=404"), "{}", sev2[0]);
    assert!(
        !capture
            .0
            .lock()
            .expect("lock")
            .iter()
            .any(|e| e.contains("severity=sev-1"))
    );
}

/// Seed 002 §1 item 13: hitting the 16-attempt cap is loud: one sev-2
/// event. Six links of 3 attempts each would make 18.
#[tokio::test(start_paused = true)]
async fn hitting_the_attempts_cap_emits_one_sev2_event() {
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let down = || ScriptedTransport::new(Reply::openai_error(503, "server_error", "down"));
    let link = |t: &ScriptedTransport| {
        ServiceBuilder::new()
            .llm_retry(RetryLayer::new().with_rng(FixedFraction(0.5)))
            .service(t.openai())
    };
    let transports: Vec<_> = (0..6).map(|_| down()).collect();
    let mut builder = FallbackLayer::builder(LinkSpec::new("p0", "m"));
    for (i, t) in transports.iter().enumerate().skip(1) {
        builder = builder.or(LinkSpec::new(format!("p{i}"), "m"), link(t));
    }
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(60))
        .llm_fallback(builder.build().expect("chain"))
        .service(link(&transports[0]));
    let err = svc
        .oneshot(ChatRequest::new("m", vec![Message::user("hi")]))
        .await
        .unwrap_err();
    assert!(err.is_attempts_cap_exceeded(), "{err:?}");
    assert_eq!(err.attempts().len(), 16);
    let made: usize = transports.iter().map(|t| t.received().len()).sum();
    assert_eq!(made, 16, "no 17th attempt");
    let sev2 = sev2(&capture);
    assert_eq!(sev2.len(), 1, "{sev2:#?}");
    assert!(sev2[0].starts_with("ERROR"), "{}", sev2[0]);
    assert!(sev2[0].contains("attempts=16"), "{}", sev2[0]);
}

/// One captured span: its name, its parent's name and its fields (as
/// `name=value` strings, values recorded later included).
#[derive(Clone, Debug, Default)]
struct SpanRec {
    name: &'static str,
    parent: Option<&'static str>,
    fields: Vec<String>,
}

impl SpanRec {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .rev()
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
    }
}

/// Records every span a subscriber sees, in creation order.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<(u64, SpanRec)>>>);

struct FieldList<'a>(&'a mut Vec<String>);

impl tracing::field::Visit for FieldList<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push(format!("{}={:?}", field.name(), value));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push(format!("{}={}", field.name(), value));
    }
}

impl<S> tracing_subscriber::Layer<S> for Spans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut rec = SpanRec {
            name: attrs.metadata().name(),
            parent: ctx
                .span(id)
                .and_then(|s| s.parent())
                .map(|p| p.metadata().name()),
            fields: Vec::new(),
        };
        attrs.record(&mut FieldList(&mut rec.fields));
        self.0.lock().expect("lock").push((id.into_u64(), rec));
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut spans = self.0.lock().expect("lock");
        if let Some((_, rec)) = spans.iter_mut().rev().find(|(i, _)| *i == id.into_u64()) {
            values.record(&mut FieldList(&mut rec.fields));
        }
    }
}

impl Spans {
    fn named(&self, name: &str) -> Vec<SpanRec> {
        self.0
            .lock()
            .expect("lock")
            .iter()
            .filter(|(_, r)| r.name == name)
            .map(|(_, r)| r.clone())
            .collect()
    }
}

/// Seed 002 §1.17: `traceparent` and `tracestate` travel together to every
/// provider, and the `llm.call` / `llm.attempt` spans carry their fields.
#[tokio::test(start_paused = true)]
async fn seed_ac17_tracestate_goes_to_all_three_providers_and_spans_carry_their_fields() {
    let tracer_provider = SdkTracerProvider::builder().build();
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(tracer_provider.tracer("test")))
        .with(spans.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let state = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
    let inbound = || {
        let remote = SpanContext::new(
            TraceId::from_hex(trace_id).expect("trace id"),
            SpanId::from_hex("00f067aa0ba902b7").expect("span id"),
            TraceFlags::SAMPLED,
            true,
            state.parse::<TraceState>().expect("trace state"),
        );
        let span = tracing::info_span!("inbound");
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
        span
    };

    let openai = ScriptedTransport::new(Reply::openai_text("hi")).then(Reply::openai_error(
        503,
        "server_error",
        "overloaded",
    ));
    let anthropic = ScriptedTransport::new(Reply::anthropic_text("hi"));
    let bedrock = ScriptedTransport::new(Reply::json(
        200,
        r#"{"output":{"message":{"role":"assistant","content":[{"text":"hi"}]}},"stopReason":"end_turn","usage":{"inputTokens":1,"outputTokens":1,"totalTokens":2},"metrics":{"latencyMs":1}}"#,
    ));
    let retry = || RetryLayer::new().with_rng(FixedFraction(0.5));
    let stack = |svc| {
        ServiceBuilder::new()
            .llm_deadline(Duration::from_secs(30))
            .llm_retry(retry().with_link(tower_llm::Link::new("openai", "gpt-4o-mini")))
            .service(svc)
    };
    stack(openai.openai())
        .oneshot(ChatRequest::new("gpt-4o-mini", vec![Message::user("hi")]))
        .instrument(inbound())
        .await
        .expect("answer after one retry");
    ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_retry(retry())
        .service(anthropic.anthropic())
        .oneshot(ChatRequest::new("claude", vec![Message::user("hi")]))
        .instrument(inbound())
        .await
        .expect("anthropic");
    let bedrock_svc = tower_llm::providers::Bedrock::new(
        bedrock.clone(),
        tower_llm::providers::BedrockConfig::new(
            tower_llm::providers::AwsCredentials::new("AKIDEXAMPLE", "secret"),
            "us-east-1",
        ),
    );
    ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_retry(retry())
        .service(bedrock_svc)
        .oneshot(ChatRequest::new(
            "amazon.nova-micro-v1:0",
            vec![Message::user("hi")],
        ))
        .instrument(inbound())
        .await
        .expect("bedrock");

    for (name, t) in [
        ("openai", &openai),
        ("anthropic", &anthropic),
        ("bedrock", &bedrock),
    ] {
        let received = t.received();
        assert!(!received.is_empty(), "{name}");
        for r in received {
            let header = |h: &str| {
                r.headers
                    .get(h)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let traceparent = header("traceparent").expect("traceparent");
            assert_eq!(traceparent.split('-').nth(1), Some(trace_id), "{name}");
            assert_eq!(header("tracestate").as_deref(), Some(state), "{name}");
        }
    }

    // The OpenAI call: one llm.call span, two llm.attempt children.
    let calls = spans.named("llm.call");
    assert_eq!(calls.len(), 3, "{calls:#?}");
    let call = &calls[0];
    assert_eq!(call.parent, Some("inbound"));
    assert_eq!(call.field("provider"), Some("openai"));
    assert_eq!(call.field("model"), Some("gpt-4o-mini"));
    assert_eq!(call.field("outcome"), Some("succeeded"));
    assert_eq!(call.field("attempts"), Some("2"));
    let attempts = spans.named("llm.attempt");
    assert_eq!(attempts.len(), 4, "{attempts:#?}");
    for (a, (number, outcome, status)) in attempts[..2]
        .iter()
        .zip([("1", "transient", "503"), ("2", "succeeded", "200")])
    {
        assert_eq!(a.parent, Some("llm.call"), "{a:?}");
        assert_eq!(a.field("provider"), Some("openai"), "{a:?}");
        assert_eq!(a.field("model"), Some("gpt-4o-mini"), "{a:?}");
        assert_eq!(a.field("attempt"), Some(number), "{a:?}");
        assert_eq!(a.field("fallback_position"), Some("0"), "{a:?}");
        assert_eq!(a.field("outcome"), Some(outcome), "{a:?}");
        assert_eq!(a.field("http_status"), Some(status), "{a:?}");
    }
}
