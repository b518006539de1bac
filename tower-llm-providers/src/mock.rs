//! Test doubles for users and for this project's own tests (feature `mock`).
//!
//! - [`ScriptedTransport`]: an in-process HTTP transport playing a script
//!   of replies and recording every request; put a real provider on it
//!   (`OpenAi::new(ScriptedTransport::new(...), ..)`) and the provider's own
//!   encoding, decoding and error classification run. Virtual-time friendly.
//! - [`MockServer`]: a real loopback hyper server speaking the OpenAI and
//!   Anthropic wire formats, with scripted faults (status codes with headers,
//!   delays, hangs, connection resets, malformed JSON, truncated and
//!   oversized bodies, SSE streams) and a record of every request.

use std::collections::VecDeque;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use std::future::Future as _;
use tower_llm_core::BoxError;
use tower_service::Service;

use crate::transport::RequestBody;

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

#[derive(Debug)]
struct Script {
    replies: VecDeque<Reply>,
    fallback: Reply,
    received: Vec<Recorded>,
    /// Keep only the last request (for load tests: bounded memory).
    keep_last_only: bool,
    aborted: Arc<AtomicUsize>,
}

impl Script {
    fn next(&mut self) -> Reply {
        self.replies
            .pop_front()
            .unwrap_or_else(|| self.fallback.clone())
    }
}

type Shared = Arc<Mutex<Script>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Script> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An in-process HTTP transport that plays a script; see the [module
/// docs](self).
///
/// ```
/// use tower::ServiceExt;
/// use tower_llm_core::{ChatRequest, Message};
/// use tower_llm_providers::mock::{Reply, ScriptedTransport};
/// use tower_llm_providers::{ApiKey, OpenAi, OpenAiConfig};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let transport = ScriptedTransport::new(Reply::openai_text("hi"))
///     .then(Reply::openai_error(503, "server_error", "overloaded"));
/// let provider = OpenAi::new(transport.clone(), OpenAiConfig::new(ApiKey::new("k")));
/// let req = || ChatRequest::new("m", vec![Message::user("hello")]);
/// assert!(provider.clone().oneshot(req()).await.unwrap_err().is_transient());
/// assert_eq!(provider.oneshot(req()).await.unwrap().text(), "hi");
/// assert_eq!(transport.received().len(), 2);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ScriptedTransport {
    script: Shared,
}

impl ScriptedTransport {
    /// A transport answering `fallback` once the script is played out.
    pub fn new(fallback: Reply) -> Self {
        ScriptedTransport {
            script: Arc::new(Mutex::new(Script {
                replies: VecDeque::new(),
                fallback,
                received: Vec::new(),
                keep_last_only: false,
                aborted: Arc::new(AtomicUsize::new(0)),
            })),
        }
    }

    /// Queues `reply` for the next request (before the fallback).
    #[must_use]
    pub fn then(self, reply: Reply) -> Self {
        self.push(reply);
        self
    }

    /// Queues `reply` (shared by every clone).
    pub fn push(&self, reply: Reply) {
        lock(&self.script).replies.push_back(reply);
    }

    /// Every request received so far.
    pub fn received(&self) -> Vec<Recorded> {
        lock(&self.script).received.clone()
    }

    /// How many [`Reply::Stream`] bodies were dropped before their end
    /// (the client went away mid-stream).
    pub fn aborted_streams(&self) -> usize {
        lock(&self.script).aborted.load(Ordering::SeqCst)
    }

    /// An OpenAI-format provider over this transport (key `mock`).
    pub fn openai(&self) -> ScriptedProvider {
        crate::openai::OpenAi::new(
            self.clone(),
            crate::openai::OpenAiConfig::new(crate::secret::ApiKey::new("mock")),
        )
    }

    /// An Anthropic-format provider over this transport (key `mock`).
    pub fn anthropic(&self) -> crate::anthropic::Anthropic<ScriptedTransport> {
        crate::anthropic::Anthropic::new(
            self.clone(),
            crate::anthropic::AnthropicConfig::new(crate::secret::ApiKey::new("mock")),
        )
    }
}

/// An in-process provider playing a script: OpenAI's wire format over a
/// [`ScriptedTransport`], so encoding, decoding and error classification
/// all run for real. Build one with [`ScriptedTransport::openai`].
pub type ScriptedProvider = crate::openai::OpenAi<ScriptedTransport>;

/// The response body of the doubles.
#[derive(Debug)]
pub struct MockBody {
    steps: VecDeque<Step>,
    repeat: Option<(Bytes, usize)>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Counts a drop before the end (streams only).
    aborted: Option<Arc<AtomicUsize>>,
    ended: bool,
}

impl MockBody {
    fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        MockBody {
            steps: steps.into_iter().collect(),
            repeat: None,
            sleep: None,
            aborted: None,
            ended: false,
        }
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                std::task::ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            match self.steps.pop_front() {
                Some(Step::Send(chunk)) => return Poll::Ready(Some(Ok(Frame::data(chunk)))),
                Some(Step::Pause(d)) => self.sleep = Some(Box::pin(tokio::time::sleep(d))),
                Some(Step::Stall) => {
                    self.steps.push_front(Step::Stall);
                    return Poll::Pending;
                }
                Some(Step::Break) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err("the connection broke off mid-body".into())));
                }
                None => break,
            }
        }
        if let Some((chunk, left)) = self.repeat.as_mut() {
            if *left > 0 {
                let n = (*left).min(chunk.len());
                *left -= n;
                return Poll::Ready(Some(Ok(Frame::data(chunk.slice(..n)))));
            }
        }
        self.ended = true;
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        // Only once polled to its end, so that a complete stream is never
        // counted as aborted.
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for MockBody {
    fn drop(&mut self) {
        if let (false, Some(aborted)) = (self.ended, &self.aborted) {
            aborted.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// `reply` with any [`Reply::With`] (also under a delay) built for `req`.
fn resolve(reply: Reply, req: &Recorded) -> Reply {
    match reply {
        Reply::With(build) => resolve(build(req), req),
        Reply::Delayed(d, inner) => Reply::Delayed(d, Box::new(resolve(*inner, req))),
        other => other,
    }
}

/// Builds the response for `reply` (after any delay), or `None` for a reset
/// or a hang (which never returns).
async fn respond(reply: Reply, aborted: Arc<AtomicUsize>) -> Option<http::Response<MockBody>> {
    let mut reply = reply;
    loop {
        match reply {
            Reply::Delayed(d, inner) => {
                tokio::time::sleep(d).await;
                reply = *inner;
            }
            Reply::Hang => std::future::pending::<()>().await,
            // Resolved against the request before `respond`.
            Reply::Reset | Reply::With(_) => return None,
            Reply::Answer {
                status,
                headers,
                body,
            } => {
                let mut res = http::Response::new(MockBody::new([Step::Send(body)]));
                *res.status_mut() =
                    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                for (k, v) in headers {
                    if let (Ok(k), Ok(v)) = (
                        HeaderName::from_bytes(k.as_bytes()),
                        HeaderValue::from_str(&v),
                    ) {
                        res.headers_mut().append(k, v);
                    }
                }
                return Some(res);
            }
            Reply::Truncated { sent } => {
                return Some(http::Response::new(MockBody::new([
                    Step::Send(sent),
                    Step::Break,
                ])));
            }
            Reply::Oversized { len } => {
                let mut body = MockBody::new([]);
                body.repeat = Some((Bytes::from(vec![b' '; 64 * 1024]), len));
                return Some(http::Response::new(body));
            }
            Reply::Sse(events) => {
                reply = Reply::sse_steps(
                    events
                        .into_iter()
                        .map(|e| Step::Send(Bytes::from(e)))
                        .collect(),
                );
            }
            Reply::Stream {
                content_type,
                steps,
            } => {
                let mut body = MockBody::new(steps);
                body.aborted = Some(aborted);
                let mut res = http::Response::new(body);
                if let Ok(v) = HeaderValue::from_str(&content_type) {
                    res.headers_mut().insert("content-type", v);
                }
                return Some(res);
            }
        }
    }
}

impl Service<http::Request<RequestBody>> for ScriptedTransport {
    type Response = http::Response<MockBody>;
    type Error = BoxError;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<RequestBody>) -> Self::Future {
        let script = self.script.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let (reply, aborted) = {
                let mut s = lock(&script);
                if s.keep_last_only {
                    s.received.clear();
                }
                s.received.push(Recorded {
                    method: parts.method,
                    path: parts
                        .uri
                        .path_and_query()
                        .map_or_else(String::new, |p| p.to_string()),
                    headers: parts.headers,
                    body,
                });
                let reply = s.next();
                let reply = match s.received.last() {
                    Some(req) => resolve(reply, req),
                    None => reply,
                };
                (reply, s.aborted.clone())
            };
            respond(reply, aborted).await.ok_or_else(|| {
                BoxError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
            })
        })
    }
}

/// A real loopback HTTP server playing a script; see the [module
/// docs](self). It stops when dropped.
///
/// ```
/// use tower_llm_providers::mock::{MockServer, Reply};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let server = MockServer::start(Reply::openai_text("hello")).await.unwrap();
/// server.push(Reply::json(429, "{}").with_header("retry-after", "2"));
/// assert!(server.url().starts_with("http://127.0.0.1:"));
/// # }
/// ```
#[derive(Debug)]
pub struct MockServer {
    addr: SocketAddr,
    script: Shared,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl MockServer {
    /// Starts a server on a fresh loopback port, answering `fallback` once
    /// the script is played out.
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    pub async fn start(fallback: Reply) -> std::io::Result<MockServer> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        MockServer::start_on(listener, fallback).await
    }

    /// As [`start`](Self::start), on a listener of your own (a fixed port;
    /// it must be non-blocking).
    ///
    /// # Errors
    ///
    /// When the listener cannot be registered with tokio.
    pub async fn start_on(
        listener: std::net::TcpListener,
        fallback: Reply,
    ) -> std::io::Result<MockServer> {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let addr = listener.local_addr()?;
        let transport = ScriptedTransport::new(fallback);
        let script = transport.script.clone();
        let connections = Arc::new(AtomicUsize::new(0));
        let accepted = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve_connection(stream, transport.clone()));
            }
        });
        Ok(MockServer {
            addr,
            script,
            connections,
            task,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queues `reply` for the next request (before the fallback).
    pub fn push(&self, reply: Reply) {
        lock(&self.script).replies.push_back(reply);
    }

    /// Every request received so far.
    pub fn received(&self) -> Vec<Recorded> {
        lock(&self.script).received.clone()
    }

    /// Keeps only the last request received, so memory stays bounded under
    /// a load test (`received()` then returns at most one request).
    pub fn keep_last_request_only(&self) {
        lock(&self.script).keep_last_only = true;
    }

    /// How many connections were accepted (keep-alive reuse shows as fewer
    /// connections than requests).
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// How many [`Reply::Stream`] bodies were dropped before their end: the
    /// client closed the connection mid-stream.
    pub fn aborted_streams(&self) -> usize {
        lock(&self.script).aborted.load(Ordering::SeqCst)
    }
}

/// Serves one accepted connection with the script.
async fn serve_connection(stream: tokio::net::TcpStream, transport: ScriptedTransport) {
    let svc = hyper::service::service_fn(move |req| handle(transport.clone(), req));
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
        .await;
}

/// Records one request and plays the next reply.
async fn handle(
    mut transport: ScriptedTransport,
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<MockBody>, BoxError> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    transport
        .call(http::Request::from_parts(parts, RequestBody::new(body)))
        .await
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
