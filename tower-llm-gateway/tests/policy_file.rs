//! The policy file: the reference in `docs/policy-file.md` (every key)
//! loads as it is; a misspelt key anywhere is refused with its path; and
//! one behaviour probe per section, through the gateway over loopback
//! (virtual time).

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;
use tower_llm_gateway::GatewayConfig;
use tower_llm_providers::mock::{MockServer, Reply};

mod gateway_support;
use gateway_support::*;

/// The policy reference: the `toml` block under "## Every key" of
/// `docs/policy-file.md`.
fn readme_policy() -> String {
    let readme = include_str!("../../docs/policy-file.md");
    let section = readme
        .split("## Every key")
        .nth(1)
        .expect("a policy file section");
    let block = section.split("```toml\n").nth(1).expect("a toml block");
    block.split("```").next().expect("its end").to_owned()
}

/// Every key a value sets, as `a.b.c` (array items as `[]`).
fn keys(value: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(path.clone());
                keys(v, &path, out);
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                keys(item, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn the_readme_reference_sets_every_key_and_loads_as_it_is() {
    let text = readme_policy();
    let config = GatewayConfig::from_toml(&text).expect("the README's policy loads");
    let policy = &config.policy;
    // Every key the policy has is written in the reference: serialised, a
    // loaded policy shows each key it holds (unset optional keys are left
    // out, so the reference must set them all to show them).
    let mut all = BTreeSet::new();
    keys(&serde_json::to_value(&config).expect("json"), "", &mut all);
    let leaves: BTreeSet<&str> = all
        .iter()
        .map(|k| k.rsplit('.').next().unwrap_or(k))
        .collect();
    for key in &leaves {
        assert!(
            text.contains(&format!("{key} ="))
                || text.contains(&format!("[{key}]"))
                || text.contains(&format!(".{key}]"))
                || text.contains(&format!("[{key}.")),
            "`{key}` is not in the README's reference"
        );
    }
    // The optional keys are set too (each shows up serialised only if set).
    for key in [
        "retry.attempt_timeout_ms",
        "retry.min_attempt_ms",
        "retry.base_ms",
        "retry.max_ms",
        "retry.budget.percent",
        "breaker.failure_ratio.window_ms",
        "breaker.slow_call_ms",
        "providers[].connect_timeout_ms",
        "providers[].first_token_timeout_ms",
        "providers[].idle_timeout_ms",
        "routes[].health_ordering_ms",
        "routes[].resume.max_continuations",
        "routes[].complete.max_ms",
        "routes[].chain[].prefill",
        "complete.max_bytes",
        "cache.max_bytes",
        "cache_shared.prefix",
        "routes[].cache.stale_for_risk",
        "routes[].cache.store_tool_calls",
        "fallback_policies[].steps[].max_stale_ms",
        "providers[].silence.head_timeout_ms",
        "providers[].silence.learned_first_token.cap_ms",
        "routes[].degraded",
        "routes[].chain[].max_attempts",
        "routes[].chain[].attempt_timeout_ms",
        "routes[].chain[].connect_timeout_ms",
        "routes[].chain[].first_token_timeout_ms",
        "routes[].chain[].idle_timeout_ms",
        "routes[].chain[].long_context",
        "routes[].chain[].filtered_content",
        "routes[].chain[].admit.any_of",
        "routes[].degraded_admit.header",
        "routes[].deadline_ms",
        "routes[].retry_policy",
        "routes[].fallback_policy",
        "routes[].breaker_policy",
        "retry_policies[].retryable",
        "retry_policies[].backoff.kind",
        "retry_policies[].idempotency",
        "fallback_policies[].trigger",
        "fallback_policies[].max_total_cost",
        "fallback_policies[].never_bypass",
        "fallback_policies[].steps[].requires_verification",
        "fallback_policies[].steps[].allowed_for_risk",
        "fallback_policies[].steps[].text",
        "breaker_policies.provider-A.consecutive_failures",
        "breaker_shared.redis",
        "breaker_shared.prefix",
        "idempotency.ttl_ms",
        "idempotency.concurrent",
        "routes[].hedge.delay_ms",
        "routes[].chain[].hedge.quantile",
        "routes[].chain[].hedge.min_useful_ms",
        "routes[].max_total_cost",
        "routes[].max_output_tokens",
        "prices.a.gpt-4o-mini.cached_input",
        "quotas.max_tokens",
        "quotas.tenants.acme.max_cost",
        "quotas_shared.local_share",
        "pools_shared.local_share",
        "pools[].affinity_header",
        "pools[].max_waiting",
        "pools[].max_wait_ms",
        "pools[].priority_header",
        "pools[].adaptive_concurrency",
        "pools[].deployments[].weight",
        "pools[].deployments[].model",
        "providers[].rpm",
        "providers[].tpm",
        "providers[].burst_ms",
    ] {
        assert!(all.contains(key), "{key} is not set by the reference");
    }
    // And the values are the layers' own.
    assert_eq!(policy.retry.max_retry_after_ms, 60_000);
    assert_eq!(policy.breaker.consecutive_failures, 5);
    assert_eq!(
        policy.breaker.slow_call,
        Some(Duration::from_millis(20_000))
    );
    assert_eq!(policy.breaker.failure_ratio.map(|r| r.min_calls), Some(20));
    assert!(policy.retry_layer().is_ok());
    // The same policy as JSON loads to the same value.
    let json = serde_json::to_string(&config).expect("json");
    assert_eq!(GatewayConfig::from_json(&json).expect("json loads"), config);
}

#[test]
fn a_misspelt_key_anywhere_is_refused_with_its_path() {
    let text = readme_policy();
    for (after, path) in [
        ("listen = \"127.0.0.1:8080\"", "tiemout_ms"),
        ("total_ms = 30000", "deadline.tiemout_ms"),
        ("max_attempts = 3 ", "retry.tiemout_ms"),
        ("consecutive_failures = 5", "breaker.tiemout_ms"),
        ("first_token_timeout_ms = 30000", "stream.tiemout_ms"),
        ("probe_timeout_ms = 5000", "health.tiemout_ms"),
        ("max_concurrency = 64", "providers[0].tiemout_ms"),
        ("degraded = ", "routes[0].tiemout_ms"),
        ("long_context = true", "routes[0].chain[1].tiemout_ms"),
        ("redis = \"redis://", "breaker_shared.tiemout_ms"),
        ("ttl_ms = 86400000", "idempotency.tiemout_ms"),
    ] {
        let at = text
            .find(after)
            .unwrap_or_else(|| panic!("{after:?} in the README"));
        let line_end = at + text[at..].find('\n').expect("a line");
        let bad = format!("{}\ntiemout_ms = 1{}", &text[..line_end], &text[line_end..]);
        let err = GatewayConfig::from_toml(&bad)
            .expect_err("refused")
            .to_string();
        assert!(err.contains(&format!("at {path}:")), "{path}: {err}");
        assert!(err.contains("unknown field `tiemout_ms`"), "{err}");
    }
    // Inside an inline table too, and in JSON.
    let bad = text.replace(
        "budget = { ttl_ms = 10000,",
        "budget = { ttl_ms = 10000, percnt = 1,",
    );
    let err = GatewayConfig::from_toml(&bad)
        .expect_err("refused")
        .to_string();
    assert!(err.contains("at retry.budget.percnt:"), "{err}");
    let err = GatewayConfig::from_json(
        r#"{"breaker": {"failure_ratio": {"ratio": 0.5, "min_calls": 1, "window": 5}}}"#,
    )
    .expect_err("refused")
    .to_string();
    assert!(err.contains("at breaker.failure_ratio.window:"), "{err}");
    // A value a layer refuses names its field.
    let err =
        GatewayConfig::from_toml(&text.replace("cooldown_growth = 1.0", "cooldown_growth = 0.5"))
            .expect_err("refused")
            .to_string();
    assert!(err.contains("breaker.cooldown_growth"), "{err}");
    // In the hedge tables (the hedge layer's own names and checks).
    let bad = text.replace("hedge = { delay_ms = 800,", "hedge = { delay = 800,");
    let err = GatewayConfig::from_toml(&bad)
        .expect_err("refused")
        .to_string();
    assert!(err.contains("at routes[0].chain[0].hedge.delay:"), "{err}");
    let bad = text.replace("hedge = { delay_ms = 500,", "hedge = { delay_ms = 0,");
    let err = GatewayConfig::from_toml(&bad)
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("route \"smart\": hedge: invalid hedge config: `delay_ms`"),
        "{err}"
    );
    let bad = text.replace("ttl_ms = 86400000", "ttl_ms = 0");
    let err = GatewayConfig::from_toml(&bad)
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("idempotency: ") && err.contains("ttl_ms"),
        "{err}"
    );
    let bad = text.replace("redis = \"redis://", "redis = \"http://");
    let err = GatewayConfig::from_toml(&bad)
        .expect_err("refused")
        .to_string();
    assert!(err.contains("breaker_shared.redis"), "{err}");
}

#[test]
fn the_shared_breaker_url_s_password_never_shows() {
    let text = readme_policy().replace(
        "redis = \"redis://127.0.0.1:6379\"",
        "redis = \"redis://:hunter2@127.0.0.1:6379/0\"",
    );
    let config = GatewayConfig::from_toml(&text).expect("loads");
    let shared = config.settings.breaker_shared.as_ref().expect("set");
    assert_eq!(shared.redacted(), "redis://***@127.0.0.1:6379/0");
    let debug = format!("{config:?}");
    assert!(!debug.contains("hunter2"), "{debug}");
    assert!(debug.contains("redis://***@127.0.0.1:6379/0"), "{debug}");
    let err = GatewayConfig::from_toml(&text.replace("redis://:hunter2@", "http://:hunter2@"))
        .expect_err("refused")
        .to_string();
    assert!(!err.contains("hunter2"), "{err}");
}

fn down() -> Reply {
    Reply::openai_error(503, "server_error", "overloaded")
}

/// A policy over the two mocks with `retry` and `breaker` keys, `health`
/// and `route` keys, and the route's `chain` (as `[[routes.chain]]`
/// tables or an inline `chain = [...]`).
fn text(
    primary: &MockServer,
    backup: &MockServer,
    retry: &str,
    breaker: &str,
    route: &str,
) -> String {
    format!(
        r#"
        [deadline]
        total_ms = 5000
        [retry]
        max_attempts = 3
        base_ms = 100
        factor = 2
        max_ms = 400
        jitter = "none"
        {retry}
        [breaker]
        cooldown_ms = 30000
        {breaker}
        [[providers]]
        name = "primary"
        kind = "openai"
        base_url = "{}/v1"
        api_key_env = "UNUSED"
        health_url = "{}/health"
        [[providers]]
        name = "backup"
        kind = "anthropic"
        base_url = "{}"
        api_key_env = "UNUSED"
        health_url = "{}/health"
        [[routes]]
        model = "smart"
        {route}
        "#,
        primary.url(),
        primary.url(),
        backup.url(),
        backup.url()
    )
}

const INLINE_CHAIN: &str = r#"chain = [{ provider = "primary", model = "gpt-4o-mini" }, { provider = "backup", model = "claude-x" }]"#;

#[tokio::test(start_paused = true)]
async fn retry_a_retry_after_above_max_retry_after_fails_over_at_once() {
    let h = start_text(
        Reply::openai_error(429, "rate_limit_exceeded", "slow down")
            .with_header("retry-after", "5"),
        Reply::anthropic_text("from backup"),
        |p, b| text(p, b, "max_retry_after_ms = 1000", "", INLINE_CHAIN),
    )
    .await;
    let started = Instant::now();
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-llm-provider"), "backup");
    assert_eq!(a.header("x-llm-attempts"), "2");
    assert_eq!(h.primary.received().len(), 1);
    assert!(started.elapsed() < Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn retry_the_budget_caps_retries() {
    // A budget of no share and no floor: no retry at all, so each failed
    // first attempt fails over at once.
    let h = start_text(down(), Reply::anthropic_text("from backup"), |p, b| {
        text(
            p,
            b,
            "budget = { ttl_ms = 10000, min_per_sec = 0, percent = 0.0 }",
            "consecutive_failures = 100",
            INLINE_CHAIN,
        )
    })
    .await;
    for _ in 0..3 {
        let a = h.chat(HELLO).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.header("x-llm-attempts"), "2");
    }
    assert_eq!(h.primary.received().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn breaker_the_ratio_window_opens_the_circuit() {
    let h = start_text(down(), Reply::anthropic_text("from backup"), |p, b| {
        text(
            p,
            b,
            "",
            "consecutive_failures = 0\nfailure_ratio = { ratio = 0.5, min_calls = 4, window_ms = 60000 }",
            INLINE_CHAIN,
        )
    })
    .await;
    // 3 failed attempts: under the minimum of 4 calls, still closed.
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200);
    assert_eq!(h.primary.received().len(), 3);
    // The 4th failure opens it; the 5th attempt is refused and fails over.
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200);
    assert_eq!(h.primary.received().len(), 4);
    let a = h.chat(HELLO).await;
    assert_eq!(a.header("x-llm-provider"), "backup");
    assert_eq!(h.primary.received().len(), 4);
    let circuits = h.send("GET", "/health/circuits", "", &[]).await.json();
    let primary = circuits
        .as_array()
        .expect("a list")
        .iter()
        .find(|c| c["provider"] == "primary")
        .expect("the primary's circuit")
        .clone();
    assert_eq!(primary["state"], "open");
}

#[tokio::test(start_paused = true)]
async fn breaker_slow_calls_count_as_failures() {
    let h = start_text(
        Reply::openai_text("slow").after(Duration::from_millis(300)),
        Reply::anthropic_text("from backup"),
        |p, b| {
            text(
                p,
                b,
                "",
                "consecutive_failures = 2\nslow_call_ms = 100",
                INLINE_CHAIN,
            )
        },
    )
    .await;
    for _ in 0..2 {
        let a = h.chat(HELLO).await;
        assert_eq!(a.header("x-llm-provider"), "primary", "{}", a.body);
    }
    // Two slow successes in a row: open.
    let a = h.chat(HELLO).await;
    assert_eq!(a.header("x-llm-provider"), "backup");
    assert_eq!(h.primary.received().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_link_s_own_max_attempts_overrides_the_route_s() {
    let chain = r#"chain = [{ provider = "primary", model = "gpt-4o-mini", max_attempts = 1 }, { provider = "backup", model = "claude-x" }]"#;
    let h = start_text(down(), Reply::anthropic_text("from backup"), |p, b| {
        text(p, b, "", "", chain)
    })
    .await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("x-llm-attempts"), "2");
    assert_eq!(h.primary.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_long_context_link_takes_a_context_window_failure() {
    let too_long = || {
        Reply::openai_error(
            400,
            "context_length_exceeded",
            "This model's maximum context length is 8192 tokens",
        )
    };
    let plain = start_text(too_long(), Reply::anthropic_text("long"), |p, b| {
        text(p, b, "", "", INLINE_CHAIN)
    })
    .await;
    assert_eq!(plain.chat(HELLO).await.status, 400);
    assert_eq!(plain.backup.received().len(), 0);

    let chain = r#"
        [[routes.chain]]
        provider = "primary"
        model = "gpt-4o-mini"
        [[routes.chain]]
        provider = "backup"
        model = "claude-x"
        long_context = true
    "#;
    let h = start_text(too_long(), Reply::anthropic_text("long"), |p, b| {
        text(p, b, "", "", chain)
    })
    .await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-llm-provider"), "backup");
    assert_eq!(h.primary.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_admission_rule_keeps_requests_off_a_link_outside_their_region() {
    let chain = r#"
        [[routes.chain]]
        provider = "primary"
        model = "gpt-4o-mini"
        [[routes.chain]]
        provider = "backup"
        model = "claude-x"
        admit = { header = "x-tenant-region", any_of = ["eu-west-1", "eu-central-1"] }
    "#;
    let h = start_text(down(), Reply::anthropic_text("from the EU"), |p, b| {
        text(p, b, "", "consecutive_failures = 100", chain)
    })
    .await;
    let eu = [("x-tenant-region", "eu-west-1")];
    let a = h.send("POST", "/v1/chat/completions", HELLO, &eu).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-llm-provider"), "backup");
    for headers in [&[("x-tenant-region", "us-east-1")][..], &[][..]] {
        let a = h.send("POST", "/v1/chat/completions", HELLO, headers).await;
        assert_eq!(a.status, 503, "{}", a.body);
    }
    assert_eq!(h.backup.received().len(), 1);
    assert_eq!(h.primary.received().len(), 9);
}

#[tokio::test(start_paused = true)]
async fn a_degraded_answer_when_every_link_failed() {
    let route = format!("degraded = \"Try again shortly.\"\n{INLINE_CHAIN}");
    let h = start_text(down(), down(), |p, b| text(p, b, "", "", &route)).await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.json()["choices"][0]["message"]["content"],
        "Try again shortly."
    );
    let a = h.chat(HELLO_STREAM).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.contains("Try again shortly."), "{}", a.body);
    assert!(a.body.ends_with("data: [DONE]\n\n"), "{}", a.body);
}

#[tokio::test(start_paused = true)]
async fn health_ordering_tries_the_healthier_alternate_first() {
    // Three links: the primary is down; of the two alternates, the first
    // written has failed before and the second has not.
    let h = start_text(down(), Reply::anthropic_text("from backup"), |p, b| {
        text(
            p,
            b,
            "",
            "consecutive_failures = 100",
            r#"health_ordering_ms = 60000
            chain = [{ provider = "primary", model = "a", max_attempts = 1 }, { provider = "primary", model = "b", max_attempts = 1 }, { provider = "backup", model = "claude-x", max_attempts = 1 }]"#,
        )
    })
    .await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.header("x-llm-attempts"), "3");
    // primary/b failed once: now the backup is tried before it.
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("x-llm-attempts"), "2");
    assert_eq!(h.primary.received().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn probes_run_at_once_each_within_its_timeout_and_feed_provider_up() {
    let h = start_text(Reply::Hang, Reply::anthropic_text("ok"), |p, b| {
        text(
            p,
            b,
            "",
            "",
            &format!("{INLINE_CHAIN}\n[health]\nprobe_timeout_ms = 500"),
        )
    })
    .await;
    let started = Instant::now();
    h.gateway.probe_once().await;
    // Both at once: the hanging one's timeout, not the sum.
    assert!(
        started.elapsed() < Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
    let probes = h.gateway.probes();
    assert!(!probes["primary"].ok);
    assert_eq!(
        probes["primary"].error.as_deref(),
        Some("timed out after 500 ms")
    );
    assert!(probes["backup"].ok);
    let metrics = h.send("GET", "/metrics", "", &[]).await.body;
    let up = |provider: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("provider_up{") && l.contains(&format!("provider=\"{provider}\""))
            })
            .unwrap_or_else(|| panic!("provider_up for {provider} in\n{metrics}"))
            .rsplit(' ')
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(up("primary"), "0");
    assert_eq!(up("backup"), "1");
}

#[tokio::test(start_paused = true)]
async fn the_probe_interval_follows_a_reload() {
    let h = start_text(
        Reply::anthropic_text("ok"),
        Reply::anthropic_text("ok"),
        |p, b| text(p, b, "", "", INLINE_CHAIN),
    )
    .await;
    let probes = |m: &MockServer| m.received().iter().filter(|r| r.path == "/health").count();
    tokio::spawn(tower_llm_gateway::probe_loop(h.gateway.clone()));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(probes(&h.primary), 0, "probes are off by default");
    let mut c = h.gateway.config();
    c.settings.health.probe_interval_ms = 1_000;
    h.gateway.reload(c).expect("valid");
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let n = probes(&h.primary);
    assert!((3..=5).contains(&n), "{n} probes in 3.5 s at 1/s");
    assert_eq!(probes(&h.backup), n);
}

#[tokio::test(start_paused = true)]
async fn manual_circuit_control_needs_the_token() {
    let h = start_text(
        Reply::openai_text("primary"),
        Reply::anthropic_text("backup"),
        |p, b| text(p, b, "", "", INLINE_CHAIN),
    )
    .await;
    let open = r#"{"action": "open", "provider": "primary", "model": "gpt-4o-mini"}"#;
    // No token configured: read-only.
    let a = h.send("POST", "/health/circuits", open, &[]).await;
    assert_eq!(a.status, 403, "{}", a.body);
    let a = h
        .send(
            "POST",
            "/health/circuits",
            open,
            &[("authorization", "Bearer anything")],
        )
        .await;
    assert_eq!(a.status, 403);
    h.gateway.set_admin_token(Some("s3cret".into()));
    for auth in [
        &[][..],
        &[("authorization", "Bearer wrong")][..],
        &[("authorization", "s3cret")][..],
    ] {
        let a = h.send("POST", "/health/circuits", open, auth).await;
        assert_eq!(a.status, 401, "{}", a.body);
    }
    assert_eq!(h.chat(HELLO).await.header("x-llm-provider"), "primary");
    let auth = [("authorization", "Bearer s3cret")];
    let a = h.send("POST", "/health/circuits", open, &auth).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["state"], "isolated");
    // Forced open: the primary is not called.
    let a = h.chat(HELLO).await;
    assert_eq!(a.header("x-llm-provider"), "backup");
    assert_eq!(h.primary.received().len(), 1);
    let close = open.replace("open", "close");
    let a = h.send("POST", "/health/circuits", &close, &auth).await;
    assert_eq!(a.json()["state"], "closed");
    assert_eq!(h.chat(HELLO).await.header("x-llm-provider"), "primary");
    let bad = h
        .send(
            "POST",
            "/health/circuits",
            r#"{"action": "explode", "provider": "p", "model": "m"}"#,
            &auth,
        )
        .await;
    assert_eq!(bad.status, 400);
    // The token never shows in the gateway's Debug.
    assert!(!format!("{:?}", h.gateway).contains("s3cret"));
}

#[tokio::test(start_paused = true)]
async fn a_reload_keeps_the_circuits_of_surviving_keys() {
    let h = start_text(down(), Reply::anthropic_text("backup"), |p, b| {
        text(p, b, "", "consecutive_failures = 3", INLINE_CHAIN)
    })
    .await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.header("x-llm-provider"), "backup");
    assert_eq!(h.primary.received().len(), 3);
    // A reload that keeps the primary's key (and changes another setting).
    let mut p = h.gateway.policy();
    p.deadline.total_ms = Some(4_000);
    h.gateway.reload(p).expect("valid");
    let a = h.chat(HELLO).await;
    assert_eq!(a.header("x-llm-provider"), "backup");
    assert_eq!(h.primary.received().len(), 3, "still open after the reload");
}

#[tokio::test(start_paused = true)]
async fn breaker_key_provider_shares_one_circuit_among_a_provider_s_models() {
    let chain = r#"chain = [{ provider = "primary", model = "a", max_attempts = 1 }, { provider = "primary", model = "b", max_attempts = 1 }, { provider = "backup", model = "claude-x" }]"#;
    let h = start_text(down(), Reply::anthropic_text("from backup"), |p, b| {
        format!(
            "breaker_key = [\"provider\"]\n{}",
            text(p, b, "", "consecutive_failures = 3", chain)
        )
    })
    .await;
    assert_eq!(h.chat(HELLO).await.header("x-llm-provider"), "backup");
    assert_eq!(h.primary.received().len(), 2);
    // The 3rd failure, on model a, opens the provider's one circuit: model
    // b is refused without a call.
    assert_eq!(h.chat(HELLO).await.header("x-llm-provider"), "backup");
    assert_eq!(h.primary.received().len(), 3);
    let circuits = h.send("GET", "/health/circuits", "", &[]).await.json();
    let primary: Vec<_> = circuits
        .as_array()
        .expect("a list")
        .iter()
        .filter(|c| c["provider"] == "primary")
        .collect();
    assert_eq!(primary.len(), 1, "{circuits}");
    assert_eq!(primary[0]["model"], "*");
    assert_eq!(primary[0]["state"], "open");
}

#[tokio::test(start_paused = true)]
async fn breaker_key_credential_opens_every_provider_on_a_failing_key() {
    // Both providers use the same key (`api_key_env = "UNUSED"`).
    let h = start_text(down(), Reply::anthropic_text("from backup"), |p, b| {
        format!(
            "breaker_key = [\"credential\"]\n{}",
            text(p, b, "", "consecutive_failures = 3", INLINE_CHAIN)
        )
    })
    .await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 503, "{}", a.body);
    assert_eq!(h.primary.received().len(), 3);
    assert_eq!(h.backup.received().len(), 0, "the shared circuit is open");
    let circuits = h.send("GET", "/health/circuits", "", &[]).await.json();
    assert_eq!(circuits[0]["scope"], "credential=UNUSED", "{circuits}");
    assert_eq!(circuits.as_array().map(Vec::len), Some(1));
}

#[test]
fn breaker_key_is_checked() {
    let text = readme_policy();
    let err = GatewayConfig::from_toml(&text.replace(
        "breaker_key = [\"provider\", \"model\"]",
        "breaker_key = []",
    ))
    .expect_err("refused")
    .to_string();
    assert!(err.contains("breaker_key is empty"), "{err}");
    let err = GatewayConfig::from_toml(&text.replace(
        "breaker_key = [\"provider\", \"model\"]",
        "breaker_key = [\"tenant\"]",
    ))
    .expect_err("refused")
    .to_string();
    assert!(err.contains("at breaker_key[0]:"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_link_s_own_first_token_timeout_cuts_a_slow_stream() {
    let chain = r#"chain = [{ provider = "primary", model = "gpt-4o-mini", max_attempts = 1, first_token_timeout_ms = 200 }, { provider = "backup", model = "claude-x" }]"#;
    let h = start_text(
        Reply::openai_stream(&["late"]).after(Duration::from_secs(1)),
        Reply::anthropic_stream(&["on", " time"]),
        |p, b| text(p, b, "", "", chain),
    )
    .await;
    let started = Instant::now();
    let a = h.chat(HELLO_STREAM).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-llm-provider"), "backup");
    assert!(a.body.contains("time"), "{}", a.body);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(500),
        "{took:?}"
    );
    // The same route without the override waits the primary out.
    let h = start_text(
        Reply::openai_stream(&["late"]).after(Duration::from_secs(1)),
        Reply::anthropic_stream(&["on", " time"]),
        |p, b| text(p, b, "", "", INLINE_CHAIN),
    )
    .await;
    let a = h.chat(HELLO_STREAM).await;
    assert_eq!(a.header("x-llm-provider"), "primary");
}

#[tokio::test(start_paused = true)]
async fn deadline_a_route_s_own_deadline_bounds_the_call() {
    let route = format!("deadline_ms = 800\n{INLINE_CHAIN}");
    let h = start_text(Reply::Hang, Reply::Hang, |p, b| text(p, b, "", "", &route)).await;
    let started = Instant::now();
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 504, "{}", a.body);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_millis(900),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn stream_the_idle_timeout_ends_a_stalled_stream() {
    let mut steps = tower_llm_providers::mock::openai_stream_steps(&["Hel"], false);
    steps.push(tower_llm_providers::mock::Step::Stall);
    let route = format!("{INLINE_CHAIN}\n[stream]\nidle_timeout_ms = 300");
    let h = start_text(
        Reply::sse_steps(steps),
        Reply::anthropic_stream(&["b"]),
        |p, b| text(p, b, "", "", &route),
    )
    .await;
    let started = Instant::now();
    let a = h.chat(HELLO_STREAM).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("x-llm-provider"), "primary");
    assert!(a.body.contains("Hel"), "{}", a.body);
    assert!(a.body.contains(r#""code":"timeout""#), "{}", a.body);
    assert!(!a.body.contains("[DONE]"), "{}", a.body);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(400),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_filtered_content_link_takes_a_content_filter_refusal() {
    let refused = || Reply::openai_error(400, "content_filter", "The prompt was filtered");
    let plain = start_text(refused(), Reply::anthropic_text("ok"), |p, b| {
        text(p, b, "", "", INLINE_CHAIN)
    })
    .await;
    let a = plain.chat(HELLO).await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.json()["error"]["code"], "content_filtered");
    assert_eq!(plain.backup.received().len(), 0);

    let chain = r#"chain = [{ provider = "primary", model = "gpt-4o-mini" }, { provider = "backup", model = "claude-x", filtered_content = true }]"#;
    let h = start_text(refused(), Reply::anthropic_text("ok"), |p, b| {
        text(p, b, "", "", chain)
    })
    .await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-llm-provider"), "backup");
    assert_eq!(h.primary.received().len(), 1);
}
