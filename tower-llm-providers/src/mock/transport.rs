//! [`ScriptedTransport`]: the in-process double.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tower_llm_core::BoxError;
use tower_service::Service;

use super::reply::{Recorded, Reply};
use super::respond::{MockBody, resolve, respond};
use super::script::{Script, Shared, collect, lock};
use crate::transport::RequestBody;

/// An in-process HTTP transport that plays a script; see the [module
/// docs](crate::mock).
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
    pub(super) script: Shared,
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
            let body = collect(body).await;
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
