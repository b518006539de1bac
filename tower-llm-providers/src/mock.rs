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
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tower_llm_core::BoxError;
use tower_service::Service;

use crate::RequestBody;

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

    /// Malformed JSON with status 200.
    pub fn malformed() -> Self {
        Reply::json(200, "{\"id\": \"x\", \"choices\": [")
    }
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

    /// An OpenAI-format provider over this transport (key `mock`).
    pub fn openai(&self) -> ScriptedProvider {
        crate::OpenAi::new(
            self.clone(),
            crate::OpenAiConfig::new(crate::ApiKey::new("mock")),
        )
    }

    /// An Anthropic-format provider over this transport (key `mock`).
    pub fn anthropic(&self) -> crate::Anthropic<ScriptedTransport> {
        crate::Anthropic::new(
            self.clone(),
            crate::AnthropicConfig::new(crate::ApiKey::new("mock")),
        )
    }
}

/// An in-process provider playing a script: OpenAI's wire format over a
/// [`ScriptedTransport`], so encoding, decoding and error classification
/// all run for real. Build one with [`ScriptedTransport::openai`].
pub type ScriptedProvider = crate::OpenAi<ScriptedTransport>;

/// The response body of the doubles.
#[derive(Debug)]
pub struct MockBody {
    chunks: VecDeque<Bytes>,
    fail_at_end: bool,
    repeat: Option<(Bytes, usize)>,
}

impl MockBody {
    fn full(body: Bytes) -> Self {
        MockBody {
            chunks: VecDeque::from([body]),
            fail_at_end: false,
            repeat: None,
        }
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(chunk) = self.chunks.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if let Some((chunk, left)) = self.repeat.as_mut() {
            if *left > 0 {
                let n = (*left).min(chunk.len());
                *left -= n;
                return Poll::Ready(Some(Ok(Frame::data(chunk.slice(..n)))));
            }
        }
        if self.fail_at_end {
            self.fail_at_end = false;
            return Poll::Ready(Some(Err("the connection broke off mid-body".into())));
        }
        Poll::Ready(None)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Builds the response for `reply` (after any delay), or `None` for a reset
/// or a hang (which never returns).
async fn respond(reply: Reply) -> Option<http::Response<MockBody>> {
    let mut reply = reply;
    loop {
        match reply {
            Reply::Delayed(d, inner) => {
                tokio::time::sleep(d).await;
                reply = *inner;
            }
            Reply::Hang => std::future::pending::<()>().await,
            Reply::Reset => return None,
            Reply::Answer {
                status,
                headers,
                body,
            } => {
                let mut res = http::Response::new(MockBody::full(body));
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
                return Some(http::Response::new(MockBody {
                    chunks: VecDeque::from([sent]),
                    fail_at_end: true,
                    repeat: None,
                }));
            }
            Reply::Oversized { len } => {
                return Some(http::Response::new(MockBody {
                    chunks: VecDeque::new(),
                    fail_at_end: false,
                    repeat: Some((Bytes::from(vec![b' '; 64 * 1024]), len)),
                }));
            }
            Reply::Sse(events) => {
                let mut res = http::Response::new(MockBody {
                    chunks: events.into_iter().map(Bytes::from).collect(),
                    fail_at_end: false,
                    repeat: None,
                });
                res.headers_mut().insert(
                    "content-type",
                    HeaderValue::from_static("text/event-stream"),
                );
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
            let reply = {
                let mut s = lock(&script);
                s.received.push(Recorded {
                    method: parts.method,
                    path: parts
                        .uri
                        .path_and_query()
                        .map_or_else(String::new, |p| p.to_string()),
                    headers: parts.headers,
                    body,
                });
                s.next()
            };
            respond(reply).await.ok_or_else(|| {
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
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let transport = ScriptedTransport::new(fallback);
        let script = transport.script.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve_connection(stream, transport.clone()));
            }
        });
        Ok(MockServer { addr, script, task })
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
