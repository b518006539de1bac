//! AWS Bedrock Converse, signed with SigV4.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, StatusCode};
use http_body::Body;
use serde::Deserialize;
use serde_json::{Value, json};
use tower_llm_core::{
    BoxError, ChatChunk, ChatRequest, ChatResponse, Choice, ContentPart, Failure, FailureClass,
    FinishReason, Message, Role, ToolCall, ToolCallDelta, ToolChoice, Usage,
};
use tower_service::Service;

use crate::failure::Scrub;
use crate::failure::{ErrorBody, error_failure, invalid, invalid_json};
use crate::stream::StreamItem;
use crate::transport::{
    Answer, DEFAULT_MAX_BODY, RequestBody, poll_transport, round_trip, take_ready,
};
use crate::wire::{data_url, merge_turns, tool_input, tool_schema, turn};
use crate::{ApiKey, ProviderFuture};

const PROVIDER: &str = "bedrock";

/// AWS credentials. `Debug` prints none of them (access key id, secret,
/// session token: all `[redacted]`).
///
/// ```
/// use tower_llm_providers::AwsCredentials;
///
/// let creds = AwsCredentials::new("AKIDEXAMPLE", "secret").with_session_token("token");
/// let shown = format!("{creds:?}");
/// assert!(!shown.contains("AKIDEXAMPLE") && !shown.contains("secret\"") && !shown.contains("token\""));
/// ```
#[derive(Clone)]
pub struct AwsCredentials {
    access_key_id: String,
    secret_access_key: ApiKey,
    session_token: Option<ApiKey>,
}

impl AwsCredentials {
    /// Long-term credentials.
    pub fn new(access_key_id: impl Into<String>, secret_access_key: impl Into<String>) -> Self {
        AwsCredentials {
            access_key_id: access_key_id.into(),
            secret_access_key: ApiKey::new(secret_access_key),
            session_token: None,
        }
    }

    /// Adds a session token (temporary credentials).
    #[must_use]
    pub fn with_session_token(mut self, token: impl Into<String>) -> Self {
        self.session_token = Some(ApiKey::new(token));
        self
    }

    /// From the standard environment variables `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY` and (optional) `AWS_SESSION_TOKEN`.
    pub fn from_env() -> Option<Self> {
        let id = std::env::var("AWS_ACCESS_KEY_ID")
            .ok()
            .filter(|v| !v.is_empty())?;
        let secret = ApiKey::from_env("AWS_SECRET_ACCESS_KEY")?;
        Some(AwsCredentials {
            access_key_id: id,
            secret_access_key: secret,
            session_token: ApiKey::from_env("AWS_SESSION_TOKEN"),
        })
    }
}

impl fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsCredentials")
            .field("access_key_id", &format_args!("[redacted]"))
            .field("secret_access_key", &self.secret_access_key)
            .field("session_token", &self.session_token)
            .finish()
    }
}

/// Settings of a [`Bedrock`] service.
///
/// ```
/// use tower_llm_providers::{AwsCredentials, BedrockConfig};
///
/// let cfg = BedrockConfig::new(AwsCredentials::new("AKIDEXAMPLE", "secret"), "eu-west-1");
/// assert_eq!(cfg.endpoint(), "https://bedrock-runtime.eu-west-1.amazonaws.com");
/// assert!(!format!("{cfg:?}").contains("secret\""));
/// ```
#[derive(Debug, Clone)]
pub struct BedrockConfig {
    credentials: AwsCredentials,
    region: Arc<str>,
    endpoint: Arc<str>,
    max_body: usize,
    fixed_time: Option<SystemTime>,
}

impl BedrockConfig {
    /// Bedrock Runtime in `region`.
    pub fn new(credentials: AwsCredentials, region: &str) -> Self {
        BedrockConfig {
            credentials,
            region: region.into(),
            endpoint: format!("https://bedrock-runtime.{region}.amazonaws.com").into(),
            max_body: DEFAULT_MAX_BODY,
            fixed_time: None,
        }
    }

    /// Another endpoint (a VPC endpoint, a test server). The signature
    /// still names `region`.
    #[must_use]
    pub fn with_endpoint(mut self, endpoint: &str) -> Self {
        self.endpoint = endpoint.trim_end_matches('/').into();
        self
    }

    /// The largest response body read (default 16 MiB).
    #[must_use]
    pub fn with_max_body(mut self, max_body: usize) -> Self {
        self.max_body = max_body;
        self
    }

    /// Signs every request as if at `time` (for tests and known vectors).
    #[must_use]
    pub fn with_fixed_time(mut self, time: SystemTime) -> Self {
        self.fixed_time = Some(time);
        self
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The region.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// The secrets to remove from upstream text: the access key id (sent
    /// in `Authorization`), the session token (sent as
    /// `x-amz-security-token`) and the secret key.
    pub(crate) fn scrub(&self) -> Scrub {
        let c = &self.credentials;
        Scrub::new(
            [c.access_key_id.as_str(), c.secret_access_key.expose()]
                .into_iter()
                .chain(c.session_token.as_ref().map(ApiKey::expose)),
        )
    }
}

/// AWS Bedrock Converse (`POST /model/{modelId}/converse`) as a
/// `Service<ChatRequest>`, signed with SigV4 by the `aws-sigv4` crate (not
/// the whole AWS SDK, which retries on its own).
///
/// Errors are classified by `x-amzn-ErrorType`: throttling is rate
/// limited, service unavailable / internal / model not ready are
/// transient, model timeout is a timeout, validation is a bad request (or
/// context window exceeded when the input is too long), access denied is
/// auth, resource not found is not found, service quota exceeded is quota
/// exhausted.
#[derive(Debug, Clone)]
pub struct Bedrock<T> {
    transport: T,
    config: Arc<BedrockConfig>,
    metrics: tower_llm_core::GenAiMetrics,
}

impl<T> Bedrock<T> {
    /// A service sending through `transport`.
    pub fn new(transport: T, config: BedrockConfig) -> Self {
        Bedrock {
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

impl<T, B> Service<ChatRequest> for Bedrock<T>
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

/// One unary Converse call.
async fn chat<T, B>(
    transport: &mut T,
    config: &BedrockConfig,
    req: &ChatRequest,
) -> Result<ChatResponse, Failure>
where
    T: Service<http::Request<RequestBody>, Response = http::Response<B>>,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let http_req = signed(config, req, "converse")?;
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
    let request_id = parts
        .headers
        .get("x-amzn-requestid")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    decode(&bytes, request_id, &req.model, latency).map_err(|f| f.with_status(parts.status))
}

impl<T> Bedrock<T> {
    /// This provider as a streaming service (ConverseStream, AWS
    /// event-stream framing); see [`Streaming`](crate::Streaming).
    pub fn streaming(self) -> crate::Streaming<Self> {
        crate::Streaming::new(self)
    }
}

impl<T> crate::streaming::private::Sealed for Bedrock<T> {}

impl<T, B> crate::StreamSource for Bedrock<T>
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
            let http_req = signed(&config, &req, "converse-stream")?;
            let open = crate::streaming::Open {
                wire: EventStreamWire::new(config.scrub()),
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

/// Bedrock's `application/vnd.amazon.eventstream` framing: length-prefixed
/// binary messages with CRC-32 checksums, decoded (and checked) by
/// `aws-smithy-eventstream`; payloads are JSON.
#[derive(Debug)]
pub(crate) struct EventStreamWire {
    buf: bytes::BytesMut,
    stopped: bool,
    /// `metadata` after `messageStop` came: the terminator was handed on.
    done: bool,
    failed: bool,
    /// The credentials sent, removed from exception messages that echo
    /// them.
    scrub: Scrub,
}

impl EventStreamWire {
    pub(crate) fn new(scrub: Scrub) -> Self {
        EventStreamWire {
            buf: bytes::BytesMut::new(),
            stopped: false,
            done: false,
            failed: false,
            scrub,
        }
    }
}

/// The largest event-stream message accepted (1 MiB, as for SSE events).
const MAX_MESSAGE_LEN: usize = crate::stream::MAX_EVENT;

impl crate::streaming::Wire for EventStreamWire {
    fn feed(
        &mut self,
        bytes: &[u8],
        out: &mut std::collections::VecDeque<Result<StreamItem, Failure>>,
    ) {
        if self.failed || self.done {
            return;
        }
        self.buf.extend_from_slice(bytes);
        while let Some(prelude) = self.buf.get(..4) {
            let mut len = [0u8; 4];
            len.copy_from_slice(prelude);
            let total = u32::from_be_bytes(len) as usize;
            if !(16..=MAX_MESSAGE_LEN).contains(&total) {
                self.failed = true;
                out.push_back(Err(invalid(
                    PROVIDER,
                    format!("an event-stream message declares {total} bytes"),
                )));
                return;
            }
            if self.buf.len() < total {
                return;
            }
            let frame = self.buf.split_to(total).freeze();
            let mut last = false;
            let item = aws_smithy_eventstream::frame::read_message_from(frame)
                .map_err(|e| invalid(PROVIDER, format!("event-stream message: {e}")))
                .and_then(|message| {
                    let header = |name: &str| {
                        message
                            .headers()
                            .iter()
                            .find(|h| h.name().as_str() == name)
                            .and_then(|h| h.value().as_string().ok())
                            .map(|v| v.as_str().to_owned())
                    };
                    match header(":message-type").as_deref() {
                        Some("event") => {
                            let kind = header(":event-type");
                            let kind = kind.as_deref().unwrap_or_default();
                            // `metadata` (the usage) follows `messageStop`:
                            // the stream's last message.
                            last = self.stopped && kind == "metadata";
                            event(kind, message.payload())
                        }
                        Some("exception") => Err(exception(
                            header(":exception-type").as_deref().unwrap_or_default(),
                            message.payload(),
                            &self.scrub,
                        )),
                        // The protocol's generic error message (not seen
                        // from Bedrock).
                        _ => Err(Failure::new(FailureClass::Transient)
                            .with_provider(PROVIDER)
                            .with_message(self.scrub.message(&format!(
                                "event-stream error {}: {}",
                                header(":error-code").unwrap_or_default(),
                                header(":error-message").unwrap_or_default()
                            )))),
                    }
                });
            if let Ok(StreamItem::Chunk(c)) = &item {
                self.stopped |= c.finish_reason.is_some();
            }
            self.failed = item.is_err();
            out.push_back(item);
            if self.failed {
                return;
            }
            if last {
                // The terminator: the stream ends here, whether or not the
                // upstream closes the body now.
                out.push_back(Ok(StreamItem::Done));
                self.done = true;
                return;
            }
        }
    }

    fn ended_cleanly(&mut self) -> bool {
        // Without a `metadata` after it, the end of the body after
        // `messageStop` is the terminator.
        !self.done && self.stopped && self.buf.is_empty()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StreamEvent {
    #[serde(default)]
    content_block_index: u32,
    #[serde(default)]
    start: Option<StreamStart>,
    #[serde(default)]
    delta: Option<StreamDelta>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StreamStart {
    #[serde(default)]
    tool_use: Option<StreamToolStart>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StreamToolStart {
    name: String,
    tool_use_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StreamDelta {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool_use: Option<StreamToolDelta>,
}

#[derive(Deserialize)]
struct StreamToolDelta {
    #[serde(default)]
    input: String,
}

/// One ConverseStream event (`messageStart`, `contentBlockStart`,
/// `contentBlockDelta`, `contentBlockStop`, `messageStop`, `metadata`).
fn event(kind: &str, payload: &[u8]) -> Result<StreamItem, Failure> {
    if !matches!(
        kind,
        "contentBlockStart" | "contentBlockDelta" | "messageStop" | "metadata"
    ) {
        return Ok(StreamItem::Skip);
    }
    let e: StreamEvent = serde_json::from_slice(payload).map_err(|e| invalid_json(PROVIDER, &e))?;
    let index = e.content_block_index;
    let chunk = match kind {
        "contentBlockStart" => match e.start.and_then(|s| s.tool_use) {
            Some(t) => ChatChunk {
                tool_call: Some(ToolCallDelta {
                    index,
                    id: Some(t.tool_use_id),
                    name: Some(t.name),
                    arguments: String::new(),
                }),
                ..ChatChunk::default()
            },
            None => return Ok(StreamItem::Skip),
        },
        "contentBlockDelta" => match e.delta {
            Some(StreamDelta {
                text: Some(text), ..
            }) => ChatChunk {
                text: Some(text),
                ..ChatChunk::default()
            },
            Some(StreamDelta {
                tool_use: Some(t), ..
            }) => ChatChunk {
                tool_call: Some(ToolCallDelta {
                    index,
                    id: None,
                    name: None,
                    arguments: t.input,
                }),
                ..ChatChunk::default()
            },
            // Reasoning, citations, images: not normalised.
            _ => return Ok(StreamItem::Skip),
        },
        "messageStop" => ChatChunk {
            finish_reason: Some(finish_reason(e.stop_reason.as_deref())),
            ..ChatChunk::default()
        },
        _ => match e.usage {
            Some(u) => ChatChunk {
                usage: Some(usage(&u)),
                ..ChatChunk::default()
            },
            None => return Ok(StreamItem::Skip),
        },
    };
    Ok(StreamItem::Chunk(chunk))
}

/// An exception message of a stream, classified by its type (the HTTP
/// codes of the Smithy model: throttling 429, service unavailable 503,
/// internal 500, model stream error 424, validation 400).
fn exception(kind: &str, payload: &[u8], scrub: &Scrub) -> Failure {
    let e: WireError<'_> = serde_json::from_slice(payload).unwrap_or_default();
    let message = e.message.as_deref().unwrap_or_default();
    let class = match kind {
        "throttlingException" => FailureClass::RateLimited,
        "validationException" if is_context_window(message) => FailureClass::ContextWindowExceeded,
        "validationException" => FailureClass::BadRequest,
        "accessDeniedException" => FailureClass::Auth,
        // serviceUnavailable, internalServer, modelStreamError, unknown.
        _ => FailureClass::Transient,
    };
    let mut f = Failure::new(class).with_provider(PROVIDER);
    if !message.is_empty() {
        f = f.with_message(scrub.message(&format!("{kind}: {message}")));
    }
    f
}

/// Characters kept as they are in a path segment (RFC 3986 unreserved).
fn encode_path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(char::from(b));
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The Converse request for `req`, signed with SigV4.
pub fn signed_request(
    config: &BedrockConfig,
    req: &ChatRequest,
) -> Result<http::Request<RequestBody>, Failure> {
    signed(config, req, "converse")
}

/// The request for `action` (`converse` or `converse-stream`), signed.
fn signed(
    config: &BedrockConfig,
    req: &ChatRequest,
    action: &str,
) -> Result<http::Request<RequestBody>, Failure> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    use aws_sigv4::sign::v4;

    let body = crate::failure::to_json(PROVIDER, &encode(req)?)?;
    let uri = format!(
        "{}/model/{}/{action}",
        config.endpoint,
        encode_path_segment(&req.model)
    );
    let mut http_req = http::Request::post(&uri)
        .header(CONTENT_TYPE, "application/json")
        .body(())
        .map_err(|e| bad_request(format!("cannot build the request: {e}")))?;
    let creds = aws_credential_types::Credentials::new(
        &config.credentials.access_key_id,
        config.credentials.secret_access_key.expose(),
        config
            .credentials
            .session_token
            .as_ref()
            .map(|t| t.expose().to_owned()),
        None,
        "tower-llm",
    );
    let identity = creds.into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(&config.region)
        .name("bedrock")
        .time(config.fixed_time.unwrap_or_else(SystemTime::now))
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| bad_request(format!("cannot sign the request: {e}")))?
        .into();
    let headers: Vec<(&str, &str)> = http_req
        .headers()
        .iter()
        .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)))
        .collect();
    let signable = SignableRequest::new(
        "POST",
        uri.as_str(),
        headers.into_iter(),
        SignableBody::Bytes(&body),
    )
    .map_err(|e| bad_request(format!("cannot sign the request: {e}")))?;
    let (instructions, _signature) = sign(signable, &params)
        .map_err(|e| bad_request(format!("cannot sign the request: {e}")))?
        .into_parts();
    instructions.apply_to_request_http1x(&mut http_req);
    // aws-sigv4 marks the session token sensitive but not `Authorization`,
    // which names the access key id: keep it out of the request's `Debug`.
    if let Some(auth) = http_req.headers_mut().get_mut(http::header::AUTHORIZATION) {
        auth.set_sensitive(true);
    }
    // Not signed: tracing headers may change without breaking the signature.
    crate::transport::inject_trace_context(http_req.headers_mut());
    Ok(http_req.map(|()| RequestBody::new(Bytes::from(body))))
}

fn bad_request(message: String) -> Failure {
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
struct WireUsage {
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
fn finish_reason(stop_reason: Option<&str>) -> FinishReason {
    match stop_reason {
        Some("end_turn" | "stop_sequence") => FinishReason::Stop,
        Some("max_tokens") => FinishReason::Length,
        Some("tool_use") => FinishReason::ToolCalls,
        Some("guardrail_intervened" | "content_filtered") => FinishReason::ContentFilter,
        _ => FinishReason::Other,
    }
}

/// Converse token counts; `prompt_tokens` counts every input token.
fn usage(u: &WireUsage) -> Usage {
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
fn is_context_window(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    message.contains("input is too long")
        || message.contains("prompt is too long")
        || message.contains("too many input tokens")
        || message.contains("context length")
}

#[derive(Deserialize, Default)]
struct WireError<'a> {
    #[serde(borrow, default, alias = "Message")]
    message: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, rename = "__type")]
    kind: Option<std::borrow::Cow<'a, str>>,
}

/// The AWS error name: the `x-amzn-ErrorType` header (or the body's
/// `__type`), up to its first `:` (and after any `#` namespace).
fn error_name<'a>(headers: &'a HeaderMap, body_kind: Option<&'a str>) -> Option<&'a str> {
    let raw = headers
        .get("x-amzn-errortype")
        .and_then(|v| v.to_str().ok())
        .or(body_kind)?;
    let name = raw.split(':').next().unwrap_or(raw);
    Some(name.rsplit('#').next().unwrap_or(name).trim())
}

/// Classifies a Bedrock error answer (a non-2xx status with its headers and
/// body). Garbage leaves the status's class.
pub fn decode_error(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Failure {
    decode_error_scrubbed(status, headers, body, &Scrub::none())
}

/// As [`decode_error`], removing the credentials of `scrub` from the
/// provider's message.
fn decode_error_scrubbed(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    scrub: &Scrub,
) -> Failure {
    let e: WireError<'_> = serde_json::from_slice(body).unwrap_or_default();
    let parsed = ErrorBody {
        kind: error_name(headers, e.kind.as_deref()).map(std::borrow::Cow::Borrowed),
        code: None,
        message: e.message,
    };
    error_failure(PROVIDER, status, headers, &parsed, scrub, |class, b| {
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
            Some(
                "AccessDeniedException" | "UnrecognizedClientException" | "ExpiredTokenException",
            ) => FailureClass::Auth,
            Some("ResourceNotFoundException") => FailureClass::NotFound,
            Some("ServiceQuotaExceededException") => FailureClass::QuotaExhausted,
            _ => class,
        }
    })
}
