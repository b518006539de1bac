//! OpenAI Chat Completions, and every server that speaks it.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http_body::Body;
use serde::Deserialize;
use serde_json::{Value, json};
use tower_llm_core::{
    BoxError, ChatRequest, ChatResponse, Choice, ContentPart, EmbeddingRequest, EmbeddingResponse,
    Failure, FailureClass, FinishReason, Message, Role, ToolCall, ToolChoice, Usage,
};
use tower_service::Service;

use crate::failure::Scrub;
use crate::failure::{build_error, error_envelope, error_failure, invalid, invalid_json};
use crate::transport::{
    Answer, DEFAULT_MAX_BODY, RequestBody, poll_transport, round_trip, take_ready,
};
use crate::wire::{secret_header, tool_schema};
use crate::{ApiKey, ProviderFuture};

const PROVIDER: &str = "openai";

/// Settings of an [`OpenAi`] service.
///
/// `base_url` makes any OpenAI-compatible server work (Azure OpenAI,
/// vLLM, Ollama, Groq, ...): the service posts to
/// `{base_url}/chat/completions`.
///
/// ```
/// use tower_llm_providers::{ApiKey, OpenAiConfig};
///
/// let official = OpenAiConfig::new(ApiKey::new("sk-..."));
/// assert_eq!(official.base_url(), "https://api.openai.com/v1");
/// let local = OpenAiConfig::new(ApiKey::new("unused"))
///     .with_base_url("http://127.0.0.1:11434/v1"); // Ollama
/// assert!(format!("{local:?}").contains("[redacted]"));
/// ```
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    api_key: ApiKey,
    base_url: Arc<str>,
    max_body: usize,
    max_completion_tokens: bool,
}

impl OpenAiConfig {
    /// The official API with `api_key`.
    pub fn new(api_key: ApiKey) -> Self {
        OpenAiConfig {
            api_key,
            base_url: "https://api.openai.com/v1".into(),
            max_body: DEFAULT_MAX_BODY,
            max_completion_tokens: false,
        }
    }

    /// Send `max_tokens` as `max_completion_tokens`, as OpenAI's o-series
    /// and gpt-5 models require (compatible servers mostly want
    /// `max_tokens`, the default).
    #[must_use]
    pub fn with_max_completion_tokens(mut self, on: bool) -> Self {
        self.max_completion_tokens = on;
        self
    }

    /// Another OpenAI-compatible server (no trailing slash needed).
    #[must_use]
    pub fn with_base_url(mut self, base_url: &str) -> Self {
        self.base_url = base_url.trim_end_matches('/').into();
        self
    }

    /// The largest response body read (default 16 MiB); a larger one is an
    /// invalid-response failure.
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

/// OpenAI Chat Completions as a `Service<ChatRequest>`, over any HTTP
/// transport `T` (a hyper-util client, or a test double).
///
/// The transport never retries: the retry layer is the one retry owner.
/// Errors are classified from the status, the rate-limit headers and the
/// error body: `insufficient_quota` is quota exhausted (not retried, fails
/// over), `context_length_exceeded` is context window exceeded.
#[derive(Debug, Clone)]
pub struct OpenAi<T> {
    transport: T,
    config: Arc<OpenAiConfig>,
    metrics: tower_llm_core::GenAiMetrics,
}

impl<T> OpenAi<T> {
    /// A service sending through `transport`.
    pub fn new(transport: T, config: OpenAiConfig) -> Self {
        OpenAi {
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

impl<T, B> Service<ChatRequest> for OpenAi<T>
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

/// One unary Chat Completions call.
async fn chat<T, B>(
    transport: &mut T,
    config: &OpenAiConfig,
    req: &ChatRequest,
) -> Result<ChatResponse, Failure>
where
    T: Service<http::Request<RequestBody>, Response = http::Response<B>>,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let body = crate::failure::to_json(
        PROVIDER,
        &encode_body(req, config.max_completion_tokens, false),
    )?;
    let http_req = post(config, "chat/completions", body)?;
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

impl<T> OpenAi<T> {
    /// This provider as a streaming service (`stream: true` with
    /// `stream_options.include_usage`); see [`Streaming`](crate::Streaming).
    pub fn streaming(self) -> crate::Streaming<Self> {
        crate::Streaming::new(self)
    }
}

impl<T> crate::streaming::private::Sealed for OpenAi<T> {}

impl<T, B> crate::StreamSource for OpenAi<T>
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
            let body = crate::failure::to_json(
                PROVIDER,
                &encode_body(&req, config.max_completion_tokens, true),
            )?;
            let http_req = post(&config, "chat/completions", body)?;
            let open = crate::streaming::Open {
                wire: crate::streaming::SseWire::new(
                    crate::stream::openai_event_scrubbed,
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

/// A JSON POST to `{base_url}/{path}` with the bearer key.
fn post(
    config: &OpenAiConfig,
    path: &str,
    body: Vec<u8>,
) -> Result<http::Request<RequestBody>, Failure> {
    http::Request::post(format!("{}/{path}", config.base_url))
        .header(CONTENT_TYPE, "application/json")
        .header(
            AUTHORIZATION,
            secret_header(PROVIDER, &format!("Bearer {}", config.api_key.expose()))?,
        )
        .body(RequestBody::new(Bytes::from(body)))
        .map(|mut req| {
            crate::transport::inject_trace_context(req.headers_mut());
            req
        })
        .map_err(build_error(PROVIDER))
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
            .map(|p| match p {
                ContentPart::Text { text } => json!({"type": "text", "text": text}),
                ContentPart::ImageUrl { url } => {
                    json!({"type": "image_url", "image_url": {"url": url}})
                }
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
struct WireToolCall {
    id: String,
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    #[serde(default)]
    arguments: String,
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
    })
}

/// OpenAI Embeddings (`POST {base_url}/embeddings`) as a
/// `Service<EmbeddingRequest>`, with the same settings, transport and error
/// classification as [`OpenAi`].
#[derive(Debug, Clone)]
pub struct OpenAiEmbeddings<T> {
    transport: T,
    config: Arc<OpenAiConfig>,
}

impl<T> OpenAiEmbeddings<T> {
    /// A service sending through `transport`.
    pub fn new(transport: T, config: OpenAiConfig) -> Self {
        OpenAiEmbeddings {
            transport,
            config: Arc::new(config),
        }
    }
}

impl<T, B> Service<EmbeddingRequest> for OpenAiEmbeddings<T>
where
    T: Service<http::Request<RequestBody>, Response = http::Response<B>> + Clone + Send + 'static,
    T::Future: Send + 'static,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = EmbeddingResponse;
    type Error = Failure;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<EmbeddingResponse, Failure>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        poll_transport(&mut self.transport, cx, PROVIDER)
    }

    fn call(&mut self, req: EmbeddingRequest) -> Self::Future {
        let mut transport = take_ready(&mut self.transport);
        let config = self.config.clone();
        Box::pin(async move {
            let mut body =
                json!({"model": req.model, "input": req.input, "encoding_format": "float"});
            if let (Some(d), Some(obj)) = (req.dimensions, body.as_object_mut()) {
                obj.insert("dimensions".into(), json!(d));
            }
            let body = crate::failure::to_json(PROVIDER, &body)?;
            let http_req = post(&config, "embeddings", body)?;
            let Answer {
                parts,
                body: bytes,
                latency,
            } = round_trip(&mut transport, http_req, config.max_body, PROVIDER).await?;
            if !parts.status.is_success() {
                return Err(decode_error_scrubbed(
                    parts.status,
                    &parts.headers,
                    &bytes,
                    &config.scrub(),
                ));
            }
            decode_embeddings(&bytes, latency).map_err(|f| f.with_status(parts.status))
        })
    }
}

#[derive(Deserialize)]
struct WireEmbeddings {
    model: String,
    data: Vec<WireEmbedding>,
    #[serde(default)]
    usage: Option<WireEmbeddingUsage>,
}

#[derive(Deserialize)]
struct WireEmbedding {
    index: usize,
    embedding: Vec<f32>,
}

#[derive(Deserialize)]
struct WireEmbeddingUsage {
    #[serde(default)]
    prompt_tokens: u32,
}

/// Normalises an Embeddings response body: vectors in input order (by
/// their `index`); a missing or duplicate index is an invalid response.
pub fn decode_embeddings(body: &[u8], latency: Duration) -> Result<EmbeddingResponse, Failure> {
    let wire: WireEmbeddings =
        serde_json::from_slice(body).map_err(|e| invalid_json(PROVIDER, &e))?;
    let n = wire.data.len();
    let mut embeddings: Vec<Option<Vec<f32>>> = vec![None; n];
    for item in wire.data {
        match embeddings.get_mut(item.index) {
            Some(slot @ None) => *slot = Some(item.embedding),
            _ => {
                return Err(invalid(
                    PROVIDER,
                    format!("bad or duplicate `index` {}", item.index),
                ));
            }
        }
    }
    Ok(EmbeddingResponse {
        model: wire.model,
        provider: PROVIDER.into(),
        embeddings: embeddings.into_iter().flatten().collect(),
        prompt_tokens: wire.usage.map_or(0, |u| u.prompt_tokens),
        latency,
        attempts: Vec::new(),
    })
}

/// The server side of the OpenAI wire format, for gateways that speak it to
/// their own clients: requests in, answers and stream chunks out.
pub mod server {
    use std::sync::Arc;

    use serde::{Deserialize, Serialize};
    use serde_json::{Value, json};
    use tower_llm_core::{
        ChatChunk, ChatRequest, ChatResponse, ContentPart, Failure, FailureClass, FinishReason,
        Message, Role, Tool, ToolCall, ToolChoice,
    };

    /// `null` reads as the default, as OpenAI's API accepts.
    fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
    where
        D: serde::Deserializer<'de>,
        T: Default + Deserialize<'de>,
    {
        Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
    }

    #[derive(Deserialize)]
    struct WireRequest {
        model: String,
        messages: Vec<WireMessage>,
        #[serde(default, deserialize_with = "nullable")]
        tools: Vec<WireTool>,
        #[serde(default)]
        tool_choice: Option<Value>,
        #[serde(default)]
        temperature: Option<f32>,
        #[serde(default)]
        top_p: Option<f32>,
        #[serde(default)]
        max_tokens: Option<u32>,
        #[serde(default)]
        max_completion_tokens: Option<u32>,
        #[serde(default)]
        stop: Option<Value>,
        #[serde(default, deserialize_with = "nullable")]
        stream: bool,
        #[serde(default)]
        n: Option<u32>,
        #[serde(default)]
        response_format: Option<Value>,
    }

    #[derive(Deserialize)]
    struct WireMessage {
        role: String,
        #[serde(default)]
        content: Option<Value>,
        #[serde(default, deserialize_with = "nullable")]
        tool_calls: Vec<WireToolCall>,
        #[serde(default)]
        tool_call_id: Option<String>,
    }

    // The tool-call shape is the one answers use.
    use super::WireToolCall;

    #[derive(Deserialize)]
    struct WireTool {
        function: WireToolDef,
    }

    #[derive(Deserialize)]
    struct WireToolDef {
        name: String,
        #[serde(default)]
        description: Option<String>,
        #[serde(default)]
        parameters: Value,
    }

    fn bad(message: impl Into<String>) -> Failure {
        Failure::new(FailureClass::BadRequest)
            .with_message(crate::failure::bounded(&message.into()))
    }

    /// Reads an OpenAI Chat Completions request body into a
    /// [`ChatRequest`] (`model` as sent: a gateway treats it as a route
    /// alias). `developer` messages are system messages;
    /// `max_completion_tokens` is `max_tokens`; `null` means absent.
    /// Fields with no provider-neutral meaning (`user`, `seed`, penalties,
    /// `logprobs`, `stream_options`, ...) are ignored; `n > 1` and a
    /// non-text `response_format` are refused, since ignoring them would
    /// change the answer.
    ///
    /// # Errors
    ///
    /// A bad-request failure naming what is wrong (malformed JSON, a
    /// missing `model` or `messages`, an unknown role, a content part of
    /// an unknown type).
    ///
    /// ```
    /// use tower_llm_providers::openai::server::decode_request;
    ///
    /// let req = decode_request(br#"{"model": "smart", "stream": true,
    ///     "messages": [{"role": "user", "content": "Hi"}]}"#).unwrap();
    /// assert_eq!(&*req.model, "smart");
    /// assert!(req.stream);
    /// assert!(decode_request(b"{").unwrap_err().is_bad_request());
    /// ```
    pub fn decode_request(body: &[u8]) -> Result<ChatRequest, Failure> {
        let wire: WireRequest =
            serde_json::from_slice(body).map_err(|e| bad(format!("invalid request body: {e}")))?;
        // Refused rather than silently dropped: an answer without them
        // would not be what the client asked for.
        if wire.n.is_some_and(|n| n > 1) {
            return Err(bad("n > 1 is not supported: ask once per choice"));
        }
        if let Some(format) = &wire.response_format {
            if format.get("type").and_then(Value::as_str) != Some("text") {
                return Err(bad(
                    "response_format other than {\"type\": \"text\"} is not supported yet",
                ));
            }
        }
        let mut messages = Vec::with_capacity(wire.messages.len());
        for m in wire.messages {
            let role = match m.role.as_str() {
                "system" | "developer" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "tool" => Role::Tool,
                other => return Err(bad(format!("unknown message role \"{other}\""))),
            };
            let content = match m.content {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::String(text)) => vec![ContentPart::Text { text }],
                Some(Value::Array(parts)) => parts
                    .into_iter()
                    .map(|part| match part.get("type").and_then(Value::as_str) {
                        Some("text") => Ok(ContentPart::Text {
                            text: part
                                .get("text")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_owned(),
                        }),
                        Some("image_url") => Ok(ContentPart::ImageUrl {
                            url: part
                                .pointer("/image_url/url")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_owned(),
                        }),
                        other => Err(bad(format!("unknown content part type {other:?}"))),
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(bad("message content must be a string or an array")),
            };
            messages.push(Message {
                role,
                content,
                tool_calls: m
                    .tool_calls
                    .into_iter()
                    .map(|c| ToolCall {
                        id: c.id,
                        name: c.function.name,
                        arguments: c.function.arguments,
                    })
                    .collect(),
                tool_call_id: m.tool_call_id,
            });
        }
        let tool_choice = match wire.tool_choice {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(match s.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" => ToolChoice::Required,
                other => return Err(bad(format!("unknown tool_choice \"{other}\""))),
            }),
            Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
                Some(name) => Some(ToolChoice::Tool(name.to_owned())),
                None => return Err(bad("tool_choice object without function.name")),
            },
        };
        let stop = match wire.stop {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![s],
            Some(Value::Array(v)) => v
                .into_iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect(),
            Some(_) => return Err(bad("stop must be a string or an array of strings")),
        };
        let tools: Vec<Tool> = wire
            .tools
            .into_iter()
            .map(|t| Tool {
                name: t.function.name,
                description: t.function.description,
                parameters: t.function.parameters,
            })
            .collect();
        Ok(ChatRequest {
            model: wire.model.into(),
            messages: Arc::new(messages),
            tools: Arc::new(tools),
            tool_choice,
            temperature: wire.temperature,
            top_p: wire.top_p,
            max_tokens: wire.max_tokens.or(wire.max_completion_tokens),
            stop: Arc::new(stop),
            stream: wire.stream,
            ..ChatRequest::default()
        })
    }

    /// The OpenAI `finish_reason` of a normalised one.
    pub fn finish_reason(reason: FinishReason) -> &'static str {
        match reason {
            FinishReason::Stop | FinishReason::Other => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
        }
    }

    /// A `chat.completion` body for `res`, under the name `model` (the alias
    /// the client asked for, or the model that served), created at
    /// `created` (Unix seconds). [`write_response`] writes the same JSON
    /// straight to bytes.
    pub fn encode_response(res: &ChatResponse, model: &str, created: u64) -> Value {
        serde_json::to_value(CompletionBody::new(res, model, created)).unwrap_or(Value::Null)
    }

    /// The bytes of [`encode_response`]'s body, written straight from `res`
    /// (no [`Value`] is built: a gateway's answer path).
    ///
    /// ```
    /// use tower_llm_core::{ChatResponse, Choice, FinishReason};
    /// use tower_llm_providers::openai::server::write_response;
    ///
    /// let res = ChatResponse {
    ///     choices: vec![Choice {
    ///         index: 0,
    ///         text: "Hi".into(),
    ///         tool_calls: Vec::new(),
    ///         finish_reason: FinishReason::Stop,
    ///     }],
    ///     ..ChatResponse::default()
    /// };
    /// let body: serde_json::Value = serde_json::from_slice(&write_response(&res, "smart", 7)).unwrap();
    /// assert_eq!(body["choices"][0]["message"]["content"], "Hi");
    /// assert_eq!(body["model"], "smart");
    /// ```
    pub fn write_response(res: &ChatResponse, model: &str, created: u64) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(256 + res.choices.iter().map(|c| c.text.len()).sum::<usize>());
        // Writing borrowed strings and numbers to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, &CompletionBody::new(res, model, created));
        out
    }

    /// A `chat.completion.chunk` body for `chunk` (a usage-only chunk has
    /// no choices, as with `stream_options.include_usage`).
    pub fn encode_chunk(chunk: &ChatChunk, id: &str, model: &str, created: u64) -> Value {
        serde_json::to_value(ChunkBody::new(chunk, id, model, created, false))
            .unwrap_or(Value::Null)
    }

    /// As [`encode_chunk`], with `"role": "assistant"` in the delta (the
    /// first chunk of a stream carries it).
    pub fn encode_first_chunk(chunk: &ChatChunk, id: &str, model: &str, created: u64) -> Value {
        serde_json::to_value(ChunkBody::new(chunk, id, model, created, true)).unwrap_or(Value::Null)
    }

    /// Appends `data: <chunk>\n\n` (the SSE event of [`encode_chunk`], or
    /// of [`encode_first_chunk`] when `first`) to `out`, written straight
    /// from `chunk`.
    fn write_chunk_event(
        out: &mut Vec<u8>,
        chunk: &ChatChunk,
        id: &str,
        model: &str,
        created: u64,
        first: bool,
    ) {
        out.extend_from_slice(b"data: ");
        // Writing borrowed strings and numbers to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, &ChunkBody::new(chunk, id, model, created, first));
        out.extend_from_slice(b"\n\n");
    }

    /// The answer bodies, borrowed from the answer they encode.
    #[derive(Serialize)]
    struct CompletionBody<'a> {
        id: &'a str,
        object: &'static str,
        created: u64,
        model: &'a str,
        choices: Seq<'a, tower_llm_core::Choice, ChoiceBody<'a>>,
        usage: UsageBody,
    }

    impl<'a> CompletionBody<'a> {
        fn new(res: &'a ChatResponse, model: &'a str, created: u64) -> Self {
            CompletionBody {
                id: if res.id.is_empty() {
                    "chatcmpl-tower-llm"
                } else {
                    &res.id
                },
                object: "chat.completion",
                created,
                model,
                choices: Seq(&res.choices, ChoiceBody::new),
                usage: UsageBody::new(res.usage),
            }
        }
    }

    /// A slice serialized as a sequence of views of its items.
    struct Seq<'a, T, B>(&'a [T], fn(&'a T) -> B);

    impl<T, B: Serialize> Serialize for Seq<'_, T, B> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(self.0.iter().map(self.1))
        }
    }

    #[derive(Serialize)]
    struct ChoiceBody<'a> {
        index: u32,
        message: MessageBody<'a>,
        finish_reason: &'static str,
    }

    impl<'a> ChoiceBody<'a> {
        fn new(c: &'a tower_llm_core::Choice) -> Self {
            let tool_calls =
                (!c.tool_calls.is_empty()).then(|| Seq(&c.tool_calls[..], ToolCallBody::new));
            ChoiceBody {
                index: c.index,
                message: MessageBody {
                    role: "assistant",
                    content: (!c.text.is_empty() || c.tool_calls.is_empty()).then_some(&c.text),
                    tool_calls,
                },
                finish_reason: finish_reason(c.finish_reason),
            }
        }
    }

    #[derive(Serialize)]
    struct MessageBody<'a> {
        role: &'static str,
        /// `null` on a tool-call-only answer.
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tool_calls: Option<Seq<'a, ToolCall, ToolCallBody<'a>>>,
    }

    #[derive(Serialize)]
    struct ToolCallBody<'a> {
        id: &'a str,
        #[serde(rename = "type")]
        kind: &'static str,
        function: FunctionBody<'a>,
    }

    impl<'a> ToolCallBody<'a> {
        fn new(t: &'a ToolCall) -> Self {
            ToolCallBody {
                id: &t.id,
                kind: "function",
                function: FunctionBody {
                    name: Some(&t.name),
                    arguments: &t.arguments,
                },
            }
        }
    }

    #[derive(Serialize)]
    struct FunctionBody<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<&'a str>,
        arguments: &'a str,
    }

    #[derive(Serialize)]
    struct UsageBody {
        prompt_tokens: u32,
        completion_tokens: u32,
        total_tokens: u32,
    }

    impl UsageBody {
        fn new(u: tower_llm_core::Usage) -> Self {
            UsageBody {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
                total_tokens: u.total_tokens(),
            }
        }
    }

    #[derive(Serialize)]
    struct ChunkBody<'a> {
        id: &'a str,
        object: &'static str,
        created: u64,
        model: &'a str,
        /// A list of none or one.
        #[serde(serialize_with = "zero_or_one")]
        choices: Option<DeltaChoice<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        usage: Option<UsageBody>,
    }

    impl<'a> ChunkBody<'a> {
        fn new(
            chunk: &'a ChatChunk,
            id: &'a str,
            model: &'a str,
            created: u64,
            first: bool,
        ) -> ChunkBody<'a> {
            let has_choice =
                chunk.text.is_some() || chunk.tool_call.is_some() || chunk.finish_reason.is_some();
            // The first chunk always has a choice: it carries the role.
            let choice = (has_choice || first).then(|| DeltaChoice {
                index: chunk.index,
                delta: DeltaBody {
                    role: first.then_some("assistant"),
                    content: chunk.text.as_deref(),
                    tool_calls: chunk.tool_call.as_ref().map(|t| {
                        [ToolCallDeltaBody {
                            index: t.index,
                            id: t.id.as_deref(),
                            kind: t.id.as_ref().map(|_| "function"),
                            function: FunctionBody {
                                name: t.name.as_deref(),
                                arguments: &t.arguments,
                            },
                        }]
                    }),
                },
                finish_reason: chunk.finish_reason.map(finish_reason),
            });
            ChunkBody {
                id,
                object: "chat.completion.chunk",
                created,
                model,
                choices: choice,
                usage: chunk.usage.map(UsageBody::new),
            }
        }
    }

    /// An optional item as a list of none or one.
    fn zero_or_one<T: Serialize, S: serde::Serializer>(
        item: &Option<T>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_seq(item)
    }

    #[derive(Serialize)]
    struct DeltaChoice<'a> {
        index: u32,
        delta: DeltaBody<'a>,
        finish_reason: Option<&'static str>,
    }

    #[derive(Serialize)]
    struct DeltaBody<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        role: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tool_calls: Option<[ToolCallDeltaBody<'a>; 1]>,
    }

    #[derive(Serialize)]
    struct ToolCallDeltaBody<'a> {
        index: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<&'a str>,
        #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
        kind: Option<&'static str>,
        function: FunctionBody<'a>,
    }

    /// An OpenAI error body: `{"error": {"message", "type", "code"}}`.
    pub fn encode_error(message: &str, kind: &str, code: Option<&str>) -> Value {
        json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
    }

    /// The HTTP status and OpenAI error `type` a failed call is answered
    /// with, by its class:
    ///
    /// | failure | status | `type` |
    /// |---|---|---|
    /// | deadline exceeded | 504 | `timeout` |
    /// | conflict (e.g. `idempotency_key_in_use`) | 409 | `conflict` |
    /// | bad request raised by a layer (no provider) with its own status 422 (e.g. `idempotency_key_reused`) | 422 | `invalid_request_error` |
    /// | bad request, context window exceeded, content filtered | 400 | `invalid_request_error` |
    /// | auth, not found (our credentials or model names), invalid response, cancelled | 502 | `upstream_error` |
    /// | every other class (transient, rate limited, timeout, quota, circuit open) | 503 | `service_unavailable` |
    ///
    /// When every link of a fallback chain failed
    /// ([`Failure::is_all_links_failed`]) the answer is 503 whatever the
    /// last class, except a deadline (504).
    ///
    /// ```
    /// use tower_llm_core::{Failure, FailureClass};
    /// use tower_llm_providers::openai::server::failure_status;
    ///
    /// let (status, kind) = failure_status(&Failure::deadline_exceeded());
    /// assert_eq!((status.as_u16(), kind), (504, "timeout"));
    /// assert_eq!(failure_status(&Failure::new(FailureClass::Auth)).0, 502);
    /// let reused = Failure::new(FailureClass::BadRequest)
    ///     .with_status(http::StatusCode::UNPROCESSABLE_ENTITY);
    /// assert_eq!(failure_status(&reused).0, 422);
    /// // An upstream's 422 stays a 400.
    /// let upstream = Failure::new(FailureClass::BadRequest)
    ///     .with_status(http::StatusCode::UNPROCESSABLE_ENTITY)
    ///     .with_provider("openai");
    /// assert_eq!(failure_status(&upstream).0, 400);
    /// ```
    pub fn failure_status(f: &Failure) -> (http::StatusCode, &'static str) {
        use http::StatusCode;
        let (status, kind) = match f.class() {
            // A request the gateway itself refused as unprocessable (no
            // provider: not an upstream's answer), such as the idempotency
            // layer's `idempotency_key_reused`: its own 422.
            FailureClass::BadRequest
                if f.provider().is_none()
                    && f.http_status() == Some(StatusCode::UNPROCESSABLE_ENTITY) =>
            {
                (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request_error")
            }
            FailureClass::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            FailureClass::Conflict => (StatusCode::CONFLICT, "conflict"),
            FailureClass::BadRequest
            | FailureClass::ContextWindowExceeded
            | FailureClass::ContentFiltered => (StatusCode::BAD_REQUEST, "invalid_request_error"),
            // Our credentials or our model names: the gateway's fault, not
            // the client's.
            FailureClass::Auth
            | FailureClass::NotFound
            | FailureClass::InvalidResponse
            | FailureClass::Cancelled => (StatusCode::BAD_GATEWAY, "upstream_error"),
            _ => (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable"),
        };
        if f.is_all_links_failed() && status != StatusCode::GATEWAY_TIMEOUT {
            (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable")
        } else {
            (status, kind)
        }
    }

    /// A failed call as an HTTP answer in OpenAI's error shape: the status
    /// and `type` of [`failure_status`], the failure's message, its class
    /// label as the `code`, and on a 503 a `Retry-After` (whole seconds,
    /// at least 1) when the failure knows one. Any server (axum, hyper)
    /// can send it as it is.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_llm_core::{Failure, FailureClass};
    /// use tower_llm_providers::openai::server::failure_response;
    ///
    /// let f = Failure::new(FailureClass::RateLimited).with_retry_after(Duration::from_millis(1500));
    /// let res = failure_response(&f);
    /// assert_eq!(res.status(), 503);
    /// assert_eq!(res.headers()["retry-after"], "2");
    /// assert_eq!(res.headers()["content-type"], "application/json");
    /// ```
    pub fn failure_response(f: &Failure) -> http::Response<http_body_util::Full<bytes::Bytes>> {
        let (status, kind) = failure_status(f);
        let body = encode_error(
            f.message().unwrap_or("the call failed"),
            kind,
            Some(f.class().as_metric_label()),
        );
        let mut res = http::Response::new(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )));
        *res.status_mut() = status;
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        if status == http::StatusCode::SERVICE_UNAVAILABLE {
            if let Some(wait) = f.retry_after() {
                let secs = (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1);
                res.headers_mut()
                    .insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
            }
        }
        res
    }

    /// `stream_options.include_usage` in a request body (read without
    /// building a copy of the rest of it): whether an OpenAI client asked
    /// for the usage chunk at the end of a stream.
    pub fn wants_usage(body: &[u8]) -> bool {
        #[derive(Deserialize)]
        struct Body {
            #[serde(default)]
            stream_options: Option<StreamOptions>,
        }
        #[derive(Deserialize)]
        struct StreamOptions {
            #[serde(default)]
            include_usage: Option<bool>,
        }
        serde_json::from_slice::<Body>(body)
            .ok()
            .and_then(|b| b.stream_options?.include_usage)
            .unwrap_or(false)
    }

    /// The server-sent event of a failure after a stream's commit point:
    /// `data: {"error": {...}}` with the class label as its `code`.
    pub fn sse_error_event(f: &Failure) -> bytes::Bytes {
        let body = encode_error(
            f.message().unwrap_or("the stream failed"),
            "stream_error",
            Some(f.class().as_metric_label()),
        );
        bytes::Bytes::from(format!("data: {body}\n\n"))
    }

    /// A committed [`ChatStream`](tower_llm_core::ChatStream) as OpenAI
    /// server-sent events, one `data:` frame per item: the first chunk
    /// carries the role; usage is summed and sent once at the end, and only
    /// when the client asked for it ([`wants_usage`]), as OpenAI does; a
    /// clean end is `data: [DONE]`, a failure after the commit point one
    /// [`sse_error_event`] and no `[DONE]`. Chunks with nothing but usage
    /// send no frame.
    ///
    /// ```
    /// # use std::pin::Pin;
    /// use futures_core::Stream;
    /// use tower_llm_core::{ChatChunk, ChatStream, FinishReason};
    /// use tower_llm_providers::openai::server::SseFrames;
    ///
    /// let chunk = |t: &str| Ok(ChatChunk { text: Some(t.into()), ..ChatChunk::default() });
    /// let stream = ChatStream::from_chunks("mock", "m", vec![chunk("Hel"), chunk("lo")]);
    /// let mut frames = SseFrames::new(stream, false, "chatcmpl-1".into(), 0);
    /// let mut out = String::new();
    /// let waker = std::task::Waker::noop();
    /// let mut cx = std::task::Context::from_waker(&waker);
    /// while let std::task::Poll::Ready(Some(frame)) = Pin::new(&mut frames).poll_next(&mut cx) {
    ///     out.push_str(std::str::from_utf8(&frame).unwrap());
    /// }
    /// assert!(out.starts_with("data: {"));
    /// assert!(out.contains(r#""role":"assistant""#));
    /// assert!(out.ends_with("data: [DONE]\n\n"));
    /// ```
    #[derive(Debug)]
    pub struct SseFrames {
        stream: tower_llm_core::ChatStream,
        done: bool,
        id: String,
        model: String,
        created: u64,
        first: bool,
        include_usage: bool,
        usage: tower_llm_core::Usage,
    }

    impl SseFrames {
        /// The frames of `stream`, as the answer `id` created at `created`
        /// (Unix seconds), named by the stream's model.
        pub fn new(
            stream: tower_llm_core::ChatStream,
            include_usage: bool,
            id: String,
            created: u64,
        ) -> Self {
            let model = stream.model().to_owned();
            SseFrames {
                stream,
                done: false,
                id,
                model,
                created,
                first: true,
                include_usage,
                usage: tower_llm_core::Usage::default(),
            }
        }
    }

    impl futures_core::Stream for SseFrames {
        type Item = bytes::Bytes;

        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            use std::task::Poll;
            let this = &mut *self;
            if this.done {
                return Poll::Ready(None);
            }
            let frame = loop {
                match std::task::ready!(std::pin::Pin::new(&mut this.stream).poll_next(cx)) {
                    Some(Ok(mut chunk)) => {
                        if let Some(u) = chunk.usage.take() {
                            // Providers report usage in parts (Anthropic:
                            // input first, output last): keep every count.
                            if u.prompt_tokens > 0 {
                                this.usage.prompt_tokens = u.prompt_tokens;
                            }
                            if u.completion_tokens > 0 {
                                this.usage.completion_tokens = u.completion_tokens;
                            }
                            if u.cached_input_tokens > 0 {
                                this.usage.cached_input_tokens = u.cached_input_tokens;
                            }
                        }
                        if chunk.text.is_none()
                            && chunk.tool_call.is_none()
                            && chunk.finish_reason.is_none()
                        {
                            continue; // usage only
                        }
                        let first = std::mem::take(&mut this.first);
                        let text = chunk.text.as_ref().map_or(0, String::len);
                        let mut out = Vec::with_capacity(160 + this.id.len() + text);
                        write_chunk_event(
                            &mut out,
                            &chunk,
                            &this.id,
                            &this.model,
                            this.created,
                            first,
                        );
                        break out;
                    }
                    Some(Err(f)) => {
                        this.done = true;
                        return Poll::Ready(Some(sse_error_event(&f)));
                    }
                    None => {
                        this.done = true;
                        let mut out = Vec::new();
                        if this.include_usage {
                            let usage = ChatChunk {
                                usage: Some(this.usage),
                                ..ChatChunk::default()
                            };
                            write_chunk_event(
                                &mut out,
                                &usage,
                                &this.id,
                                &this.model,
                                this.created,
                                false,
                            );
                        }
                        out.extend_from_slice(b"data: [DONE]\n\n");
                        break out;
                    }
                }
            };
            Poll::Ready(Some(bytes::Bytes::from(frame)))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn answers_encode_to_openai_shapes_and_bytes_match_values() {
            use tower_llm_core::{Choice, ToolCallDelta, Usage};
            let call = ToolCall {
                id: "call_1".into(),
                name: "lookup".into(),
                arguments: r#"{"q":"x"}"#.into(),
            };
            let res = ChatResponse {
                choices: vec![
                    Choice {
                        index: 0,
                        text: "Hi \"there\"".into(),
                        tool_calls: Vec::new(),
                        finish_reason: FinishReason::Length,
                    },
                    Choice {
                        index: 1,
                        text: String::new(),
                        tool_calls: vec![call],
                        finish_reason: FinishReason::ToolCalls,
                    },
                ],
                usage: Usage {
                    prompt_tokens: 3,
                    completion_tokens: 4,
                    cached_input_tokens: 0,
                },
                ..ChatResponse::default()
            };
            let want = json!({
                "id": "chatcmpl-tower-llm", "object": "chat.completion", "created": 7,
                "model": "smart",
                "choices": [
                    {"index": 0, "finish_reason": "length",
                     "message": {"role": "assistant", "content": "Hi \"there\""}},
                    {"index": 1, "finish_reason": "tool_calls",
                     "message": {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "lookup", "arguments": "{\"q\":\"x\"}"}}]}},
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
            });
            assert_eq!(encode_response(&res, "smart", 7), want);
            let bytes: Value =
                serde_json::from_slice(&write_response(&res, "smart", 7)).expect("valid JSON");
            assert_eq!(bytes, want);
            // An empty answer still has its text, empty.
            let empty = encode_response(&ChatResponse::default(), "m", 1);
            assert_eq!(empty["choices"], json!([]));

            let head = json!({"id": "c", "object": "chat.completion.chunk", "created": 7,
                              "model": "smart"});
            let with = |extra: Value| {
                let mut v = head.clone();
                for (k, x) in extra.as_object().expect("object") {
                    v[k] = x.clone();
                }
                v
            };
            let text = ChatChunk {
                text: Some("He".into()),
                ..ChatChunk::default()
            };
            assert_eq!(
                encode_chunk(&text, "c", "smart", 7),
                with(json!({"choices": [{"index": 0, "delta": {"content": "He"},
                                          "finish_reason": null}]}))
            );
            assert_eq!(
                encode_first_chunk(&text, "c", "smart", 7),
                with(json!({"choices": [{"index": 0,
                    "delta": {"role": "assistant", "content": "He"}, "finish_reason": null}]}))
            );
            // A first chunk with nothing to say still carries the role.
            assert_eq!(
                encode_first_chunk(&ChatChunk::default(), "c", "smart", 7),
                with(
                    json!({"choices": [{"index": 0, "delta": {"role": "assistant"},
                                          "finish_reason": null}]})
                )
            );
            let opening = ChatChunk {
                index: 2,
                tool_call: Some(ToolCallDelta {
                    index: 1,
                    id: Some("call_9".into()),
                    name: Some("f".into()),
                    arguments: String::new(),
                }),
                ..ChatChunk::default()
            };
            assert_eq!(
                encode_chunk(&opening, "c", "smart", 7),
                with(
                    json!({"choices": [{"index": 2, "finish_reason": null, "delta": {
                    "tool_calls": [{"index": 1, "id": "call_9", "type": "function",
                                    "function": {"name": "f", "arguments": ""}}]}}]})
                )
            );
            let more = ChatChunk {
                tool_call: Some(ToolCallDelta {
                    index: 1,
                    id: None,
                    name: None,
                    arguments: "{\"a\"".into(),
                }),
                finish_reason: Some(FinishReason::ToolCalls),
                ..ChatChunk::default()
            };
            assert_eq!(
                encode_chunk(&more, "c", "smart", 7),
                with(
                    json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "delta": {
                    "tool_calls": [{"index": 1, "function": {"arguments": "{\"a\""}}]}}]})
                )
            );
            let usage = ChatChunk {
                usage: Some(Usage {
                    prompt_tokens: 1,
                    completion_tokens: 2,
                    cached_input_tokens: 0,
                }),
                ..ChatChunk::default()
            };
            assert_eq!(
                encode_chunk(&usage, "c", "smart", 7),
                with(json!({"choices": [], "usage": {"prompt_tokens": 1,
                    "completion_tokens": 2, "total_tokens": 3}}))
            );
            // The SSE event is the same JSON, framed.
            let mut event = Vec::new();
            write_chunk_event(&mut event, &opening, "c", "smart", 7, false);
            let event = std::str::from_utf8(&event).expect("UTF-8");
            let json = event
                .strip_prefix("data: ")
                .and_then(|e| e.strip_suffix("\n\n"))
                .expect("one data event");
            assert_eq!(
                serde_json::from_str::<Value>(json).expect("JSON"),
                encode_chunk(&opening, "c", "smart", 7)
            );
        }

        #[test]
        fn requests_decode_with_every_shape() {
            let req = decode_request(
                br#"{"model": "smart", "max_completion_tokens": 9, "stop": "END",
                "tool_choice": {"type": "function", "function": {"name": "f"}},
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                "messages": [
                  {"role": "developer", "content": "be brief"},
                  {"role": "user", "content": [{"type": "text", "text": "look"},
                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
                  {"role": "assistant", "content": null, "tool_calls": [
                     {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "42"}]}"#,
            )
            .expect("valid");
            assert_eq!(req.messages[0].role, Role::System);
            assert_eq!(req.messages[1].content.len(), 2);
            assert_eq!(req.messages[2].tool_calls[0].id, "c1");
            assert_eq!(req.messages[3].tool_call_id.as_deref(), Some("c1"));
            assert_eq!(req.max_tokens, Some(9));
            assert_eq!(*req.stop, ["END"]);
            assert_eq!(req.tool_choice, Some(ToolChoice::Tool("f".into())));
            // `null` is absent, as OpenAI's own API reads it.
            let req = decode_request(
                br#"{"model": "m", "stream": null, "tools": null, "n": 1, "user": "u",
                "response_format": {"type": "text"},
                "messages": [{"role": "assistant", "content": "x", "tool_calls": null}]}"#,
            )
            .expect("valid");
            assert!(!req.stream && req.tools.is_empty());
            for bad in [
                &b"{"[..],
                br#"{"messages": []}"#,
                br#"{"model": "m", "messages": [{"role": "robot", "content": "x"}]}"#,
                br#"{"model": "m", "messages": [{"role": "user", "content": 7}]}"#,
                br#"{"model": "m", "messages": [], "tool_choice": "sometimes"}"#,
                br#"{"model": "m", "messages": [], "n": 3}"#,
                br#"{"model": "m", "messages": [], "response_format": {"type": "json_object"}}"#,
            ] {
                assert!(decode_request(bad).unwrap_err().is_bad_request());
            }
        }

        #[test]
        fn answers_and_chunks_encode_in_openai_shape() {
            let res = crate::openai::decode(
                br#"{"id": "x", "model": "m", "choices": [{"index": 0,
                    "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1}}"#,
                std::time::Duration::ZERO,
            )
            .expect("decodes");
            let body = encode_response(&res, "smart", 7);
            assert_eq!(body["choices"][0]["message"]["content"], "hi");
            assert_eq!(body["usage"]["total_tokens"], 4);
            assert_eq!(body["model"], "smart");
            let chunk = ChatChunk {
                text: Some("He".into()),
                ..ChatChunk::default()
            };
            let c = encode_chunk(&chunk, "id", "smart", 7);
            assert_eq!(c["choices"][0]["delta"]["content"], "He");
            let usage = ChatChunk {
                usage: Some(tower_llm_core::Usage {
                    prompt_tokens: 1,
                    completion_tokens: 2,
                    cached_input_tokens: 0,
                }),
                ..ChatChunk::default()
            };
            let c = encode_chunk(&usage, "id", "smart", 7);
            assert_eq!(c["choices"], json!([]));
            assert_eq!(c["usage"]["total_tokens"], 3);
            // What we encode, our own client decodes.
            let event = crate::stream::SseEvent {
                event: None,
                data: encode_chunk(&chunk, "id", "smart", 7).to_string(),
            };
            assert!(
                crate::stream::openai_event(&event)
                    .expect("decodes")
                    .is_content()
            );
        }
    }
}
