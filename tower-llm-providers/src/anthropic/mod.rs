//! Anthropic Messages: the Anthropic [`Dialect`] and the [`Anthropic`]
//! service; and the server side of the wire format ([`server`]).

pub mod server;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use serde::Deserialize;
use serde_json::{Value, json};
use tower_llm_core::{
    ChatRequest, ChatResponse, Choice, ContentPart, Failure, FailureClass, FinishReason, Message,
    Role, ToolCall, ToolChoice, Usage,
};

use crate::dialect::{Dialect, ErrorBody, SseWire};
use crate::failure::{Scrub, build_error, error_envelope, error_failure, invalid_json, to_json};
use crate::provider::Provider;
use crate::secret::ApiKey;
use crate::stream::anthropic_event_scrubbed;
use crate::transport::DEFAULT_MAX_BODY;
use crate::wire::{data_url, merge_turns, secret_header, tool_input, tool_schema, turn};

const PROVIDER: &str = "anthropic";

/// The `anthropic-version` header sent by default.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// `max_tokens` sent when the request sets none (Anthropic requires it).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// Settings of an [`Anthropic`] service, and the Anthropic [`Dialect`]:
/// `Anthropic::new(transport, config)` is [`Provider::new`] with this
/// dialect.
///
/// ```
/// use tower_llm_providers::{AnthropicConfig, ApiKey};
///
/// let cfg = AnthropicConfig::new(ApiKey::new("sk-ant-..."));
/// assert_eq!(cfg.base_url(), "https://api.anthropic.com");
/// assert!(!format!("{cfg:?}").contains("sk-ant"));
/// ```
#[derive(Debug, Clone)]
pub struct AnthropicConfig {
    api_key: ApiKey,
    base_url: Arc<str>,
    version: Arc<str>,
    max_body: usize,
}

impl AnthropicConfig {
    /// The official API with `api_key`.
    pub fn new(api_key: ApiKey) -> Self {
        AnthropicConfig {
            api_key,
            base_url: "https://api.anthropic.com".into(),
            version: ANTHROPIC_VERSION.into(),
            max_body: DEFAULT_MAX_BODY,
        }
    }

    /// Another base URL (a proxy, a test server); the service posts to
    /// `{base_url}/v1/messages`.
    #[must_use]
    pub fn with_base_url(mut self, base_url: &str) -> Self {
        self.base_url = base_url.trim_end_matches('/').into();
        self
    }

    /// The `anthropic-version` header (default [`ANTHROPIC_VERSION`]).
    #[must_use]
    pub fn with_version(mut self, version: &str) -> Self {
        self.version = version.into();
        self
    }

    /// The largest response body read (default 16 MiB).
    #[must_use]
    pub fn with_max_body(mut self, max_body: usize) -> Self {
        self.max_body = max_body;
        self
    }

    /// The base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }
}

/// Anthropic Messages as a `Service<ChatRequest>`, over any HTTP transport:
/// the [`Provider`] speaking the Anthropic dialect, [`AnthropicConfig`].
///
/// System messages become the top-level `system`, tool results become
/// `tool_result` blocks, and a missing `max_tokens` is sent as
/// [`DEFAULT_MAX_TOKENS`]. Errors: 529 `overloaded_error` is transient, a
/// spend or credit limit is quota exhausted, "prompt is too long" is context
/// window exceeded. Streams ([`streaming`](Provider::streaming)) send
/// `stream: true`.
pub type Anthropic<T> = Provider<AnthropicConfig, T>;

/// Anthropic Messages: `POST {base_url}/v1/messages` with `x-api-key` and
/// `anthropic-version`.
impl Dialect for AnthropicConfig {
    type Wire = SseWire;

    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn encode(&self, req: &ChatRequest, stream: bool) -> Result<http::Request<Bytes>, Failure> {
        let mut body = encode(req);
        if let Some(obj) = body.as_object_mut() {
            obj.insert("stream".into(), Value::Bool(stream));
        }
        let body = to_json(PROVIDER, &body)?;
        http::Request::post(format!("{}/v1/messages", self.base_url))
            .header(CONTENT_TYPE, "application/json")
            .header("x-api-key", secret_header(PROVIDER, self.api_key.expose())?)
            .header("anthropic-version", &*self.version)
            .body(Bytes::from(body))
            .map_err(build_error(PROVIDER))
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
        SseWire::new(move |event| anthropic_event_scrubbed(event, &scrub))
    }

    fn max_body(&self) -> usize {
        self.max_body
    }
}

/// The Messages request body for `req` (`stream` as `req.stream` says).
pub fn encode(req: &ChatRequest) -> Value {
    let system: Vec<String> = req
        .messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(Message::joined_text)
        .collect();
    let messages: Vec<Value> = merge_turns(
        req.messages
            .iter()
            .filter(|m| m.role != Role::System)
            .map(encode_message)
            .collect(),
        |b| b.get("type").and_then(Value::as_str) == Some("tool_result"),
    );
    let mut body = json!({
        "model": req.model,
        "max_tokens": req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        "stream": req.stream,
    });
    let obj = body.as_object_mut().expect("a JSON object literal");
    // Moved in: `json!` would copy the whole array.
    obj.insert("messages".into(), Value::Array(messages));
    if !system.is_empty() {
        obj.insert("system".into(), json!(system.join("\n\n")));
    }
    if !req.tools.is_empty() {
        obj.insert(
            "tools".into(),
            req.tools
                .iter()
                .map(|t| {
                    let mut tool =
                        json!({"name": t.name, "input_schema": tool_schema(&t.parameters)});
                    if let (Some(d), Some(o)) = (&t.description, tool.as_object_mut()) {
                        o.insert("description".into(), json!(d));
                    }
                    tool
                })
                .collect(),
        );
    }
    if let Some(choice) = &req.tool_choice {
        obj.insert(
            "tool_choice".into(),
            match choice {
                ToolChoice::Auto => json!({"type": "auto"}),
                ToolChoice::None => json!({"type": "none"}),
                ToolChoice::Required => json!({"type": "any"}),
                ToolChoice::Tool(name) => json!({"type": "tool", "name": name}),
                // A choice this dialect cannot express: the provider's default.
                _ => json!({"type": "auto"}),
            },
        );
    }
    if let Some(t) = req.temperature {
        obj.insert("temperature".into(), json!(t));
    }
    if let Some(p) = req.top_p {
        obj.insert("top_p".into(), json!(p));
    }
    if !req.stop.is_empty() {
        obj.insert("stop_sequences".into(), json!(req.stop));
    }
    body
}

fn encode_message(m: &Message) -> Value {
    if m.role == Role::Tool {
        return json!({"role": "user", "content": [{
            "type": "tool_result",
            "tool_use_id": m.tool_call_id.as_deref().unwrap_or_default(),
            "content": m.joined_text(),
        }]});
    }
    let role = if m.role == Role::Assistant {
        "assistant"
    } else {
        "user"
    };
    let mut blocks: Vec<Value> = m
        .content
        .iter()
        .filter_map(|p| match p {
            // Empty text blocks are rejected (an assistant tool-call turn
            // usually has no text).
            ContentPart::Text { text } if text.is_empty() => None,
            ContentPart::Text { text } => Some(json!({"type": "text", "text": text})),
            ContentPart::ImageUrl { url } => Some(match data_url(url) {
                Some((media_type, data)) => json!({"type": "image", "source":
                    {"type": "base64", "media_type": media_type, "data": data}}),
                None => json!({"type": "image", "source": {"type": "url", "url": url}}),
            }),
            // A part this dialect cannot carry is left out.
            _ => None,
        })
        .collect();
    for call in &m.tool_calls {
        blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name,
                           "input": tool_input(&call.arguments)}));
    }
    turn(role, blocks)
}

#[derive(Deserialize)]
struct WireResponse {
    id: String,
    model: String,
    content: Vec<WireBlock>,
    #[serde(default)]
    stop_reason: Option<String>,
    usage: WireUsage,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct WireUsage {
    input_tokens: u32,
    output_tokens: u32,
    #[serde(default)]
    cache_read_input_tokens: Option<u32>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u32>,
}

/// Normalises a Messages response body. `prompt_tokens` counts every input
/// token (uncached, cache reads and cache writes), `cached_input_tokens` the
/// cache reads. A missing required field (`id`, `model`, `content`,
/// `usage`) is an invalid-response failure naming it.
pub fn decode(body: &[u8], latency: Duration) -> Result<ChatResponse, Failure> {
    let wire: WireResponse =
        serde_json::from_slice(body).map_err(|e| invalid_json(PROVIDER, &e))?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in wire.content {
        match block {
            WireBlock::Text { text: t } => text.push_str(&t),
            WireBlock::ToolUse { id, name, input } => tool_calls.push(ToolCall {
                id,
                name,
                arguments: input.to_string(),
            }),
            WireBlock::Other => {}
        }
    }
    let cache_read = wire.usage.cache_read_input_tokens.unwrap_or(0);
    let cache_write = wire.usage.cache_creation_input_tokens.unwrap_or(0);
    Ok(ChatResponse {
        id: wire.id,
        model: wire.model,
        provider: PROVIDER.into(),
        fallback_position: 0,
        degraded: false,
        idempotent_replayed: false,
        cache: None,
        choices: vec![Choice {
            index: 0,
            text,
            tool_calls,
            finish_reason: match wire.stop_reason.as_deref() {
                Some("end_turn" | "stop_sequence") => FinishReason::Stop,
                Some("max_tokens") => FinishReason::Length,
                Some("tool_use") => FinishReason::ToolCalls,
                Some("refusal") => FinishReason::ContentFilter,
                _ => FinishReason::Other,
            },
        }],
        usage: Usage {
            prompt_tokens: wire
                .usage
                .input_tokens
                .saturating_add(cache_read)
                .saturating_add(cache_write),
            completion_tokens: wire.usage.output_tokens,
            cached_input_tokens: cache_read,
        },
        latency,
        attempts: Vec::new(),
    })
}

/// Classifies an Anthropic error answer (a non-2xx status with its headers
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

/// Sharpens the status's class from an Anthropic error body.
fn classify(class: FailureClass, b: &ErrorBody<'_>) -> FailureClass {
    let message = b.message();
    if message.contains("credit balance")
        || message.contains("usage limit")
        || message.contains("Extra usage is required")
    {
        FailureClass::QuotaExhausted
    } else if message.contains("prompt is too long") {
        FailureClass::ContextWindowExceeded
    } else if b.kind() == Some("overloaded_error") {
        FailureClass::Transient
    } else {
        class
    }
}
