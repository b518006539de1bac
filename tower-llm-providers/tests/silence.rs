//! The opt-in guards against a silent or garbled upstream, in virtual
//! time over scripted transports: the learned first-token limit, the
//! response-head timeout, and skipping malformed events after the commit
//! point.

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;
use tokio::time::Instant;
use tower::ServiceExt;
use tower_llm_core::{
    ChatChunk, ChatRequest, ChatStream, Deadline, Failure, FailureClass, Message,
};
use tower_llm_providers::mock::{
    Reply, ScriptedProvider, ScriptedTransport, Step, anthropic_stream_steps, bedrock_stream_steps,
    openai_stream_steps,
};
use tower_llm_providers::streaming::{FirstTokenLimit, FirstTokenLimitConfig, MalformedChunks};
use tower_llm_providers::{AwsCredentials, Bedrock, BedrockConfig, Streaming};

fn req() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("hi")])
}

/// Reads a stream to its end: the chunks, and the terminal error if any.
async fn drain(mut stream: ChatStream) -> (Vec<ChatChunk>, Option<Failure>) {
    let mut chunks = Vec::new();
    while let Some(item) = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await {
        match item {
            Ok(c) => chunks.push(c),
            Err(f) => {
                let after = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await;
                assert!(after.is_none(), "an item after the terminal error");
                return (chunks, Some(f));
            }
        }
    }
    (chunks, None)
}

fn text(chunks: &[ChatChunk]) -> String {
    chunks.iter().filter_map(|c| c.text.as_deref()).collect()
}

/// An OpenAI stream of `pieces` whose first content comes after `wait`.
fn slow_first_token(wait: Duration, pieces: &[&str]) -> Reply {
    let mut steps = vec![Step::Pause(wait)];
    steps.extend(openai_stream_steps(pieces, true));
    Reply::sse_steps(steps)
}

/// A stream that answers its head, then never sends a thing.
fn silent() -> Reply {
    Reply::sse_steps(vec![Step::Stall])
}

fn learned(config: FirstTokenLimitConfig) -> FirstTokenLimit {
    FirstTokenLimit::new(config).expect("valid")
}

/// Streams `n` answers whose first token comes after `wait`, each through
/// a clone of `streaming`.
async fn teach(
    streaming: &Streaming<ScriptedProvider>,
    t: &ScriptedTransport,
    n: usize,
    wait: Duration,
) {
    for _ in 0..n {
        t.push(slow_first_token(wait, &["ok"]));
        let stream = streaming.clone().oneshot(req()).await.expect("commits");
        let (chunks, end) = drain(stream).await;
        assert!(end.is_none(), "{end:?}");
        assert_eq!(text(&chunks), "ok");
    }
}

/// Opens a silent stream: the failure, and how long it took.
async fn fail_silently(
    streaming: &Streaming<ScriptedProvider>,
    t: &ScriptedTransport,
) -> (Failure, Duration) {
    t.push(silent());
    let started = Instant::now();
    let err = streaming
        .clone()
        .oneshot(req())
        .await
        .expect_err("no content");
    (err, started.elapsed())
}

#[tokio::test(start_paused = true)]
async fn the_learned_limit_starts_at_the_fixed_limit_and_tightens_after_min_samples() {
    let t = ScriptedTransport::new(silent());
    let limit = learned(FirstTokenLimitConfig::default());
    let streaming = t
        .openai()
        .streaming()
        .with_first_token_timeout(Duration::from_secs(30))
        .with_learned_first_token(limit.clone());

    // Nothing learned: a silent upstream fails at the fixed 30 s, and
    // that timeout is recorded as a time to first token of 30 s.
    let (err, took) = fail_silently(&streaming, &t).await;
    assert_eq!(err.class(), FailureClass::Timeout);
    assert_eq!(took, Duration::from_secs(30));
    assert_eq!(
        err.message(),
        Some("no first content frame within the 30s first-token timeout")
    );
    assert_eq!(limit.samples(), 1);

    // 18 more streams at 3 s: 19 samples, still the fixed limit.
    teach(&streaming, &t, 18, Duration::from_secs(3)).await;
    assert_eq!(limit.samples(), 19);
    assert_eq!(limit.learned(), None);
    assert_eq!(
        limit.limit(Duration::from_secs(30)),
        Duration::from_secs(30)
    );

    // The 20th sample: p99 of 20 is the slowest, the 30 s timeout.
    teach(&streaming, &t, 1, Duration::from_secs(3)).await;
    assert_eq!(limit.learned(), Some(Duration::from_secs(60)));
    assert_eq!(
        limit.limit(Duration::from_secs(30)),
        Duration::from_secs(30)
    );

    // 237 more at 3 s: the window (the latest 256) no longer holds the
    // 30 s sample.
    teach(&streaming, &t, 237, Duration::from_secs(3)).await;
    assert_eq!(limit.samples(), 256);
    assert_eq!(limit.learned(), Some(Duration::from_secs(6)));
    assert_eq!(limit.limit(Duration::from_secs(30)), Duration::from_secs(6));

    // A silent upstream now fails at the learned 6 s, a retryable timeout.
    let (err, took) = fail_silently(&streaming, &t).await;
    assert_eq!(took, Duration::from_secs(6));
    assert_eq!(err.class(), FailureClass::Timeout);
    assert_eq!(err.provider(), Some("openai"));
    assert_eq!(
        err.message(),
        Some("no first content frame within the 6s learned first-token limit")
    );
}

#[tokio::test(start_paused = true)]
async fn the_learned_limit_never_goes_below_the_floor_nor_above_the_cap() {
    // Fast streams: 2 × 100 ms is under the 2 s floor.
    let t = ScriptedTransport::new(silent());
    let limit = learned(FirstTokenLimitConfig::default());
    let streaming = t
        .openai()
        .streaming()
        .with_learned_first_token(limit.clone());
    teach(&streaming, &t, 20, Duration::from_millis(100)).await;
    assert_eq!(limit.learned(), Some(Duration::from_millis(200)));
    let (err, took) = fail_silently(&streaming, &t).await;
    assert_eq!(err.class(), FailureClass::Timeout);
    assert_eq!(took, Duration::from_secs(2));

    // Slow streams: 2 × 20 s is over the cap, by default the fixed limit.
    let t = ScriptedTransport::new(silent());
    let limit = learned(FirstTokenLimitConfig::default());
    let streaming = t
        .openai()
        .streaming()
        .with_first_token_timeout(Duration::from_secs(30))
        .with_learned_first_token(limit.clone());
    teach(&streaming, &t, 20, Duration::from_secs(20)).await;
    assert_eq!(limit.learned(), Some(Duration::from_secs(40)));
    let (_, took) = fail_silently(&streaming, &t).await;
    assert_eq!(took, Duration::from_secs(30));

    // An explicit cap below the fixed limit.
    let t = ScriptedTransport::new(silent());
    let limit = learned(FirstTokenLimitConfig {
        cap_ms: Some(25_000),
        ..FirstTokenLimitConfig::default()
    });
    let streaming = t
        .openai()
        .streaming()
        .with_learned_first_token(limit.clone());
    teach(&streaming, &t, 20, Duration::from_secs(20)).await;
    let (_, took) = fail_silently(&streaming, &t).await;
    assert_eq!(took, Duration::from_secs(25));
}

#[tokio::test(start_paused = true)]
async fn first_token_timeouts_grow_the_learned_limit_back_after_a_slowdown() {
    let t = ScriptedTransport::new(silent());
    let limit = learned(FirstTokenLimitConfig::default());
    let streaming = t
        .openai()
        .streaming()
        .with_learned_first_token(limit.clone());
    teach(&streaming, &t, 20, Duration::from_secs(3)).await;
    // Each timeout records the limit it hit, which becomes the 0.99
    // quantile: the limit doubles, up to the cap (the fixed 30 s).
    let mut took = Vec::new();
    for _ in 0..4 {
        took.push(fail_silently(&streaming, &t).await.1);
    }
    assert_eq!(
        took,
        [6, 12, 24, 30].map(Duration::from_secs),
        "the limit grows back"
    );
    // Once it is long enough, the slow link commits again.
    t.push(slow_first_token(Duration::from_secs(20), &["late"]));
    let stream = streaming.clone().oneshot(req()).await.expect("commits");
    assert_eq!(text(&drain(stream).await.0), "late");
}

#[tokio::test(start_paused = true)]
async fn streams_cut_by_the_deadline_or_failing_otherwise_teach_nothing() {
    let t = ScriptedTransport::new(silent());
    let limit = learned(FirstTokenLimitConfig::default());
    let streaming = t
        .openai()
        .streaming()
        .with_learned_first_token(limit.clone());
    teach(&streaming, &t, 20, Duration::from_secs(3)).await;

    // The call's deadline (1 s) comes before the learned limit (6 s).
    t.push(silent());
    let mut r = req();
    Deadline::after(Duration::from_secs(1)).store(&mut r);
    let started = Instant::now();
    let err = streaming.clone().oneshot(r).await.expect_err("deadline");
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert_eq!(started.elapsed(), Duration::from_secs(1));

    // An error answer, and a stream that ends with no content.
    t.push(Reply::openai_error(503, "server_error", "overloaded"));
    assert!(streaming.clone().oneshot(req()).await.is_err());
    t.push(Reply::sse_steps(openai_stream_steps(&[], false)));
    assert!(streaming.clone().oneshot(req()).await.is_err());

    assert_eq!(limit.samples(), 20);
    assert_eq!(limit.limit(Duration::from_secs(30)), Duration::from_secs(6));
}

#[tokio::test(start_paused = true)]
async fn a_missing_response_head_fails_at_exactly_the_head_timeout() {
    let t = ScriptedTransport::new(Reply::openai_text("late").after(Duration::from_secs(60)));
    let provider = t.openai().with_head_timeout(Duration::from_secs(4));
    assert_eq!(provider.head_timeout(), Some(Duration::from_secs(4)));
    let started = Instant::now();
    let err = provider.clone().oneshot(req()).await.expect_err("no head");
    assert_eq!(started.elapsed(), Duration::from_secs(4));
    assert_eq!(err.class(), FailureClass::Timeout);
    assert_eq!(err.provider(), Some("openai"));
    assert_eq!(
        err.message(),
        Some("no response head within the 4s head timeout")
    );

    // Streams too, well before their first-token timeout.
    let started = Instant::now();
    let err = provider
        .streaming()
        .with_first_token_timeout(Duration::from_secs(30))
        .oneshot(req())
        .await
        .expect_err("no head");
    assert_eq!(started.elapsed(), Duration::from_secs(4));
    assert_eq!(err.class(), FailureClass::Timeout);
    assert_eq!(
        err.message(),
        Some("no response head within the 4s head timeout")
    );

    // Without the setting, nothing bounds the head.
    let started = Instant::now();
    let answer = t.openai().oneshot(req()).await.expect("answers");
    assert_eq!(answer.text(), "late");
    assert_eq!(started.elapsed(), Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn a_slow_body_after_a_quick_head_is_not_cut_by_the_head_timeout() {
    // The head at once, the body after 10 s.
    let body = serde_json::json!({
        "id": "chatcmpl-mock", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "slow body"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    });
    let t = ScriptedTransport::new(Reply::stream(
        "application/json",
        vec![
            Step::Pause(Duration::from_secs(10)),
            Step::Send(Bytes::from(body.to_string())),
        ],
    ));
    let provider = t.openai().with_head_timeout(Duration::from_secs(4));
    let started = Instant::now();
    let answer = provider.clone().oneshot(req()).await.expect("answers");
    assert_eq!(answer.text(), "slow body");
    assert_eq!(started.elapsed(), Duration::from_secs(10));

    // A stream whose head is quick and whose first token takes 10 s.
    t.push(slow_first_token(Duration::from_secs(10), &["thought"]));
    let started = Instant::now();
    let stream = provider.streaming().oneshot(req()).await.expect("commits");
    assert_eq!(started.elapsed(), Duration::from_secs(10));
    assert_eq!(text(&drain(stream).await.0), "thought");
}

/// An OpenAI stream: "Hel", then `bad`, then "lo", stop, usage, `[DONE]`.
fn with_bad_event_after_commit(bad: Step) -> Reply {
    let mut steps = openai_stream_steps(&["Hel"], false);
    steps.push(bad);
    steps.extend(openai_stream_steps(&["lo"], true).into_iter().skip(1));
    Reply::sse_steps(steps)
}

#[tokio::test(start_paused = true)]
async fn skip_mode_passes_malformed_events_after_commit_and_the_rest_arrives_whole() {
    let t = ScriptedTransport::new(with_bad_event_after_commit(Step::sse(
        None,
        "{\"choices\": 7}",
    )));
    let streaming = t
        .openai()
        .streaming()
        .with_malformed_chunks(MalformedChunks::Skip);
    assert_eq!(streaming.malformed_chunks(), MalformedChunks::Skip);
    let stream = streaming.clone().oneshot(req()).await.expect("commits");
    let (chunks, end) = drain(stream).await;
    assert!(end.is_none(), "{end:?}");
    assert_eq!(text(&chunks), "Hello");
    assert_eq!(streaming.malformed_skipped(), 1);

    // Two in one stream, one of them in the same body frame as good events.
    let mut steps = openai_stream_steps(&["a"], false);
    steps.push(Step::sse(None, "{not json"));
    steps.push(Step::Send(Bytes::from(
        "data: [1, 2]\n\ndata: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"b\"}}]}\n\n",
    )));
    steps.extend(openai_stream_steps(&["c"], true).into_iter().skip(1));
    t.push(Reply::sse_steps(steps));
    let (chunks, end) = drain(streaming.clone().oneshot(req()).await.expect("commits")).await;
    assert!(end.is_none(), "{end:?}");
    assert_eq!(text(&chunks), "abc");
    assert_eq!(streaming.malformed_skipped(), 3);

    // Anthropic's events are skipped the same way.
    let mut steps = anthropic_stream_steps(&["Hel"], false);
    steps.push(Step::sse(Some("content_block_delta"), "{\"type\": 5}"));
    steps.extend(anthropic_stream_steps(&["lo"], true).into_iter().skip(3));
    let t = ScriptedTransport::new(Reply::sse_steps(steps));
    let streaming = t
        .anthropic()
        .streaming()
        .with_malformed_chunks(MalformedChunks::Skip);
    let (chunks, end) = drain(streaming.clone().oneshot(req()).await.expect("commits")).await;
    assert!(end.is_none(), "{end:?}");
    assert_eq!(text(&chunks), "Hello");
    assert_eq!(streaming.malformed_skipped(), 1);
}

#[tokio::test(start_paused = true)]
async fn fail_mode_ends_the_stream_at_a_malformed_event_after_commit() {
    let t = ScriptedTransport::new(with_bad_event_after_commit(Step::sse(
        None,
        "{\"choices\": 7}",
    )));
    let streaming = t.openai().streaming();
    assert_eq!(streaming.malformed_chunks(), MalformedChunks::Fail);
    let (chunks, end) = drain(streaming.clone().oneshot(req()).await.expect("commits")).await;
    assert_eq!(text(&chunks), "Hel");
    let end = end.expect("terminal");
    assert_eq!(end.class(), FailureClass::InvalidResponse);
    assert_eq!(
        end.message(),
        Some("malformed openai response: unexpected value at line 1 column 13")
    );
    assert_eq!(streaming.malformed_skipped(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_malformed_event_before_commit_fails_the_call_in_both_modes() {
    for mode in [MalformedChunks::Fail, MalformedChunks::Skip] {
        // In its own frame, before the first content.
        let mut steps = vec![Step::sse(None, "{\"choices\": 7}")];
        steps.extend(openai_stream_steps(&["never"], true));
        let t = ScriptedTransport::new(Reply::sse_steps(steps));
        let streaming = t.openai().streaming().with_malformed_chunks(mode);
        let err = streaming
            .clone()
            .oneshot(req())
            .await
            .expect_err("before commit");
        assert_eq!(err.class(), FailureClass::InvalidResponse, "{mode:?}");

        // In the same frame as the first content, before it.
        let t = ScriptedTransport::new(Reply::sse_steps(vec![
            Step::Send(Bytes::from(
                "data: [1]\n\ndata: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"x\"}}]}\n\n",
            )),
            Step::sse(None, "[DONE]"),
        ]));
        let streaming = t.openai().streaming().with_malformed_chunks(mode);
        let err = streaming
            .clone()
            .oneshot(req())
            .await
            .expect_err("before commit");
        assert_eq!(err.class(), FailureClass::InvalidResponse, "{mode:?}");
        assert_eq!(streaming.malformed_skipped(), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn skip_mode_still_ends_the_stream_at_in_band_errors_and_broken_framing() {
    // An in-band error event is not a malformed one.
    let error = serde_json::json!({"error": {"message": "boom", "type": "server_error"}});
    let t = ScriptedTransport::new(with_bad_event_after_commit(Step::sse(
        None,
        &error.to_string(),
    )));
    let streaming = t
        .openai()
        .streaming()
        .with_malformed_chunks(MalformedChunks::Skip);
    let (chunks, end) = drain(streaming.clone().oneshot(req()).await.expect("commits")).await;
    assert_eq!(text(&chunks), "Hel");
    let end = end.expect("terminal");
    assert_eq!(end.class(), FailureClass::Transient);
    assert_eq!(end.message(), Some("boom"));

    // A line that is not UTF-8 breaks the framing.
    t.push(with_bad_event_after_commit(Step::Send(Bytes::from_static(
        b"data: \xff\xfe\n\n",
    ))));
    let (chunks, end) = drain(streaming.clone().oneshot(req()).await.expect("commits")).await;
    assert_eq!(text(&chunks), "Hel");
    let end = end.expect("terminal");
    assert_eq!(end.class(), FailureClass::InvalidResponse);
    assert_eq!(end.message(), Some("an SSE line is not UTF-8"));
    assert_eq!(streaming.malformed_skipped(), 0);
}

#[tokio::test(start_paused = true)]
async fn bedrock_skips_an_event_whose_payload_does_not_decode_but_not_broken_framing() {
    let bedrock = |steps: Vec<Step>| {
        Bedrock::new(
            ScriptedTransport::new(Reply::stream("application/vnd.amazon.eventstream", steps)),
            BedrockConfig::new(AwsCredentials::new("AKID", "secret"), "us-east-1"),
        )
        .streaming()
    };
    // A whole, checksummed event whose JSON is broken, after content.
    let mut steps = bedrock_stream_steps(&["a"], false);
    steps.push(Step::bedrock_event("contentBlockDelta", "{not json"));
    steps.extend(bedrock_stream_steps(&["b"], true).into_iter().skip(1));
    let skipping = bedrock(steps.clone()).with_malformed_chunks(MalformedChunks::Skip);
    let (chunks, end) = drain(skipping.clone().oneshot(req()).await.expect("commits")).await;
    assert_eq!(text(&chunks), "ab");
    assert!(end.is_none(), "{end:?}");
    assert_eq!(skipping.malformed_skipped(), 1);
    // The default fails at it.
    let failing = bedrock(steps);
    let (chunks, end) = drain(failing.oneshot(req()).await.expect("commits")).await;
    assert_eq!(text(&chunks), "a");
    assert_eq!(
        end.expect("terminal").class(),
        FailureClass::InvalidResponse
    );
    // A frame whose declared length is impossible is broken framing: no
    // skipping past it.
    let mut steps = bedrock_stream_steps(&["a"], false);
    steps.push(Step::Send(Bytes::from_static(&[0, 0, 0, 1, 0, 0, 0, 0])));
    let skipping = bedrock(steps).with_malformed_chunks(MalformedChunks::Skip);
    let (chunks, end) = drain(skipping.clone().oneshot(req()).await.expect("commits")).await;
    assert_eq!(text(&chunks), "a");
    assert_eq!(
        end.expect("terminal").class(),
        FailureClass::InvalidResponse
    );
    assert_eq!(skipping.malformed_skipped(), 0);
}

#[cfg(feature = "otel")]
mod log {
    //! The warning of a skipped event, captured by a subscriber of our own.

    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    /// Every `warn` event: its fields, as `name=value`.
    #[derive(Clone, Default)]
    pub(super) struct Warnings(pub(super) Arc<Mutex<Vec<Vec<String>>>>);

    struct Fields(Vec<String>);

    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.push(format!("{}={value:?}", field.name()));
        }
    }

    impl Subscriber for Warnings {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            if *event.metadata().level() == Level::WARN {
                let mut fields = Fields(Vec::new());
                event.record(&mut fields);
                self.0.lock().expect("lock").push(fields.0);
            }
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
}

#[cfg(feature = "otel")]
#[tokio::test(start_paused = true)]
async fn a_skipped_event_is_logged_once_per_stream_without_its_text() {
    let warnings = log::Warnings::default();
    let _guard = tracing::subscriber::set_default(warnings.clone());
    let mut steps = openai_stream_steps(&["Hel"], false);
    steps.push(Step::sse(None, "{\"choices\": \"sk-leaked\"}"));
    steps.push(Step::sse(None, "{\"choices\": \"sk-leaked\"}"));
    steps.extend(openai_stream_steps(&["lo"], true).into_iter().skip(1));
    let t = ScriptedTransport::new(Reply::sse_steps(steps));
    let streaming = t
        .openai()
        .streaming()
        .with_malformed_chunks(MalformedChunks::Skip);
    for _ in 0..2 {
        let (chunks, end) = drain(streaming.clone().oneshot(req()).await.expect("commits")).await;
        assert!(end.is_none());
        assert_eq!(text(&chunks), "Hello");
    }
    assert_eq!(streaming.malformed_skipped(), 4);
    let logged = warnings.0.lock().expect("lock").clone();
    let expected = vec![
        "message=skipped a malformed stream event (logged once per stream)".to_owned(),
        "provider=\"openai\"".to_owned(),
        "class=\"invalid_response\"".to_owned(),
        "chunks_before=1".to_owned(),
    ];
    assert_eq!(logged, vec![expected.clone(), expected], "once per stream");
}
