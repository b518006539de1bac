//! Anthropic Messages.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http_body::Body;
use serde::Deserialize;
use serde_json::{Value, json};
use tower_llm_core::{
    BoxError, ChatRequest, ChatResponse, Choice, ContentPart, Failure, FailureClass, FinishReason,
    Message, Role, ToolCall, ToolChoice, Usage,
};
use tower_service::Service;

use crate::failure::Scrub;
use crate::failure::{build_error, error_envelope, error_failure, invalid_json};
use crate::transport::{
    Answer, DEFAULT_MAX_BODY, RequestBody, poll_transport, round_trip, take_ready,
};
use crate::wire::{data_url, merge_turns, secret_header, tool_input, tool_schema, turn};
use crate::{ApiKey, ProviderFuture};

const PROVIDER: &str = "anthropic";

/// The `anthropic-version` header sent by default.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// `max_tokens` sent when the request sets none (Anthropic requires it).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// Settings of an [`Anthropic`] service.
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

    /// The secrets to remove from upstream text: the key.
    pub(crate) fn scrub(&self) -> Scrub {
        Scrub::new([self.api_key.expose()])
    }
}

/// Anthropic Messages as a `Service<ChatRequest>`, over any HTTP transport.
///
/// System messages become the top-level `system`, tool results become
/// `tool_result` blocks, and a missing `max_tokens` is sent as
/// [`DEFAULT_MAX_TOKENS`]. Errors: 529 `overloaded_error` is transient, a
/// spend or credit limit is quota exhausted, "prompt is too long" is context
/// window exceeded.
#[derive(Debug, Clone)]
pub struct Anthropic<T> {
    transport: T,
    config: Arc<AnthropicConfig>,
    metrics: tower_llm_core::GenAiMetrics,
}

impl<T> Anthropic<T> {
    /// A service sending through `transport`.
    pub fn new(transport: T, config: AnthropicConfig) -> Self {
        Anthropic {
            transport,
            config: Arc::new(config),
            metrics: tower_llm_core::GenAiMetrics::global(),
        }
    }

    /// Records the GenAI client metrics (`gen_ai.client.operation.duration`,
    /// `gen_ai.client.token.usage`) on `metrics`. Default:
    /// [`GenAiMetrics::global`](tower_llm_core::GenAiMetrics::global), a
    /// no-op until the host installs an OpenTelemetry SDK.
    #[must_use]
    pub fn with_metrics(mut self, metrics: tower_llm_core::GenAiMetrics) -> Self {
        self.metrics = metrics;
        self
    }
}

impl<T, B> Service<ChatRequest> for Anthropic<T>
where
    T: Service<http::Request<RequestBody>, Response = http::Response<B>> + Clone + Send + 'static,
    T::Future: Send + 'static,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = ChatResponse;
    type Error = Failure;
    type Future = ProviderFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        poll_transport(&mut self.transport, cx, PROVIDER)
    }

    fn call(&mut self, req: ChatRequest) -> Self::Future {
        let mut transport = take_ready(&mut self.transport);
        let config = self.config.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let call = chat(&mut transport, &config, &req);
            let model = crate::transport::metric_model(&req);
            crate::transport::timed_chat(&metrics, PROVIDER, &model, call).await
        })
    }
}

/// One unary Messages call.
async fn chat<T, B>(
    transport: &mut T,
    config: &AnthropicConfig,
    req: &ChatRequest,
) -> Result<ChatResponse, Failure>
where
    T: Service<http::Request<RequestBody>, Response = http::Response<B>>,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let http_req = request(config, req, false)?;
    let Answer {
        parts,
        body: bytes,
        latency,
    } = round_trip(transport, http_req, config.max_body, PROVIDER).await?;
    if !parts.status.is_success() {
        return Err(decode_error_scrubbed(
            parts.status,
            &parts.headers,
            &bytes,
            &config.scrub(),
        ));
    }
    decode(&bytes, latency).map_err(|f| f.with_status(parts.status))
}

/// The Messages POST for `req` (streaming or not).
fn request(
    config: &AnthropicConfig,
    req: &ChatRequest,
    stream: bool,
) -> Result<http::Request<RequestBody>, Failure> {
    let mut body = encode(req);
    if let Some(obj) = body.as_object_mut() {
        obj.insert("stream".into(), Value::Bool(stream));
    }
    let body = crate::failure::to_json(PROVIDER, &body)?;
    http::Request::post(format!("{}/v1/messages", config.base_url))
        .header(CONTENT_TYPE, "application/json")
        .header(
            "x-api-key",
            secret_header(PROVIDER, config.api_key.expose())?,
        )
        .header("anthropic-version", &*config.version)
        .body(RequestBody::new(Bytes::from(body)))
        .map(|mut req| {
            crate::transport::inject_trace_context(req.headers_mut());
            req
        })
        .map_err(build_error(PROVIDER))
}

impl<T> Anthropic<T> {
    /// This provider as a streaming service (`stream: true`); see
    /// [`Streaming`](crate::Streaming).
    pub fn streaming(self) -> crate::Streaming<Self> {
        crate::Streaming::new(self)
    }
}

impl<T> crate::streaming::private::Sealed for Anthropic<T> {}

impl<T, B> crate::StreamSource for Anthropic<T>
where
    T: Service<http::Request<RequestBody>, Response = http::Response<B>> + Clone + Send + 'static,
    T::Future: Send + 'static,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    fn poll_ready_stream(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        poll_transport(&mut self.transport, cx, PROVIDER)
    }

    fn open_stream(
        &mut self,
        req: ChatRequest,
        timeouts: crate::StreamTimeouts,
    ) -> crate::StreamFuture {
        let transport = take_ready(&mut self.transport);
        let config = self.config.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let http_req = request(&config, &req, true)?;
            let open = crate::streaming::Open {
                wire: crate::streaming::SseWire::new(
                    crate::stream::anthropic_event_scrubbed,
                    config.scrub(),
                ),
                provider: PROVIDER,
                model: req.model.to_string(),
                metric_model: crate::transport::metric_model(&req),
                max_error_body: config.max_body,
                timeouts,
                deadline: tower_llm_core::Deadline::of(&req),
                metrics,
                error: |parts: &http::response::Parts, body: &[u8]| {
                    decode_error_scrubbed(parts.status, &parts.headers, body, &config.scrub())
                },
            };
            crate::streaming::open(transport, http_req, open).await
        })
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
    decode_error_scrubbed(status, headers, body, &Scrub::none())
}

/// As [`decode_error`], removing the secrets of `scrub` (the API key sent)
/// from the provider's message.
fn decode_error_scrubbed(
    status: http::StatusCode,
    headers: &http::HeaderMap,
    body: &[u8],
    scrub: &Scrub,
) -> Failure {
    let parsed = error_envelope(body);
    error_failure(PROVIDER, status, headers, &parsed, scrub, |class, b| {
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
    })
}
