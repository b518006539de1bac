//! Deadline and retry around a plain hyper-util client, against a real
//! server on loopback. Virtual time throughout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_llm::prelude::*;
use tower_llm::retry::FixedFraction;
use tower_llm::{AttemptStatus, Attempts};

use crate::common::serve;

/// A server that answers each request with the next status of `script`
/// (the last repeats); status 0 means "never answer".
async fn scripted(
    script: &'static [(u16, Option<&'static str>)],
) -> (SocketAddr, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let addr = serve(service_fn(move |_req: http::Request<Incoming>| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        let (status, retry_after) = script[n.min(script.len() - 1)];
        async move {
            if status == 0 {
                std::future::pending::<()>().await;
            }
            let mut res = http::Response::builder().status(status);
            if let Some(v) = retry_after {
                res = res.header("retry-after", v);
            }
            Ok::<_, Failure>(res.body(Full::from("body")).expect("response"))
        }
    }))
    .await;
    (addr, hits)
}

fn get(addr: SocketAddr) -> http::Request<Empty<Bytes>> {
    http::Request::get(format!("http://{addr}/v1/chat/completions"))
        .body(Empty::new())
        .expect("request")
}

fn client_stack(
    retry: RetryLayer<tower_llm::HttpClassifier>,
) -> impl tower::Service<
    http::Request<Empty<Bytes>>,
    Response = http::Response<Incoming>,
    Error = Failure,
    Future = impl Future<Output = Result<http::Response<Incoming>, Failure>>,
> + Clone {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    ServiceBuilder::new()
        // Ask for the attempt records on every response.
        .map_request(|mut req: http::Request<Empty<Bytes>>| {
            req.extensions_mut().insert(tower_llm::KeepAttempts);
            req
        })
        .llm_deadline(Duration::from_secs(30))
        .llm_retry(retry)
        .service(client)
}

fn statuses(res: &http::Response<Incoming>) -> Vec<AttemptStatus> {
    res.extensions()
        .get::<Attempts>()
        .expect("attempts attached")
        .0
        .iter()
        .map(|a| a.status())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn two_503s_then_200_over_real_http() {
    let (addr, hits) = scripted(&[(503, None), (503, None), (200, None)]).await;
    let svc = client_stack(RetryLayer::http().with_rng(FixedFraction(0.5)));
    let start = Instant::now();
    let res = svc.oneshot(get(addr)).await.expect("third attempt");
    assert_eq!(res.status(), 200);
    assert_eq!(start.elapsed(), Duration::from_millis(200 + 800));
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    assert_eq!(
        statuses(&res),
        [
            AttemptStatus::RetriedAfter5xx,
            AttemptStatus::RetriedAfter5xx,
            AttemptStatus::Succeeded
        ]
    );
    let body = res.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"body");
}

#[tokio::test(start_paused = true)]
async fn retry_after_from_the_wire_is_honoured() {
    let (addr, hits) = scripted(&[(429, Some("2")), (200, None)]).await;
    let svc = client_stack(RetryLayer::http());
    let start = Instant::now();
    let res = svc.oneshot(get(addr)).await.expect("retried");
    assert_eq!(res.status(), 200);
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    assert_eq!(
        statuses(&res),
        [AttemptStatus::RetriedAfter429, AttemptStatus::Succeeded]
    );
}

#[tokio::test(start_paused = true)]
async fn a_hung_connection_times_out_and_the_retry_succeeds() {
    let (addr, hits) = scripted(&[(0, None), (200, None)]).await;
    let svc = client_stack(
        RetryLayer::http()
            .with_attempt_timeout(Duration::from_secs(1))
            .with_rng(FixedFraction(0.5)),
    );
    let start = Instant::now();
    let res = svc.oneshot(get(addr)).await.expect("second attempt");
    assert_eq!(res.status(), 200);
    assert_eq!(start.elapsed(), Duration::from_millis(1200));
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    assert_eq!(
        statuses(&res),
        [AttemptStatus::RetriedAfterTimeout, AttemptStatus::Succeeded]
    );
}

#[tokio::test(start_paused = true)]
async fn a_401_is_returned_after_one_attempt() {
    let (addr, hits) = scripted(&[(401, None), (200, None)]).await;
    let res = client_stack(RetryLayer::http())
        .oneshot(get(addr))
        .await
        .expect("an HTTP answer");
    assert_eq!(res.status(), 401);
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert_eq!(statuses(&res), [AttemptStatus::TerminalAuth]);
}
