//! Converse: the request body, the answer and the error answers.

use std::borrow::Cow;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use tower_llm_core::{
    ChatRequest, ChatResponse, Choice, ContentPart, Failure, FailureClass, FinishReason, Message,
    Role, ToolCall, ToolChoice, Usage,
};

use super::config::PROVIDER;
use crate::failure::{ErrorBody, Scrub, error_failure, invalid_json};
use crate::wire::{data_url, merge_turns, tool_input, tool_schema, turn};

pub(super) fn bad_request(message: String) -> Failure {
    Failure::new(FailureClass::BadRequest)
        .with_provider(PROVIDER)
        .with_message(message)
}
/// The Converse request body for `req`.
///
/// # Errors
///
/// An image given by URL: Converse takes image bytes only.
pub fn encode(req: &ChatRequest) -> Result<Value, Failure> {
    let system: Vec<Value> = req
        .messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(|m| json!({"text": m.joined_text()}))
        .collect();
    let messages = merge_turns(
        req.messages
            .iter()
            .filter(|m| m.role != Role::System)
            .map(encode_message)
            .collect::<Result<Vec<_>, _>>()?,
        |b| b.get("toolResult").is_some(),
    );
    // Moved in: `json!` would copy the whole array.
    let mut obj = serde_json::Map::new();
    obj.insert("messages".into(), Value::Array(messages));
    if !system.is_empty() {
        obj.insert("system".into(), Value::Array(system));
    }
    let mut inference = serde_json::Map::new();
    if let Some(m) = req.max_tokens {
        inference.insert("maxTokens".into(), json!(m));
    }
    if let Some(t) = req.temperature {
        inference.insert("temperature".into(), json!(t));
    }
    if let Some(p) = req.top_p {
        inference.insert("topP".into(), json!(p));
    }
    if !req.stop.is_empty() {
        inference.insert("stopSequences".into(), json!(req.stop));
    }
    if !inference.is_empty() {
        obj.insert("inferenceConfig".into(), Value::Object(inference));
    }
    // Converse has no "none" tool choice: no tools are offered then.
    if !req.tools.is_empty() && req.tool_choice != Some(ToolChoice::None) {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut spec =
                    json!({"name": t.name, "inputSchema": {"json": tool_schema(&t.parameters)}});
                if let (Some(d), Some(o)) = (&t.description, spec.as_object_mut()) {
                    o.insert("description".into(), json!(d));
                }
                json!({"toolSpec": spec})
            })
            .collect();
        let mut config = json!({"tools": tools});
        if let Some(choice) = &req.tool_choice {
            let choice = match choice {
                ToolChoice::Auto | ToolChoice::None => json!({"auto": {}}),
                ToolChoice::Required => json!({"any": {}}),
                ToolChoice::Tool(name) => json!({"tool": {"name": name}}),
                // A choice this dialect cannot express: the provider's default.
                _ => json!({"auto": {}}),
            };
            if let Some(c) = config.as_object_mut() {
                c.insert("toolChoice".into(), choice);
            }
        }
        obj.insert("toolConfig".into(), config);
    }
    Ok(Value::Object(obj))
}

fn encode_message(m: &Message) -> Result<Value, Failure> {
    if m.role == Role::Tool {
        return Ok(json!({"role": "user", "content": [{"toolResult": {
            "toolUseId": m.tool_call_id.as_deref().unwrap_or_default(),
            "content": [{"text": m.joined_text()}],
        }}]}));
    }
    let role = if m.role == Role::Assistant {
        "assistant"
    } else {
        "user"
    };
    let mut blocks = Vec::with_capacity(m.content.len() + m.tool_calls.len());
    for part in &m.content {
        match part {
            // Empty text blocks are rejected.
            ContentPart::Text { text } if text.is_empty() => {}
            ContentPart::Text { text } => blocks.push(json!({"text": text})),
            ContentPart::ImageUrl { url } => {
                let format = data_url(url).and_then(|(media, data)| {
                    let format = match media {
                        "image/png" => "png",
                        "image/jpeg" | "image/jpg" => "jpeg",
                        "image/gif" => "gif",
                        "image/webp" => "webp",
                        _ => return None,
                    };
                    Some((format, data))
                });
                match format {
                    Some((format, data)) => {
                        blocks.push(json!({"image": {"format": format, "source": {"bytes": data}}}))
                    }
                    None => {
                        return Err(bad_request(
                            "Bedrock Converse takes image bytes (a base64 `data:` URL of a png, jpeg, gif or webp), not image links".into(),
                        ));
                    }
                }
            }
            // A part this dialect cannot carry is left out.
            _ => {}
        }
    }
    for call in &m.tool_calls {
        blocks.push(json!({"toolUse": {"toolUseId": call.id, "name": call.name,
                                       "input": tool_input(&call.arguments)}}));
    }
    Ok(turn(role, blocks))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireResponse {
    output: WireOutput,
    #[serde(default)]
    stop_reason: Option<String>,
    usage: WireUsage,
}

#[derive(Deserialize)]
struct WireOutput {
    message: WireMessage,
}

#[derive(Deserialize)]
struct WireMessage {
    content: Vec<WireBlock>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireBlock {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool_use: Option<WireToolUse>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireToolUse {
    tool_use_id: String,
    name: String,
    #[serde(default)]
    input: Value,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WireUsage {
    input_tokens: u32,
    output_tokens: u32,
    #[serde(default)]
    cache_read_input_tokens: Option<u32>,
    #[serde(default)]
    cache_write_input_tokens: Option<u32>,
}

/// Normalises a Converse response body. Converse has no response id: the
/// `x-amzn-RequestId` header stands in. `prompt_tokens` counts every input
/// token (uncached, cache reads and cache writes), as for Anthropic. A
/// missing required field (`output`, `message`, `content`, `usage`) is an
/// invalid-response failure naming it.
pub fn decode(
    body: &[u8],
    request_id: &str,
    model: &str,
    latency: Duration,
) -> Result<ChatResponse, Failure> {
    let wire: WireResponse =
        serde_json::from_slice(body).map_err(|e| invalid_json(PROVIDER, &e))?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in wire.output.message.content {
        if let Some(t) = block.text {
            text.push_str(&t);
        }
        if let Some(t) = block.tool_use {
            tool_calls.push(ToolCall {
                id: t.tool_use_id,
                name: t.name,
                arguments: t.input.to_string(),
            });
        }
    }
    Ok(ChatResponse {
        id: request_id.to_owned(),
        model: model.to_owned(),
        provider: PROVIDER.into(),
        fallback_position: 0,
        degraded: false,
        idempotent_replayed: false,
        cache: None,
        choices: vec![Choice {
            index: 0,
            text,
            tool_calls,
            finish_reason: finish_reason(wire.stop_reason.as_deref()),
        }],
        usage: usage(&wire.usage),
        latency,
        attempts: Vec::new(),
    })
}

/// The normalised finish reason of a Converse `stopReason`.
pub(super) fn finish_reason(stop_reason: Option<&str>) -> FinishReason {
    match stop_reason {
        Some("end_turn" | "stop_sequence") => FinishReason::Stop,
        Some("max_tokens") => FinishReason::Length,
        Some("tool_use") => FinishReason::ToolCalls,
        Some("guardrail_intervened" | "content_filtered") => FinishReason::ContentFilter,
        _ => FinishReason::Other,
    }
}

/// Converse token counts; `prompt_tokens` counts every input token.
pub(super) fn usage(u: &WireUsage) -> Usage {
    let cache_read = u.cache_read_input_tokens.unwrap_or(0);
    let cache_write = u.cache_write_input_tokens.unwrap_or(0);
    Usage {
        prompt_tokens: u
            .input_tokens
            .saturating_add(cache_read)
            .saturating_add(cache_write),
        completion_tokens: u.output_tokens,
        cached_input_tokens: cache_read,
    }
}

/// `true` for a validation message saying the input is over the model's
/// context window (matched lower-case).
pub(super) fn is_context_window(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    message.contains("input is too long")
        || message.contains("prompt is too long")
        || message.contains("too many input tokens")
        || message.contains("context length")
}

#[derive(Deserialize, Default)]
pub(super) struct WireError<'a> {
    #[serde(borrow, default, alias = "Message")]
    pub(super) message: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, rename = "__type")]
    kind: Option<std::borrow::Cow<'a, str>>,
}

/// The AWS error name in `raw` (an `x-amzn-ErrorType` header or a body's
/// `__type`): up to its first `:`, after any `#` namespace.
fn error_name(raw: &str) -> &str {
    let name = raw.split(':').next().unwrap_or(raw);
    name.rsplit('#').next().unwrap_or(name).trim()
}

/// What a Bedrock error answer says: the AWS error name from the
/// `x-amzn-ErrorType` header (or the body's `__type`), and the body's
/// `message` (or `Message`). Garbage gives an empty body.
pub(super) fn error_body<'a>(headers: &'a HeaderMap, body: &'a [u8]) -> ErrorBody<'a> {
    let e: WireError<'a> = serde_json::from_slice(body).unwrap_or_default();
    let kind = match headers
        .get("x-amzn-errortype")
        .and_then(|v| v.to_str().ok())
    {
        Some(raw) => Some(Cow::Borrowed(error_name(raw))),
        None => e.kind.map(|raw| match raw {
            Cow::Borrowed(raw) => Cow::Borrowed(error_name(raw)),
            Cow::Owned(raw) => Cow::Owned(error_name(&raw).to_owned()),
        }),
    };
    ErrorBody::new(kind, None, e.message)
}

/// Classifies a Bedrock error answer (a non-2xx status with its headers and
/// body). Garbage leaves the status's class.
pub fn decode_error(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Failure {
    error_failure(
        PROVIDER,
        status,
        headers,
        &error_body(headers, body),
        &Scrub::none(),
        classify,
    )
}

/// Sharpens the status's class from the AWS error name.
pub(super) fn classify(class: FailureClass, b: &ErrorBody<'_>) -> FailureClass {
    let message = b.message().to_ascii_lowercase();
    match b.kind() {
        Some("ThrottlingException") => FailureClass::RateLimited,
        Some(
            "ServiceUnavailableException"
            | "InternalServerException"
            | "ModelNotReadyException"
            | "ModelErrorException",
        ) => FailureClass::Transient,
        Some("ModelTimeoutException") => FailureClass::Timeout,
        Some("ValidationException") if is_context_window(&message) => {
            FailureClass::ContextWindowExceeded
        }
        Some("ValidationException") => FailureClass::BadRequest,
        Some("AccessDeniedException" | "UnrecognizedClientException" | "ExpiredTokenException") => {
            FailureClass::Auth
        }
        Some("ResourceNotFoundException") => FailureClass::NotFound,
        Some("ServiceQuotaExceededException") => FailureClass::QuotaExhausted,
        _ => class,
    }
}
