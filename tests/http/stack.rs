//! The layers composed (deadline → retry → breaker) around a plain
//! hyper-util client, against a failing server on loopback.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_llm::breaker::{BreakerKey, CircuitState};
use tower_llm::prelude::*;
use tower_llm::retry::FixedFraction;
use tower_llm::{AttemptStatus, FailureClass};

use crate::common::serve;

#[tokio::test(start_paused = true)]
async fn retries_then_the_breaker_opens_and_fails_fast() {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let addr = serve(service_fn(move |_req: http::Request<Incoming>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async {
            Ok::<_, Failure>(
                http::Response::builder()
                    .status(503)
                    .body(Full::from("overloaded"))
                    .expect("response"),
            )
        }
    }))
    .await;

    let breaker = BreakerLayer::http();
    let handle = breaker.handle();
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_retry(RetryLayer::http().with_rng(FixedFraction(0.5)))
        .llm_breaker(breaker)
        .service(client);
    let get = || {
        http::Request::get(format!("http://{addr}/v1/chat/completions"))
            .body(Empty::<Bytes>::new())
            .expect("request")
    };

    // Call 1: three attempts, all 503; the last 503 comes back as is.
    let start = Instant::now();
    let res = svc.clone().oneshot(get()).await.expect("an HTTP answer");
    assert_eq!(res.status(), 503);
    assert_eq!(start.elapsed(), Duration::from_millis(1000));
    assert_eq!(hits.load(Ordering::SeqCst), 3);

    // Call 2: two more 503s open the circuit (5 in a row); the third
    // attempt is refused by the breaker and not retried.
    let err = svc
        .clone()
        .oneshot(get())
        .await
        .expect_err("circuit opened");
    assert!(err.is_circuit_open(), "{err:?}");
    assert_eq!(hits.load(Ordering::SeqCst), 5);
    let statuses: Vec<_> = err.attempts().iter().map(|a| a.status()).collect();
    assert_eq!(
        statuses,
        [
            AttemptStatus::RetriedAfter5xx,
            AttemptStatus::RetriedAfter5xx,
            AttemptStatus::Failed
        ]
    );
    assert_eq!(
        err.attempts()[2].outcome,
        tower_llm::AttemptOutcome::Failed(FailureClass::CircuitOpen)
    );

    // Call 3: fails fast, nothing reaches the server.
    let start = Instant::now();
    let err = svc.clone().oneshot(get()).await.expect_err("open");
    assert!(err.is_circuit_open());
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(hits.load(Ordering::SeqCst), 5);
    assert_eq!(
        handle.get(&BreakerKey::new("default", "")).map(|s| s.state),
        Some(CircuitState::Open)
    );
}

/// A server that always answers `status`; counts its requests.
async fn fixed(status: u16) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let addr = serve(service_fn(move |_req: http::Request<Incoming>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            Ok::<_, Failure>(
                http::Response::builder()
                    .status(status)
                    .body(Full::from("{}"))
                    .expect("response"),
            )
        }
    }))
    .await;
    (addr, hits)
}

#[tokio::test(start_paused = true)]
async fn the_full_stack_fails_over_between_two_real_servers() {
    use tower_llm::ServedBy;
    use tower_llm::fallback::{FallbackLayer, LinkSpec};

    type Req = http::Request<Empty<Bytes>>;
    let (primary_addr, primary_hits) = fixed(503).await;
    let (backup_addr, backup_hits) = fixed(200).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let breaker = BreakerLayer::http();
    // Each link: retry → breaker → the same pooled client, pointed at its host.
    let link = || {
        ServiceBuilder::new()
            .llm_retry(RetryLayer::http().with_rng(FixedFraction(0.5)))
            .llm_breaker(breaker.clone())
            .service(client.clone())
    };
    let to = |addr: std::net::SocketAddr| {
        move |req: &mut Req, _: &tower_llm::Link| {
            *req.uri_mut() = format!("http://{addr}/v1/chat/completions")
                .parse()
                .expect("uri");
        }
    };
    let fallback =
        FallbackLayer::builder(LinkSpec::new("primary", "m").with_rewrite(to(primary_addr)))
            .or(
                LinkSpec::new("backup", "m").with_rewrite(to(backup_addr)),
                link(),
            )
            .with_classifier(tower_llm::HttpClassifier)
            .build()
            .expect("chain");
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_fallback(fallback)
        .service(link());

    let start = Instant::now();
    let res = svc
        .oneshot(
            http::Request::get("http://unused.invalid/")
                .extension(tower_llm::KeepAttempts)
                .body(Empty::new())
                .expect("request"),
        )
        .await
        .expect("the backup answers");
    assert_eq!(res.status(), 200);
    assert_eq!(start.elapsed(), Duration::from_millis(1000));
    assert_eq!(primary_hits.load(Ordering::SeqCst), 3);
    assert_eq!(backup_hits.load(Ordering::SeqCst), 1);
    assert_eq!(
        res.extensions().get::<ServedBy>().map(|s| s.0.provider()),
        Some("backup")
    );
    let statuses: Vec<_> = res
        .extensions()
        .get::<tower_llm::Attempts>()
        .expect("attempts")
        .0
        .iter()
        .map(|a| (a.provider.to_string(), a.status()))
        .collect();
    let s = |p: &str, st| (p.to_string(), st);
    assert_eq!(
        statuses,
        [
            s("primary", AttemptStatus::RetriedAfter5xx),
            s("primary", AttemptStatus::RetriedAfter5xx),
            s("primary", AttemptStatus::FailedOver),
            s("backup", AttemptStatus::Succeeded),
        ]
    );
}
