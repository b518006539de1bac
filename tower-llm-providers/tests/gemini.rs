//! The Gemini dialect: request encoding, the fixtures of its answers and
//! error answers, error classification, streams through the commit point,
//! safety blocks, secret scrubbing, hostile model names and bad input.

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;
use tower_llm_core::{
    ChatChunk, ChatRequest, ChatStream, ContentPart, Failure, FailureClass, FinishReason, Message,
    Role, Tool, ToolCall, ToolChoice, Usage,
};
use tower_llm_providers::mock::{Reply, ScriptedTransport, Step};
use tower_llm_providers::{ApiKey, Gemini, GeminiConfig, gemini};

mod common;
use common::fixture;

const KEY: &str = "AIzaSyPLANTEDgemini0123456789abcdefXYZ";

fn provider(t: &ScriptedTransport) -> Gemini<ScriptedTransport> {
    Gemini::new(t.clone(), GeminiConfig::new(ApiKey::new(KEY)))
}

fn req() -> ChatRequest {
    ChatRequest::new("gemini-2.5-flash", vec![Message::user("hi")])
}

/// Reads a stream to its end: the chunks, and the terminal error if any.
async fn drain(mut stream: ChatStream) -> (Vec<ChatChunk>, Option<Failure>) {
    let mut chunks = Vec::new();
    while let Some(item) = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await {
        match item {
            Ok(c) => chunks.push(c),
            Err(f) => {
                let after = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await;
                assert!(after.is_none(), "an item after the terminal error");
                return (chunks, Some(f));
            }
        }
    }
    (chunks, None)
}

fn text(chunks: &[ChatChunk]) -> String {
    chunks.iter().filter_map(|c| c.text.as_deref()).collect()
}

/// A body sent in `size`-byte frames.
fn split(bytes: &[u8], size: usize) -> Vec<Step> {
    bytes
        .chunks(size)
        .map(|c| Step::Send(Bytes::copy_from_slice(c)))
        .collect()
}

fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).expect("status")
}

// ---------------------------------------------------------------- requests

#[tokio::test(start_paused = true)]
async fn requests_go_to_generate_content_with_the_key_in_a_sensitive_header_only() {
    let t = ScriptedTransport::new(Reply::gemini_text("hi"));
    provider(&t).oneshot(req()).await.expect("answer");
    let sent = &t.received()[0];
    assert_eq!(sent.method, http::Method::POST);
    assert_eq!(sent.path, "/v1beta/models/gemini-2.5-flash:generateContent");
    let key = &sent.headers["x-goog-api-key"];
    assert_eq!(key, KEY);
    assert!(key.is_sensitive());
    assert_eq!(sent.headers["content-type"], "application/json");
    assert!(!sent.path.contains(KEY));
    assert!(!String::from_utf8_lossy(&sent.body).contains(KEY));
    assert!(!sent.headers.contains_key("authorization"));

    // A stream asks for server-sent events at its own URL.
    let t = ScriptedTransport::new(Reply::gemini_stream(&["x"]));
    let stream = provider(&t)
        .streaming()
        .oneshot(req())
        .await
        .expect("commits");
    drain(stream).await;
    assert_eq!(
        t.received()[0].path,
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );

    // Another base URL, its trailing slash trimmed.
    let t = ScriptedTransport::new(Reply::gemini_text("hi"));
    let cfg = GeminiConfig::new(ApiKey::new(KEY)).with_base_url("http://proxy.test/gemini/v1/");
    assert_eq!(cfg.base_url(), "http://proxy.test/gemini/v1");
    Gemini::new(t.clone(), cfg)
        .oneshot(req())
        .await
        .expect("answer");
    assert_eq!(
        t.received()[0].path,
        "/gemini/v1/models/gemini-2.5-flash:generateContent"
    );
}

#[test]
fn every_part_kind_is_encoded() {
    let user = Message {
        role: Role::User,
        content: vec![
            ContentPart::Text {
                text: "What is in these?".into(),
            },
            ContentPart::Text { text: "".into() },
            ContentPart::ImageUrl {
                url: "data:image/png;base64,iVBORw0KGgo=".into(),
            },
            ContentPart::ImageUrl {
                url: "https://example.com/cat.JPG?sig=abc".into(),
            },
            ContentPart::ImageUrl {
                url: "https://generativelanguage.googleapis.com/v1beta/files/abc123".into(),
            },
        ],
        tool_calls: Vec::new(),
        tool_call_id: None,
    };
    let req = ChatRequest::new(
        "gemini-2.5-flash",
        vec![
            Message::system("Be brief."),
            Message::system("Answer in English."),
            user,
        ],
    );
    let body = gemini::encode(&req).expect("encodes");
    assert_eq!(
        body,
        json!({
            "systemInstruction": {"parts": [{"text": "Be brief."}, {"text": "Answer in English."}]},
            "contents": [{"role": "user", "parts": [
                {"text": "What is in these?"},
                {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
                {"fileData": {"fileUri": "https://example.com/cat.JPG?sig=abc", "mimeType": "image/jpeg"}},
                {"fileData": {"fileUri": "https://generativelanguage.googleapis.com/v1beta/files/abc123"}}
            ]}]
        })
    );
}

fn weather_tool() -> Tool {
    Tool {
        name: "get_weather".into(),
        description: Some("The weather in a city".into()),
        parameters: json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "additionalProperties": false,
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"]
        }),
    }
}

#[test]
fn tools_tool_calls_and_results_with_their_names_recovered() {
    let assistant = Message {
        role: Role::Assistant,
        content: vec![ContentPart::Text {
            text: String::new(),
        }],
        tool_calls: vec![
            ToolCall {
                id: "call_a".into(),
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into(),
            },
            ToolCall {
                id: "call_b".into(),
                name: "get_time".into(),
                arguments: "not json".into(),
            },
        ],
        tool_call_id: None,
    };
    let mut req = ChatRequest::new(
        "gemini-2.5-flash",
        vec![
            Message::user("Weather and time in Paris?"),
            assistant,
            Message::tool_result("call_b", "12:00"),
            Message::tool_result("call_a", r#"{"temp_c": 21}"#),
            Message::user("Thanks, and tomorrow?"),
        ],
    )
    .with_tools(vec![
        weather_tool(),
        Tool {
            name: "get_time".into(),
            description: None,
            parameters: Value::Null,
        },
    ])
    .with_temperature(0.5)
    .with_max_tokens(100);
    req.top_p = Some(0.25);
    req.stop = std::sync::Arc::new(vec!["END".into()]);
    req.tool_choice = Some(ToolChoice::Tool("get_weather".into()));
    let body = gemini::encode(&req).expect("encodes");
    assert_eq!(
        body["contents"],
        json!([
            {"role": "user", "parts": [{"text": "Weather and time in Paris?"}]},
            {"role": "model", "parts": [
                {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                 "thoughtSignature": "skip_thought_signature_validator"},
                {"functionCall": {"name": "get_time", "args": {}}}
            ]},
            // The two results and the next user text: one merged user turn,
            // the results first, each named after its call.
            {"role": "user", "parts": [
                {"functionResponse": {"name": "get_time", "response": {"output": "12:00"}}},
                {"functionResponse": {"name": "get_weather", "response": {"temp_c": 21}}},
                {"text": "Thanks, and tomorrow?"}
            ]}
        ])
    );
    assert_eq!(
        body["tools"],
        json!([{"functionDeclarations": [
            {"name": "get_weather", "description": "The weather in a city", "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"]
            }},
            {"name": "get_time"}
        ]}])
    );
    assert_eq!(
        body["toolConfig"],
        json!({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}})
    );
    assert_eq!(
        body["generationConfig"],
        json!({"temperature": 0.5, "topP": 0.25, "maxOutputTokens": 100, "stopSequences": ["END"]})
    );
    assert!(body.get("systemInstruction").is_none());
}

#[test]
fn tool_choices_map_to_function_calling_modes() {
    for (choice, mode) in [
        (ToolChoice::Auto, "AUTO"),
        (ToolChoice::None, "NONE"),
        (ToolChoice::Required, "ANY"),
    ] {
        let mut r = req().with_tools(vec![weather_tool()]);
        r.tool_choice = Some(choice);
        let body = gemini::encode(&r).expect("encodes");
        assert_eq!(
            body["toolConfig"],
            json!({"functionCallingConfig": {"mode": mode}})
        );
    }
    let body = gemini::encode(&req()).expect("encodes");
    assert_eq!(
        body,
        json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    );
}

#[test]
fn a_tool_result_answers_the_latest_call_with_its_id() {
    // Two assistant turns reuse the id `call_0` (as Gemini's synthesised
    // ids do across turns): each result is named after the call before it.
    let call = |name: &str| Message {
        role: Role::Assistant,
        content: Vec::new(),
        tool_calls: vec![ToolCall {
            id: "call_0".into(),
            name: name.into(),
            arguments: "{}".into(),
        }],
        tool_call_id: None,
    };
    let r = ChatRequest::new(
        "m",
        vec![
            Message::user("a"),
            call("first"),
            Message::tool_result("call_0", "1"),
            call("second"),
            Message::tool_result("call_0", "2"),
        ],
    );
    let body = gemini::encode(&r).expect("encodes");
    assert_eq!(
        body["contents"][2]["parts"][0]["functionResponse"]["name"],
        "first"
    );
    assert_eq!(
        body["contents"][4]["parts"][0]["functionResponse"]["name"],
        "second"
    );
}

// ----------------------------------------------------------------- answers

#[test]
fn the_text_fixture_normalises() {
    let r = gemini::decode(
        &fixture("gemini_generate_content.json"),
        "asked-model",
        Duration::from_millis(3),
    )
    .expect("decodes");
    assert_eq!(r.id, "f0ZuaMOjH5LgnsEPvN-I2Qo");
    assert_eq!(r.model, "gemini-2.5-flash");
    assert_eq!(r.provider.as_ref(), "gemini");
    assert_eq!(r.text(), "Hello! How can I help you today?");
    assert_eq!(r.finish_reason(), Some(FinishReason::Stop));
    assert!(r.choices[0].tool_calls.is_empty());
    // 9 answer tokens + 25 thinking tokens.
    assert_eq!(
        r.usage,
        Usage {
            prompt_tokens: 4,
            completion_tokens: 34,
            cached_input_tokens: 0
        }
    );
    assert_eq!(r.latency, Duration::from_millis(3));
}

#[test]
fn the_function_call_fixture_normalises_with_synthesised_ids() {
    let r = gemini::decode(
        &fixture("gemini_generate_content_function_call.json"),
        "m",
        Duration::ZERO,
    )
    .expect("decodes");
    assert_eq!(r.finish_reason(), Some(FinishReason::ToolCalls));
    assert_eq!(r.text(), "");
    assert_eq!(
        r.choices[0].tool_calls,
        vec![
            ToolCall {
                id: "call_0".into(),
                name: "get_current_weather".into(),
                arguments: r#"{"location":"Boston, MA"}"#.into(),
            },
            ToolCall {
                id: "call_1".into(),
                name: "get_current_weather".into(),
                arguments: r#"{"location":"Paris, FR"}"#.into(),
            },
        ]
    );
    assert_eq!(
        r.usage,
        Usage {
            prompt_tokens: 70,
            completion_tokens: 34,
            cached_input_tokens: 32
        }
    );
}

#[test]
fn gemini_call_ids_are_kept_and_thoughts_left_out() {
    let body = br#"{"candidates": [{"content": {"role": "model", "parts": [
        {"text": "Let me think", "thought": true},
        {"text": "Checking. "},
        {"functionCall": {"id": "fc-7", "name": "lookup"}},
        {"text": "Done."}
    ]}}]}"#;
    let r = gemini::decode(body, "asked-model", Duration::ZERO).expect("decodes");
    assert_eq!(r.text(), "Checking. Done.");
    assert_eq!(
        r.choices[0].tool_calls,
        vec![ToolCall {
            id: "fc-7".into(),
            name: "lookup".into(),
            arguments: "{}".into(),
        }]
    );
    // No finish reason, but a call: tool calls. No modelVersion: the model asked.
    assert_eq!(r.finish_reason(), Some(FinishReason::ToolCalls));
    assert_eq!(r.model, "asked-model");
    assert_eq!(r.id, "");
    assert_eq!(r.usage, Usage::default());
}

#[test]
fn finish_reasons_map() {
    for (reason, expected) in [
        ("STOP", FinishReason::Stop),
        ("MAX_TOKENS", FinishReason::Length),
        ("SAFETY", FinishReason::ContentFilter),
        ("RECITATION", FinishReason::ContentFilter),
        ("BLOCKLIST", FinishReason::ContentFilter),
        ("PROHIBITED_CONTENT", FinishReason::ContentFilter),
        ("SPII", FinishReason::ContentFilter),
        ("IMAGE_SAFETY", FinishReason::ContentFilter),
        ("LANGUAGE", FinishReason::Other),
        ("MALFORMED_FUNCTION_CALL", FinishReason::Other),
        ("OTHER", FinishReason::Other),
    ] {
        let body = format!(
            r#"{{"candidates": [{{"content": {{"parts": [{{"text": "x"}}]}}, "finishReason": "{reason}"}}]}}"#
        );
        let r = gemini::decode(body.as_bytes(), "m", Duration::ZERO).expect("decodes");
        assert_eq!(r.finish_reason(), Some(expected), "{reason}");
    }
}

#[test]
fn safety_blocks_are_content_filtered_failures_or_finish_reasons() {
    // The prompt refused before generation: a failure.
    let f = gemini::decode(&fixture("gemini_prompt_blocked.json"), "m", Duration::ZERO)
        .expect_err("blocked");
    assert_eq!(f.class(), FailureClass::ContentFiltered);
    assert_eq!(f.provider(), Some("gemini"));
    assert_eq!(f.message(), Some("Gemini blocked the prompt (SAFETY)"));
    // An odd block reason is not quoted.
    let f = gemini::decode(
        br#"{"promptFeedback": {"blockReason": "sk-leak 123"}}"#,
        "m",
        Duration::ZERO,
    )
    .expect_err("blocked");
    assert!(f.is_content_filtered());
    assert_eq!(f.message(), Some("Gemini blocked the prompt"));
    // The answer stopped by the filter, with no content: kept.
    let r = gemini::decode(
        br#"{"candidates": [{"finishReason": "SAFETY", "index": 0}]}"#,
        "m",
        Duration::ZERO,
    )
    .expect("an answer");
    assert_eq!(r.text(), "");
    assert_eq!(r.finish_reason(), Some(FinishReason::ContentFilter));
}

#[tokio::test(start_paused = true)]
async fn a_blocked_prompt_fails_the_call_with_the_status() {
    let t = ScriptedTransport::new(Reply::json(200, fixture("gemini_prompt_blocked.json")));
    let f = provider(&t).oneshot(req()).await.expect_err("blocked");
    assert!(f.is_content_filtered());
    assert_eq!(f.http_status(), Some(StatusCode::OK));
}

// ------------------------------------------------------------------ errors

#[test]
fn errors_are_classified_from_status_and_body() {
    let none = HeaderMap::new();
    let table: &[(u16, &[u8], FailureClass, Option<Duration>)] = &[
        (
            429,
            &fixture("gemini_error_resource_exhausted_429.json"),
            FailureClass::RateLimited,
            Some(Duration::from_secs(7)),
        ),
        (
            429,
            &fixture("gemini_error_resource_exhausted_daily_429.json"),
            FailureClass::QuotaExhausted,
            None,
        ),
        (
            429,
            br#"{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 0, model: gemini-2.5-pro"}}"#,
            FailureClass::QuotaExhausted,
            None,
        ),
        (
            400,
            &fixture("gemini_error_invalid_argument_400.json"),
            FailureClass::BadRequest,
            None,
        ),
        (
            400,
            &fixture("gemini_error_token_count_400.json"),
            FailureClass::ContextWindowExceeded,
            None,
        ),
        (
            400,
            &fixture("gemini_error_api_key_invalid_400.json"),
            FailureClass::Auth,
            None,
        ),
        (
            503,
            &fixture("gemini_error_unavailable_503.json"),
            FailureClass::Transient,
            None,
        ),
        (
            500,
            br#"{"error": {"code": 500, "message": "An internal error has occurred.", "status": "INTERNAL"}}"#,
            FailureClass::Transient,
            None,
        ),
        (
            504,
            br#"{"error": {"code": 504, "message": "Deadline expired", "status": "DEADLINE_EXCEEDED"}}"#,
            FailureClass::Transient,
            None,
        ),
        (
            403,
            br#"{"error": {"code": 403, "message": "Permission denied", "status": "PERMISSION_DENIED"}}"#,
            FailureClass::Auth,
            None,
        ),
        (
            401,
            br#"{"error": {"code": 401, "message": "no", "status": "UNAUTHENTICATED"}}"#,
            FailureClass::Auth,
            None,
        ),
        (
            404,
            br#"{"error": {"code": 404, "message": "models/x is not found", "status": "NOT_FOUND"}}"#,
            FailureClass::NotFound,
            None,
        ),
        (
            400,
            br#"{"error": {"code": 400, "message": "User location is not supported for the API use.", "status": "FAILED_PRECONDITION"}}"#,
            FailureClass::BadRequest,
            None,
        ),
        // The streaming endpoint's array form.
        (
            400,
            br#"[{"error": {"code": 400, "message": "The input token count (134123) exceeds the maximum number of tokens allowed (131072).", "status": "INVALID_ARGUMENT"}}]"#,
            FailureClass::ContextWindowExceeded,
            None,
        ),
        // Garbage: the status's class.
        (429, b"<html>Too Many Requests</html>", FailureClass::RateLimited, None),
        (502, b"", FailureClass::Transient, None),
    ];
    for (code, body, class, retry_after) in table {
        let f = gemini::decode_error(status(*code), &none, body);
        assert_eq!(
            (f.class(), f.retry_after(), f.http_status()),
            (*class, *retry_after, Some(status(*code))),
            "{code} {}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(f.provider(), Some("gemini"));
    }
    let f = gemini::decode_error(
        status(400),
        &none,
        &fixture("gemini_error_api_key_invalid_400.json"),
    );
    assert_eq!(
        f.message(),
        Some("API key not valid. Please pass a valid API key.")
    );
}

#[test]
fn a_retry_after_header_wins_over_the_retry_info_detail() {
    let mut h = HeaderMap::new();
    h.insert("retry-after", "30".parse().expect("value"));
    let f = gemini::decode_error(
        status(429),
        &h,
        &fixture("gemini_error_resource_exhausted_429.json"),
    );
    assert_eq!(f.retry_after(), Some(Duration::from_secs(30)));
}

#[tokio::test(start_paused = true)]
async fn error_answers_through_the_service_are_classified() {
    let t = ScriptedTransport::new(Reply::json(
        429,
        fixture("gemini_error_resource_exhausted_429.json"),
    ));
    let f = provider(&t).oneshot(req()).await.expect_err("limited");
    assert!(f.is_rate_limited());
    assert_eq!(f.retry_after(), Some(Duration::from_secs(7)));
    // Before a stream's commit point, the same.
    let f = provider(&t)
        .streaming()
        .oneshot(req())
        .await
        .expect_err("limited");
    assert!(f.is_rate_limited());
    assert_eq!(f.retry_after(), Some(Duration::from_secs(7)));
}

// ----------------------------------------------------------------- streams

#[tokio::test(start_paused = true)]
async fn the_stream_fixture_commits_in_frames_of_any_size() {
    let bytes = fixture("gemini_stream_basic.sse");
    for size in [1, 2, 3, 17, 4096] {
        let t = ScriptedTransport::new(Reply::sse_steps(split(&bytes, size)));
        let stream = provider(&t)
            .streaming()
            .oneshot(req())
            .await
            .expect("commits");
        assert_eq!(stream.provider(), "gemini");
        let (chunks, end) = drain(stream).await;
        assert!(end.is_none(), "{size}-byte frames: {end:?}");
        assert_eq!(text(&chunks), "Hello! How can I help you today?");
        // Usage once, with the finish reason, on the last chunk.
        let last = chunks.last().expect("chunks");
        assert_eq!(last.finish_reason, Some(FinishReason::Stop));
        assert_eq!(
            last.usage,
            Some(Usage {
                prompt_tokens: 4,
                completion_tokens: 31,
                cached_input_tokens: 0
            })
        );
        assert_eq!(chunks.iter().filter(|c| c.usage.is_some()).count(), 1);
    }
    let t = ScriptedTransport::new(Reply::sse_steps(split(&bytes, 4096)));
    let answer = provider(&t)
        .streaming()
        .oneshot(req())
        .await
        .expect("commits")
        .collect_response()
        .await
        .expect("complete");
    assert_eq!(answer.text(), "Hello! How can I help you today?");
    assert_eq!(answer.finish_reason(), Some(FinishReason::Stop));
    assert_eq!(
        (answer.usage.prompt_tokens, answer.usage.completion_tokens),
        (4, 31)
    );
}

#[tokio::test(start_paused = true)]
async fn streamed_function_calls_commit_and_finish_as_tool_calls() {
    let t = ScriptedTransport::new(Reply::sse_steps(vec![
        Step::sse(
            None,
            r#"{"candidates": [{"content": {"role": "model", "parts": [{"functionCall": {"name": "a", "args": {"x": 1}}}]}}]}"#,
        ),
        Step::sse(
            None,
            &json!({"candidates": [{"content": {"role": "model", "parts": [{"functionCall": {"name": "b"}}]}, "finishReason": "STOP"}],
                "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 7}})
            .to_string(),
        ),
    ]));
    let answer = provider(&t)
        .streaming()
        .oneshot(req())
        .await
        .expect("commits at the first call")
        .collect_response()
        .await
        .expect("complete");
    assert_eq!(answer.finish_reason(), Some(FinishReason::ToolCalls));
    assert_eq!(
        answer.choices[0].tool_calls,
        vec![
            ToolCall {
                id: "call_0".into(),
                name: "a".into(),
                arguments: r#"{"x":1}"#.into()
            },
            ToolCall {
                id: "call_1".into(),
                name: "b".into(),
                arguments: "{}".into()
            },
        ]
    );
    assert_eq!(
        (answer.usage.prompt_tokens, answer.usage.completion_tokens),
        (5, 7)
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_ends_before_its_finish_reason_is_truncated() {
    let bytes = fixture("gemini_stream_basic.sse");
    // The first two events only: content, then a clean end of the body.
    let cut = bytes
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == b"\r\n\r\n")
        .nth(1)
        .map(|(i, _)| i + 4)
        .expect("two events");
    let t = ScriptedTransport::new(Reply::sse_steps(split(&bytes[..cut], 4096)));
    let stream = provider(&t)
        .streaming()
        .oneshot(req())
        .await
        .expect("commits");
    let (chunks, end) = drain(stream).await;
    assert_eq!(text(&chunks), "Hello! How can I");
    let end = end.expect("truncated");
    assert_eq!(end.class(), FailureClass::Transient);
    assert_eq!(end.provider(), Some("gemini"));

    // Cut in the middle of the last event, after its finish reason was sent.
    let t = ScriptedTransport::new(Reply::sse_steps(split(&bytes[..bytes.len() - 3], 4096)));
    let (_, end) = drain(
        provider(&t)
            .streaming()
            .oneshot(req())
            .await
            .expect("commits"),
    )
    .await;
    assert_eq!(end.expect("truncated").class(), FailureClass::Transient);

    // The mock's stream without its last event: the same.
    let t = ScriptedTransport::new(Reply::sse_steps(vec![Step::sse(
        None,
        r#"{"candidates": [{"content": {"parts": [{"text": "Hi"}]}}]}"#,
    )]));
    let (_, end) = drain(
        provider(&t)
            .streaming()
            .oneshot(req())
            .await
            .expect("commits"),
    )
    .await;
    assert_eq!(end.expect("truncated").class(), FailureClass::Transient);
}

#[tokio::test(start_paused = true)]
async fn an_error_event_midway_is_committed_then_terminal() {
    let t = ScriptedTransport::new(Reply::sse_steps(split(
        &fixture("gemini_stream_error_midway.sse"),
        5,
    )));
    let stream = provider(&t)
        .streaming()
        .oneshot(req())
        .await
        .expect("commits");
    let (chunks, end) = drain(stream).await;
    assert_eq!(text(&chunks), "Hello");
    let end = end.expect("terminal");
    assert_eq!(end.class(), FailureClass::Transient);
    assert_eq!(end.provider(), Some("gemini"));
    assert_eq!(
        end.message(),
        Some("The model is overloaded. Please try again later.")
    );
}

#[tokio::test(start_paused = true)]
async fn failures_before_the_first_content_fail_the_call() {
    // An error event first: the call's error, classified.
    let t = ScriptedTransport::new(Reply::sse_steps(vec![Step::sse(
        None,
        &json!({"error": {"code": 429, "message": "slow down", "status": "RESOURCE_EXHAUSTED",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "2.5s"}]}})
        .to_string(),
    )]));
    let f = provider(&t)
        .streaming()
        .oneshot(req())
        .await
        .expect_err("fails");
    assert!(f.is_rate_limited());
    assert_eq!(f.retry_after(), Some(Duration::from_millis(2500)));
    // A blocked prompt: content filtered.
    let t = ScriptedTransport::new(Reply::sse_steps(vec![Step::sse(
        None,
        r#"{"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}, "usageMetadata": {"promptTokenCount": 9}}"#,
    )]));
    let f = provider(&t)
        .streaming()
        .oneshot(req())
        .await
        .expect_err("fails");
    assert!(f.is_content_filtered());
    assert_eq!(
        f.message(),
        Some("Gemini blocked the prompt (PROHIBITED_CONTENT)")
    );
    // An empty body: transient.
    let t = ScriptedTransport::new(Reply::sse_steps(vec![]));
    let f = provider(&t)
        .streaming()
        .oneshot(req())
        .await
        .expect_err("fails");
    assert!(f.is_transient());
    // A malformed event: invalid response.
    let t = ScriptedTransport::new(Reply::sse_steps(vec![Step::sse(None, "{not json")]));
    let f = provider(&t)
        .streaming()
        .oneshot(req())
        .await
        .expect_err("fails");
    assert!(f.is_invalid_response());
}

#[tokio::test(start_paused = true)]
async fn a_safety_stop_with_no_content_commits_as_an_empty_filtered_answer() {
    let t = ScriptedTransport::new(Reply::sse_steps(vec![Step::sse(
        None,
        r#"{"candidates": [{"finishReason": "SAFETY", "index": 0}], "usageMetadata": {"promptTokenCount": 6}}"#,
    )]));
    let answer = provider(&t)
        .streaming()
        .oneshot(req())
        .await
        .expect("a complete answer")
        .collect_response()
        .await
        .expect("complete");
    assert_eq!(answer.text(), "");
    assert_eq!(answer.finish_reason(), Some(FinishReason::ContentFilter));
    assert_eq!(answer.usage.prompt_tokens, 6);
}

#[tokio::test(start_paused = true)]
async fn the_mock_replies_speak_gemini() {
    let t = ScriptedTransport::new(Reply::gemini_text("Hello there"));
    let r = provider(&t).oneshot(req()).await.expect("answer");
    assert_eq!(r.text(), "Hello there");
    assert_eq!(r.model, "mock-model");
    assert_eq!(
        r.usage,
        Usage {
            prompt_tokens: 10,
            completion_tokens: 5,
            cached_input_tokens: 0
        }
    );
    let t = ScriptedTransport::new(Reply::gemini_stream(&["Hel", "lo"]));
    let r = provider(&t)
        .streaming()
        .oneshot(req())
        .await
        .expect("commits")
        .collect_response()
        .await
        .expect("complete");
    assert_eq!(r.text(), "Hello");
    assert_eq!(r.finish_reason(), Some(FinishReason::Stop));
    assert_eq!((r.usage.prompt_tokens, r.usage.completion_tokens), (10, 2));
}

// ----------------------------------------------------------------- secrets

/// Every rendering of a failure.
fn rendered(f: &Failure) -> String {
    let mut out = format!("{:?} | {} | {:?}", f.message(), f, f);
    let mut source = std::error::Error::source(f);
    while let Some(s) = source {
        out.push_str(&format!(" | {s} | {s:?}"));
        source = s.source();
    }
    out
}

#[tokio::test(start_paused = true)]
async fn the_key_never_shows_in_failures_or_debug() {
    let cfg = GeminiConfig::new(ApiKey::new(KEY));
    assert!(!format!("{cfg:?}").contains(&KEY[..12]));
    let echo = format!("API key not valid: {KEY}. Please pass a valid API key.");
    let straddling = format!("{} {KEY} trailing", "x".repeat(500));
    for message in [echo, straddling] {
        for code in [400u16, 403, 429, 503] {
            let body = json!({"error": {"code": code, "message": message, "status": "INVALID_ARGUMENT",
                "details": [{"@type": "type.googleapis.com/google.rpc.DebugInfo", "detail": KEY}]}});
            let t = ScriptedTransport::new(Reply::json(code, body.to_string()));
            let f = provider(&t).oneshot(req()).await.expect_err("fails");
            let shown = rendered(&f);
            assert!(!shown.contains(&KEY[..12]), "{shown}");
            assert!(f.message().is_some_and(|m| m.contains("[redacted]")));
        }
        // In-band, before and after the commit point.
        let error =
            json!({"error": {"code": 500, "message": message, "status": "INTERNAL"}}).to_string();
        let t = ScriptedTransport::new(Reply::sse_steps(vec![Step::sse(None, &error)]));
        let f = provider(&t)
            .streaming()
            .oneshot(req())
            .await
            .expect_err("fails");
        assert!(!rendered(&f).contains(&KEY[..12]));
        let t = ScriptedTransport::new(Reply::sse_steps(vec![
            Step::sse(
                None,
                r#"{"candidates": [{"content": {"parts": [{"text": "Hi"}]}}]}"#,
            ),
            Step::sse(None, &error),
        ]));
        let stream = provider(&t)
            .streaming()
            .oneshot(req())
            .await
            .expect("commits");
        let (_, end) = drain(stream).await;
        let end = end.expect("terminal");
        assert!(end.is_transient());
        assert!(!rendered(&end).contains(&KEY[..12]));
    }
    // A key with a newline cannot be a header: an auth failure, no panic, not quoted.
    let t = ScriptedTransport::new(Reply::gemini_text("hi"));
    let f = Gemini::new(t.clone(), GeminiConfig::new(ApiKey::new("bad\nkey-secret")))
        .oneshot(req())
        .await
        .expect_err("refused");
    assert!(f.is_auth());
    assert!(!rendered(&f).contains("key-secret"));
    assert!(t.received().is_empty());
}

// ----------------------------------------------------------- hostile input

#[tokio::test(start_paused = true)]
async fn hostile_model_names_are_bad_requests_never_sent() {
    let long = "m".repeat(257);
    for model in [
        "",
        ".",
        "..",
        "../files",
        "gemini..pro",
        "models/gemini-2.5-flash",
        "gemini?alt=media",
        "gemini#x",
        "gemini:streamGenerateContent",
        "gemini 2.5",
        "gemini%2F..",
        "gémini",
        "gemini\n",
        "gemini@evil.example",
        long.as_str(),
    ] {
        let t = ScriptedTransport::new(Reply::gemini_text("hi"));
        let r = ChatRequest::new(model, vec![Message::user("hi")]);
        let f = provider(&t).oneshot(r.clone()).await.expect_err(model);
        assert!(f.is_bad_request(), "{model:?}: {f:?}");
        assert_eq!(f.provider(), Some("gemini"));
        let f = provider(&t).streaming().oneshot(r).await.expect_err(model);
        assert!(f.is_bad_request(), "{model:?}: {f:?}");
        assert!(t.received().is_empty(), "{model:?} was sent");
    }
    // Plain names go as they are.
    for model in [
        "gemini-2.5-flash",
        "gemini-1.5-pro-002",
        "gemma_3.27b",
        &"m".repeat(256),
    ] {
        let t = ScriptedTransport::new(Reply::gemini_text("hi"));
        provider(&t)
            .oneshot(ChatRequest::new(model, vec![Message::user("hi")]))
            .await
            .expect(model);
        assert_eq!(
            t.received()[0].path,
            format!("/v1beta/models/{model}:generateContent")
        );
    }
}

#[test]
fn requests_gemini_cannot_take_are_bad_requests() {
    let image = |url: &str| Message {
        role: Role::User,
        content: vec![ContentPart::ImageUrl { url: url.into() }],
        tool_calls: Vec::new(),
        tool_call_id: None,
    };
    let cases: Vec<(&str, Vec<Message>)> = vec![
        (
            "an unknown call",
            vec![Message::user("a"), Message::tool_result("call_9", "x")],
        ),
        (
            "no call id",
            vec![Message {
                tool_call_id: None,
                ..Message::tool_result("x", "y")
            }],
        ),
        ("an ftp image", vec![image("ftp://example.com/a.png")]),
        ("a relative image", vec![image("/a.png")]),
        (
            "a data URL without base64",
            vec![image("data:image/png,abc")],
        ),
        ("a data URL without a type", vec![image("data:;base64,abc")]),
        (
            "a data URL without data",
            vec![image("data:image/png;base64")],
        ),
    ];
    for (what, messages) in cases {
        let f = gemini::encode(&ChatRequest::new("m", messages)).expect_err(what);
        assert_eq!(f.class(), FailureClass::BadRequest, "{what}");
        assert_eq!(f.provider(), Some("gemini"), "{what}");
        assert!(f.message().is_some_and(|m| !m.is_empty()), "{what}");
    }
    // A signed URL is never quoted in the failure.
    let f = gemini::encode(&ChatRequest::new(
        "m",
        vec![image("s3://bucket/a.png?X-Amz-Signature=SECRETSIG")],
    ))
    .expect_err("refused");
    assert!(!rendered(&f).contains("SECRETSIG"));
    // A schema nested too deep.
    let mut schema = json!({"type": "string"});
    for _ in 0..100 {
        schema = json!({"type": "object", "properties": {"a": schema}});
    }
    let r = req().with_tools(vec![Tool {
        name: "deep".into(),
        description: None,
        parameters: schema,
    }]);
    assert!(gemini::encode(&r).expect_err("too deep").is_bad_request());
}

#[test]
fn bad_answers_get_a_clear_failure_and_no_panic() {
    for body in [&b"{not json"[..], b"", b"null", b"[]", b"{}", b"\xff\xfe"] {
        let f = gemini::decode(body, "m", Duration::ZERO).expect_err("bad");
        assert!(f.is_invalid_response(), "{f:?}");
        assert_eq!(f.provider(), Some("gemini"));
    }
    let f = gemini::decode(br#"{"candidates": []}"#, "m", Duration::ZERO).expect_err("none");
    assert!(f.to_string().contains("no candidates"), "{f}");
    let f = gemini::decode(
        br#"{"candidates": [{"content": {"parts": [{"functionCall": {"args": {}}}]}}]}"#,
        "m",
        Duration::ZERO,
    )
    .expect_err("a call without a name");
    assert!(f.to_string().contains("name"), "{f}");
    // A value is never quoted.
    let f = gemini::decode(
        br#"{"candidates": [{"content": {"parts": [{"text": 5}]}, "finishReason": "sk-QUOTED"}], "usageMetadata": "sk-QUOTED"}"#,
        "m",
        Duration::ZERO,
    )
    .expect_err("bad types");
    assert!(!rendered(&f).contains("sk-QUOTED"));
    // An error object in a 200: its class.
    let f = gemini::decode(
        br#"{"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}"#,
        "m",
        Duration::ZERO,
    )
    .expect_err("error");
    assert!(f.is_transient());
    // Truncated fixtures.
    for name in [
        "gemini_generate_content.json",
        "gemini_generate_content_function_call.json",
    ] {
        let full = fixture(name);
        assert!(gemini::decode(&full[..full.len() / 2], "m", Duration::ZERO).is_err());
    }
    // Error bodies: a long message bounded, garbage details ignored.
    let long = json!({"error": {"code": 500, "message": "x".repeat(10_000), "status": "INTERNAL",
        "details": [5, null, {"retryDelay": 7}, {"violations": "no"}]}});
    let f = gemini::decode_error(status(500), &HeaderMap::new(), long.to_string().as_bytes());
    assert!(f.is_transient());
    assert!(
        f.message()
            .is_some_and(|m| m.len() <= tower_llm_providers::MAX_MESSAGE + 3)
    );
    assert_eq!(f.retry_after(), None);
}
