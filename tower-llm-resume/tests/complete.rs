//! Complete-or-fail: a held stream that breaks is an error of the call.

mod common;

use std::time::Duration;

use common::*;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm_core::{AttemptStatus, ChatRequest, FailureClass, Message};
use tower_llm_deadline::DeadlineLayer;
use tower_llm_resume::{CHUNK_OVERHEAD, CompleteConfig, CompleteLayer};
use tower_llm_retry::RetryLayer;

fn request() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("Count the words.")]).with_stream(true)
}

fn complete(max_bytes: usize, max_ms: u64) -> CompleteLayer {
    CompleteLayer::new(CompleteConfig { max_bytes, max_ms }).expect("valid")
}

#[tokio::test(start_paused = true)]
async fn a_cut_in_a_held_stream_is_retried_by_the_retry_layer() {
    let all = words(8);
    let script = Script::new();
    // Cut after 3 tokens, then a complete stream.
    let mut broken: Vec<Item> = all[..3].iter().map(|w| text(w)).collect();
    broken.push(cut());
    script.then("a", now(broken));
    script.then("a", now(all.iter().map(|w| text(w)).collect()));
    let link = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(RetryLayer::new())
        .layer(complete(1 << 20, 10_000))
        .service(script.service("a"));

    let stream = link
        .oneshot(request())
        .await
        .expect("the retry is complete");
    let statuses: Vec<_> = stream.attempts().iter().map(|r| r.status()).collect();
    let items = drain(stream).await;
    // The client sees the second stream only: no token twice.
    let (got, failed) = joined(&items);
    assert_eq!((got.as_str(), failed), (all.concat().as_str(), None));
    assert_eq!(duplicated_and_missing(&got, &all), (0, 0));
    assert_eq!(items.len(), 8);
    assert_eq!(script.calls("a"), 2);
    assert_eq!(
        statuses,
        [
            AttemptStatus::RetriedAfterConnReset,
            AttemptStatus::Succeeded
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn without_the_layer_the_same_cut_reaches_the_client_and_is_not_retried() {
    let script = Script::new();
    script.then("a", now(vec![text("w0 "), text("w1 "), cut()]));
    script.then("a", now(vec![text("never")]));
    let link = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(RetryLayer::new())
        .service(script.service("a"));
    let items = drain(link.oneshot(request()).await.expect("committed")).await;
    assert_eq!(
        joined(&items),
        ("w0 w1 ".to_owned(), Some(FailureClass::Transient))
    );
    assert_eq!(script.calls("a"), 1);
}

#[tokio::test(start_paused = true)]
async fn past_the_byte_cap_it_answers_with_what_it_holds_and_streams_on() {
    let script = Script::new();
    // Ten chunks of 20 bytes, then a cut: the cap (100 bytes) is passed
    // at the second chunk (2 × (20 + overhead) > 100).
    let chunk = "x".repeat(20);
    let mut items: Vec<Item> = (0..10).map(|_| text(&chunk)).collect();
    items.push(cut());
    script.then("a", now(items));
    script.then("a", now(vec![text("never")]));
    const { assert!(2 * (20 + CHUNK_OVERHEAD) > 100 && 20 + CHUNK_OVERHEAD <= 100) };
    let link = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(RetryLayer::new())
        .layer(complete(100, 10_000))
        .service(script.service("a"));
    let items = drain(link.oneshot(request()).await.expect("committed")).await;
    // An ordinary committed stream now: the cut ends it, nothing retries.
    assert_eq!(items.len(), 11);
    assert_eq!(
        joined(&items),
        (chunk.repeat(10), Some(FailureClass::Transient))
    );
    assert_eq!(script.calls("a"), 1);
}

#[tokio::test(start_paused = true)]
async fn past_the_time_cap_it_answers_with_what_it_holds_and_streams_on() {
    let script = Script::new();
    script.then(
        "a",
        Play::Stream(vec![(0, text("Hel")), (20_000, text("lo")), (0, cut())]),
    );
    let link = ServiceBuilder::new()
        .layer(complete(1 << 20, 5_000))
        .service(script.service("a"));
    let start = Instant::now();
    let stream = link.oneshot(request()).await.expect("committed");
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    let items = drain(stream).await;
    assert_eq!(
        joined(&items),
        ("Hello".to_owned(), Some(FailureClass::Transient))
    );
    assert_eq!(start.elapsed(), Duration::from_secs(20));
}

#[tokio::test(start_paused = true)]
async fn only_requests_the_predicate_picks_are_held() {
    #[derive(Clone)]
    struct HoldIt;
    let script = Script::new();
    script.then(
        "a",
        Play::Stream(vec![(0, text("Hel")), (1_000, text("lo"))]),
    );
    script.then(
        "a",
        Play::Stream(vec![(0, text("Hel")), (1_000, text("lo"))]),
    );
    let link = ServiceBuilder::new()
        .layer(complete(1 << 20, 10_000).when(|req| req.extensions.get::<HoldIt>().is_some()))
        .service(script.service("a"));
    let start = Instant::now();
    let _passed = link.clone().oneshot(request()).await.expect("at once");
    assert_eq!(start.elapsed(), Duration::ZERO);
    let mut held = request();
    held.extensions.insert(HoldIt);
    let answer = link.oneshot(held).await.expect("complete");
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    let (got, failed) = joined(&drain(answer).await);
    assert_eq!((got.as_str(), failed), ("Hello", None));
}
