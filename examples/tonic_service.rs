//! The stack inside a gRPC service: a tonic server whose `Complete` method
//! calls the stack and maps the outcome to a gRPC status. The caller's
//! `grpc-timeout` becomes the call's deadline.
//!
//! ```text
//! cargo run --example tonic_service
//! ```
//!
//! No `protoc` needed: the two messages are written by hand with
//! `prost`'s derive, and the method is routed by hand the way tonic's
//! generated code does it. The example starts a mock provider, serves the
//! service on loopback, calls it as a gRPC client would, prints, exits.
//! `tests/http/examples.rs` runs it and checks the reply.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm::deadline::parse_grpc_timeout;
use tower_llm::prelude::*;
use tower_llm::providers::https::client_with_connect_timeout;
use tower_llm::providers::{ApiKey, OpenAi, OpenAiConfig};
use tower_llm_providers::mock::{MockServer, Reply};

/// `message CompleteRequest { string model = 1; string prompt = 2; }`
#[derive(Clone, PartialEq, prost::Message)]
struct CompleteRequest {
    #[prost(string, tag = "1")]
    model: String,
    #[prost(string, tag = "2")]
    prompt: String,
}

/// `message CompleteReply { string text = 1; string provider = 2; uint32 attempts = 3; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct CompleteReply {
    /// The answer's text.
    #[prost(string, tag = "1")]
    pub text: String,
    /// The provider that served.
    #[prost(string, tag = "2")]
    pub provider: String,
    /// Attempts the call made.
    #[prost(uint32, tag = "3")]
    pub attempts: u32,
}

type Llm = BoxCloneSyncService<ChatRequest, ChatResponse, Failure>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// `service Chat { rpc Complete(CompleteRequest) returns (CompleteReply); }`
#[derive(Clone)]
struct ChatServer {
    llm: Llm,
}

impl tonic::server::NamedService for ChatServer {
    const NAME: &'static str = "llm.Chat";
}

/// The `Complete` method.
struct Complete(Llm);

impl tonic::server::UnaryService<CompleteRequest> for Complete {
    type Response = CompleteReply;
    type Future = BoxFuture<Result<tonic::Response<CompleteReply>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<CompleteRequest>) -> Self::Future {
        let llm = self.0.clone();
        Box::pin(async move {
            // The caller's gRPC deadline bounds every retry and failover.
            let timeout = request
                .metadata()
                .get("grpc-timeout")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| http::HeaderValue::from_str(v).ok())
                .and_then(|v| parse_grpc_timeout(&v));
            let message = request.into_inner();
            let mut req = ChatRequest::new(message.model, vec![Message::user(message.prompt)]);
            if let Some(timeout) = timeout {
                tower_llm::Deadline::after(timeout).store(&mut req);
            }
            match llm.oneshot(req).await {
                Ok(res) => Ok(tonic::Response::new(CompleteReply {
                    text: res.text().to_owned(),
                    provider: res.provider.to_string(),
                    attempts: u32::try_from(res.attempts.len()).unwrap_or(u32::MAX),
                })),
                Err(e) => Err(status(&e)),
            }
        })
    }
}

/// A failure as a gRPC status.
fn status(e: &Failure) -> tonic::Status {
    let message = e.to_string();
    match e.class() {
        FailureClass::DeadlineExceeded => tonic::Status::deadline_exceeded(message),
        FailureClass::Conflict => tonic::Status::aborted(message),
        FailureClass::BadRequest | FailureClass::ContextWindowExceeded => {
            tonic::Status::invalid_argument(message)
        }
        FailureClass::RateLimited | FailureClass::QuotaExhausted => {
            tonic::Status::resource_exhausted(message)
        }
        FailureClass::Auth | FailureClass::NotFound | FailureClass::InvalidResponse => {
            tonic::Status::internal(message)
        }
        _ => tonic::Status::unavailable(message),
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for ChatServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let llm = self.llm.clone();
        Box::pin(async move {
            if req.uri().path() == "/llm.Chat/Complete" {
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
                return Ok(grpc.unary(Complete(llm), req).await);
            }
            Ok(tonic::Status::unimplemented("no such method").into_http())
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reply = run().await?;
    println!(
        "llm.Chat/Complete -> {:?} from {} after {} attempts",
        reply.text, reply.provider, reply.attempts
    );
    Ok(())
}

/// Starts the mock provider and the gRPC server, calls `Complete` once,
/// returns the reply (`tests/http/examples.rs` runs this and checks it).
pub async fn run() -> Result<CompleteReply, Box<dyn std::error::Error>> {
    let provider = MockServer::start(Reply::openai_text("Hello over gRPC")).await?;
    provider.push(Reply::openai_error(503, "server_error", "busy"));
    let openai = OpenAi::new(
        client_with_connect_timeout(Duration::from_secs(5)),
        OpenAiConfig::new(ApiKey::new("mock")).with_base_url(&format!("{}/v1", provider.url())),
    );
    let llm: Llm = BoxCloneSyncService::new(
        ServiceBuilder::new()
            .llm_deadline(Duration::from_secs(30))
            .llm_retry(RetryLayer::new())
            .llm_breaker(BreakerLayer::new())
            .service(openai),
    );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = tokio_stream_from(listener);
    tokio::spawn(
        // One service, so no router: tonic's server serves it directly.
        tonic::transport::Server::builder().serve_with_incoming(ChatServer { llm }, incoming),
    );

    // A gRPC client calls `Complete` with a 10 s deadline.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await?;
    let mut request = tonic::Request::new(CompleteRequest {
        model: "gpt-4o-mini".into(),
        prompt: "Hi".into(),
    });
    request.set_timeout(Duration::from_secs(10));
    let reply: tonic::Response<CompleteReply> = client
        .unary(
            request,
            http::uri::PathAndQuery::from_static("/llm.Chat/Complete"),
            tonic_prost::ProstCodec::default(),
        )
        .await?;
    Ok(reply.into_inner())
}

/// Accepted connections as the stream tonic's `serve_with_incoming` takes.
fn tokio_stream_from(
    listener: tokio::net::TcpListener,
) -> impl futures_core::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    struct Incoming(tokio::net::TcpListener);
    impl futures_core::Stream for Incoming {
        type Item = std::io::Result<tokio::net::TcpStream>;
        fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            self.0.poll_accept(cx).map(|r| {
                Some(r.map(|(stream, _)| {
                    let _ = stream.set_nodelay(true);
                    stream
                }))
            })
        }
    }
    Incoming(listener)
}
