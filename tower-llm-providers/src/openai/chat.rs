//! Chat Completions: the OpenAI [`Dialect`] (its request body, its answer,
//! its error answers and its streams) and the [`OpenAi`] service.

use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};
use tower_llm_core::{
    ChatRequest, ChatResponse, Choice, ContentPart, Failure, FailureClass, FinishReason, Message,
    Role, ToolCall, ToolChoice, Usage,
};

use super::config::{OpenAiConfig, PROVIDER};
use crate::dialect::{Dialect, ErrorBody, SseWire};
use crate::failure::{Scrub, error_envelope, error_failure, invalid, invalid_json, to_json};
use crate::provider::Provider;
use crate::stream::openai_event_scrubbed;
use crate::wire::tool_schema;

/// OpenAI Chat Completions as a `Service<ChatRequest>`, over any HTTP
/// transport `T` (a hyper-util client, or a test double): the
/// [`Provider`] speaking the OpenAI dialect, [`OpenAiConfig`].
///
/// The transport never retries: the retry layer is the one retry owner.
/// Errors are classified from the status, the rate-limit headers and the
/// error body: `insufficient_quota` is quota exhausted (not retried, fails
/// over), `context_length_exceeded` is context window exceeded. Streams
/// ([`streaming`](Provider::streaming)) send `stream: true` with
/// `stream_options.include_usage`.
pub type OpenAi<T> = Provider<OpenAiConfig, T>;

/// OpenAI Chat Completions (and every server that speaks it):
/// `POST {base_url}/chat/completions` with the bearer key.
impl Dialect for OpenAiConfig {
    type Wire = SseWire;

    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn encode(&self, req: &ChatRequest, stream: bool) -> Result<http::Request<Bytes>, Failure> {
        let body = to_json(
            PROVIDER,
            &encode_body(req, self.max_completion_tokens, stream),
        )?;
        self.post("chat/completions", body)
    }

    fn decode(
        &self,
        _req: &ChatRequest,
        answer: &http::Response<Bytes>,
        latency: Duration,
    ) -> Result<ChatResponse, Failure> {
        decode(answer.body(), latency)
    }

    fn classify(&self, class: FailureClass, error: &ErrorBody<'_>) -> FailureClass {
        classify(class, error)
    }

    fn secrets(&self) -> Vec<&str> {
        vec![self.api_key.expose()]
    }

    fn wire(&self) -> SseWire {
        let scrub = Scrub::new(self.secrets());
        SseWire::new(move |event| openai_event_scrubbed(event, &scrub))
    }

    fn max_body(&self) -> usize {
        self.max_body
    }
}

/// The Chat Completions request body for `req` (`max_tokens` as is). With
/// `req.stream` set it asks for a stream with usage
/// (`stream_options.include_usage`).
pub fn encode(req: &ChatRequest) -> Value {
    encode_with(req, false)
}

/// The Chat Completions request body for `req`, sending `max_tokens` as
/// `max_completion_tokens` when `max_completion_tokens` is set.
pub fn encode_with(req: &ChatRequest, max_completion_tokens: bool) -> Value {
    encode_body(req, max_completion_tokens, req.stream)
}

fn encode_body(req: &ChatRequest, max_completion_tokens: bool, stream: bool) -> Value {
    let mut body = json!({
        "model": req.model,
        "stream": stream,
    });
    let obj = body.as_object_mut().expect("a JSON object literal");
    // Moved in: `json!` would copy the whole array.
    obj.insert(
        "messages".into(),
        Value::Array(req.messages.iter().map(encode_message).collect()),
    );
    if stream {
        obj.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if !req.tools.is_empty() {
        obj.insert(
            "tools".into(),
            req.tools
                .iter()
                .map(|t| {
                    let mut function =
                        json!({"name": t.name, "parameters": tool_schema(&t.parameters)});
                    if let (Some(d), Some(f)) = (&t.description, function.as_object_mut()) {
                        f.insert("description".into(), json!(d));
                    }
                    json!({"type": "function", "function": function})
                })
                .collect(),
        );
    }
    if let Some(choice) = &req.tool_choice {
        obj.insert(
            "tool_choice".into(),
            match choice {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::None => json!("none"),
                ToolChoice::Required => json!("required"),
                ToolChoice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
                // A choice this dialect cannot express: the provider's default.
                _ => json!("auto"),
            },
        );
    }
    if let Some(t) = req.temperature {
        obj.insert("temperature".into(), json!(t));
    }
    if let Some(p) = req.top_p {
        obj.insert("top_p".into(), json!(p));
    }
    if let Some(m) = req.max_tokens {
        let field = if max_completion_tokens {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        obj.insert(field.into(), json!(m));
    }
    if !req.stop.is_empty() {
        obj.insert("stop".into(), json!(req.stop));
    }
    body
}

fn encode_message(m: &Message) -> Value {
    let role = match m.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
        // A role this dialect does not know speaks as the user.
        _ => "user",
    };
    let only_text = m
        .content
        .iter()
        .all(|p| matches!(p, ContentPart::Text { .. }));
    let content = if only_text {
        json!(m.joined_text())
    } else {
        m.content
            .iter()
            .filter_map(|p| match p {
                ContentPart::Text { text } => Some(json!({"type": "text", "text": text})),
                ContentPart::ImageUrl { url } => {
                    Some(json!({"type": "image_url", "image_url": {"url": url}}))
                }
                // A part this dialect cannot carry is left out.
                _ => None,
            })
            .collect()
    };
    let mut msg = json!({"role": role, "content": content});
    let obj = msg.as_object_mut().expect("a JSON object literal");
    if !m.tool_calls.is_empty() {
        obj.insert(
            "tool_calls".into(),
            m.tool_calls
                .iter()
                .map(|c| {
                    json!({"id": c.id, "type": "function",
                           "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect(),
        );
    }
    if let Some(id) = &m.tool_call_id {
        obj.insert("tool_call_id".into(), json!(id));
    }
    msg
}

#[derive(Deserialize)]
struct WireResponse {
    id: String,
    model: String,
    choices: Vec<WireChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice {
    #[serde(default)]
    index: u32,
    message: WireMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
    #[serde(default)]
    refusal: Option<String>,
}

#[derive(Deserialize)]
pub(crate) struct WireToolCall {
    pub(crate) id: String,
    pub(crate) function: WireFunction,
}

#[derive(Deserialize)]
pub(crate) struct WireFunction {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) arguments: String,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u32>,
    #[serde(default)]
    completion_tokens: Option<u32>,
    #[serde(default)]
    prompt_tokens_details: Option<WireTokenDetails>,
}

#[derive(Deserialize)]
struct WireTokenDetails {
    #[serde(default)]
    cached_tokens: Option<u32>,
}

/// Normalises a Chat Completions response body. A missing required field
/// (`id`, `model`, `choices`, a choice's `message`) is an invalid-response
/// failure naming it; unknown fields are ignored.
pub fn decode(body: &[u8], latency: Duration) -> Result<ChatResponse, Failure> {
    let wire: WireResponse =
        serde_json::from_slice(body).map_err(|e| invalid_json(PROVIDER, &e))?;
    if wire.choices.is_empty() {
        return Err(invalid(PROVIDER, "`choices` is empty"));
    }
    let usage = wire.usage.map_or(Usage::default(), |u| Usage {
        prompt_tokens: u.prompt_tokens.unwrap_or(0),
        completion_tokens: u.completion_tokens.unwrap_or(0),
        cached_input_tokens: u
            .prompt_tokens_details
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0),
    });
    Ok(ChatResponse {
        id: wire.id,
        model: wire.model,
        provider: PROVIDER.into(),
        fallback_position: 0,
        degraded: false,
        idempotent_replayed: false,
        cache: None,
        choices: wire
            .choices
            .into_iter()
            .map(|c| Choice {
                index: c.index,
                finish_reason: if c.message.refusal.is_some() {
                    FinishReason::ContentFilter
                } else {
                    finish_reason(c.finish_reason.as_deref())
                },
                text: c.message.content.unwrap_or_default(),
                tool_calls: c
                    .message
                    .tool_calls
                    .unwrap_or_default()
                    .into_iter()
                    .map(|t| ToolCall {
                        id: t.id,
                        name: t.function.name,
                        arguments: t.function.arguments,
                    })
                    .collect(),
            })
            .collect(),
        usage,
        latency,
        attempts: Vec::new(),
    })
}

fn finish_reason(reason: Option<&str>) -> FinishReason {
    match reason {
        Some("stop") => FinishReason::Stop,
        Some("length") => FinishReason::Length,
        Some("tool_calls" | "function_call") => FinishReason::ToolCalls,
        Some("content_filter") => FinishReason::ContentFilter,
        _ => FinishReason::Other,
    }
}

/// Classifies an OpenAI error answer (a non-2xx status with its headers
/// and body). The body is read leniently: garbage leaves the status's class.
pub fn decode_error(status: http::StatusCode, headers: &http::HeaderMap, body: &[u8]) -> Failure {
    error_failure(
        PROVIDER,
        status,
        headers,
        &error_envelope(body),
        &Scrub::none(),
        classify,
    )
}

/// Sharpens the status's class from an OpenAI error body.
fn classify(class: FailureClass, b: &ErrorBody<'_>) -> FailureClass {
    let is = |s: &str| b.code() == Some(s) || b.kind() == Some(s);
    let message = b.message();
    if is("insufficient_quota") {
        FailureClass::QuotaExhausted
    } else if is("context_length_exceeded")
        || message.contains("maximum context length")
        // A single request over the tokens-per-minute limit: no wait
        // can fix it on this link.
        || message.starts_with("Request too large")
    {
        FailureClass::ContextWindowExceeded
    } else if is("content_filter") || is("content_policy_violation") {
        FailureClass::ContentFiltered
    } else {
        class
    }
}
