//! Hedging over real loopback HTTP (`MockServer`): the loser's connection
//! is closed, a stream never yields tokens from two attempts, an open
//! circuit is never hedged into, and the loser's cancellation neither trips
//! nor resets its circuit.

use std::pin::Pin;
use std::time::Duration;

use futures_core::Stream as _;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm::breaker::BreakerKey;
use tower_llm::hedge::{HedgeConfig, HedgeLayer};
use tower_llm::prelude::*;
use tower_llm::providers::https::{HttpsClient, client_with_connect_timeout};
use tower_llm::providers::{ApiKey, OpenAi, OpenAiConfig};
use tower_llm::{AttemptOutcome, ChatChunk, Link};
use tower_llm_providers::mock::{MockServer, Reply, Step, openai_stream_steps};

fn req() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("hi")])
}

fn openai(server: &MockServer) -> OpenAi<HttpsClient> {
    OpenAi::new(
        client_with_connect_timeout(Duration::from_secs(5)),
        OpenAiConfig::new(ApiKey::new("k")).with_base_url(&server.url()),
    )
}

fn hedge(delay_ms: u64) -> HedgeLayer {
    HedgeLayer::new(HedgeConfig {
        delay_ms,
        ..HedgeConfig::default()
    })
    .expect("valid")
}

/// A stream that sends its headers at once and its first content frame
/// after `wait`.
fn slow_stream(wait: Duration, pieces: &[&str]) -> Reply {
    let mut steps = vec![Step::Pause(wait)];
    steps.extend(openai_stream_steps(pieces, true));
    Reply::sse_steps(steps)
}

async fn drain(mut stream: ChatStream) -> String {
    let mut text = String::new();
    while let Some(item) = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await {
        let chunk: ChatChunk = item.expect("no error");
        text.push_str(chunk.text.as_deref().unwrap_or_default());
    }
    text
}

/// Waits (virtual time, real sockets) until `server` has seen `n` streams
/// closed before their end.
async fn aborted(server: &MockServer, n: usize) {
    for _ in 0..200 {
        if server.aborted_streams() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{} streams aborted, {n} expected", server.aborted_streams());
}

#[tokio::test(start_paused = true)]
async fn a_streaming_hedge_commits_first_and_the_slow_stream_is_closed_unread() {
    let server = MockServer::start(Reply::openai_stream(&["hello", " world"]))
        .await
        .expect("server");
    // The first request gets a stream whose first token comes after 1 s.
    server.push(slow_stream(Duration::from_secs(1), &["LATE ", "tokens"]));
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_hedge(hedge(200))
        .llm_retry(RetryLayer::new())
        .llm_breaker(BreakerLayer::new())
        .service(openai(&server).streaming());

    let start = Instant::now();
    let stream = svc.oneshot(req()).await.expect("the hedge commits");
    let committed = start.elapsed();
    assert!(
        committed >= Duration::from_millis(200) && committed < Duration::from_secs(1),
        "{committed:?}"
    );
    let records: Vec<_> = stream
        .attempts()
        .iter()
        .map(|r| (r.outcome, r.hedge))
        .collect();
    assert_eq!(
        records,
        [
            (AttemptOutcome::CancelledByHedge, false),
            (AttemptOutcome::Succeeded, true)
        ]
    );
    // The whole text is the hedge's; the first stream's late tokens never
    // reach the client, even after they were due.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(drain(stream).await, "hello world");
    assert_eq!(server.received().len(), 2);
    aborted(&server, 1).await;
}

#[tokio::test(start_paused = true)]
async fn a_unary_hedge_on_the_same_link_closes_the_slow_connection() {
    let server = MockServer::start(Reply::openai_text("fast"))
        .await
        .expect("server");
    let body = Reply::openai_text("slow");
    let Reply::Answer { body, .. } = body else {
        panic!("an answer")
    };
    server.push(Reply::stream(
        "application/json",
        vec![Step::Pause(Duration::from_secs(10)), Step::Send(body)],
    ));
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_hedge(hedge(300))
        .llm_retry(RetryLayer::new())
        .service(openai(&server));

    let res = svc.oneshot(req()).await.expect("the hedge answers");
    assert_eq!(res.text(), "fast");
    assert!(res.attempts[1].hedge);
    assert_eq!(server.received().len(), 2);
    aborted(&server, 1).await;
}

#[tokio::test(start_paused = true)]
async fn an_open_circuit_is_never_hedged_into() {
    let primary =
        MockServer::start(Reply::openai_text("primary").after(Duration::from_millis(500)))
            .await
            .expect("server");
    let backup = MockServer::start(Reply::openai_text("backup"))
        .await
        .expect("server");
    let breaker = BreakerLayer::new();
    let handle = breaker.handle();
    let backup_link = ServiceBuilder::new()
        .llm_retry(RetryLayer::new())
        .llm_breaker(breaker.clone())
        .service(openai(&backup));
    // The backup's circuit exists (one call made), then is opened.
    let mut first = req();
    Link::new("backup", "m").store(&mut first);
    backup_link
        .clone()
        .oneshot(first)
        .await
        .expect("the backup answers");
    let key = BreakerKey::new("backup", "m");
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .layer(hedge(100).to(Link::new("backup", "m"), backup_link))
        .llm_retry(RetryLayer::new())
        .llm_breaker(breaker)
        .service(openai(&primary));
    let before = backup.received().len();
    assert!(handle.isolate(&key));

    let start = Instant::now();
    let res = svc.oneshot(req()).await.expect("the primary answers");
    assert_eq!(res.text(), "primary");
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    assert_eq!(
        backup.received().len(),
        before,
        "no request to an open circuit"
    );
    assert_eq!(
        res.attempts[1].outcome,
        AttemptOutcome::Failed(FailureClass::CircuitOpen)
    );
}

#[tokio::test(start_paused = true)]
async fn the_losers_cancellation_neither_trips_nor_resets_its_circuit() {
    let primary =
        MockServer::start(Reply::openai_text("primary").after(Duration::from_millis(300)))
            .await
            .expect("server");
    let backup = MockServer::start(Reply::openai_text("backup").after(Duration::from_secs(5)))
        .await
        .expect("server");
    // The backup failed once before: one failure of three counted.
    backup.push(Reply::openai_error(503, "server_error", "down"));
    let breaker = BreakerLayer::new()
        .with_config(BreakerConfig {
            consecutive_failures: 3,
            ..BreakerConfig::default()
        })
        .expect("valid");
    let handle = breaker.handle();
    let backup_link = ServiceBuilder::new()
        .llm_retry(RetryLayer::new().with_max_attempts(1))
        .llm_breaker(breaker.clone())
        .service(openai(&backup));
    let key = BreakerKey::new("backup", "m");
    let mut first = req();
    Link::new("backup", "m").store(&mut first);
    let err = backup_link
        .clone()
        .oneshot(first)
        .await
        .expect_err("the 503");
    assert!(err.is_transient());
    assert_eq!(handle.get(&key).expect("circuit").consecutive_failures, 1);

    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .layer(hedge(100).to(Link::new("backup", "m"), backup_link))
        .llm_retry(RetryLayer::new())
        .llm_breaker(breaker)
        .service(openai(&primary));
    for _ in 0..5 {
        let res = svc.clone().oneshot(req()).await.expect("the primary wins");
        assert_eq!(res.text(), "primary");
        assert_eq!(res.attempts[1].outcome, AttemptOutcome::CancelledByHedge);
    }
    let circuit = handle.get(&key).expect("circuit");
    assert_eq!(circuit.state, tower_llm::breaker::CircuitState::Closed);
    assert_eq!(circuit.consecutive_failures, 1, "neither counted nor reset");
    assert_eq!(backup.received().len(), 6);
}
