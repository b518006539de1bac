//! Continuing streams that break after their first token: what the client
//! receives, what each link is asked, and when nothing is continued.

mod common;

use std::time::Duration;

use common::*;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_llm_core::{
    AttemptStatus, ChatChunk, ChatRequest, Continuation, FailureClass, FinishReason, Message,
    NotReplayable, Role,
};
use tower_llm_deadline::DeadlineLayer;
use tower_llm_fallback::{FallbackLayer, LinkSpec};
use tower_llm_resume::{
    CONTINUE_INSTRUCTION, ContinuationLayer, OVERLAP_WINDOW, Prefill, ResumeConfig, ResumeLayer,
};
use tower_llm_retry::RetryLayer;

fn request() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("Count the words.")]).with_stream(true)
}

fn resume(max_continuations: u8) -> ResumeLayer {
    ResumeLayer::new(ResumeConfig {
        max_continuations,
        ..ResumeConfig::default()
    })
    .expect("valid")
}

/// deadline (30 s) → resume → one link: continuation (prefill) → provider "a".
fn route(
    script: &Script,
    max_continuations: u8,
) -> impl tower::Service<
    ChatRequest,
    Response = tower_llm_core::ChatStream,
    Error = tower_llm_core::Failure,
> + Clone {
    ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(resume(max_continuations))
        .layer(ContinuationLayer::new(Prefill::new(true)))
        .service(script.service("a"))
}

/// The chunks of `parts`, one per part.
fn chunks(parts: &[String]) -> Vec<Item> {
    parts.iter().map(|p| text(p)).collect()
}

#[tokio::test(start_paused = true)]
async fn a_cut_stream_continued_with_its_last_five_tokens_repeated_has_every_token_once() {
    let all = words(20);
    let script = Script::new();
    let mut first = chunks(&all[..12]);
    first.push(cut());
    script.then("a", now(first));
    // The continuation repeats w7..w11, then goes on.
    let mut second = chunks(&all[7..]);
    second.push(Ok(ChatChunk {
        finish_reason: Some(FinishReason::Stop),
        ..ChatChunk::default()
    }));
    script.then("a", now(second));

    let stream = route(&script, 1)
        .oneshot(request())
        .await
        .expect("committed");
    let continued = stream.continuations();
    let items = drain(stream).await;
    let (got, failed) = joined(&items);
    assert_eq!(failed, None);
    assert_eq!(got, all.concat());
    assert_eq!(duplicated_and_missing(&got, &all), (0, 0));
    assert_eq!(continued.count(), 1);
    assert_eq!(continued.pieces()[0].cause(), FailureClass::Transient);
    assert_eq!(script.calls("a"), 2);
    // The continuation request: the original, its partial answer
    // prefilled (trailing whitespace left out).
    let asked = &script.seen("a")[1];
    assert_eq!(asked.messages.len(), 2);
    assert_eq!(asked.messages[1].role, Role::Assistant);
    assert_eq!(
        asked.messages[1].joined_text(),
        all[..12].concat().trim_end()
    );
    assert!(
        Continuation::of(asked).is_none(),
        "the marker is not sent on"
    );
}

#[tokio::test(start_paused = true)]
async fn a_continuation_that_repeats_nothing_is_spliced_as_it_is() {
    let all = words(10);
    let script = Script::new();
    let mut first = chunks(&all[..4]);
    first.push(cut());
    script.then("a", now(first));
    script.then("a", now(chunks(&all[4..])));

    let items = drain(
        route(&script, 1)
            .oneshot(request())
            .await
            .expect("committed"),
    )
    .await;
    let (got, failed) = joined(&items);
    assert_eq!((got.as_str(), failed), (all.concat().as_str(), None));
    assert_eq!(duplicated_and_missing(&got, &all), (0, 0));
    // Chunk for chunk: nothing held back longer than deciding took.
    assert_eq!(items.len(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_repeat_split_across_chunk_boundaries_is_trimmed_across_them() {
    let all = words(30);
    let full = all.concat();
    let script = Script::new();
    let mut first = chunks(&all[..20]);
    first.push(cut());
    script.then("a", now(first));
    // The continuation repeats the last 3 words and more, in 3-byte
    // chunks that cut across the words and the repeat's end.
    let sent = all[..20].concat();
    let from = sent.len() - all[17..20].concat().len();
    let again = &full[from..];
    let pieces: Vec<Item> = again
        .as_bytes()
        .chunks(3)
        .map(|b| text(std::str::from_utf8(b).expect("ASCII")))
        .collect();
    script.then("a", now(pieces));

    let items = drain(
        route(&script, 1)
            .oneshot(request())
            .await
            .expect("committed"),
    )
    .await;
    let (got, failed) = joined(&items);
    assert_eq!(failed, None);
    assert_eq!(got, full);
    assert_eq!(duplicated_and_missing(&got, &all), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_link_that_refuses_prefill_is_learned_two_calls_the_first_time_one_after() {
    let script = Script::new();
    let prefill = Prefill::new(true);
    // A provider that refuses a request whose last message is the
    // assistant's, as newer Claude models do.
    let provider = script.service("a");
    let refusing = tower::service_fn(move |req: ChatRequest| {
        let provider = provider.clone();
        async move {
            if req.messages.last().map(|m| m.role) == Some(Role::Assistant) {
                return Err(fail(FailureClass::BadRequest).with_message("prefill not supported"));
            }
            provider.oneshot(req).await
        }
    });
    let counted = CountCalls::new(refusing);
    let counter = counted.calls.clone();
    let calls = || counter.load(std::sync::atomic::Ordering::SeqCst);
    let route = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(resume(1))
        .layer(ContinuationLayer::new(prefill.clone()))
        .service(counted);

    for round in 0..2 {
        script.then("a", now(vec![text("One, two, "), cut()]));
        script.then("a", now(vec![text("three.")]));
        let before = calls();
        let items = drain(route.clone().oneshot(request()).await.expect("committed")).await;
        assert_eq!(joined(&items), ("One, two, three.".to_owned(), None));
        // The first call, then the continuation: refused with prefill
        // and sent again without (2) the first time; 1 once learned.
        let continuation_calls = calls() - before - 1;
        assert_eq!(
            continuation_calls,
            if round == 0 { 2 } else { 1 },
            "round {round}"
        );
        assert!(!prefill.is_supported() && prefill.was_refused());
    }
    // Without prefill: the partial answer, then the instruction.
    let asked = &script.seen("a")[1];
    let roles: Vec<_> = asked.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::User, Role::Assistant, Role::User]);
    assert_eq!(asked.messages[1].joined_text(), "One, two,");
    assert_eq!(asked.messages[2].joined_text(), CONTINUE_INSTRUCTION);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_and_a_failed_plain_continuation_say_so_without_the_text() {
    let script = Script::new();
    script.then("a", now(vec![text("Secret partial "), cut()]));
    script.then(
        "a",
        Play::Fail(fail(FailureClass::BadRequest).with_message("no prefill")),
    );
    script.then(
        "a",
        Play::Fail(fail(FailureClass::BadRequest).with_message("still no")),
    );
    let items = drain(
        route(&script, 1)
            .oneshot(request())
            .await
            .expect("committed"),
    )
    .await;
    let Some(Err(failure)) = items.last() else {
        panic!("the stream ends with the failure");
    };
    assert!(failure.is_bad_request());
    let message = failure.message().expect("a message");
    assert!(message.starts_with("still no"), "{message}");
    assert!(
        message.contains("refused an assistant prefill"),
        "{message}"
    );
    assert!(!failure.to_string().contains("Secret"), "{failure}");
    assert_eq!(script.calls("a"), 3);
}

#[tokio::test(start_paused = true)]
async fn max_continuations_is_respected_exactly() {
    let script = Script::new();
    for i in 0..5 {
        script.then("a", now(vec![text(&format!("p{i} ")), cut()]));
    }
    let stream = route(&script, 2)
        .oneshot(request())
        .await
        .expect("committed");
    let continued = stream.continuations();
    let items = drain(stream).await;
    assert_eq!(
        joined(&items),
        ("p0 p1 p2 ".to_owned(), Some(FailureClass::Transient))
    );
    assert_eq!(script.calls("a"), 3);
    assert_eq!(continued.count(), 2);
}

#[tokio::test(start_paused = true)]
async fn no_continuation_once_the_deadline_has_passed() {
    let script = Script::new();
    // The stream breaks 2 s in, after the call's 1 s deadline.
    script.then("a", Play::Stream(vec![(0, text("Hel")), (2_000, cut())]));
    script.then("a", now(vec![text("lo")]));
    let route = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(1)))
        .layer(resume(1))
        .layer(ContinuationLayer::new(Prefill::new(true)))
        .service(script.service("a"));
    let items = drain(route.oneshot(request()).await.expect("committed")).await;
    assert_eq!(
        joined(&items),
        ("Hel".to_owned(), Some(FailureClass::Transient))
    );
    assert_eq!(script.calls("a"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_sent_a_tool_call_or_another_choice_is_not_continued() {
    let other_choice = Ok(ChatChunk {
        index: 1,
        text: Some("B".into()),
        ..ChatChunk::default()
    });
    for (name, broken) in [
        (
            "tool call",
            vec![text("Let me look."), tool_fragment(), cut()],
        ),
        ("two choices", vec![text("A"), other_choice, cut()]),
    ] {
        let script = Script::new();
        script.then("a", now(broken));
        script.then("a", now(vec![text("never")]));
        let stream = route(&script, 1)
            .oneshot(request())
            .await
            .expect("committed");
        let continued = stream.continuations();
        let items = drain(stream).await;
        assert_eq!(joined(&items).1, Some(FailureClass::Transient), "{name}");
        assert_eq!(script.calls("a"), 1, "{name}");
        assert_eq!(continued.count(), 0, "{name}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_failure_of_a_class_that_is_not_resumable_passes_through_unchanged() {
    for class in [
        FailureClass::ContentFiltered,
        FailureClass::DeadlineExceeded,
        FailureClass::Cancelled,
        FailureClass::BadRequest,
        FailureClass::CostBudgetExhausted,
    ] {
        let script = Script::new();
        script.then(
            "a",
            now(vec![
                text("Hel"),
                Err(fail(class).with_message("upstream said")),
            ]),
        );
        script.then("a", now(vec![text("lo")]));
        let items = drain(
            route(&script, 1)
                .oneshot(request())
                .await
                .expect("committed"),
        )
        .await;
        let Some(Err(failure)) = items.last() else {
            panic!("{class:?}: the stream ends with its failure");
        };
        assert_eq!(
            (failure.class(), failure.message()),
            (class, Some("upstream said"))
        );
        assert_eq!(script.calls("a"), 1, "{class:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_that_may_be_sent_once_is_not_continued() {
    let script = Script::new();
    script.then("a", now(vec![text("Hel"), cut()]));
    let mut req = request();
    req.extensions.insert(NotReplayable);
    let items = drain(route(&script, 1).oneshot(req).await.expect("committed")).await;
    assert_eq!(
        joined(&items),
        ("Hel".to_owned(), Some(FailureClass::Transient))
    );
    assert_eq!(script.calls("a"), 1);
}

#[tokio::test(start_paused = true)]
async fn usage_adds_up_across_pieces_and_the_finish_reason_is_the_last_pieces() {
    let script = Script::new();
    script.then(
        "a",
        now(vec![
            usage(10, 0),
            text("Hel"),
            Ok(ChatChunk {
                finish_reason: Some(FinishReason::Length),
                ..ChatChunk::default()
            }),
            cut(),
        ]),
    );
    script.then(
        "a",
        now(vec![
            usage(13, 0),
            text("lo"),
            usage(0, 7),
            Ok(ChatChunk {
                finish_reason: Some(FinishReason::Stop),
                ..ChatChunk::default()
            }),
        ]),
    );
    let answer = route(&script, 1)
        .oneshot(request())
        .await
        .expect("committed")
        .collect_response()
        .await
        .expect("continued");
    assert_eq!(answer.text(), "Hello");
    assert_eq!(
        (answer.usage.prompt_tokens, answer.usage.completion_tokens),
        (23, 7)
    );
    assert_eq!(answer.finish_reason(), Some(FinishReason::Stop));
}

#[tokio::test(start_paused = true)]
async fn a_continuation_can_fail_over_and_its_pieces_records_are_kept() {
    let script = Script::new();
    script.then("a", now(vec![text("Hello, "), cut()]));
    // The continuation: link a refuses (a 5xx before any token), link b
    // serves.
    script.then("a", Play::Fail(fail(FailureClass::Transient)));
    script.then("b", now(vec![text("world.")]));
    let link = |name: &'static str| {
        ServiceBuilder::new()
            .layer(ContinuationLayer::new(Prefill::new(false)))
            .layer(RetryLayer::new().with_max_attempts(1))
            .service(script.service(name))
    };
    let chain = FallbackLayer::builder(LinkSpec::new("a", "model-a"))
        .or(LinkSpec::new("b", "model-b").rewrite_model(), link("b"))
        .build()
        .expect("chain")
        .layer(link("a"));
    let route = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(resume(1))
        .service(chain);

    let stream = route.oneshot(request()).await.expect("committed");
    let continued = stream.continuations();
    let first: Vec<_> = stream.attempts().iter().map(|r| r.status()).collect();
    let answer = stream.collect_response().await.expect("continued");
    assert_eq!(answer.text(), "Hello, world.");
    assert_eq!(first, [AttemptStatus::Succeeded]);
    let pieces = continued.pieces();
    assert_eq!(pieces.len(), 1);
    assert_eq!((pieces[0].provider(), pieces[0].model()), ("b", "model-b"));
    assert_eq!(pieces[0].fallback_position(), 1);
    let statuses: Vec<_> = pieces[0].attempts().iter().map(|r| r.status()).collect();
    assert_eq!(
        statuses,
        [AttemptStatus::FailedOver, AttemptStatus::Succeeded]
    );
    // Link b was asked to continue without prefill.
    let asked = &script.seen("b")[0];
    assert_eq!(
        asked.messages.last().map(|m| m.joined_text()).as_deref(),
        Some(CONTINUE_INSTRUCTION)
    );
}

#[tokio::test(start_paused = true)]
async fn a_continuation_that_fails_before_committing_ends_the_stream_with_its_failure() {
    let script = Script::new();
    script.then("a", now(vec![text("Hel"), cut()]));
    script.then("a", Play::Fail(fail(FailureClass::Auth)));
    let items = drain(
        route(&script, 1)
            .oneshot(request())
            .await
            .expect("committed"),
    )
    .await;
    assert_eq!(joined(&items), ("Hel".to_owned(), Some(FailureClass::Auth)));
}

#[tokio::test(start_paused = true)]
async fn a_continuation_that_breaks_before_its_repeat_is_decided_resumes_after_the_same_text() {
    let script = Script::new();
    script.then("a", now(vec![text("abc abc"), cut()]));
    // Breaks while still repeating ("abc" may be the start of a repeat of
    // "abc abc"): nothing of it was sent.
    script.then("a", now(vec![text("abc"), cut()]));
    script.then("a", now(vec![text(" abc def")]));
    let stream = route(&script, 2)
        .oneshot(request())
        .await
        .expect("committed");
    let continued = stream.continuations();
    let items = drain(stream).await;
    assert_eq!(joined(&items), ("abc abc def".to_owned(), None));
    assert_eq!(continued.count(), 2);
    let asked = &script.seen("a")[2];
    assert_eq!(asked.messages[1].joined_text(), "abc abc");
}

#[tokio::test(start_paused = true)]
async fn a_link_without_the_continuation_layer_starts_over_and_only_a_short_answer_is_trimmed() {
    let direct = |script: &Script| {
        ServiceBuilder::new()
            .layer(DeadlineLayer::new(Duration::from_secs(30)))
            .layer(resume(1))
            .service(script.service("a"))
    };
    // Within the window, the whole restart is the repeat.
    let script = Script::new();
    script.then("a", now(vec![text("The answer is"), cut()]));
    script.then("a", now(vec![text("The answer is 42.")]));
    let items = drain(direct(&script).oneshot(request()).await.expect("committed")).await;
    assert_eq!(joined(&items), ("The answer is 42.".to_owned(), None));
    assert_eq!(script.seen("a")[1].messages.len(), 1, "asked as it was");
    // Past the window, a restart is no repeat of its tail: kept whole.
    let long = words(300).concat();
    assert!(long.len() > OVERLAP_WINDOW);
    let script = Script::new();
    script.then("a", now(vec![text(&long), cut()]));
    script.then("a", now(vec![text(&long), text("end")]));
    let items = drain(direct(&script).oneshot(request()).await.expect("committed")).await;
    let (got, _) = joined(&items);
    assert_eq!(got.len(), 2 * long.len() + 3);
}

/// Counts the calls that reach the inner service.
#[derive(Clone)]
struct CountCalls<S> {
    inner: S,
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl<S> CountCalls<S> {
    fn new(inner: S) -> Self {
        CountCalls {
            inner,
            calls: Default::default(),
        }
    }
}

impl<S: tower::Service<ChatRequest>> tower::Service<ChatRequest> for CountCalls<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ChatRequest) -> S::Future {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.call(req)
    }
}

#[tokio::test(start_paused = true)]
async fn a_continuation_head_of_textless_chunks_is_held_only_up_to_a_bound() {
    // "ab" may start a repeat of "ab ab" (from its start) as well as be
    // one (its tail): undecided, then nothing but empty deltas, forever.
    struct Endless(usize);
    impl futures_core::Stream for Endless {
        type Item = Item;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Item>> {
            self.0 += 1;
            assert!(self.0 < 1_000, "pulled far past the bound");
            std::task::Poll::Ready(Some(if self.0 == 1 { text("ab") } else { text("") }))
        }
    }
    let first = Script::new();
    first.then("a", now(vec![text("ab ab"), cut()]));
    let scripted = first.service("a");
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = calls.clone();
    let provider = tower::service_fn(move |req: ChatRequest| {
        let scripted = scripted.clone();
        let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            if n == 0 {
                return scripted.oneshot(req).await;
            }
            Ok(tower_llm_core::ChatStream::new("a", "m", Endless(0)))
        }
    });
    let route = ServiceBuilder::new()
        .layer(resume(1))
        .layer(ContinuationLayer::new(Prefill::new(true)))
        .service(provider);
    let mut stream = route.oneshot(request()).await.expect("committed");
    let mut items = Vec::new();
    for _ in 0..2 {
        let item = std::future::poll_fn(|cx| {
            futures_core::Stream::poll_next(std::pin::Pin::new(&mut stream), cx)
        })
        .await;
        items.push(item.expect("an item").expect("a chunk").text);
    }
    // The continuation's repeat ("ab") is trimmed; its empty deltas come.
    assert_eq!(items, [Some("ab ab".to_owned()), Some(String::new())]);
}
