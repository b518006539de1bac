//! The gateway example's application, started in-process on loopback in
//! front of `MockServer` providers, driven by a real HTTP client.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower_llm_providers::mock::Reply;

use crate::support::*;

fn down() -> Reply {
    Reply::openai_error(503, "server_error", "overloaded")
}

#[tokio::test(start_paused = true)]
async fn happy_path_names_the_provider_model_and_attempts() {
    let h = start(
        Reply::openai_text("hi there"),
        Reply::anthropic_text("backup"),
        "",
    )
    .await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["choices"][0]["message"]["content"], "hi there");
    assert_eq!(a.json()["object"], "chat.completion");
    assert_eq!(a.header("x-llm-provider"), "primary");
    assert_eq!(a.header("x-llm-model-used"), "gpt-4o-mini");
    assert_eq!(a.header("x-llm-attempts"), "1");
    assert_eq!(a.header("x-request-id"), "req-0");
    // The route's model was sent upstream, with our key.
    let sent = &h.primary.received()[0];
    let body: serde_json::Value = serde_json::from_slice(&sent.body).expect("json");
    assert_eq!(body["model"], "gpt-4o-mini");
}

#[tokio::test(start_paused = true)]
async fn a_503_then_200_is_retried_on_the_primary() {
    let h = start(
        Reply::openai_text("second try"),
        Reply::anthropic_text("backup"),
        "",
    )
    .await;
    h.primary.push(down());
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("x-llm-provider"), "primary");
    assert_eq!(a.header("x-llm-attempts"), "2");
    assert_eq!(h.primary.received().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn three_503s_fail_over_and_the_headers_name_the_backup() {
    let h = start(down(), Reply::anthropic_text("from backup"), "").await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["choices"][0]["message"]["content"], "from backup");
    assert_eq!(a.header("x-llm-provider"), "backup");
    assert_eq!(a.header("x-llm-attempts"), "4");
    assert_eq!(h.primary.received().len(), 3);
    assert_eq!(h.backup.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_400_is_not_failed_over_and_keeps_the_providers_message() {
    let h = start(
        Reply::openai_error(
            400,
            "invalid_request_error",
            "messages[0] is missing content",
        ),
        Reply::anthropic_text("backup"),
        "",
    )
    .await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 400);
    assert_eq!(
        a.json()["error"]["message"],
        "messages[0] is missing content"
    );
    assert_eq!(h.primary.received().len(), 1);
    assert_eq!(h.backup.received().len(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_answers_504_within_its_budget() {
    let h = start(Reply::Hang, Reply::Hang, "").await;
    let start = Instant::now();
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 504, "{}", a.body);
    assert!(
        start.elapsed() <= Duration::from_millis(2050),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(a.json()["error"]["code"], "deadline_exceeded");
}

#[tokio::test(start_paused = true)]
async fn upstream_auth_and_unknown_routes_and_bad_bodies() {
    let h = start(
        Reply::openai_error(401, "invalid_request_error", "Incorrect API key"),
        Reply::anthropic_text("backup"),
        "",
    )
    .await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 502, "{}", a.body);
    assert!(!a.body.contains("sk-test-key"));
    // Our key was refused: the client's SDK is told retrying cannot help.
    assert_eq!(a.header("x-should-retry"), "false");
    let a = h.chat(r#"{"model": "nope", "messages": []}"#).await;
    assert_eq!(a.status, 404);
    assert_eq!(a.json()["error"]["code"], "model_not_found");
    let a = h.chat("{not json").await;
    assert_eq!(a.status, 400);
    let huge = format!(
        r#"{{"model": "smart", "messages": [{{"role": "user", "content": "{}"}}]}}"#,
        "x".repeat(tower_llm_gateway::MAX_REQUEST_BODY)
    );
    let a = h.chat(&huge).await;
    assert_eq!(a.status, 413);
    assert_eq!(a.json()["error"]["code"], "request_too_large");
    assert_eq!(h.send("GET", "/health", "", &[]).await.status, 200);
}

#[tokio::test(start_paused = true)]
async fn all_links_down_is_503_and_the_circuit_opens_so_the_primary_rests() {
    let h = start(down(), down(), "").await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 503, "{}", a.body);
    // 3 + 3 attempts; the next call opens the primary's circuit (5 in a row).
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 503);
    let before = h.primary.received().len();
    assert_eq!(before, 5);
    for _ in 0..3 {
        let a = h.chat(HELLO).await;
        assert_eq!(a.status, 503);
        assert!(a.headers.get("retry-after").is_some(), "{:?}", a.headers);
    }
    assert_eq!(
        h.primary.received().len(),
        before,
        "the open circuit sheds the primary"
    );
    let circuits = h.send("GET", "/health/circuits", "", &[]).await.json();
    let primary = circuits
        .as_array()
        .expect("array")
        .iter()
        .find(|c| c["provider"] == "primary")
        .expect("the primary's circuit")
        .clone();
    assert_eq!(primary["state"], "open");
    let metrics = h.send("GET", "/metrics", "", &[]).await.body;
    assert!(metrics.contains("ai_router_calls_total{"));
    assert!(metrics.contains("llm_circuit_state{"));
}

#[tokio::test(start_paused = true)]
async fn streams_go_through_the_gateway_and_fail_over_before_the_first_token() {
    let h = start(down(), Reply::anthropic_stream(&["Hel", "lo"]), "").await;
    let a = h.chat(HELLO_STREAM).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("content-type"), "text/event-stream");
    assert_eq!(a.header("x-llm-provider"), "backup");
    let mut text = String::new();
    for line in a.body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            break;
        }
        let chunk: serde_json::Value = serde_json::from_str(line).expect("chunk json");
        if let Some(t) = chunk["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
    }
    assert_eq!(text, "Hello");
    assert!(a.body.ends_with("data: [DONE]\n\n"));
    // Every chunk has a choice (no usage unless asked for); the first one
    // carries the role; ids are per stream.
    let chunks: Vec<serde_json::Value> = a
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|l| *l != "[DONE]")
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["choices"].as_array().is_some_and(|v| !v.is_empty()))
    );
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");

    // Asked for usage: one usage chunk at the end, with the summed counts.
    h.primary.push(down());
    h.primary.push(down());
    h.primary.push(down());
    let with_usage = r#"{"model": "smart", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Hello"}]}"#;
    let b = h.chat(with_usage).await;
    let last: serde_json::Value = b
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .rfind(|l| *l != "[DONE]")
        .map(|l| serde_json::from_str(l).expect("json"))
        .expect("chunks");
    assert_eq!(last["choices"], serde_json::json!([]));
    assert_eq!(last["usage"]["prompt_tokens"], 10);
    assert_eq!(last["usage"]["completion_tokens"], 2);
    assert_eq!(last["usage"]["total_tokens"], 12);
    let first_id = chunks[0]["id"].clone();
    assert!(b.body.contains("chatcmpl-") && !b.body.contains(first_id.as_str().unwrap_or("?")));
}

#[tokio::test(start_paused = true)]
async fn a_reload_swaps_the_chain_without_dropping_a_call_in_flight() {
    let h = start(
        Reply::openai_text("old policy").after(Duration::from_millis(1500)),
        Reply::anthropic_text("new policy"),
        "",
    )
    .await;
    let h = Arc::new(h);
    let in_flight = {
        let h = h.clone();
        tokio::spawn(async move { h.chat(HELLO).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.primary.received().len(), 1);
    // The new policy routes `smart` to the backup only.
    let mut new = h.gateway.policy();
    new.routes[0].chain.remove(0);
    h.gateway.reload(new).expect("valid");
    let a = h.chat(HELLO).await;
    assert_eq!(a.header("x-llm-provider"), "backup");
    let old = in_flight.await.expect("task");
    assert_eq!(old.status, 200);
    assert_eq!(old.json()["choices"][0]["message"]["content"], "old policy");
    // An invalid policy is refused; the running one stays.
    let mut bad = h.gateway.policy();
    bad.routes[0].chain.clear();
    assert!(h.gateway.reload(bad).is_err());
    assert_eq!(h.chat(HELLO).await.header("x-llm-provider"), "backup");
}

#[tokio::test(start_paused = true)]
async fn a_bulkhead_sheds_into_the_next_link() {
    let h = start(
        Reply::openai_text("slow primary").after(Duration::from_millis(500)),
        Reply::anthropic_text("backup"),
        "",
    )
    .await;
    // One call at a time on the primary.
    let mut p = h.gateway.policy();
    p.providers[0].max_concurrency = Some(1);
    h.gateway.reload(p).expect("valid");
    let h = Arc::new(h);
    let first = {
        let h = h.clone();
        tokio::spawn(async move { h.chat(HELLO).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = h.chat(HELLO).await;
    assert_eq!(second.status, 200);
    assert_eq!(second.header("x-llm-provider"), "backup");
    assert_eq!(
        first.await.expect("task").header("x-llm-provider"),
        "primary"
    );
    assert_eq!(h.primary.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_changed_config_file_is_reloaded_and_a_broken_one_refused() {
    let h = start(
        Reply::openai_text("primary"),
        Reply::anthropic_text("backup"),
        "",
    )
    .await;
    let path = std::env::temp_dir().join(format!("tower-llm-gateway-{}.toml", std::process::id()));
    std::fs::write(&path, policy_text(&h.primary, &h.backup, "", FULL_CHAIN)).expect("write");
    tokio::spawn(tower_llm_gateway::reload_on_change(
        h.gateway.clone(),
        path.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.chat(HELLO).await.header("x-llm-provider"), "primary");

    let backup_only = r#"[{ provider = "backup", model = "claude-x" }]"#;
    std::fs::write(&path, policy_text(&h.primary, &h.backup, "", backup_only)).expect("write");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.chat(HELLO).await.header("x-llm-provider"), "backup");

    // A broken file: refused, the running policy stays.
    std::fs::write(&path, "[[routes]]\nmodel = ").expect("write");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.chat(HELLO).await.header("x-llm-provider"), "backup");
    assert_eq!(h.gateway.policy().routes[0].chain.len(), 1);
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(start_paused = true)]
async fn background_probes_report_each_provider() {
    let h = start(Reply::json(200, "{}"), Reply::json(503, "{}"), "").await;
    let mut p = h.gateway.policy();
    p.providers[0].health_url = Some(format!("{}/v1/models", h.primary.url()));
    p.providers[1].health_url = Some(format!("{}/v1/models", h.backup.url()));
    h.gateway.reload(p).expect("valid");
    h.gateway.probe_once().await;
    let probes = h.send("GET", "/health/providers", "", &[]).await.json();
    assert_eq!(probes["primary"]["ok"], true);
    assert_eq!(probes["backup"]["ok"], false);
    assert_eq!(probes["backup"]["status"], 503);
    // `/health` itself does no I/O and stays cheap.
    assert_eq!(
        h.send("GET", "/health", "", &[]).await.json()["status"],
        "ok"
    );
}

#[tokio::test(start_paused = true)]
async fn a_bulkhead_holds_across_a_reload_of_the_same_limit() {
    let h = start(
        Reply::openai_text("slow primary").after(Duration::from_millis(500)),
        Reply::anthropic_text("backup"),
        "",
    )
    .await;
    let mut p = h.gateway.policy();
    p.providers[0].max_concurrency = Some(1);
    h.gateway.reload(p.clone()).expect("valid");
    let h = Arc::new(h);
    let first = {
        let h = h.clone();
        tokio::spawn(async move { h.chat(HELLO).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The same file reloaded (a touch, a SIGHUP): the call in flight still
    // holds the primary's only permit.
    h.gateway.reload(p).expect("valid");
    let second = h.chat(HELLO).await;
    assert_eq!(second.header("x-llm-provider"), "backup");
    assert_eq!(
        first.await.expect("task").header("x-llm-provider"),
        "primary"
    );
    assert_eq!(h.primary.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_upstream_stream_with_a_finish_reason_but_no_done_ends_cleanly_with_its_usage() {
    use tower_llm_providers::mock::{anthropic_stream_steps, openai_stream_steps};
    // The primary (OpenAI) sends every chunk, the stop chunk and the usage
    // chunk, then ends its body without `data: [DONE]`.
    let mut steps = openai_stream_steps(&["Hel", "lo"], true);
    assert_eq!(
        steps.pop(),
        Some(tower_llm_providers::mock::Step::sse(None, "[DONE]"))
    );
    let h = start(Reply::sse_steps(steps), Reply::anthropic_text("unused"), "").await;
    let with_usage = r#"{"model": "smart", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Hello"}]}"#;
    let a = h.chat(with_usage).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-llm-provider"), "primary");
    let check = |body: &str| {
        assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
        assert!(!body.contains("\"error\""), "no error event: {body}");
        let chunks: Vec<serde_json::Value> = body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|l| *l != "[DONE]")
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Hello");
        assert!(
            chunks
                .iter()
                .any(|c| c["choices"][0]["finish_reason"] == "stop")
        );
        let last = chunks.last().expect("chunks");
        assert_eq!(last["choices"], serde_json::json!([]));
        assert_eq!(last["usage"]["prompt_tokens"], 10);
        assert_eq!(last["usage"]["completion_tokens"], 2);
    };
    check(&a.body);
    assert_eq!(h.primary.received().len(), 1, "not retried");
    assert_eq!(h.backup.received().len(), 0, "not failed over");

    // The backup (Anthropic) sends message_delta with its stop reason, then
    // ends its body without message_stop.
    let mut steps = anthropic_stream_steps(&["Hel", "lo"], true);
    steps.pop();
    h.backup.push(Reply::sse_steps(steps));
    for _ in 0..3 {
        h.primary.push(down());
    }
    let b = h.chat(with_usage).await;
    assert_eq!(b.status, 200, "{}", b.body);
    assert_eq!(b.header("x-llm-provider"), "backup");
    check(&b.body);
}
