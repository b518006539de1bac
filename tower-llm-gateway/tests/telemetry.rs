//! Telemetry: the seed-002 metrics read through OpenTelemetry's Prometheus
//! exporter (so the names are checked as a scrape reads them) and the
//! breaker gauge. (Tests that need a tracing subscriber are in
//! `traces/propagation.rs`.)

use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm::breaker::BreakerConfig;
use tower_llm::layer::MetricsExt as _;
use tower_llm::prelude::*;
use tower_llm::retry::FixedFraction;
use tower_llm::{GenAiMetrics, Metrics};
use tower_llm_providers::mock::{Reply, ScriptedTransport};

mod metrics_support;
use metrics_support::{prometheus, sample, scrape};

#[derive(Clone)]
struct EuOnly;

#[tokio::test(start_paused = true)]
async fn seed_ac14_counts_after_a_hundred_calls() {
    let (meter_provider, registry) = prometheus();
    let meter = meter_provider.meter("tower-llm");
    let primary_t = ScriptedTransport::new(Reply::openai_text("primary"));
    let fallback_t = ScriptedTransport::new(Reply::openai_text("fallback"));
    let genai = GenAiMetrics::new(&meter);
    let primary = primary_t.openai().with_metrics(genai.clone());
    let fallback = fallback_t.openai().with_metrics(genai);

    let breaker = BreakerLayer::new();
    let link = |svc| {
        ServiceBuilder::new()
            .llm_retry(RetryLayer::new().with_rng(FixedFraction(0.5)))
            .llm_breaker(breaker.clone())
            .service(svc)
    };
    let chain = FallbackLayer::builder(LinkSpec::new("primary", "gpt-4o-mini"))
        .or(
            LinkSpec::new("fallback", "claude")
                .with_admission(|req: &ChatRequest| req.extensions.get::<EuOnly>().is_none()),
            link(fallback),
        )
        .build()
        .expect("chain");
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)).with_metrics(Metrics::new(&meter)))
        .llm_fallback(chain)
        .service(link(primary));

    let down = || Reply::openai_error(503, "server_error", "overloaded");
    let mut retried_attempts = 0;
    let (mut ok, mut failed) = (0, 0);
    for i in 0..100 {
        let mut req = ChatRequest::new("m", vec![Message::user("hi")]);
        // Every tenth call the primary is down: 8 fail over, 2 may not
        // leave the EU (the fallback does not admit them) and fail.
        if i % 10 == 9 {
            for _ in 0..3 {
                primary_t.push(down());
            }
            if i >= 80 {
                req.extensions.insert(EuOnly);
            }
        }
        let attempts = match svc.clone().oneshot(req).await {
            Ok(res) => {
                ok += 1;
                res.attempts
            }
            Err(e) => {
                failed += 1;
                assert!(e.is_all_links_failed(), "{e:?}");
                e.attempts().to_vec()
            }
        };
        retried_attempts += attempts
            .iter()
            .filter(|a| a.next == tower_llm::NextStep::Retried)
            .count();
    }
    assert_eq!((ok, failed), (98, 2));

    let text = scrape(&registry);
    let calls = |outcome| sample(&text, "ai_router_calls_total", &[("outcome", outcome)]);
    assert_eq!(calls("succeeded"), 98.0);
    assert_eq!(calls("all_failed"), 2.0);
    assert_eq!(calls("terminal_4xx") + calls("auth_error"), 0.0);
    assert_eq!(
        sample(
            &text,
            "ai_router_calls_total",
            &[("provider", "fallback"), ("outcome", "succeeded")]
        ),
        8.0
    );
    assert_eq!(
        sample(
            &text,
            "ai_router_failovers_total",
            &[("from", "primary"), ("to", "fallback")]
        ),
        8.0
    );
    let retries = sample(&text, "ai_router_retries_total", &[]);
    assert!(retries >= retried_attempts as f64);
    assert_eq!(retries, 20.0); // 10 failing calls, 2 retries each
    assert_eq!(
        sample(
            &text,
            "ai_router_retries_total",
            &[("provider", "primary"), ("reason", "5xx")]
        ),
        20.0
    );
    // 90 + 8 × (3 + 1) + 2 × 3 attempts.
    assert_eq!(
        sample(&text, "ai_router_attempts_per_call_count", &[]),
        100.0
    );
    assert_eq!(sample(&text, "ai_router_attempts_per_call_sum", &[]), 128.0);
    assert_eq!(sample(&text, "ai_router_latency_ms_count", &[]), 128.0);
    assert_eq!(sample(&text, "ai_router_deadline_exceeded_total", &[]), 0.0);
    // The GenAI conventions on the provider services: one duration per
    // provider call, two token samples per answer.
    assert_eq!(
        sample(&text, "gen_ai_client_operation_duration_seconds_count", &[]),
        128.0
    );
    assert_eq!(
        sample(
            &text,
            "gen_ai_client_operation_duration_seconds_count",
            &[("error_type", "transient")]
        ),
        30.0
    );
    assert_eq!(
        sample(
            &text,
            "gen_ai_client_token_usage_count",
            &[("gen_ai_token_type", "input")]
        ),
        98.0
    );
    // Names as a Prometheus scrape reads them: no doubled suffixes.
    assert!(!text.contains("_total_total"));
    assert!(text.contains("# TYPE ai_router_calls_total counter"));
    assert!(text.contains("# TYPE ai_router_latency_ms histogram"));
}

#[tokio::test(start_paused = true)]
async fn a_deadline_exceeded_call_is_counted_once() {
    let (meter_provider, registry) = prometheus();
    let meter = meter_provider.meter("tower-llm");
    let t = ScriptedTransport::new(Reply::Hang);
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(2)).with_metrics(Metrics::new(&meter)))
        .llm_retry(RetryLayer::new())
        .service(t.openai());
    let err = svc
        .oneshot(ChatRequest::new("m", vec![Message::user("hi")]))
        .await
        .unwrap_err();
    assert!(err.is_deadline_exceeded());
    let text = scrape(&registry);
    assert_eq!(sample(&text, "ai_router_deadline_exceeded_total", &[]), 1.0);
    assert_eq!(
        sample(
            &text,
            "ai_router_calls_total",
            &[("outcome", "all_failed"), ("provider", "default")]
        ),
        1.0
    );
}

#[tokio::test(start_paused = true)]
async fn the_breaker_gauge_moves_closed_open_half_open_closed() {
    let (meter_provider, registry) = prometheus();
    let meter = meter_provider.meter("tower-llm");
    let breaker = BreakerLayer::new()
        .with_config(BreakerConfig::default())
        .expect("config");
    let _gauge = breaker.handle().register_gauge(&meter);
    let t = ScriptedTransport::new(Reply::openai_text("ok"));
    let svc = ServiceBuilder::new()
        .llm_breaker(breaker)
        .service(t.openai());
    let req = || ChatRequest::new("m", vec![Message::user("hi")]);
    let state = || {
        sample(
            &scrape(&registry),
            "llm_circuit_state",
            &[("provider", "default")],
        )
    };

    svc.clone().oneshot(req()).await.expect("healthy");
    assert_eq!(state(), 0.0);
    for _ in 0..5 {
        t.push(Reply::openai_error(503, "server_error", "down"));
        svc.clone().oneshot(req()).await.unwrap_err();
    }
    assert_eq!(state(), 1.0);
    // After the cooldown, one probe goes through: half-open while it runs.
    tokio::time::sleep(BreakerConfig::default().cooldown + Duration::from_millis(1)).await;
    t.push(Reply::openai_text("back").after(Duration::from_secs(1)));
    let probe = tokio::spawn(svc.clone().oneshot(req()));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(state(), 2.0);
    probe.await.expect("task").expect("the probe succeeds");
    assert_eq!(state(), 0.0);
}

#[tokio::test(start_paused = true)]
async fn a_degraded_answer_is_not_a_success() {
    let (meter_provider, registry) = prometheus();
    let meter = meter_provider.meter("tower-llm");
    let t = ScriptedTransport::new(Reply::openai_error(503, "server_error", "down"));
    let chain = FallbackLayer::builder(LinkSpec::new("primary", "m"))
        .with_degraded(|_f: &Failure| tower_llm::ChatResponse {
            id: String::new(),
            model: "canned".into(),
            provider: "degraded".into(),
            fallback_position: 0,
            degraded: false,
            idempotent_replayed: false,
            cache: None,
            choices: vec![],
            usage: tower_llm::Usage::default(),
            latency: Duration::ZERO,
            attempts: vec![],
        })
        .with_metrics(Metrics::new(&meter))
        .build()
        .expect("chain");
    let svc = ServiceBuilder::new()
        .llm_fallback(chain)
        .llm_retry(RetryLayer::new().with_rng(FixedFraction(0.5)))
        .service(t.openai());
    let res = svc
        .oneshot(ChatRequest::new("m", vec![Message::user("hi")]))
        .await
        .expect("degraded");
    assert!(res.degraded);
    let text = scrape(&registry);
    assert_eq!(
        sample(&text, "ai_router_calls_total", &[("outcome", "all_failed")]),
        1.0
    );
    assert_eq!(
        sample(&text, "ai_router_calls_total", &[("outcome", "succeeded")]),
        0.0
    );
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_call_is_still_counted_with_its_attempts() {
    let (meter_provider, registry) = prometheus();
    let meter = meter_provider.meter("tower-llm");
    let t = ScriptedTransport::new(Reply::Hang);
    t.push(Reply::openai_error(503, "server_error", "down"));
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)).with_metrics(Metrics::new(&meter)))
        .llm_retry(RetryLayer::new().with_rng(FixedFraction(0.5)))
        .service(t.openai());
    // The caller gives up after 5 s: one 503, a retry, then a hang.
    let gave_up = tokio::time::timeout(
        Duration::from_secs(5),
        svc.oneshot(ChatRequest::new("m", vec![Message::user("hi")])),
    )
    .await;
    assert!(gave_up.is_err());
    let text = scrape(&registry);
    assert_eq!(
        sample(&text, "ai_router_calls_total", &[("outcome", "all_failed")]),
        1.0
    );
    assert_eq!(
        sample(&text, "ai_router_retries_total", &[("reason", "5xx")]),
        1.0
    );
    assert_eq!(sample(&text, "ai_router_latency_ms_count", &[]), 2.0);
    assert_eq!(sample(&text, "ai_router_attempts_per_call_sum", &[]), 2.0);
}

/// A call whose last record is a refusal by another link's open circuit:
/// the call is labelled with that last link, the latency with the link
/// that was timed.
#[tokio::test(start_paused = true)]
async fn a_call_ending_on_another_links_refusal_is_labelled_with_that_link() {
    use tower_llm::{AttemptOutcome, AttemptRecord, FailureClass, Link, NextStep};
    let (meter_provider, registry) = prometheus();
    let metrics = Metrics::new(&meter_provider.meter("tower-llm"));
    let a = Link::new("a", "m1");
    let b = Link::new("b", "m2").with_position(1);
    let records = [
        AttemptRecord::new(
            &a,
            1,
            AttemptOutcome::Failed(FailureClass::Transient),
            Duration::from_millis(20),
        )
        .with_next(NextStep::FailedOver),
        AttemptRecord::new(
            &b,
            1,
            AttemptOutcome::Failed(FailureClass::CircuitOpen),
            Duration::ZERO,
        ),
    ];
    let failure = Failure::new(FailureClass::CircuitOpen);
    metrics.record_call(Some(&failure), &records);
    let text = scrape(&registry);
    let count = |name, p, m| sample(&text, name, &[("provider", p), ("model", m)]);
    assert_eq!(count("ai_router_calls_total", "b", "m2"), 1.0);
    assert_eq!(count("ai_router_calls_total", "a", "m1"), 0.0);
    assert_eq!(count("ai_router_latency_ms_count", "a", "m1"), 1.0);
    assert_eq!(count("ai_router_latency_ms_count", "b", "m2"), 0.0);
    assert_eq!(
        sample(
            &text,
            "ai_router_failovers_total",
            &[("from", "a"), ("to", "b")]
        ),
        1.0
    );
}

/// An OpenAI answer naming `model` (as an upstream may, whatever was asked).
fn answer_naming(model: &str) -> Reply {
    Reply::json(
        200,
        serde_json::json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        })
        .to_string(),
    )
}

/// The series of a scrape: every sample line without its value.
fn series(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s.to_owned()))
        .collect()
}

/// Seed 002 §1 item 14: provider and model labels come from configuration
/// only. 3,000 calls, each with its own client model alias (sent upstream
/// as is: the links do not rewrite it) and its own model name in the
/// upstream answer, some failing over, some straight to a provider with no
/// link: the label sets after 100 calls are the label sets after 3,000.
#[tokio::test(start_paused = true)]
async fn seed_ac14_labels_do_not_grow_with_client_aliases_or_upstream_names() {
    let (meter_provider, registry) = prometheus();
    let meter = meter_provider.meter("tower-llm");
    let genai = GenAiMetrics::new(&meter);
    let primary_t = ScriptedTransport::new(answer_naming("upstream-default"));
    let backup_t = ScriptedTransport::new(answer_naming("upstream-default"));
    let bare_t = ScriptedTransport::new(answer_naming("upstream-default"));
    let link = |svc| {
        ServiceBuilder::new()
            .llm_retry(RetryLayer::new().with_rng(FixedFraction(0.5)))
            .llm_breaker(BreakerLayer::new())
            .service(svc)
    };
    let chain = FallbackLayer::builder(LinkSpec::new("primary", "gpt-4o-mini"))
        .or(
            LinkSpec::new("backup", "claude-x"),
            link(backup_t.openai().with_metrics(genai.clone())),
        )
        .build()
        .expect("chain");
    let deadline =
        || DeadlineLayer::new(Duration::from_secs(30)).with_metrics(Metrics::new(&meter));
    let svc = ServiceBuilder::new()
        .layer(deadline())
        .llm_fallback(chain)
        .service(link(primary_t.openai().with_metrics(genai.clone())));
    let bare = ServiceBuilder::new()
        .layer(deadline())
        .llm_retry(RetryLayer::new().with_rng(FixedFraction(0.5)))
        .service(bare_t.openai().with_metrics(genai));

    let down = || Reply::openai_error(503, "server_error", "overloaded");
    let mut after_100 = None;
    for i in 0..3_000 {
        let alias = format!("alias-{i}");
        let upstream = format!("upstream-{i}");
        if i % 10 == 9 {
            for _ in 0..3 {
                primary_t.push(down());
            }
            backup_t.push(answer_naming(&upstream));
        } else {
            primary_t.push(answer_naming(&upstream));
        }
        let res = svc
            .clone()
            .oneshot(ChatRequest::new(alias.as_str(), vec![Message::user("hi")]))
            .await
            .expect("served");
        assert_eq!(res.model, upstream);
        if i % 3 == 0 {
            bare_t.push(answer_naming(&upstream));
            bare.clone()
                .oneshot(ChatRequest::new(alias.as_str(), vec![Message::user("hi")]))
                .await
                .expect("served");
        }
        if i == 99 {
            after_100 = Some(series(&scrape(&registry)));
        }
    }
    let text = scrape(&registry);
    assert!(!text.contains("alias-"), "a client alias became a label");
    assert!(
        !text.contains("upstream-"),
        "an upstream name became a label"
    );
    assert_eq!(Some(series(&text)), after_100, "the label sets grew");
    // The calls are all there, under configured names.
    assert_eq!(
        sample(&text, "ai_router_calls_total", &[("outcome", "succeeded")]),
        4_000.0
    );
    assert_eq!(
        sample(
            &text,
            "ai_router_calls_total",
            &[("provider", "backup"), ("model", "claude-x")]
        ),
        300.0
    );
    assert_eq!(
        sample(
            &text,
            "gen_ai_client_operation_duration_seconds_count",
            &[("gen_ai_request_model", "gpt-4o-mini")]
        ),
        2_700.0 + 900.0
    );
}

#[tokio::test(start_paused = true)]
async fn hedges_are_counted_won_lost_and_skipped_by_the_budget() {
    use tower_llm::hedge::{HedgeConfig, HedgeLayer};
    let (meter_provider, registry) = prometheus();
    let meter = meter_provider.meter("tower-llm");
    // Call by call: the first waits 1 s (its hedge, 10 ms, wins); the
    // second 300 ms (it beats its hedge, 1 s); the third 1 s again (no
    // budget left for its hedge).
    let transport = ScriptedTransport::new(Reply::openai_text("x"))
        .then(Reply::openai_text("slow").after(Duration::from_secs(1)))
        .then(Reply::openai_text("hedge").after(Duration::from_millis(10)))
        .then(Reply::openai_text("first").after(Duration::from_millis(300)))
        .then(Reply::openai_text("hedge").after(Duration::from_secs(1)))
        .then(Reply::openai_text("alone").after(Duration::from_secs(1)));
    let budget = std::sync::Arc::new(
        tower_llm::retry::RetryBudget::new(Duration::from_secs(10), 0, 1.0).expect("budget"),
    );
    let hedge = HedgeLayer::new(HedgeConfig {
        delay_ms: 200,
        ..HedgeConfig::default()
    })
    .expect("valid")
    .with_budget(budget.clone())
    .with_metrics(Metrics::new(&meter));
    let svc = ServiceBuilder::new()
        .llm_hedge(hedge)
        .service(transport.openai());
    let req = || ChatRequest::new("m", vec![Message::user("hi")]);
    assert_eq!(
        svc.clone().oneshot(req()).await.expect("ok").text(),
        "hedge"
    );
    assert_eq!(
        svc.clone().oneshot(req()).await.expect("ok").text(),
        "first"
    );
    // The third call deposits a third hedge's worth (100 %): spend it
    // before the hedge is due.
    let third = tokio::spawn(svc.oneshot(req()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(tower::retry::budget::Budget::withdraw(&*budget));
    assert_eq!(third.await.expect("joined").expect("ok").text(), "alone");
    let text = scrape(&registry);
    for (outcome, n) in [("won", 1.0), ("lost", 1.0), ("skipped_budget", 1.0)] {
        assert_eq!(
            sample(&text, "ai_router_hedges_total", &[("outcome", outcome)]),
            n,
            "{outcome}: {text}"
        );
    }
}

/// The telemetry wiring of `docs/telemetry.md`, as it is there (compiled here, where
/// the crates it uses are dependencies).
mod readme_wiring {
    use opentelemetry::trace::TracerProvider as _;
    use tower_llm::prelude::*;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    pub(crate) fn telemetry() -> Result<prometheus::Registry, Box<dyn std::error::Error>> {
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .build()?;
        let meters = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_reader(exporter)
            .build();
        opentelemetry::global::set_meter_provider(meters.clone()); // before building the layers

        let tracer = opentelemetry_sdk::trace::SdkTracerProvider::builder().build(); // + your span exporter
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(tracer.tracer("my-gateway")))
            .init();

        let breaker = BreakerLayer::new();
        let _gauge = breaker
            .handle()
            .register_gauge(&opentelemetry::global::meter("tower-llm"));
        Ok(registry)
    }
}

#[test]
fn the_readme_wiring_compiles() {
    // Compiled, not run: it installs global providers.
    let wiring: fn() -> Result<prometheus::Registry, Box<dyn std::error::Error>> =
        readme_wiring::telemetry;
    let _ = wiring;
}
