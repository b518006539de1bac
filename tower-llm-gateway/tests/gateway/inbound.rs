//! The APIs clients speak to the gateway besides Chat Completions:
//! Anthropic's Messages (`/v1/messages`, any upstream behind it) and
//! OpenAI's Embeddings (`/v1/embeddings`, through the route's stack).

use tower_llm_providers::mock::{MockServer, Reply};

use crate::support::*;

fn down() -> Reply {
    Reply::openai_error(503, "server_error", "overloaded")
}

/// An OpenAI Embeddings answer with one vector per input.
fn vectors(model: &str, vectors: &[&[f32]]) -> Reply {
    let data: Vec<serde_json::Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| serde_json::json!({"object": "embedding", "index": i, "embedding": v}))
        .collect();
    Reply::json(
        200,
        serde_json::json!({"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": 5, "total_tokens": 5}})
        .to_string(),
    )
}

/// Two OpenAI-format providers, and the route `embed` over both.
fn two_openai(p: &MockServer, b: &MockServer) -> String {
    format!(
        r#"
        [deadline]
        total_ms = 2000
        [retry]
        max_attempts = 3
        attempt_timeout_ms = 2000
        base_ms = 100
        factor = 2
        max_ms = 400
        jitter = "none"
        [breaker]
        consecutive_failures = 5
        cooldown_ms = 30000
        [[providers]]
        name = "primary"
        kind = "openai"
        base_url = "{}/v1"
        api_key_env = "UNUSED"
        [[providers]]
        name = "backup"
        kind = "openai"
        base_url = "{}/v1"
        api_key_env = "UNUSED"
        [[routes]]
        model = "embed"
        chain = [{{ provider = "primary", model = "text-embedding-3-small" }}, {{ provider = "backup", model = "text-embedding-3-large" }}]
        "#,
        p.url(),
        b.url()
    )
}

const EMBED_TWO: &str = r#"{"model": "embed", "input": ["alpha", "beta"]}"#;

#[tokio::test(start_paused = true)]
async fn embeddings_are_retried_then_failed_over_and_answered_in_openais_shape() {
    let h = start_text(
        down(),
        vectors("text-embedding-3-large", &[&[0.25, -1.0], &[0.5, 2.0]]),
        two_openai,
    )
    .await;
    let a = h.send("POST", "/v1/embeddings", EMBED_TWO, &[]).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let body = a.json();
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], "embed");
    assert_eq!(
        body["data"][0]["embedding"],
        serde_json::json!([0.25, -1.0])
    );
    assert_eq!(body["data"][1]["index"], 1);
    assert_eq!(body["data"][1]["embedding"], serde_json::json!([0.5, 2.0]));
    assert_eq!(body["usage"]["prompt_tokens"], 5);
    assert_eq!(a.header("x-llm-provider"), "backup");
    assert_eq!(a.header("x-llm-model-used"), "text-embedding-3-large");
    assert_eq!(a.header("x-llm-attempts"), "4");
    assert_eq!(h.primary.received().len(), 3);
    let sent = &h.backup.received()[0];
    assert_eq!(sent.path, "/v1/embeddings");
    let sent: serde_json::Value = serde_json::from_slice(&sent.body).expect("json");
    assert_eq!(sent["model"], "text-embedding-3-large");
    assert_eq!(sent["input"], serde_json::json!(["alpha", "beta"]));
    // The GenAI client metrics count each upstream call as an embeddings
    // operation of the link's configured model.
    let metrics = h.send("GET", "/metrics", "", &[]).await.body;
    let count = |labels: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("gen_ai_client_operation_duration_seconds_count")
                    && l.contains("gen_ai_operation_name=\"embeddings\"")
                    && l.contains(labels)
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    assert_eq!(
        count("gen_ai_request_model=\"text-embedding-3-large\"").as_deref(),
        Some("1"),
        "{metrics}"
    );
    assert_eq!(
        count("error_type=\"transient\"").as_deref(),
        Some("3"),
        "{metrics}"
    );
}

#[tokio::test(start_paused = true)]
async fn embeddings_asked_as_base64_come_back_as_little_endian_f32() {
    let h = start_text(
        vectors("text-embedding-3-small", &[&[1.0, -0.5]]),
        down(),
        two_openai,
    )
    .await;
    let a = h
        .send(
            "POST",
            "/v1/embeddings",
            r#"{"model": "embed", "input": "alpha", "encoding_format": "base64"}"#,
            &[],
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    // 1.0 = 00 00 80 3f, -0.5 = 00 00 00 bf.
    assert_eq!(a.json()["data"][0]["embedding"], "AACAPwAAAL8=");
    // Upstream, floats were asked for.
    let sent: serde_json::Value =
        serde_json::from_slice(&h.primary.received()[0].body).expect("json");
    assert_eq!(sent["encoding_format"], "float");
}

#[tokio::test(start_paused = true)]
async fn embeddings_failing_on_every_link_are_a_503_in_openais_shape() {
    let h = start_text(down(), down(), two_openai).await;
    let a = h.send("POST", "/v1/embeddings", EMBED_TWO, &[]).await;
    assert_eq!(a.status, 503, "{}", a.body);
    assert_eq!(a.json()["error"]["type"], "service_unavailable");
    assert_eq!(a.header("x-llm-attempts"), "6");
}

#[tokio::test(start_paused = true)]
async fn a_route_with_a_link_that_cannot_embed_refuses_embeddings() {
    // The default harness's route falls back to an Anthropic provider.
    let h = start(
        Reply::openai_text("unused"),
        Reply::anthropic_text("unused"),
        "",
    )
    .await;
    let a = h
        .send(
            "POST",
            "/v1/embeddings",
            r#"{"model": "smart", "input": "x"}"#,
            &[],
        )
        .await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.json()["error"]["code"], "embeddings_not_supported");
    assert!(h.primary.received().is_empty());
}

#[tokio::test(start_paused = true)]
async fn bad_embeddings_requests_are_refused_before_any_upstream() {
    let h = start_text(vectors("m", &[&[1.0]]), down(), two_openai).await;
    for (body, status, needle) in [
        (r#"{"model": "embed", "input": [1, 2, 3]}"#, 400, "token-id"),
        (r#"{"model": "embed", "input": []}"#, 400, "empty"),
        (r#"{"model": "embed"}"#, 400, "input"),
        (
            r#"{"model": "embed", "input": "x", "encoding_format": "int8"}"#,
            400,
            "encoding_format",
        ),
        (r#"{"model": "nope", "input": "x"}"#, 404, "no route"),
        ("{", 400, "invalid request body"),
    ] {
        let a = h.send("POST", "/v1/embeddings", body, &[]).await;
        assert_eq!(a.status, status, "{body}: {}", a.body);
        let message = a.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(message.contains(needle), "{body}: {message}");
    }
    assert!(h.primary.received().is_empty());
}

const MESSAGE: &str = r#"{"model": "smart", "max_tokens": 64,
    "system": "Be brief.",
    "messages": [{"role": "user", "content": "Hello"}]}"#;

#[tokio::test(start_paused = true)]
async fn messages_over_an_openai_upstream_answer_in_anthropics_shape() {
    let h = start(
        Reply::openai_text("hi there"),
        Reply::anthropic_text("backup"),
        "",
    )
    .await;
    let a = h.send("POST", "/v1/messages", MESSAGE, &[]).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let body = a.json();
    assert_eq!(body["type"], "message");
    assert_eq!(body["role"], "assistant");
    assert_eq!(body["content"][0]["type"], "text");
    assert_eq!(body["content"][0]["text"], "hi there");
    assert_eq!(body["stop_reason"], "end_turn");
    assert!(body["id"].as_str().unwrap_or_default().starts_with("msg_"));
    assert_eq!(a.header("x-llm-provider"), "primary");
    assert_eq!(a.header("x-llm-attempts"), "1");
    // Sent upstream in OpenAI's format, the system prompt first.
    let sent: serde_json::Value =
        serde_json::from_slice(&h.primary.received()[0].body).expect("json");
    assert_eq!(sent["model"], "gpt-4o-mini");
    assert_eq!(sent["messages"][0]["role"], "system");
    assert_eq!(sent["messages"][0]["content"], "Be brief.");
    assert_eq!(sent["max_tokens"], 64);
}

#[tokio::test(start_paused = true)]
async fn a_streamed_message_is_anthropics_event_sequence_whoever_serves_it() {
    let h = start(down(), Reply::anthropic_stream(&["Hel", "lo"]), "").await;
    let body = MESSAGE.replace(
        "\"max_tokens\": 64,",
        "\"max_tokens\": 64, \"stream\": true,",
    );
    let a = h.send("POST", "/v1/messages", &body, &[]).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("content-type"), "text/event-stream");
    assert_eq!(a.header("x-llm-provider"), "backup");
    let events: Vec<&str> = a
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(events.first(), Some(&"message_start"));
    assert_eq!(events.last(), Some(&"message_stop"));
    assert!(events.contains(&"content_block_start"));
    assert!(events.contains(&"content_block_stop"));
    assert!(events.contains(&"message_delta"));
    let text: String = a
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter(|v| v["type"] == "content_block_delta")
        .filter_map(|v| v["delta"]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, "Hello");
}

#[tokio::test(start_paused = true)]
async fn messages_errors_are_in_anthropics_shape() {
    let h = start(down(), down(), "").await;
    // Every link failed: overloaded, with the retry hint of our own.
    let a = h.send("POST", "/v1/messages", MESSAGE, &[]).await;
    assert_eq!(a.status, 503, "{}", a.body);
    assert_eq!(a.json()["type"], "error");
    assert_eq!(a.json()["error"]["type"], "overloaded_error");
    // The gateway's own refusals too.
    for (body, status, kind) in [
        (
            r#"{"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}"#,
            404,
            "not_found_error",
        ),
        (
            r#"{"model": "smart", "messages": [{"role": "user", "content": "x"}]}"#,
            400,
            "invalid_request_error",
        ),
        ("not json", 400, "invalid_request_error"),
    ] {
        let a = h.send("POST", "/v1/messages", body, &[]).await;
        assert_eq!(a.status, status, "{body}: {}", a.body);
        assert_eq!(a.json()["type"], "error", "{body}");
        assert_eq!(a.json()["error"]["type"], kind, "{body}");
    }
    // A body over the cap: 413 in Anthropic's shape on its path, OpenAI's
    // on the chat path.
    let huge = format!(
        r#"{{"model": "smart", "max_tokens": 5, "messages": [{{"role": "user", "content": "{}"}}]}}"#,
        "x".repeat(tower_llm_gateway::MAX_REQUEST_BODY)
    );
    let a = h.send("POST", "/v1/messages", &huge, &[]).await;
    assert_eq!(a.status, 413);
    assert_eq!(a.json()["error"]["type"], "request_too_large");
    let a = h.chat(&huge).await;
    assert_eq!(a.status, 413);
    assert_eq!(a.json()["error"]["code"], "request_too_large");
}

#[tokio::test(start_paused = true)]
async fn a_tool_call_from_an_openai_upstream_is_a_tool_use_block() {
    let answer = serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "weather", "arguments": "{\"city\":\"Lyon\"}"}}]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    });
    let h = start(
        Reply::json(200, answer.to_string()),
        Reply::anthropic_text("unused"),
        "",
    )
    .await;
    let body = r#"{"model": "smart", "max_tokens": 64,
        "tools": [{"name": "weather", "description": "Weather in a city",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "messages": [{"role": "user", "content": "Weather in Lyon?"}]}"#;
    let a = h.send("POST", "/v1/messages", body, &[]).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let out = a.json();
    assert_eq!(out["stop_reason"], "tool_use");
    let block = out["content"]
        .as_array()
        .and_then(|c| c.iter().find(|b| b["type"] == "tool_use"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(block["id"], "call_1");
    assert_eq!(block["name"], "weather");
    assert_eq!(block["input"]["city"], "Lyon");
    assert_eq!(out["usage"]["input_tokens"], 10);
    assert_eq!(out["usage"]["output_tokens"], 5);
    // The tool went upstream in OpenAI's format.
    let sent: serde_json::Value =
        serde_json::from_slice(&h.primary.received()[0].body).expect("json");
    assert_eq!(sent["tools"][0]["function"]["name"], "weather");
}

/// An Azure OpenAI deployment first, Gemini second, for the routes
/// `smart` (chat) and `embed` (the Azure deployment alone).
fn azure_then_gemini(p: &MockServer, b: &MockServer) -> String {
    format!(
        r#"
        [deadline]
        total_ms = 2000
        [retry]
        max_attempts = 2
        attempt_timeout_ms = 2000
        base_ms = 100
        factor = 2
        max_ms = 400
        jitter = "none"
        [breaker]
        consecutive_failures = 5
        cooldown_ms = 30000
        [[providers]]
        name = "azure"
        kind = "azure"
        base_url = "{}"
        api_version = "2024-10-21"
        api_key_env = "UNUSED"
        [[providers]]
        name = "gemini"
        kind = "gemini"
        base_url = "{}/v1beta"
        api_key_env = "UNUSED"
        [[routes]]
        model = "smart"
        chain = [{{ provider = "azure", model = "gpt4o-prod" }}, {{ provider = "gemini", model = "gemini-2.5-flash" }}]
        [[routes]]
        model = "embed"
        chain = [{{ provider = "azure", model = "embed-prod" }}]
        "#,
        p.url(),
        b.url()
    )
}

#[tokio::test(start_paused = true)]
async fn an_azure_deployment_serves_chat_and_embeddings_with_its_key_header() {
    let h = start_text(Reply::openai_text("from azure"), down(), azure_then_gemini).await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["choices"][0]["message"]["content"], "from azure");
    assert_eq!(a.header("x-llm-provider"), "azure");
    let sent = &h.primary.received()[0];
    assert_eq!(
        sent.path,
        "/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21"
    );
    assert_eq!(sent.headers["api-key"], "sk-test-key");
    assert!(sent.headers.get("authorization").is_none());

    h.primary.push(vectors("embed-prod", &[&[0.5]]));
    let a = h
        .send(
            "POST",
            "/v1/embeddings",
            r#"{"model": "embed", "input": "x"}"#,
            &[],
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["data"][0]["embedding"], serde_json::json!([0.5]));
    assert_eq!(
        h.primary.received()[1].path,
        "/openai/deployments/embed-prod/embeddings?api-version=2024-10-21"
    );
}

#[tokio::test(start_paused = true)]
async fn azure_failing_over_to_gemini_answers_both_client_apis() {
    let h = start_text(down(), Reply::gemini_text("from gemini"), azure_then_gemini).await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["choices"][0]["message"]["content"], "from gemini");
    assert_eq!(a.header("x-llm-provider"), "gemini");
    assert_eq!(a.header("x-llm-model-used"), "gemini-2.5-flash");
    assert_eq!(a.header("x-llm-attempts"), "3");
    let sent = &h.backup.received()[0];
    assert_eq!(sent.path, "/v1beta/models/gemini-2.5-flash:generateContent");
    assert_eq!(sent.headers["x-goog-api-key"], "sk-test-key");

    // A streamed Anthropic Messages call, served by Gemini's stream.
    h.backup.push(Reply::gemini_stream(&["Hel", "lo"]));
    let body = MESSAGE.replace(
        "\"max_tokens\": 64,",
        "\"max_tokens\": 64, \"stream\": true,",
    );
    let a = h.send("POST", "/v1/messages", &body, &[]).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-llm-provider"), "gemini");
    let text: String = a
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter(|v| v["type"] == "content_block_delta")
        .filter_map(|v| v["delta"]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, "Hello");
    assert!(a.body.contains("event: message_stop"), "{}", a.body);
    assert_eq!(
        h.backup.received()[1].path,
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );
}
