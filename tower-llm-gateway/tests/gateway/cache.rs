//! The response cache over loopback: a repeated request is a hit with its
//! `Age` and no upstream call; streams replay chunk for chunk; the
//! request's `Cache-Control` is honoured within the route's settings;
//! tenants (opaque bytes, not ASCII) never share; and when every provider
//! is down, the stale-safe rung answers with a stored answer, flagged.
//! Virtual time: ages and TTLs are exact.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tower_llm_providers::mock::{MockServer, Reply};

use crate::support::*;

fn down() -> Reply {
    Reply::openai_error(503, "server_error", "overloaded")
}

/// One route `smart` over the two providers with `route` added to it, and
/// `tables` before the providers.
fn cached(
    tables: &'static str,
    route: &'static str,
) -> impl FnOnce(&MockServer, &MockServer) -> String {
    move |p, b| {
        format!(
            r#"
            [deadline]
            total_ms = 2000
            [retry]
            max_attempts = 2
            attempt_timeout_ms = 1000
            base_ms = 100
            factor = 2
            max_ms = 100
            jitter = "none"
            [breaker]
            consecutive_failures = 50
            cooldown_ms = 30000
            {tables}
            [[providers]]
            name = "primary"
            kind = "openai"
            base_url = "{}/v1"
            api_key_env = "UNUSED"
            [[providers]]
            name = "backup"
            kind = "anthropic"
            base_url = "{}"
            api_key_env = "UNUSED"
            [[routes]]
            model = "smart"
            chain = [{{ provider = "primary", model = "gpt-4o-mini" }}, {{ provider = "backup", model = "claude-x" }}]
            {route}
            "#,
            p.url(),
            b.url()
        )
    }
}

const ASK: &str =
    r#"{"model": "smart", "messages": [{"role": "user", "content": "Capital of France?"}]}"#;
const ASK_STREAM: &str = r#"{"model": "smart", "stream": true, "messages": [{"role": "user", "content": "Capital of France?"}]}"#;
const TTL: &str = r#"cache = { ttl_ms = 60000, stale_ms = 600000 }"#;

fn text(a: &Answer) -> String {
    a.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The content deltas of an SSE answer, in order, and whether it ended
/// with `[DONE]`.
fn deltas(body: &str) -> (Vec<String>, bool) {
    let mut out = Vec::new();
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else {
            continue;
        };
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            out.push(t.to_owned());
        }
    }
    (out, body.ends_with("data: [DONE]\n\n"))
}

/// Sends `body` to the chat endpoint with `headers` (raw bytes), on a
/// connection of its own: virtual time jumps past the server's keep-alive
/// limit between calls, so a pooled connection could be closed under it.
async fn call(h: &Harness, body: &'static str, headers: &[(&str, &[u8])]) -> Answer {
    let mut req = http::Request::post(format!("{}/v1/chat/completions", h.url))
        .header("content-type", "application/json");
    for (name, value) in headers {
        req = req.header(
            *name,
            http::HeaderValue::from_bytes(value).expect("a header value"),
        );
    }
    let req = req
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("request");
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http();
    let res = client.request(req).await.expect("an answer");
    let (parts, body) = res.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

async fn chat(h: &Harness, body: &'static str) -> Answer {
    call(h, body, &[]).await
}

async fn as_tenant(h: &Harness, tenant: &[u8]) -> Answer {
    call(h, ASK, &[("x-tenant-id", tenant)]).await
}

#[tokio::test(start_paused = true)]
async fn a_repeated_request_is_answered_from_the_cache_with_its_age_until_the_ttl() {
    let h = start_text(Reply::openai_text("Paris"), down(), cached("", TTL)).await;
    let first = chat(&h, ASK).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.header("x-llm-cache"), "miss");
    assert_eq!(first.header("age"), "");
    assert_eq!(first.header("x-llm-provider"), "primary");

    tokio::time::advance(Duration::from_millis(42_500)).await;
    let again = chat(&h, ASK).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.header("x-llm-cache"), "hit");
    assert_eq!(again.header("age"), "42");
    assert_eq!(again.header("x-llm-stale"), "");
    assert_eq!(text(&again), "Paris");
    assert_eq!(again.json()["model"], first.json()["model"]);
    assert_eq!(h.primary.received().len(), 1, "a hit calls no provider");

    // Another question is another entry.
    let other = h
        .chat(
            r#"{"model": "smart", "messages": [{"role": "user", "content": "Capital of Spain?"}]}"#,
        )
        .await;
    assert_eq!(other.header("x-llm-cache"), "miss");
    assert_eq!(h.primary.received().len(), 2);

    // Past the TTL (60 s after it was stored): a provider answers again.
    tokio::time::advance(Duration::from_millis(17_501)).await;
    let late = chat(&h, ASK).await;
    assert_eq!(late.header("x-llm-cache"), "miss");
    assert_eq!(h.primary.received().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_stream_is_replayed_chunk_for_chunk() {
    let h = start_text(
        Reply::openai_stream(&["The ", "capital ", "is ", "Paris."]),
        down(),
        cached("", TTL),
    )
    .await;
    let first = chat(&h, ASK_STREAM).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.header("x-llm-cache"), "miss");
    let (live, done) = deltas(&first.body);
    assert!(done, "{}", first.body);
    assert_eq!(live, ["The ", "capital ", "is ", "Paris."]);

    tokio::time::advance(Duration::from_secs(3)).await;
    let again = chat(&h, ASK_STREAM).await;
    assert_eq!(again.header("x-llm-cache"), "hit");
    assert_eq!(again.header("age"), "3");
    let (replayed, done) = deltas(&again.body);
    assert!(done, "{}", again.body);
    assert_eq!(replayed, live);
    assert_eq!(h.primary.received().len(), 1);

    // The unary request is another request (it does not stream).
    h.primary.push(Reply::openai_text("Paris"));
    let unary = chat(&h, ASK).await;
    assert_eq!(unary.header("x-llm-cache"), "miss");
}

#[tokio::test(start_paused = true)]
async fn cache_control_is_honoured_within_the_routes_settings() {
    let h = start_text(Reply::openai_text("Paris"), down(), cached("", TTL)).await;
    let ask = |cc: &'static str| {
        let h = &h;
        async move { call(h, ASK, &[("cache-control", cc.as_bytes())]).await }
    };
    // no-store: answered, not kept.
    assert_eq!(ask("no-store").await.header("x-llm-cache"), "miss");
    assert_eq!(chat(&h, ASK).await.header("x-llm-cache"), "miss");
    assert_eq!(h.primary.received().len(), 2);
    // no-cache: a provider answers, and its answer is kept.
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(ask("no-cache").await.header("x-llm-cache"), "miss");
    assert_eq!(h.primary.received().len(), 3);
    let hit = chat(&h, ASK).await;
    assert_eq!((hit.header("x-llm-cache"), hit.header("age")), ("hit", "0"));
    // max-age shortens what this request accepts ...
    tokio::time::advance(Duration::from_secs(6)).await;
    assert_eq!(ask("max-age=5").await.header("x-llm-cache"), "miss");
    assert_eq!(h.primary.received().len(), 4);
    // ... and can never lengthen it past the route's ttl_ms.
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(ask("max-age=86400").await.header("x-llm-cache"), "miss");
    assert_eq!(h.primary.received().len(), 5);
    // A malformed or contradictory header is ignored: a plain hit.
    for bad in ["max-age=soon", "max-age=1, max-age=2", "no-cache=\"x\""] {
        let a = ask(bad).await;
        assert_eq!(a.status, 200, "{bad}: {}", a.body);
        assert_eq!(a.header("x-llm-cache"), "hit", "{bad}");
    }
    assert_eq!(h.primary.received().len(), 5);
}

#[tokio::test(start_paused = true)]
async fn tenants_never_share_answers_whatever_bytes_name_them() {
    let h = start_text(Reply::openai_text("fallback"), down(), cached("", TTL)).await;
    let tenants: [&[u8]; 4] = [
        "café-lyon".as_bytes(),
        b"caf\xe9-lyon",
        b"",
        b"CAF\xc9-LYON",
    ];
    for (i, tenant) in tenants.iter().enumerate() {
        h.primary.push(Reply::openai_text(&format!("answer {i}")));
        let a = as_tenant(&h, tenant).await;
        assert_eq!(a.header("x-llm-cache"), "miss", "tenant {i}");
        assert_eq!(text(&a), format!("answer {i}"));
    }
    // No tenant at all is yet another scope (not the empty name's).
    h.primary.push(Reply::openai_text("answer none"));
    assert_eq!(chat(&h, ASK).await.header("x-llm-cache"), "miss");
    assert_eq!(h.primary.received().len(), 5);
    for (i, tenant) in tenants.iter().enumerate() {
        let a = as_tenant(&h, tenant).await;
        assert_eq!(a.header("x-llm-cache"), "hit", "tenant {i}");
        assert_eq!(text(&a), format!("answer {i}"), "tenant {i} got its own");
    }
    assert_eq!(text(&chat(&h, ASK).await), "answer none");
    assert_eq!(h.primary.received().len(), 5);
}

#[tokio::test(start_paused = true)]
async fn when_every_provider_is_down_a_stored_answer_is_served_stale() {
    let h = start_text(down(), down(), cached("", TTL)).await;
    h.primary.push(Reply::openai_text("Paris"));
    assert_eq!(chat(&h, ASK).await.header("x-llm-cache"), "miss");
    // Fresh: a hit, whatever the providers' state.
    tokio::time::advance(Duration::from_secs(61)).await;
    let stale = chat(&h, ASK).await;
    assert_eq!(stale.status, 200, "{}", stale.body);
    assert_eq!(stale.header("x-llm-cache"), "stale");
    assert_eq!(stale.header("x-llm-stale"), "true");
    assert_eq!(stale.header("age"), "61");
    assert_eq!(text(&stale), "Paris");
    // Both links were tried (2 attempts each) before the stale answer.
    assert_eq!(h.primary.received().len(), 1 + 2);
    assert_eq!(h.backup.received().len(), 2);
    // A client that refuses stale answers gets the failure.
    let refused = call(&h, ASK, &[("cache-control", "stale-if-error=0".as_bytes())]).await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.header("x-llm-cache"), "");
    // Past ttl_ms + stale_ms: nothing stale enough, the failure.
    tokio::time::advance(Duration::from_secs(600)).await;
    let gone = chat(&h, ASK).await;
    assert_eq!(gone.status, 503, "{}", gone.body);
}

#[tokio::test(start_paused = true)]
async fn a_stale_stream_is_served_when_every_provider_is_down() {
    let h = start_text(down(), down(), cached("", TTL)).await;
    h.primary.push(Reply::openai_stream(&["Par", "is"]));
    let (live, _) = deltas(&chat(&h, ASK_STREAM).await.body);
    tokio::time::advance(Duration::from_secs(120)).await;
    let stale = chat(&h, ASK_STREAM).await;
    assert_eq!(stale.status, 200, "{}", stale.body);
    assert_eq!(stale.header("x-llm-cache"), "stale");
    assert_eq!(stale.header("x-llm-stale"), "true");
    assert_eq!(stale.header("age"), "120");
    let (replayed, done) = deltas(&stale.body);
    assert!(done);
    assert_eq!(replayed, live);
}

const LADDER: &str = r#"
    [[fallback_policies]]
    fallback_id = "ladder"
    steps = [
      { target = "STALE_CACHE", max_stale_ms = 3600000, allowed_for_risk = ["LOW"] },
      { target = "DEGRADED_TEMPLATE", text = "Unavailable; try again shortly." },
    ]
"#;

#[tokio::test(start_paused = true)]
async fn a_stale_cache_step_answers_admitted_risks_before_the_degraded_answer() {
    let h = start_text(
        down(),
        down(),
        cached(LADDER, r#"fallback_policy = "ladder""#),
    )
    .await;
    h.primary.push(Reply::openai_text("Paris"));
    // The step keeps answers for the stale rung only: never a fresh hit.
    let first = call(&h, ASK, &[("x-llm-risk", "LOW".as_bytes())]).await;
    assert_eq!(first.header("x-llm-cache"), "miss");
    tokio::time::advance(Duration::from_secs(30)).await;
    let low = call(&h, ASK, &[("x-llm-risk", "LOW".as_bytes())]).await;
    assert_eq!(low.status, 200, "{}", low.body);
    assert_eq!(low.header("x-llm-cache"), "stale");
    assert_eq!(low.header("age"), "30");
    assert_eq!(low.header("x-llm-degraded"), "");
    assert_eq!(text(&low), "Paris");
    // Another risk is not admitted to the stale answer: the next rung.
    let high = call(&h, ASK, &[("x-llm-risk", "HIGH".as_bytes())]).await;
    assert_eq!(high.status, 200, "{}", high.body);
    assert_eq!(high.header("x-llm-degraded"), "true");
    assert_eq!(text(&high), "Unavailable; try again shortly.");
    assert_eq!(high.header("x-llm-cache"), "miss");
    // Past max_stale_ms: the degraded answer for everyone.
    tokio::time::advance(Duration::from_secs(3600)).await;
    let late = call(&h, ASK, &[("x-llm-risk", "LOW".as_bytes())]).await;
    assert_eq!(late.header("x-llm-degraded"), "true");
}

#[tokio::test(start_paused = true)]
async fn errors_degraded_and_tool_call_answers_are_never_stored() {
    let tool_call = Reply::json(
        200,
        serde_json::json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
                "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "charge", "arguments": "{}"}}]}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
        .to_string(),
    );
    let h = start_text(
        down(),
        down(),
        cached(
            "",
            r#"cache = { ttl_ms = 60000 }
            degraded = "Unavailable.""#,
        ),
    )
    .await;
    // A degraded answer (every link failed) is not kept.
    let degraded = chat(&h, ASK).await;
    assert_eq!(degraded.header("x-llm-degraded"), "true");
    h.primary.push(tool_call.clone());
    let called = chat(&h, ASK).await;
    assert_eq!(called.header("x-llm-cache"), "miss", "{}", called.body);
    assert_eq!(called.json()["choices"][0]["finish_reason"], "tool_calls");
    // Neither was stored: the next call goes to the providers again.
    h.primary.push(Reply::openai_text("Paris"));
    let fresh = chat(&h, ASK).await;
    assert_eq!(fresh.header("x-llm-cache"), "miss");
    assert_eq!(text(&fresh), "Paris");
    assert_eq!(chat(&h, ASK).await.header("x-llm-cache"), "hit");
}

#[tokio::test(start_paused = true)]
async fn an_answer_from_a_link_with_an_admission_rule_is_never_given_to_a_request_it_would_refuse()
{
    let h = start_text(down(), Reply::anthropic_text("from the EU link"), |p, b| {
        format!(
            r#"
            [deadline]
            total_ms = 2000
            [retry]
            max_attempts = 1
            [[providers]]
            name = "primary"
            kind = "openai"
            base_url = "{}/v1"
            api_key_env = "UNUSED"
            [[providers]]
            name = "backup"
            kind = "anthropic"
            base_url = "{}"
            api_key_env = "UNUSED"
            [[routes]]
            model = "smart"
            chain = [{{ provider = "primary", model = "gpt-4o-mini" }}, {{ provider = "backup", model = "claude-x", admit = {{ header = "x-region", any_of = ["eu"] }} }}]
            cache = {{ ttl_ms = 60000, stale_ms = 600000 }}
            "#,
            p.url(),
            b.url()
        )
    })
    .await;
    let eu = call(&h, ASK, &[("x-region", b"eu")]).await;
    assert_eq!(eu.status, 200, "{}", eu.body);
    assert_eq!(eu.header("x-llm-cache"), "miss");
    assert_eq!(
        call(&h, ASK, &[("x-region", b"eu")])
            .await
            .header("x-llm-cache"),
        "hit"
    );
    // Another region (or none) may not use that link: no hit, no stale
    // answer from it; the primary is down, so the failure.
    for other in [&[("x-region", b"us" as &[u8])][..], &[][..]] {
        let refused = call(&h, ASK, other).await;
        assert_eq!(refused.status, 503, "{}", refused.body);
        assert_eq!(refused.header("x-llm-cache"), "");
    }
    assert_eq!(h.backup.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn cached_answers_survive_a_reload_while_the_cache_settings_are_unchanged() {
    let h = start_text(Reply::openai_text("Paris"), down(), cached("", TTL)).await;
    assert_eq!(chat(&h, ASK).await.header("x-llm-cache"), "miss");
    // `[cache]` written out at its default: the same store, its answers kept.
    let same = cached("[cache]\nmax_bytes = 67108864", TTL)(&h.primary, &h.backup);
    h.gateway
        .reload(tower_llm_gateway::GatewayConfig::from_toml(&same).expect("valid"))
        .expect("reloads");
    assert_eq!(chat(&h, ASK).await.header("x-llm-cache"), "hit");
    // Another bound: a new store, empty.
    let other = cached("[cache]\nmax_bytes = 1048576", TTL)(&h.primary, &h.backup);
    h.gateway
        .reload(tower_llm_gateway::GatewayConfig::from_toml(&other).expect("valid"))
        .expect("reloads");
    assert_eq!(chat(&h, ASK).await.header("x-llm-cache"), "miss");
    assert_eq!(h.primary.received().len(), 2);
}
