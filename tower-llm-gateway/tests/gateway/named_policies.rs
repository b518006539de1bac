//! Seed 004's two JSON policy examples (verbatim in `fixtures/`) load as
//! they are, as named policies a route refers to, and do what they say
//! over loopback; a field or value with no meaning here is refused naming
//! it.

use std::time::Duration;

use tower_llm::FailureClass;
use tower_llm::config::{AdmitRule, LinkConfig, Policy};
use tower_llm::retry::{JitterSpec, NamedJitter};
use tower_llm_providers::mock::{MockServer, Reply};

use crate::support::*;

const RETRY_POLICY: &str = include_str!("../fixtures/seed004_retry_policy.json");
const FALLBACK_POLICY: &str = include_str!("../fixtures/seed004_fallback_policy.json");

/// A whole policy (JSON) with the two examples as they are, a breaker
/// policy "provider-A", providers `provider_A` and `provider_B` at the two
/// mocks, and the route `smart` = `provider_A/model_Y` under the
/// operation's policy.
fn policy_json(a: &str, b: &str, retry: &str, fallback: &str) -> String {
    format!(
        r#"{{
        "retry_policies": [{retry}],
        "fallback_policies": [{fallback}],
        "breaker_policies": {{"provider-A": {{"consecutive_failures": 100, "cooldown_ms": 10000}}}},
        "providers": [
            {{"name": "provider_A", "kind": "openai", "base_url": "{a}/v1", "api_key_env": "UNUSED"}},
            {{"name": "provider_B", "kind": "anthropic", "base_url": "{b}", "api_key_env": "UNUSED"}}
        ],
        "routes": [{{
            "model": "smart",
            "chain": [{{"provider": "provider_A", "model": "model_Y"}}],
            "retry_policy": "model.generate"
        }}]
    }}"#
    )
}

fn load(retry: &str, fallback: &str) -> Result<Policy, String> {
    Policy::from_json(&policy_json(
        "http://127.0.0.1:1",
        "http://127.0.0.1:2",
        retry,
        fallback,
    ))
    .map_err(|e| e.to_string())
}

#[test]
fn both_examples_load_as_they_are_and_map_onto_the_layers() {
    let policy = load(RETRY_POLICY, FALLBACK_POLICY).expect("the seed's examples load");
    let r = policy.resolve(&policy.routes[0]).expect("resolves");
    // The operation's retry policy.
    assert_eq!(r.total_ms, 12_000);
    assert_eq!(r.retry.max_attempts, 3);
    assert_eq!(r.retry.attempt_timeout_ms, Some(3_500));
    assert_eq!((r.retry.base_ms(), r.retry.max_ms()), (250, 3_000));
    assert_eq!(r.retry.factor, 2.0);
    assert_eq!(r.retry.jitter, JitterSpec::Named(NamedJitter::Full));
    let retried = r.retry_failures.expect("retryable");
    for class in [
        FailureClass::Timeout,
        FailureClass::Transient,
        FailureClass::RateLimited,
    ] {
        assert!(retried.get(class).retry, "{class:?}");
    }
    // Its breaker policy.
    assert_eq!(r.breaker.consecutive_failures, 100);
    assert_eq!(r.breaker.cooldown, Duration::from_secs(10));
    // The fallback ladder after the route's own link.
    assert_eq!(
        r.chain,
        [
            LinkConfig::new("provider_A", "model_Y"),
            LinkConfig {
                max_attempts: Some(1),
                requires_verification: true,
                ..LinkConfig::new("provider_B", "model_X")
            },
        ]
    );
    let fails_over = r.fallback_failures.expect("trigger");
    assert!(fails_over.get(FailureClass::Transient).failover);
    assert!(fails_over.get(FailureClass::CircuitOpen).failover);
    assert!(!fails_over.get(FailureClass::RateLimited).failover);
    assert!(!fails_over.get(FailureClass::Timeout).failover);
    assert_eq!(
        r.degraded.as_deref(),
        Some(tower_llm::config::DEFAULT_DEGRADED_TEXT)
    );
    assert_eq!(
        r.degraded_admit,
        Some(AdmitRule {
            header: "x-llm-risk".into(),
            any_of: vec!["LOW".into(), "MEDIUM".into()],
        })
    );
    // Each document on its own, too.
    let op: tower_llm::config::OperationPolicy =
        serde_json::from_str(RETRY_POLICY).expect("the retry policy");
    assert_eq!(op.operation, "model.generate");
    let doc: tower_llm::config::FallbackPolicyDoc =
        serde_json::from_str(FALLBACK_POLICY).expect("the fallback policy");
    assert_eq!(doc.steps.len(), 2);
}

#[test]
fn fields_and_values_without_a_meaning_here_are_refused_by_name() {
    let refused = |retry: &str, fallback: &str| load(retry, fallback).expect_err("refused");
    let e = refused(
        &RETRY_POLICY.replace(
            "\"max_attempts\": 3,",
            "\"max_attempts\": 3, \"hedge\": true,",
        ),
        FALLBACK_POLICY,
    );
    assert!(e.contains("at retry_policies[0].hedge:"), "{e}");
    // A real budget needs every link priced and an output cap.
    let e = refused(
        RETRY_POLICY,
        &FALLBACK_POLICY.replace("\"max_total_cost\": \"...\"", "\"max_total_cost\": 0.5"),
    );
    assert!(e.contains("max_total_cost needs max_output_tokens"), "{e}");
    assert!(
        e.contains("max_total_cost needs every link priced: add [prices.provider_A.\"model_Y\"]"),
        "{e}"
    );
    let e = refused(
        RETRY_POLICY,
        &FALLBACK_POLICY.replace(
            "\"max_total_cost\": \"...\"",
            "\"max_total_cost\": \"lots\"",
        ),
    );
    assert!(
        e.contains("max_total_cost: \"lots\" is not an amount of money"),
        "{e}"
    );
    let e = refused(
        &RETRY_POLICY.replace("REQUIRED_FOR_WRITE", "REQUIRED_ALWAYS"),
        FALLBACK_POLICY,
    );
    assert!(e.contains("at retry_policies[0].idempotency:"), "{e}");
    let e = refused(
        RETRY_POLICY,
        &FALLBACK_POLICY.replace("\"APPROVAL\"", "\"BUDGET\""),
    );
    assert!(
        e.contains("at fallback_policies[0].never_bypass[2]:"),
        "{e}"
    );
    let e = refused(
        RETRY_POLICY,
        &FALLBACK_POLICY.replace("\"requires_verification\": true", "\"verified_by\": \"x\""),
    );
    assert!(
        e.contains("at fallback_policies[0].steps[0].verified_by:"),
        "{e}"
    );
    let e = refused(
        &RETRY_POLICY.replace("\"TIMEOUT\",", "\"BREAKER_OPEN\","),
        FALLBACK_POLICY,
    );
    assert!(e.contains("retryable: BreakerOpen is never retried"), "{e}");
    let e = refused(
        RETRY_POLICY,
        &FALLBACK_POLICY.replace("\"BREAKER_OPEN\"", "\"CONTEXT_WINDOW_EXCEEDED\""),
    );
    assert!(e.contains("cannot be a trigger"), "{e}");
    let e = refused(
        RETRY_POLICY,
        &FALLBACK_POLICY.replace("provider_B/model_X", "provider_C/model_X"),
    );
    assert!(e.contains("unknown provider \"provider_C\""), "{e}");
    let e = refused(
        &RETRY_POLICY.replace("model-primary-v2", "model-primary-v3"),
        FALLBACK_POLICY,
    );
    assert!(
        e.contains("unknown fallback_policy \"model-primary-v3\""),
        "{e}"
    );
    let e = refused(
        RETRY_POLICY,
        &FALLBACK_POLICY.replace("provider_B/model_X", "provider_B"),
    );
    assert!(e.contains("neither \"provider/model\""), "{e}");
}

async fn start_seed(a: Reply, b: Reply) -> Harness {
    start_policy(a, b, |a: &MockServer, b: &MockServer| {
        Policy::from_json(&policy_json(
            &a.url(),
            &b.url(),
            RETRY_POLICY,
            FALLBACK_POLICY,
        ))
        .expect("valid")
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn the_seed_policies_drive_the_gateway() {
    // provider_A down: 3 attempts (UNAVAILABLE is retryable), then the
    // ladder's step: provider_B, once, its answer flagged for verification.
    let h = start_seed(
        Reply::openai_error(503, "server_error", "down"),
        Reply::anthropic_text("from B"),
    )
    .await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-llm-provider"), "provider_B");
    assert_eq!(a.header("x-llm-requires-verification"), "true");
    assert_eq!(h.primary.received().len(), 3);
    assert_eq!(h.backup.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_seed_trigger_and_degraded_step_hold() {
    // A 429 is retried (RATE_LIMITED is retryable) but is not a trigger:
    // no failover to provider_B, and no degraded answer either (that is
    // for every link failing).
    let h = start_seed(
        Reply::openai_error(429, "rate_limit_exceeded", "slow down"),
        Reply::anthropic_text("from B"),
    )
    .await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 503, "{}", a.body);
    assert_eq!(h.backup.received().len(), 0);
    assert_eq!(h.primary.received().len(), 3);

    // Both down: the degraded answer, only for LOW and MEDIUM risk.
    let down = || Reply::openai_error(503, "server_error", "down");
    let h = start_seed(down(), down()).await;
    let low = h
        .send(
            "POST",
            "/v1/chat/completions",
            HELLO,
            &[("x-llm-risk", "LOW")],
        )
        .await;
    assert_eq!(low.status, 200, "{}", low.body);
    assert_eq!(low.header("x-llm-degraded"), "true");
    assert_eq!(
        low.json()["choices"][0]["message"]["content"],
        tower_llm::config::DEFAULT_DEGRADED_TEXT
    );
    for risk in [&[("x-llm-risk", "HIGH")][..], &[][..]] {
        let a = h.send("POST", "/v1/chat/completions", HELLO, risk).await;
        assert_eq!(a.status, 503, "{}", a.body);
    }
}
