//! The script: replies, the steps of a streamed body, and what a double
//! received.

use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;

/// One scripted reply.
#[derive(Debug, Clone)]
pub enum Reply {
    /// An answer with this status, headers and body.
    Answer {
        /// The status.
        status: u16,
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// The body.
        body: Bytes,
    },
    /// The reply after a delay (tokio time: virtual in paused tests).
    Delayed(Duration, Box<Reply>),
    /// Never answers.
    Hang,
    /// The connection closes before any answer (a reset).
    Reset,
    /// A 200 whose body breaks off after `sent` (declaring more).
    Truncated {
        /// What is sent before the connection drops.
        sent: Bytes,
    },
    /// A 200 with a body of `len` bytes of whitespace, sent in chunks.
    Oversized {
        /// The body length.
        len: usize,
    },
    /// A 200 `text/event-stream` body made of these events (each already
    /// framed, for example `data: {...}\n\n`).
    Sse(Vec<String>),
    /// The reply this function builds from the request (for example, an
    /// echo of the prompt).
    With(fn(&Recorded) -> Reply),
    /// A 200 streamed body with this content type, played step by step
    /// (pauses, stalls and breaks between the bytes).
    Stream {
        /// The `content-type` header.
        content_type: String,
        /// What the body does, in order.
        steps: Vec<Step>,
    },
}

/// One step of a [`Reply::Stream`] body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Sends these bytes as one body frame.
    Send(Bytes),
    /// Waits (tokio time: virtual in paused tests).
    Pause(Duration),
    /// Sends nothing more and never ends (the connection stays open).
    Stall,
    /// The connection breaks off here.
    Break,
}

impl Step {
    /// One server-sent event: `event: NAME` (if given) and `data: DATA`.
    pub fn sse(event: Option<&str>, data: &str) -> Self {
        let mut text = String::new();
        if let Some(event) = event {
            text.push_str("event: ");
            text.push_str(event);
            text.push('\n');
        }
        text.push_str("data: ");
        text.push_str(data);
        text.push_str("\n\n");
        Step::Send(Bytes::from(text))
    }

    /// An OpenAI stream chunk with `text` as the delta.
    pub fn openai_text(text: &str) -> Self {
        let chunk = serde_json::json!({
            "id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0,
            "model": "mock-model",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]
        });
        Step::sse(None, &chunk.to_string())
    }

    /// An Anthropic `content_block_delta` with `text`.
    pub fn anthropic_text(text: &str) -> Self {
        let delta = serde_json::json!({
            "type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": text}
        });
        Step::sse(Some("content_block_delta"), &delta.to_string())
    }

    /// A Bedrock ConverseStream `contentBlockDelta` message with `text`.
    pub fn bedrock_text(text: &str) -> Self {
        let payload = serde_json::json!({"contentBlockIndex": 0, "delta": {"text": text}});
        Step::bedrock_event("contentBlockDelta", &payload.to_string())
    }

    /// One Bedrock event-stream message (`:message-type` `event`) with a
    /// JSON payload, framed with its CRCs.
    pub fn bedrock_event(event_type: &str, payload: &str) -> Self {
        Step::Send(event_stream_message(
            &[
                (":event-type", event_type),
                (":content-type", "application/json"),
                (":message-type", "event"),
            ],
            payload,
        ))
    }

    /// One Bedrock event-stream exception message (for example
    /// `throttlingException`) with `{"message": ...}`.
    pub fn bedrock_exception(exception_type: &str, message: &str) -> Self {
        let payload = serde_json::json!({ "message": message });
        Step::Send(event_stream_message(
            &[
                (":exception-type", exception_type),
                (":content-type", "application/json"),
                (":message-type", "exception"),
            ],
            &payload.to_string(),
        ))
    }
}

/// Frames one event-stream message (string headers, prelude and message
/// CRCs) with `aws-smithy-eventstream`.
fn event_stream_message(headers: &[(&str, &str)], payload: &str) -> Bytes {
    use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
    let mut message = Message::new(Bytes::copy_from_slice(payload.as_bytes()));
    for (name, value) in headers {
        message = message.add_header(Header::new(
            (*name).to_owned(),
            HeaderValue::String((*value).to_owned().into()),
        ));
    }
    let mut out = Vec::new();
    // Writing to a Vec only fails for headers or payloads over 4 GiB.
    if aws_smithy_eventstream::frame::write_message_to(&message, &mut out).is_err() {
        out.clear();
    }
    Bytes::from(out)
}

impl Reply {
    /// A JSON answer with `status`.
    pub fn json(status: u16, body: impl Into<Bytes>) -> Self {
        Reply::Answer {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.into(),
        }
    }

    /// Adds a header to an [`Reply::Answer`] (other replies are unchanged).
    #[must_use]
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        if let Reply::Answer { headers, .. } = &mut self {
            headers.push((name.into(), value.into()));
        }
        self
    }

    /// The reply after `delay`.
    #[must_use]
    pub fn after(self, delay: Duration) -> Self {
        Reply::Delayed(delay, Box::new(self))
    }

    /// An OpenAI Chat Completions answer with `text`.
    pub fn openai_text(text: &str) -> Self {
        let body = serde_json::json!({
            "id": "chatcmpl-mock", "object": "chat.completion", "created": 0, "model": "mock-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        });
        Reply::json(200, body.to_string())
    }

    /// An Anthropic Messages answer with `text`.
    pub fn anthropic_text(text: &str) -> Self {
        let body = serde_json::json!({
            "id": "msg_mock", "type": "message", "role": "assistant", "model": "mock-model",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 10, "output_tokens": 5}
        });
        Reply::json(200, body.to_string())
    }

    /// An OpenAI-style error answer.
    pub fn openai_error(status: u16, kind: &str, message: &str) -> Self {
        let body = serde_json::json!({"error": {"message": message, "type": kind, "code": kind}});
        Reply::json(status, body.to_string())
    }

    /// A 200 stream with this content type playing `steps`.
    pub fn stream(content_type: &str, steps: Vec<Step>) -> Self {
        Reply::Stream {
            content_type: content_type.into(),
            steps,
        }
    }

    /// A 200 `text/event-stream` playing `steps`.
    pub fn sse_steps(steps: Vec<Step>) -> Self {
        Reply::stream("text/event-stream", steps)
    }

    /// A complete OpenAI stream: a role chunk, one chunk per piece of
    /// `pieces`, a stop chunk, a usage chunk and `[DONE]`.
    pub fn openai_stream(pieces: &[&str]) -> Self {
        Reply::sse_steps(openai_stream_steps(pieces, true))
    }

    /// A complete Anthropic stream: `message_start`, `content_block_start`,
    /// a `ping`, one delta per piece, `content_block_stop`, `message_delta`
    /// (stop reason, usage) and `message_stop`.
    pub fn anthropic_stream(pieces: &[&str]) -> Self {
        Reply::sse_steps(anthropic_stream_steps(pieces, true))
    }

    /// A complete Bedrock ConverseStream: `messageStart`, one
    /// `contentBlockDelta` per piece, `contentBlockStop`, `messageStop` and
    /// `metadata` with usage, in AWS event-stream framing.
    pub fn bedrock_stream(pieces: &[&str]) -> Self {
        Reply::stream(
            "application/vnd.amazon.eventstream",
            bedrock_stream_steps(pieces, true),
        )
    }

    /// A Gemini `generateContent` answer with `text` (finish reason
    /// `STOP`, 10 prompt and 5 candidate tokens, model `mock-model`).
    pub fn gemini_text(text: &str) -> Self {
        let body = serde_json::json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                            "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
            "modelVersion": "mock-model", "responseId": "mock-response"
        });
        Reply::json(200, body.to_string())
    }

    /// A complete Gemini `streamGenerateContent?alt=sse` stream: one event
    /// per piece of `pieces`, then one with finish reason `STOP` and the
    /// usage (Gemini sends no terminator: the body ends).
    pub fn gemini_stream(pieces: &[&str]) -> Self {
        let event = |text: &str, last: bool| {
            let mut candidate = serde_json::json!({
                "content": {"role": "model", "parts": [{"text": text}]}, "index": 0
            });
            let mut e =
                serde_json::json!({"modelVersion": "mock-model", "responseId": "mock-response"});
            if last {
                candidate["finishReason"] = "STOP".into();
                e["usageMetadata"] = serde_json::json!({
                    "promptTokenCount": 10, "candidatesTokenCount": pieces.len(),
                    "totalTokenCount": 10 + pieces.len()
                });
            }
            e["candidates"] = serde_json::json!([candidate]);
            Step::sse(None, &e.to_string())
        };
        let mut steps: Vec<Step> = pieces.iter().map(|p| event(p, false)).collect();
        steps.push(event("", true));
        Reply::sse_steps(steps)
    }

    /// Malformed JSON with status 200.
    pub fn malformed() -> Self {
        Reply::json(200, "{\"id\": \"x\", \"choices\": [")
    }
}

/// The steps of an OpenAI stream of `pieces`, with the stop chunk, the
/// usage chunk and `[DONE]` when `terminated`.
pub fn openai_stream_steps(pieces: &[&str], terminated: bool) -> Vec<Step> {
    let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
        serde_json::json!({
            "id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0,
            "model": "mock-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
        })
        .to_string()
    };
    let mut steps = vec![Step::sse(
        None,
        &chunk(
            serde_json::json!({"role": "assistant", "content": ""}),
            serde_json::Value::Null,
        ),
    )];
    steps.extend(pieces.iter().map(|p| Step::openai_text(p)));
    if terminated {
        steps.push(Step::sse(
            None,
            &chunk(serde_json::json!({}), "stop".into()),
        ));
        let usage = serde_json::json!({
            "id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0,
            "model": "mock-model", "choices": [],
            "usage": {"prompt_tokens": 10, "completion_tokens": pieces.len(), "total_tokens": 10 + pieces.len()}
        });
        steps.push(Step::sse(None, &usage.to_string()));
        steps.push(Step::sse(None, "[DONE]"));
    }
    steps
}

/// The steps of an Anthropic stream of `pieces`, through `message_stop`
/// when `terminated`.
pub fn anthropic_stream_steps(pieces: &[&str], terminated: bool) -> Vec<Step> {
    let start = serde_json::json!({
        "type": "message_start",
        "message": {"id": "msg_mock", "type": "message", "role": "assistant", "content": [],
                    "model": "mock-model", "stop_reason": null,
                    "usage": {"input_tokens": 10, "output_tokens": 1}}
    });
    let mut steps = vec![
        Step::sse(Some("message_start"), &start.to_string()),
        Step::sse(
            Some("content_block_start"),
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
        Step::sse(Some("ping"), r#"{"type": "ping"}"#),
    ];
    steps.extend(pieces.iter().map(|p| Step::anthropic_text(p)));
    if terminated {
        steps.push(Step::sse(
            Some("content_block_stop"),
            r#"{"type":"content_block_stop","index":0}"#,
        ));
        let delta = serde_json::json!({
            "type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"output_tokens": pieces.len()}
        });
        steps.push(Step::sse(Some("message_delta"), &delta.to_string()));
        steps.push(Step::sse(
            Some("message_stop"),
            r#"{"type":"message_stop"}"#,
        ));
    }
    steps
}

/// The steps of a Bedrock ConverseStream of `pieces`, through
/// `messageStop` and `metadata` when `terminated`.
pub fn bedrock_stream_steps(pieces: &[&str], terminated: bool) -> Vec<Step> {
    let mut steps = vec![Step::bedrock_event(
        "messageStart",
        r#"{"role":"assistant"}"#,
    )];
    steps.extend(pieces.iter().map(|p| Step::bedrock_text(p)));
    if terminated {
        steps.push(Step::bedrock_event(
            "contentBlockStop",
            r#"{"contentBlockIndex":0}"#,
        ));
        steps.push(Step::bedrock_event(
            "messageStop",
            r#"{"stopReason":"end_turn"}"#,
        ));
        let metadata = serde_json::json!({
            "usage": {"inputTokens": 10, "outputTokens": pieces.len(), "totalTokens": 10 + pieces.len()},
            "metrics": {"latencyMs": 1}
        });
        steps.push(Step::bedrock_event("metadata", &metadata.to_string()));
    }
    steps
}

/// What a double received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The method.
    pub method: http::Method,
    /// The path and query.
    pub path: String,
    /// The headers (credentials included: keep these out of logs).
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}
