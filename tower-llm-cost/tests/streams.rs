//! A streamed answer holds its attempt's worst case until the stream ends
//! and is charged then: its usage when it came, else what was delivered.

use futures_util::StreamExt as _;
use tower::{Layer, ServiceExt, service_fn};
use tower_llm_core::layer::{AttemptLogExt as _, AttemptRecordExt as _};
use tower_llm_core::{
    AttemptLog, AttemptRecord, Budget, ChatChunk, ChatRequest, ChatStream, Cost, Failure,
    FailureClass, FinishReason, Link, LlmRequest as _, Usage,
};
use tower_llm_cost::CostLayer;

mod common;
use common::*;

fn text(t: &str) -> Result<ChatChunk, Failure> {
    Ok(ChatChunk {
        text: Some(t.into()),
        ..ChatChunk::default()
    })
}

fn last(usage: Option<Usage>) -> Result<ChatChunk, Failure> {
    Ok(ChatChunk {
        finish_reason: Some(FinishReason::Stop),
        usage,
        ..ChatChunk::default()
    })
}

/// A request with a budget of $1 and a log holding one in-flight record
/// (as the retry layer would have begun it), and the log's owner.
fn metered() -> (ChatRequest, Budget, AttemptLog) {
    let mut r = req();
    let budget = Budget::new(nanos(1_000_000_000)).store(&mut r);
    let owned = AttemptLog::install(&mut r).expect("a fresh log");
    let log = AttemptLog::of(&r).expect("installed");
    log.begin(AttemptRecord::begun(r.call(), &Link::new("p", "m")))
        .expect("room");
    (r, budget, owned)
}

/// The stream the cost layer (cheap price, `cap` output tokens) returns
/// for a provider streaming `items`.
async fn stream(r: ChatRequest, cap: u32, items: Vec<Result<ChatChunk, Failure>>) -> ChatStream {
    let items = std::sync::Arc::new(std::sync::Mutex::new(Some(items)));
    let provider = service_fn(move |_: ChatRequest| {
        let items = items.lock().expect("lock").take().expect("called once");
        async move { Ok::<_, Failure>(ChatStream::from_chunks("p", "m", items)) }
    });
    CostLayer::new(cheap())
        .with_max_output_tokens(cap)
        .layer(provider)
        .oneshot(r)
        .await
        .expect("the stream")
}

fn charged(log: &AttemptLog) -> (Option<Cost>, bool) {
    let records = log.snapshot();
    assert_eq!(records.len(), 1);
    (records[0].cost, records[0].cost_estimated)
}

#[tokio::test(start_paused = true)]
async fn a_stream_is_charged_its_final_usage_when_it_ends_and_holds_until_then() {
    let (r, budget, log) = metered();
    let mut s = stream(r, CAP, vec![text("Hel"), text("lo"), last(Some(usual()))]).await;
    for _ in 0..3 {
        assert_eq!(budget.held(), nanos(worst(1, 2)), "held while it streams");
        assert_eq!(budget.spent(), Cost::ZERO);
        assert!(s.next().await.expect("a chunk").is_ok());
    }
    // The usage chunk came, the stream has not ended yet.
    assert_eq!(budget.held(), nanos(worst(1, 2)));
    assert_eq!(charged(&log), (None, false));
    assert!(s.next().await.is_none());
    assert_eq!(budget.spent(), nanos(40_000));
    assert_eq!(budget.held(), Cost::ZERO);
    assert_eq!(charged(&log), (Some(nanos(40_000)), false));
    drop(s);
    assert_eq!(
        budget.spent(),
        nanos(40_000),
        "dropping after the end charges nothing more"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_cut_by_an_error_is_charged_input_and_one_token_per_byte_delivered() {
    let (r, budget, log) = metered();
    let mut s = stream(
        r,
        CAP,
        vec![
            text("abc"),
            text("defg"),
            Err(Failure::new(FailureClass::Transient)),
        ],
    )
    .await;
    assert!(s.next().await.expect("abc").is_ok());
    assert!(s.next().await.expect("defg").is_ok());
    assert_eq!(budget.held(), nanos(worst(1, 2)));
    assert!(s.next().await.expect("the error").is_err());
    // 29 input tokens × 1,000 + 7 bytes as output tokens × 2,000.
    let cost = nanos(29_000 + 14_000);
    assert_eq!((budget.spent(), budget.held()), (cost, Cost::ZERO));
    assert_eq!(charged(&log), (Some(cost), true));
    assert!(s.next().await.is_none());
    drop(s);
    assert_eq!(budget.spent(), cost, "settled once");
}

#[tokio::test(start_paused = true)]
async fn a_stream_its_reader_drops_midway_is_charged_input_and_one_token_per_byte_delivered() {
    let (r, budget, log) = metered();
    let mut s = stream(
        r,
        CAP,
        vec![
            text("abc"),
            text("defg"),
            text("never read"),
            last(Some(usual())),
        ],
    )
    .await;
    assert!(s.next().await.expect("abc").is_ok());
    assert!(s.next().await.expect("defg").is_ok());
    drop(s);
    let cost = nanos(29_000 + 14_000);
    assert_eq!((budget.spent(), budget.held()), (cost, Cost::ZERO));
    assert_eq!(charged(&log), (Some(cost), true));
}

#[tokio::test(start_paused = true)]
async fn a_stream_dropped_before_any_chunk_is_charged_its_input_estimate() {
    let (r, budget, log) = metered();
    let s = stream(r, CAP, vec![text("abc"), last(None)]).await;
    drop(s);
    let cost = nanos(input_only(1));
    assert_eq!((budget.spent(), budget.held()), (cost, Cost::ZERO));
    assert_eq!(charged(&log), (Some(cost), true));
}

#[tokio::test(start_paused = true)]
async fn a_cut_stream_is_charged_at_most_its_output_cap() {
    let (r, budget, log) = metered();
    // A cap of 5 output tokens; 7 bytes delivered.
    let mut s = stream(
        r,
        5,
        vec![
            text("abc"),
            text("defg"),
            Err(Failure::new(FailureClass::Transient)),
        ],
    )
    .await;
    while s.next().await.is_some() {}
    let cost = nanos(29_000 + 5 * 2_000);
    assert_eq!((budget.spent(), budget.held()), (cost, Cost::ZERO));
    assert_eq!(charged(&log), (Some(cost), true));
}

#[tokio::test(start_paused = true)]
async fn a_stream_ending_without_usage_is_charged_its_whole_estimate() {
    let (r, budget, log) = metered();
    let mut s = stream(r, CAP, vec![text("abc"), text("defg"), last(None)]).await;
    while s.next().await.is_some() {}
    let cost = nanos(worst(1, 2));
    assert_eq!((budget.spent(), budget.held()), (cost, Cost::ZERO));
    assert_eq!(charged(&log), (Some(cost), true));
}

#[tokio::test(start_paused = true)]
async fn a_stream_cut_after_its_usage_came_is_charged_that_usage() {
    let (r, budget, log) = metered();
    let mut s = stream(
        r,
        CAP,
        vec![
            text("abc"),
            Ok(ChatChunk {
                usage: Some(usual()),
                ..ChatChunk::default()
            }),
            Err(Failure::new(FailureClass::Transient)),
        ],
    )
    .await;
    while s.next().await.is_some() {}
    assert_eq!((budget.spent(), budget.held()), (nanos(40_000), Cost::ZERO));
    assert_eq!(charged(&log), (Some(nanos(40_000)), false));
}

#[tokio::test(start_paused = true)]
async fn a_stream_whose_usage_counts_fewer_tokens_than_pieces_delivered_is_charged_the_estimate() {
    let (r, budget, log) = metered();
    // Three non-empty deltas, one output token reported.
    let mut s = stream(
        r,
        CAP,
        vec![text("a"), text("b"), text("c"), last(Some(usage(20, 1)))],
    )
    .await;
    while s.next().await.is_some() {}
    let cost = nanos(worst(1, 2));
    assert_eq!((budget.spent(), budget.held()), (cost, Cost::ZERO));
    assert_eq!(charged(&log), (Some(cost), true));
}
