//! Keys planted in every upstream field a response can carry (error
//! message, type and code, model, id, content, tool-call arguments,
//! echoed headers, in-band stream errors, event-stream exceptions) never
//! reach a `Failure`'s message, `Display` or `Debug`, for the three
//! providers, unary and streaming; nor does any `Debug` of a type holding
//! a secret print one.

use std::pin::Pin;

use tower::ServiceExt;
use tower_llm_core::{ChatRequest, ChatStream, Failure, Message};
use tower_llm_providers::mock::{Reply, ScriptedTransport, Step};
use tower_llm_providers::{
    Anthropic, AnthropicConfig, ApiKey, AwsCredentials, Bedrock, BedrockConfig, OpenAi,
    OpenAiConfig,
};

const OPENAI_KEY: &str = "sk-proj-PLANTEDopenai0123456789abcdef";
const ANTHROPIC_KEY: &str = "sk-ant-api03-PLANTEDanthropic0123456789";
const AWS_KEY_ID: &str = "AKIAPLANTEDKEYID0123";
const AWS_SECRET: &str = "wJalrXUtnFEMI/PLANTEDsecret/bPxRfiCYEXAMPLEKEY";
const AWS_TOKEN: &str = "IQoJb3JpZ2luX2VjEPLANTEDsessiontoken/with+slash==";

fn req() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("hi")])
}

fn openai(t: &ScriptedTransport) -> OpenAi<ScriptedTransport> {
    OpenAi::new(t.clone(), OpenAiConfig::new(ApiKey::new(OPENAI_KEY)))
}

fn anthropic(t: &ScriptedTransport) -> Anthropic<ScriptedTransport> {
    Anthropic::new(t.clone(), AnthropicConfig::new(ApiKey::new(ANTHROPIC_KEY)))
}

fn bedrock_config() -> BedrockConfig {
    BedrockConfig::new(
        AwsCredentials::new(AWS_KEY_ID, AWS_SECRET).with_session_token(AWS_TOKEN),
        "us-east-1",
    )
}

fn bedrock(t: &ScriptedTransport) -> Bedrock<ScriptedTransport> {
    Bedrock::new(t.clone(), bedrock_config())
}

/// Fails when `shown` holds `key` or its first 12 bytes (a key cut in two
/// leaks its first part).
fn assert_clean(shown: &str, key: &str, what: &str) {
    assert!(
        !shown.contains(&key[..12]),
        "{what}: the key (or its first part) leaked: {shown}"
    );
}

/// Every rendering of a failure: message, `Display`, `Debug`, and the
/// `Display` of each source.
fn rendered(f: &Failure) -> String {
    let mut out = format!("{:?} | {} | {:?}", f.message(), f, f);
    let mut source = std::error::Error::source(f);
    while let Some(s) = source {
        out.push_str(&format!(" | {s} | {s:?}"));
        source = s.source();
    }
    out
}

/// A provider message of 500 bytes then `key`: the 512-byte cut falls
/// inside the key.
fn straddling(key: &str) -> String {
    format!("{} {key} trailing", "x".repeat(500))
}

/// Error answers echoing `key` in the message (twice: short, and
/// straddling the cut), the type and code, and in response headers.
fn error_replies(key: &str, openai_shape: bool) -> Vec<Reply> {
    let mut replies = Vec::new();
    for status in [400u16, 401, 429, 500] {
        for message in [
            format!("Incorrect API key provided: {key}."),
            straddling(key),
        ] {
            let body = if openai_shape {
                serde_json::json!({"error": {"message": message, "type": key, "code": key, "param": key}})
            } else {
                serde_json::json!({"message": message, "__type": key, "Message": key})
            };
            replies.push(
                Reply::json(status, body.to_string())
                    .with_header("x-echo-authorization", &format!("Bearer {key}"))
                    .with_header("x-amzn-errortype", &format!("{key}:http://x/"))
                    .with_header("www-authenticate", key),
            );
        }
    }
    replies
}

/// 2xx bodies that do not decode, with `key` in the fields that serde
/// would quote (a string where a number, array or object is expected)
/// and in every other field.
fn malformed_openai(key: &str) -> Vec<String> {
    let k = serde_json::json!(key);
    vec![
        format!(r#"{{"id": {k}, "model": {k}, "choices": {k}}}"#),
        format!(
            r#"{{"id": {k}, "model": {k}, "choices": [{{"index": {k}, "message": {{"content": {k}}}}}]}}"#
        ),
        format!(
            r#"{{"id": {k}, "model": {k}, "choices": [{{"message": {{"content": {k}, "tool_calls": [{{"id": {k}, "function": {{"name": {k}, "arguments": {k}}}}}, {k}]}}}}]}}"#
        ),
        format!(
            r#"{{"id": {k}, "model": {k}, "choices": [{{"message": {{"content": {k}}}}}], "usage": {{"prompt_tokens": {k}}}}}"#
        ),
        format!(
            r#"{{"id": {k}, "model": {k}, "choices": [{{"message": {{"content": {k}}}, "finish_reason": 7}}], "usage": {{"completion_tokens": {k}}}}}"#
        ),
    ]
}

fn malformed_anthropic(key: &str) -> Vec<String> {
    let k = serde_json::json!(key);
    vec![
        format!(
            r#"{{"id": {k}, "model": {k}, "content": {k}, "usage": {{"input_tokens": 1, "output_tokens": 1}}}}"#
        ),
        format!(
            r#"{{"id": {k}, "model": {k}, "content": [{{"type": "text", "text": {k}}}], "usage": {{"input_tokens": {k}, "output_tokens": 1}}}}"#
        ),
        format!(
            r#"{{"id": {k}, "model": {k}, "content": [{{"type": "tool_use", "id": {k}, "name": {k}, "input": {{"a": {k}}}}}, {{"type": "text", "text": 1}}], "usage": {{"input_tokens": 1, "output_tokens": 1}}}}"#
        ),
        format!(
            r#"{{"id": 1, "model": {k}, "content": [], "usage": {{"input_tokens": 1, "output_tokens": 1}}, "stop_reason": {k}}}"#
        ),
    ]
}

fn malformed_bedrock(key: &str) -> Vec<String> {
    let k = serde_json::json!(key);
    vec![
        format!(
            r#"{{"output": {{"message": {{"content": {k}}}}}, "usage": {{"inputTokens": 1, "outputTokens": 1}}}}"#
        ),
        format!(
            r#"{{"output": {{"message": {{"content": [{{"text": {k}}}]}}}}, "usage": {{"inputTokens": {k}, "outputTokens": 1}}, "stopReason": {k}}}"#
        ),
        format!(
            r#"{{"output": {{"message": {{"content": [{{"toolUse": {{"toolUseId": {k}, "name": {k}, "input": {{"a": {k}}}}}}}, {{"text": 5}}]}}}}, "usage": {{"inputTokens": 1, "outputTokens": 1}}}}"#
        ),
        format!(
            r#"{{"output": {{"message": {{"content": [{{"toolUse": {{"toolUseId": [{k}], "name": {k}}}}}]}}}}, "usage": {{"inputTokens": 1, "outputTokens": {k}}}}}"#
        ),
    ]
}

/// Each reply of `replies` to one unary call through `call`: each must
/// fail, and no rendering of the failure may hold any of `keys`.
async fn unary_failures<F, Fut>(replies: Vec<Reply>, keys: &[&str], call: F)
where
    F: Fn(ScriptedTransport) -> Fut,
    Fut: std::future::Future<Output = Result<tower_llm_core::ChatResponse, Failure>>,
{
    for (n, reply) in replies.into_iter().enumerate() {
        let t = ScriptedTransport::new(reply);
        let f = call(t).await.expect_err("a failure");
        let shown = rendered(&f);
        for key in keys {
            assert_clean(&shown, key, &format!("unary reply {n}"));
        }
    }
}

/// As [`unary_failures`], for a streaming call: the failure is the call's
/// `Err` (before the commit point) or the stream's terminal item.
async fn stream_failures<F, Fut>(replies: Vec<Reply>, keys: &[&str], call: F)
where
    F: Fn(ScriptedTransport) -> Fut,
    Fut: std::future::Future<Output = Result<ChatStream, Failure>>,
{
    for (n, reply) in replies.into_iter().enumerate() {
        let t = ScriptedTransport::new(reply);
        let f = match call(t).await {
            Err(f) => f,
            Ok(mut stream) => {
                let mut last = None;
                while let Some(item) =
                    std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await
                {
                    if let Err(f) = item {
                        last = Some(f);
                    }
                }
                last.unwrap_or_else(|| panic!("stream reply {n}: no terminal error"))
            }
        };
        let shown = rendered(&f);
        for key in keys {
            assert_clean(&shown, key, &format!("stream reply {n}"));
        }
    }
}

use futures_core::Stream as _;

fn json_replies(bodies: Vec<String>) -> Vec<Reply> {
    bodies
        .into_iter()
        .map(|b| Reply::json(200, b).with_header("x-echo", "x"))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn openai_failures_never_carry_the_key() {
    let keys = [OPENAI_KEY];
    let mut replies = error_replies(OPENAI_KEY, true);
    replies.extend(json_replies(malformed_openai(OPENAI_KEY)));
    unary_failures(replies, &keys, |t| openai(&t).oneshot(req())).await;

    let k = serde_json::json!(OPENAI_KEY);
    let mut streams = error_replies(OPENAI_KEY, true);
    let error_event = |message: String| {
        Step::sse(
            None,
            &serde_json::json!({"error": {"message": message, "type": OPENAI_KEY, "code": OPENAI_KEY}})
                .to_string(),
        )
    };
    for message in [format!("bad key {OPENAI_KEY}"), straddling(OPENAI_KEY)] {
        // Before the commit point, and after it.
        streams.push(Reply::sse_steps(vec![error_event(message.clone())]));
        streams.push(Reply::sse_steps(vec![
            Step::openai_text("Hel"),
            error_event(message),
        ]));
    }
    for data in [
        format!(
            r#"{{"id": {k}, "model": {k}, "choices": [{{"index": {k}, "delta": {{"content": {k}}}}}]}}"#
        ),
        format!(
            r#"{{"choices": [{{"delta": {{"tool_calls": [{{"index": 0, "id": {k}, "function": {{"name": {k}, "arguments": {{"a": {k}}}}}}}]}}}}]}}"#
        ),
        format!(r#"{{"choices": [], "usage": {{"prompt_tokens": {k}}}}}"#),
    ] {
        streams.push(Reply::sse_steps(vec![Step::sse(None, &data)]));
        streams.push(Reply::sse_steps(vec![
            Step::openai_text("Hel"),
            Step::sse(None, &data),
        ]));
    }
    stream_failures(streams, &keys, |t| openai(&t).streaming().oneshot(req())).await;
}

#[tokio::test(start_paused = true)]
async fn anthropic_failures_never_carry_the_key() {
    let keys = [ANTHROPIC_KEY];
    let mut replies = error_replies(ANTHROPIC_KEY, true);
    replies.extend(json_replies(malformed_anthropic(ANTHROPIC_KEY)));
    unary_failures(replies, &keys, |t| anthropic(&t).oneshot(req())).await;

    let k = serde_json::json!(ANTHROPIC_KEY);
    let mut streams = error_replies(ANTHROPIC_KEY, true);
    let error_event = |message: String| {
        Step::sse(
            Some("error"),
            &serde_json::json!({"type": "error", "error": {"type": ANTHROPIC_KEY, "message": message}})
                .to_string(),
        )
    };
    for message in [
        format!("bad key {ANTHROPIC_KEY}"),
        straddling(ANTHROPIC_KEY),
    ] {
        streams.push(Reply::sse_steps(vec![error_event(message.clone())]));
        streams.push(Reply::sse_steps(vec![
            Step::anthropic_text("Hel"),
            error_event(message),
        ]));
    }
    for data in [
        format!(
            r#"{{"type": "content_block_delta", "index": {k}, "delta": {{"type": "text_delta", "text": {k}}}}}"#
        ),
        format!(
            r#"{{"type": "content_block_start", "index": 0, "content_block": {{"type": "tool_use", "id": {k}, "name": 5}}}}"#
        ),
        format!(
            r#"{{"type": "content_block_delta", "index": 0, "delta": {{"type": "input_json_delta", "partial_json": [{k}]}}, "x": {k}}}"#
        ),
        format!(
            r#"{{"type": "message_delta", "delta": {{"stop_reason": {k}}}, "usage": {{"output_tokens": {k}}}}}"#
        ),
        format!(
            r#"{{"type": "message_start", "message": {{"id": {k}, "model": {k}, "usage": {{"input_tokens": {k}}}}}}}"#
        ),
    ] {
        streams.push(Reply::sse_steps(vec![Step::sse(None, &data)]));
        streams.push(Reply::sse_steps(vec![
            Step::anthropic_text("Hel"),
            Step::sse(None, &data),
        ]));
    }
    stream_failures(streams, &keys, |t| anthropic(&t).streaming().oneshot(req())).await;
}

#[tokio::test(start_paused = true)]
async fn bedrock_failures_never_carry_the_credentials() {
    let keys = [AWS_KEY_ID, AWS_TOKEN, AWS_SECRET];
    for key in keys {
        let mut replies = error_replies(key, false);
        replies.extend(json_replies(malformed_bedrock(key)));
        unary_failures(replies, &keys, |t| bedrock(&t).oneshot(req())).await;

        let k = serde_json::json!(key);
        let mut streams = error_replies(key, false);
        let eventstream = |steps| Reply::stream("application/vnd.amazon.eventstream", steps);
        for message in [format!("bad token {key}"), straddling(key)] {
            for kind in ["throttlingException", "validationException", key] {
                streams.push(eventstream(vec![Step::bedrock_exception(kind, &message)]));
                streams.push(eventstream(vec![
                    Step::bedrock_text("Hel"),
                    Step::bedrock_exception(kind, &message),
                ]));
            }
        }
        for payload in [
            format!(r#"{{"contentBlockIndex": {k}, "delta": {{"text": {k}}}}}"#),
            format!(
                r#"{{"contentBlockIndex": 0, "start": {{"toolUse": {{"toolUseId": {k}, "name": 5}}}}}}"#
            ),
            format!(r#"{{"contentBlockIndex": 0, "delta": {{"toolUse": {{"input": [{k}]}}}}}}"#),
        ] {
            let kind = if payload.contains("start") {
                "contentBlockStart"
            } else {
                "contentBlockDelta"
            };
            streams.push(eventstream(vec![Step::bedrock_event(kind, &payload)]));
            streams.push(eventstream(vec![
                Step::bedrock_text("Hel"),
                Step::bedrock_event(kind, &payload),
            ]));
        }
        for payload in [
            format!(r#"{{"stopReason": 3, "x": {k}}}"#),
            format!(r#"{{"usage": {{"inputTokens": {k}}}, "metrics": {k}}}"#),
        ] {
            let kind = if payload.contains("stopReason") {
                "messageStop"
            } else {
                "metadata"
            };
            streams.push(eventstream(vec![
                Step::bedrock_text("Hel"),
                Step::bedrock_event(kind, &payload),
            ]));
        }
        stream_failures(streams, &keys, |t| bedrock(&t).streaming().oneshot(req())).await;
    }
}

#[test]
fn no_debug_output_prints_a_secret() {
    let t = ScriptedTransport::new(Reply::Hang);
    let creds = AwsCredentials::new(AWS_KEY_ID, AWS_SECRET).with_session_token(AWS_TOKEN);
    let signed =
        tower_llm_providers::bedrock::signed_request(&bedrock_config(), &req()).expect("signed");
    // The signed request does carry the credentials it must send...
    let auth = signed
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(auth.contains(AWS_KEY_ID));
    let shown = [
        format!("{creds:?}"),
        format!("{:?}", bedrock_config()),
        format!("{:?}", bedrock(&t)),
        format!("{:?}", bedrock(&t).streaming()),
        format!("{signed:?}"),
        format!("{:?}", signed.headers()),
        format!("{:?}", openai(&t)),
        format!("{:?}", OpenAiConfig::new(ApiKey::new(OPENAI_KEY))),
        format!("{:?}", anthropic(&t)),
        format!("{:?}", AnthropicConfig::new(ApiKey::new(ANTHROPIC_KEY))),
        format!("{:?}", ApiKey::new(OPENAI_KEY)),
    ];
    for (n, shown) in shown.iter().enumerate() {
        for key in [AWS_KEY_ID, AWS_SECRET, AWS_TOKEN, OPENAI_KEY, ANTHROPIC_KEY] {
            assert_clean(shown, key, &format!("Debug output {n}"));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn stream_errors_are_scrubbed_before_they_are_cut() {
    // The 512-byte cut falls inside the key: cut first, then scrubbed,
    // its first part would stay.
    let openai_error = Step::sse(
        None,
        &serde_json::json!({"error": {"type": "server_error", "message": straddling(OPENAI_KEY)}})
            .to_string(),
    );
    let t = ScriptedTransport::new(Reply::sse_steps(vec![
        Step::openai_text("Hel"),
        openai_error,
    ]));
    let mut stream = openai(&t)
        .streaming()
        .oneshot(req())
        .await
        .expect("committed");
    let mut items = Vec::new();
    while let Some(item) = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await {
        items.push(item);
    }
    let f = items.pop().and_then(Result::err).expect("a terminal error");
    assert!(f.is_transient());
    assert!(f.message().is_some_and(|m| m.contains("[redacted]")), "{f}");
    assert_clean(&rendered(&f), OPENAI_KEY, "openai error event");

    let anthropic_error = Step::sse(
        Some("error"),
        &serde_json::json!({"type": "error", "error": {"type": "overloaded_error", "message": straddling(ANTHROPIC_KEY)}})
            .to_string(),
    );
    let t = ScriptedTransport::new(Reply::sse_steps(vec![anthropic_error]));
    let f = anthropic(&t)
        .streaming()
        .oneshot(req())
        .await
        .expect_err("error event");
    assert!(f.is_transient());
    assert!(f.message().is_some_and(|m| m.contains("[redacted]")), "{f}");
    assert_clean(&rendered(&f), ANTHROPIC_KEY, "anthropic error event");

    let t = ScriptedTransport::new(Reply::stream(
        "application/vnd.amazon.eventstream",
        vec![Step::bedrock_exception(
            "throttlingException",
            &straddling(AWS_TOKEN),
        )],
    ));
    let f = bedrock(&t)
        .streaming()
        .oneshot(req())
        .await
        .expect_err("exception");
    assert!(f.is_rate_limited());
    assert_clean(&rendered(&f), AWS_TOKEN, "bedrock exception");
}

#[test]
fn the_signed_request_debug_hides_the_access_key_id() {
    let signed =
        tower_llm_providers::bedrock::signed_request(&bedrock_config(), &req()).expect("signed");
    assert_clean(&format!("{signed:?}"), AWS_KEY_ID, "signed request");
    assert_clean(&format!("{signed:?}"), AWS_TOKEN, "signed request");
}
