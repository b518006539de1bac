//! [`MockServer`]: the loopback HTTP double.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tower_llm_core::BoxError;
use tower_service::Service;

use super::reply::{Recorded, Reply};
use super::respond::MockBody;
use super::script::{Shared, collect, lock};
use super::transport::ScriptedTransport;
use crate::transport::RequestBody;

/// A real loopback HTTP server playing a script; see the [module
/// docs](crate::mock). It stops when dropped.
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
    let body = collect(body).await;
    transport
        .call(http::Request::from_parts(parts, RequestBody::new(body)))
        .await
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
