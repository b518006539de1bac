//! The deadline layer over real HTTP on loopback: around a plain hyper-util
//! client (outbound), and inside a hyper server reading `grpc-timeout` /
//! `x-request-timeout-ms` from the wire (inbound). Virtual time throughout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_llm::prelude::*;
use tower_llm::{Classify, HttpClassifier, Outcome};

use crate::common::{DropFlag, serve};

/// A provider stand-in: `/slow` never answers (and flags when its handler
/// is dropped), `/429` is rate limited, anything else answers at once.
async fn provider(flag: Arc<AtomicBool>) -> SocketAddr {
    serve(service_fn(move |req: http::Request<Incoming>| {
        let flag = flag.clone();
        async move {
            match req.uri().path() {
                "/slow" => {
                    let _guard = DropFlag(flag);
                    std::future::pending::<()>().await;
                    unreachable!()
                }
                "/429" => Ok(http::Response::builder()
                    .status(429)
                    .header("retry-after", "7")
                    .header("x-should-retry", "true")
                    .body(Full::from("{}"))
                    .expect("response")),
                _ => Ok(http::Response::new(Full::from("hello"))),
            }
        }
    }))
    .await
}

fn get(addr: SocketAddr, path: &str) -> http::Request<Empty<Bytes>> {
    http::Request::get(format!("http://{addr}{path}"))
        .body(Empty::new())
        .expect("request")
}

#[tokio::test(start_paused = true)]
async fn hyper_client_call_is_cut_at_the_deadline_and_cancelled() {
    let handler_dropped = Arc::new(AtomicBool::new(false));
    let addr = provider(handler_dropped.clone()).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(5))
        .service(client);

    let start = Instant::now();
    let err = svc
        .clone()
        .oneshot(get(addr, "/slow"))
        .await
        .expect_err("deadline");
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(5));

    // Dropping the client's future closes the connection, so the server
    // stops working on the abandoned request.
    tokio::time::timeout(Duration::from_secs(1), async {
        // Sleeping (not yielding) lets paused time advance, so this
        // timeout can fire if the handler is never dropped.
        while !handler_dropped.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("server-side handler dropped after the client gave up");

    // The same stack serves a healthy path at once.
    let start = Instant::now();
    let res = svc.oneshot(get(addr, "/fast")).await.expect("ok");
    assert_eq!(start.elapsed(), Duration::ZERO);
    let body = res.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"hello");
}

#[tokio::test(start_paused = true)]
async fn real_429_is_classified_with_its_retry_after() {
    let addr = provider(Arc::new(AtomicBool::new(false))).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(5))
        .service(client);
    let result = svc.oneshot(get(addr, "/429")).await;
    match HttpClassifier.classify(&result) {
        Outcome::Failure(c) => {
            assert_eq!(c.class, FailureClass::RateLimited);
            assert_eq!(c.retry_after, Some(Duration::from_secs(7)));
            assert_eq!(c.should_retry, Some(true));
            assert_eq!(c.http_status, Some(http::StatusCode::TOO_MANY_REQUESTS));
        }
        Outcome::Success { .. } => panic!("429 classified as success"),
    }
}

#[tokio::test(start_paused = true)]
async fn connection_refused_is_transient() {
    // Bind then drop: nothing listens on this port any more.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr");
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let err = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(5))
        .service(client)
        .oneshot(get(addr, "/"))
        .await
        .expect_err("refused");
    assert!(err.is_transient(), "{err:?}");
    assert!(std::error::Error::source(&err).is_some());
}

/// A server whose handler reports the deadline it was given.
async fn deadline_echo_server() -> SocketAddr {
    serve(
        ServiceBuilder::new()
            .llm_deadline(Duration::from_secs(30))
            .service(service_fn(|req: http::Request<Incoming>| async move {
                let left = Deadline::remaining_in(&req).expect("deadline");
                Ok::<_, Failure>(http::Response::new(Full::from(
                    left.as_millis().to_string(),
                )))
            })),
    )
    .await
}

async fn remaining_ms(addr: SocketAddr, header: Option<(&'static str, &'static str)>) -> String {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut req = get(addr, "/");
    if let Some((k, v)) = header {
        req.headers_mut()
            .insert(k, http::HeaderValue::from_static(v));
    }
    let res = client.request(req).await.expect("response");
    let body = res.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8(body.to_vec()).expect("utf-8")
}

#[tokio::test(start_paused = true)]
async fn inbound_timeout_headers_tighten_the_server_deadline() {
    let addr = deadline_echo_server().await;
    assert_eq!(remaining_ms(addr, None).await, "30000");
    assert_eq!(
        remaining_ms(addr, Some(("grpc-timeout", "2S"))).await,
        "2000"
    );
    assert_eq!(
        remaining_ms(addr, Some(("x-request-timeout-ms", "1500"))).await,
        "1500"
    );
    // Looser than the budget: the budget stands. Garbage: ignored.
    assert_eq!(
        remaining_ms(addr, Some(("grpc-timeout", "1H"))).await,
        "30000"
    );
    assert_eq!(
        remaining_ms(addr, Some(("grpc-timeout", "soon"))).await,
        "30000"
    );
}
