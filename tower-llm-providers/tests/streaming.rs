//! The streaming services over scripted transports (virtual time): the
//! recorded fixtures of the three wires, the commit point, and every way a
//! stream can fail on either side of it.

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;
use tokio::time::Instant;
use tower::ServiceExt;
use tower_llm_core::{
    ChatChunk, ChatRequest, ChatStream, Deadline, Failure, FailureClass, FinishReason, Message,
};
use tower_llm_providers::https::{HttpsClient, client_with_connect_timeout};
use tower_llm_providers::mock::{
    MockServer, Reply, ScriptedTransport, Step, anthropic_stream_steps, bedrock_stream_steps,
    openai_stream_steps,
};
use tower_llm_providers::{AwsCredentials, Bedrock, BedrockConfig};

mod common;
use common::fixture;

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
                // Nothing follows a terminal error.
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

/// A body sent as one frame, or split into `size`-byte frames.
fn split(bytes: &[u8], size: usize) -> Vec<Step> {
    bytes
        .chunks(size)
        .map(|c| Step::Send(Bytes::copy_from_slice(c)))
        .collect()
}

fn bedrock(transport: ScriptedTransport) -> Bedrock<ScriptedTransport> {
    Bedrock::new(
        transport,
        BedrockConfig::new(AwsCredentials::new("AKID", "secret"), "us-east-1"),
    )
}

#[tokio::test(start_paused = true)]
async fn openai_fixtures_stream_in_frames_of_any_size() {
    for size in [1, 3, 17, 4096] {
        let t = ScriptedTransport::new(Reply::sse_steps(split(
            &fixture("openai_stream_include_usage.sse"),
            size,
        )));
        let stream = t
            .openai()
            .streaming()
            .oneshot(req())
            .await
            .expect("commits");
        assert_eq!(stream.provider(), "openai");
        let (chunks, end) = drain(stream).await;
        assert!(end.is_none(), "{end:?}");
        assert_eq!(text(&chunks), "Hello!", "{size}-byte frames");
        assert_eq!(
            chunks
                .iter()
                .filter_map(|c| c.finish_reason)
                .collect::<Vec<_>>(),
            [FinishReason::Stop]
        );
        assert!(chunks.iter().any(|c| c.usage.is_some()));
    }
    // The request asked for a stream with usage.
    let t = ScriptedTransport::new(Reply::openai_stream(&["x"]));
    t.openai()
        .streaming()
        .oneshot(req())
        .await
        .expect("commits");
    let body: serde_json::Value = serde_json::from_slice(&t.received()[0].body).expect("json");
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
}

#[tokio::test(start_paused = true)]
async fn anthropic_fixture_streams_and_an_overloaded_first_event_fails_before_commit() {
    let t = ScriptedTransport::new(Reply::sse_steps(split(
        &fixture("anthropic_stream_basic.sse"),
        5,
    )));
    let stream = t
        .anthropic()
        .streaming()
        .oneshot(req())
        .await
        .expect("commits");
    let (chunks, end) = drain(stream).await;
    assert!(end.is_none());
    assert_eq!(text(&chunks), "Hello!");
    let body: serde_json::Value = serde_json::from_slice(&t.received()[0].body).expect("json");
    assert_eq!(body["stream"], true);

    let t = ScriptedTransport::new(Reply::sse_steps(split(
        &fixture("anthropic_stream_overloaded_first.sse"),
        4096,
    )));
    let err = t.anthropic().streaming().oneshot(req()).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Transient);
    assert_eq!(err.provider(), Some("anthropic"));
    assert_eq!(err.message(), Some("Overloaded"));
}

#[tokio::test(start_paused = true)]
async fn bedrock_recorded_event_stream_decodes_in_frames_of_any_size() {
    let bytes = fixture("bedrock_stream_basic.bin");
    for size in [1, 7, 16, 100, bytes.len()] {
        let t = ScriptedTransport::new(Reply::stream(
            "application/vnd.amazon.eventstream",
            split(&bytes, size),
        ));
        let stream = bedrock(t.clone())
            .streaming()
            .oneshot(req())
            .await
            .expect("commits");
        let answer = stream.collect_response().await.expect("complete");
        assert_eq!(
            answer.text(),
            "Hi! How can I help you",
            "{size}-byte frames"
        );
        assert_eq!(answer.finish_reason(), Some(FinishReason::Length));
        assert_eq!(
            (answer.usage.prompt_tokens, answer.usage.completion_tokens),
            (8, 10)
        );
        assert_eq!(t.received()[0].path, "/model/m/converse-stream");
    }
}

#[tokio::test(start_paused = true)]
async fn bedrock_in_stream_exception_after_content_is_a_terminal_rate_limit() {
    let t = ScriptedTransport::new(Reply::stream(
        "application/vnd.amazon.eventstream",
        split(&fixture("bedrock_stream_exception_throttling.bin"), 9),
    ));
    let stream = bedrock(t)
        .streaming()
        .oneshot(req())
        .await
        .expect("commits");
    let (chunks, end) = drain(stream).await;
    assert_eq!(text(&chunks), "Hi! How can I help you");
    assert_eq!(end.expect("terminal").class(), FailureClass::RateLimited);

    // The same exception before any content fails the call instead.
    let t = ScriptedTransport::new(Reply::stream(
        "application/vnd.amazon.eventstream",
        vec![
            Step::bedrock_event("messageStart", r#"{"role":"assistant"}"#),
            Step::bedrock_exception("serviceUnavailableException", "try later"),
        ],
    ));
    let err = bedrock(t).streaming().oneshot(req()).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Transient);
    assert_eq!(err.provider(), Some("bedrock"));
}

#[tokio::test(start_paused = true)]
async fn corrupt_or_oversized_event_stream_frames_are_invalid_responses() {
    let mut bytes = fixture("bedrock_stream_basic.bin");
    // Flip a payload byte of the first message: its CRC no longer matches.
    bytes[40] ^= 0x20;
    let t = ScriptedTransport::new(Reply::stream(
        "application/vnd.amazon.eventstream",
        split(&bytes, 4096),
    ));
    let err = bedrock(t).streaming().oneshot(req()).await.unwrap_err();
    assert!(err.is_invalid_response(), "{err:?}");

    // A prelude declaring 2 GiB: refused at once, nothing buffered.
    let t = ScriptedTransport::new(Reply::stream(
        "application/vnd.amazon.eventstream",
        vec![
            Step::Send(Bytes::from_static(&[0x80, 0, 0, 0, 0, 0, 0, 0])),
            Step::Stall,
        ],
    ));
    let err = bedrock(t).streaming().oneshot(req()).await.unwrap_err();
    assert!(err.is_invalid_response(), "{err:?}");
    assert!(err.message().unwrap_or_default().contains("declares"));
}

#[tokio::test(start_paused = true)]
async fn openai_error_midway_is_committed_then_terminal() {
    let t = ScriptedTransport::new(Reply::sse_steps(split(
        &fixture("openai_stream_error_midway.sse"),
        4096,
    )));
    let stream = t
        .openai()
        .streaming()
        .oneshot(req())
        .await
        .expect("commits");
    let (chunks, end) = drain(stream).await;
    assert_eq!(text(&chunks), "Hello");
    let end = end.expect("terminal error");
    assert_eq!(end.class(), FailureClass::Transient);
    assert!(
        end.message()
            .unwrap_or_default()
            .contains("server had an error")
    );
    assert_eq!(t.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn http_errors_before_the_stream_are_classified_like_unary_calls() {
    let t = ScriptedTransport::new(
        Reply::openai_error(429, "rate_limit_exceeded", "slow down")
            .with_header("retry-after", "3"),
    );
    let err = t.openai().streaming().oneshot(req()).await.unwrap_err();
    assert!(err.is_rate_limited());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
    assert_eq!(err.http_status().map(|s| s.as_u16()), Some(429));
}

#[tokio::test(start_paused = true)]
async fn empty_streams_fail_before_commit_but_a_finished_empty_answer_commits() {
    for steps in [
        vec![],
        vec![Step::sse(None, "[DONE]")],
        openai_stream_steps(&[], false),
    ] {
        let t = ScriptedTransport::new(Reply::sse_steps(steps));
        let err = t.openai().streaming().oneshot(req()).await.unwrap_err();
        assert_eq!(err.class(), FailureClass::Transient);
        assert!(
            err.message()
                .unwrap_or_default()
                .contains("before any content")
        );
    }
    // A stop with no text, then [DONE]: a complete (empty) answer.
    let t = ScriptedTransport::new(Reply::sse_steps(openai_stream_steps(&[], true)));
    let stream = t
        .openai()
        .streaming()
        .oneshot(req())
        .await
        .expect("commits");
    let answer = stream.collect_response().await.expect("complete");
    assert_eq!(answer.text(), "");
    assert_eq!(answer.finish_reason(), Some(FinishReason::Stop));
}

#[tokio::test(start_paused = true)]
async fn no_first_frame_within_the_first_token_timeout_is_a_timeout() {
    // Headers and a role chunk, then silence.
    let mut steps = openai_stream_steps(&[], false);
    steps.push(Step::Stall);
    let t = ScriptedTransport::new(Reply::sse_steps(steps));
    let start = Instant::now();
    let err = t
        .openai()
        .streaming()
        .with_first_token_timeout(Duration::from_secs(7))
        .oneshot(req())
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Timeout);
    assert_eq!(start.elapsed(), Duration::from_secs(7));

    // The call's deadline comes first: deadline exceeded at the deadline.
    let mut r = req();
    Deadline::after(Duration::from_secs(2)).store(&mut r);
    let start = Instant::now();
    let err = t.openai().streaming().oneshot(r).await.unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn a_stall_after_commit_ends_with_a_timeout_after_exactly_the_idle_timeout() {
    let mut steps = anthropic_stream_steps(&["Hel", "lo"], false);
    steps.insert(4, Step::Pause(Duration::from_secs(4))); // within the idle window
    steps.push(Step::Stall);
    let t = ScriptedTransport::new(Reply::sse_steps(steps));
    let stream = t
        .anthropic()
        .streaming()
        .with_idle_timeout(Duration::from_secs(5))
        .oneshot(req())
        .await
        .expect("commits");
    let committed = Instant::now();
    let (chunks, end) = drain(stream).await;
    assert_eq!(text(&chunks), "Hello");
    assert_eq!(end.expect("terminal").class(), FailureClass::Timeout);
    // 4 s pause before "lo", then 5 s of silence.
    assert_eq!(committed.elapsed(), Duration::from_secs(9));
}

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_a_committed_stream() {
    let mut steps = bedrock_stream_steps(&["a"], false);
    steps.push(Step::Pause(Duration::from_secs(1)));
    steps.push(Step::bedrock_text("b"));
    steps.push(Step::Stall);
    let t = ScriptedTransport::new(Reply::stream("application/vnd.amazon.eventstream", steps));
    let mut r = req();
    Deadline::after(Duration::from_secs(3)).store(&mut r);
    let start = Instant::now();
    let stream = bedrock(t).streaming().oneshot(r).await.expect("commits");
    let (chunks, end) = drain(stream).await;
    assert_eq!(text(&chunks), "ab");
    assert!(end.expect("terminal").is_deadline_exceeded());
    assert_eq!(start.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn missing_terminators_and_broken_connections_end_with_one_terminal_error() {
    let cases: Vec<(Reply, &str)> = vec![
        (
            Reply::sse_steps(openai_stream_steps(&["a", "b"], false)),
            "openai",
        ),
        (
            Reply::sse_steps(anthropic_stream_steps(&["a", "b"], false)),
            "anthropic",
        ),
        (
            Reply::stream(
                "application/vnd.amazon.eventstream",
                bedrock_stream_steps(&["a", "b"], false),
            ),
            "bedrock",
        ),
    ];
    for (reply, provider) in cases {
        let t = ScriptedTransport::new(reply);
        let stream = match provider {
            "openai" => t.openai().streaming().oneshot(req()).await,
            "anthropic" => t.anthropic().streaming().oneshot(req()).await,
            _ => bedrock(t.clone()).streaming().oneshot(req()).await,
        }
        .expect("commits");
        let (chunks, end) = drain(stream).await;
        assert_eq!(text(&chunks), "ab", "{provider}");
        let end = end.expect("terminal error");
        assert_eq!(end.class(), FailureClass::Transient, "{provider}");
        assert!(
            end.message().unwrap_or_default().contains("terminator"),
            "{provider}: {end:?}"
        );
    }

    let mut steps = openai_stream_steps(&["a"], false);
    steps.push(Step::Break);
    let t = ScriptedTransport::new(Reply::sse_steps(steps));
    let (chunks, end) = drain(
        t.openai()
            .streaming()
            .oneshot(req())
            .await
            .expect("commits"),
    )
    .await;
    assert_eq!(text(&chunks), "a");
    let end = end.expect("terminal");
    assert_eq!(end.class(), FailureClass::Transient);
    assert!(end.message().unwrap_or_default().contains("broke off"));
}

#[tokio::test(start_paused = true)]
async fn malformed_frames_are_invalid_responses_on_either_side_of_the_commit() {
    let t = ScriptedTransport::new(Reply::sse_steps(vec![Step::sse(None, "{not json")]));
    assert!(
        t.openai()
            .streaming()
            .oneshot(req())
            .await
            .unwrap_err()
            .is_invalid_response()
    );

    let mut steps = openai_stream_steps(&["a"], false);
    steps.push(Step::sse(None, "{\"choices\": 7}"));
    steps.push(Step::openai_text("never read"));
    let t = ScriptedTransport::new(Reply::sse_steps(steps));
    let (chunks, end) = drain(
        t.openai()
            .streaming()
            .oneshot(req())
            .await
            .expect("commits"),
    )
    .await;
    assert_eq!(text(&chunks), "a");
    assert!(end.expect("terminal").is_invalid_response());

    // One huge event: refused at the cap, never buffered whole.
    let mut steps = openai_stream_steps(&["a"], false);
    steps.push(Step::Send(Bytes::from(format!(
        "data: {}",
        "x".repeat(2 << 20)
    ))));
    let t = ScriptedTransport::new(Reply::sse_steps(steps));
    let (_, end) = drain(
        t.openai()
            .streaming()
            .oneshot(req())
            .await
            .expect("commits"),
    )
    .await;
    assert!(end.expect("terminal").is_invalid_response());
}

#[tokio::test(start_paused = true)]
async fn the_first_frame_is_handed_on_unchanged_after_the_preamble() {
    let t = ScriptedTransport::new(Reply::anthropic_stream(&["Hi", " there"]));
    let stream = t
        .anthropic()
        .streaming()
        .oneshot(req())
        .await
        .expect("commits");
    let (chunks, end) = drain(stream).await;
    assert!(end.is_none());
    // message_start's usage (the preamble), then the first delta as sent.
    assert_eq!(chunks[0].usage.map(|u| u.prompt_tokens), Some(10));
    assert_eq!(chunks[0].text, None);
    assert_eq!(chunks[1].text.as_deref(), Some("Hi"));
    assert_eq!(chunks[2].text.as_deref(), Some(" there"));
    assert_eq!(chunks[3].finish_reason, Some(FinishReason::Stop));
}

#[tokio::test(start_paused = true)]
async fn dropping_a_stream_drops_the_upstream_body() {
    let mut steps = openai_stream_steps(&["a"], false);
    steps.push(Step::Pause(Duration::from_secs(1)));
    steps.push(Step::openai_text("b"));
    let t = ScriptedTransport::new(Reply::sse_steps(steps));
    let stream = t
        .openai()
        .streaming()
        .oneshot(req())
        .await
        .expect("commits");
    assert_eq!(t.aborted_streams(), 0);
    drop(stream);
    assert_eq!(t.aborted_streams(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_ends_a_stream_even_while_chunks_keep_coming() {
    let pieces: Vec<String> = (0..20).map(|i| format!("{i} ")).collect();
    let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let t = ScriptedTransport::new(Reply::openai_stream(&pieces));
    let mut r = req();
    Deadline::after(Duration::from_secs(3)).store(&mut r);
    let start = Instant::now();
    let mut stream = t.openai().streaming().oneshot(r).await.expect("commits");
    let mut read = 0;
    let end = loop {
        match std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await {
            Some(Ok(_)) => {
                read += 1;
                // A slow reader: every chunk is already there when asked for.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Some(Err(f)) => break f,
            None => panic!("the stream outlived its deadline"),
        }
    };
    assert!(end.is_deadline_exceeded(), "{end:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(3));
    assert_eq!(read, 3);
}

#[tokio::test(start_paused = true)]
async fn timeouts_too_large_for_the_clock_mean_never() {
    let t = ScriptedTransport::new(Reply::openai_stream(&["a", "b"]));
    let stream = t
        .openai()
        .streaming()
        .with_first_token_timeout(Duration::MAX)
        .with_idle_timeout(Duration::MAX)
        .oneshot(req())
        .await
        .expect("commits");
    let (chunks, end) = drain(stream).await;
    assert!(end.is_none());
    assert_eq!(text(&chunks), "ab");
}

#[tokio::test(start_paused = true)]
async fn several_tool_calls_in_one_openai_delta_are_all_kept() {
    let delta = serde_json::json!({
        "id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
        "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_a", "type": "function",
             "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
            {"index": 1, "id": "call_b", "type": "function",
             "function": {"name": "time", "arguments": "{}"}}
        ]}, "finish_reason": "tool_calls"}]
    });
    let t = ScriptedTransport::new(Reply::sse_steps(vec![
        Step::sse(None, &delta.to_string()),
        Step::sse(None, "[DONE]"),
    ]));
    let stream = t
        .openai()
        .streaming()
        .oneshot(req())
        .await
        .expect("commits");
    let answer = stream.collect_response().await.expect("complete");
    let calls = &answer.choices[0].tool_calls;
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[0].name.as_str(), calls[1].name.as_str()),
        ("weather", "time")
    );
    assert_eq!(calls[0].arguments, "{\"city\":\"Paris\"}");
    assert_eq!(answer.finish_reason(), Some(FinishReason::ToolCalls));
}

#[tokio::test(start_paused = true)]
async fn in_band_errors_never_carry_the_api_key() {
    // ScriptedTransport::openai() sends the key "mock"; use a real-looking one.
    let t = ScriptedTransport::new(Reply::sse_steps(vec![Step::sse(
        None,
        r#"{"error":{"type":"invalid_request_error","message":"bad key sk-live-SECRET-0123"}}"#,
    )]));
    let provider = tower_llm_providers::OpenAi::new(
        t,
        tower_llm_providers::OpenAiConfig::new(tower_llm_providers::ApiKey::new(
            "sk-live-SECRET-0123",
        )),
    );
    let err = provider.streaming().oneshot(req()).await.unwrap_err();
    assert!(err.is_bad_request());
    assert_eq!(err.message(), Some("bad key [redacted]"));
    assert!(!format!("{err:?} {err}").contains("SECRET"));
}

#[tokio::test(start_paused = true)]
async fn a_complete_stream_is_not_an_aborted_one_and_a_bom_is_skipped() {
    let mut steps = vec![Step::Send(Bytes::from_static(b"\xEF\xBB\xBF"))];
    steps.extend(openai_stream_steps(&["a"], true));
    steps.push(Step::Pause(Duration::from_millis(50))); // the end comes later
    let t = ScriptedTransport::new(Reply::sse_steps(steps));
    let stream = t
        .openai()
        .streaming()
        .oneshot(req())
        .await
        .expect("commits");
    let (chunks, end) = drain(stream).await;
    assert!(end.is_none());
    assert_eq!(text(&chunks), "a");
    assert_eq!(t.aborted_streams(), 0, "read to its end after [DONE]");
}

// The end of a stream without its terminator, over real loopback HTTP: a
// finish reason (for every choice that started) followed by a clean end of
// the body proves the answer complete; a body that ends before it is
// truncated.

/// The wire a loopback test speaks.
#[derive(Clone, Copy)]
enum Wire {
    OpenAi,
    Anthropic,
}

/// Serves `steps` from a loopback server and drains the stream that
/// `wire`'s provider makes of them (it must commit); the server too, for
/// what it saw.
async fn play(wire: Wire, steps: Vec<Step>) -> (Vec<ChatChunk>, Option<Failure>, MockServer) {
    let server = MockServer::start(Reply::sse_steps(steps))
        .await
        .expect("server");
    let stream = match wire {
        Wire::OpenAi => loopback_openai(&server).oneshot(req()).await,
        Wire::Anthropic => loopback_anthropic(&server).oneshot(req()).await,
    }
    .expect("commits");
    let (chunks, end) = drain(stream).await;
    (chunks, end, server)
}

/// `end` is the truncation error: transient, "without its terminator".
fn assert_truncated(end: Option<Failure>) {
    let end = end.expect("a terminal error");
    assert_eq!(end.class(), FailureClass::Transient);
    assert_eq!(
        end.message(),
        Some("the stream ended without its terminator")
    );
}

/// A provider streaming from `server` over a real HTTP client.
fn loopback_openai(
    server: &MockServer,
) -> tower_llm_providers::Streaming<tower_llm_providers::OpenAi<HttpsClient>> {
    tower_llm_providers::OpenAi::new(
        client_with_connect_timeout(Duration::from_secs(5)),
        tower_llm_providers::OpenAiConfig::new(tower_llm_providers::ApiKey::new("k"))
            .with_base_url(&format!("{}/v1", server.url())),
    )
    .streaming()
}

fn loopback_anthropic(
    server: &MockServer,
) -> tower_llm_providers::Streaming<tower_llm_providers::Anthropic<HttpsClient>> {
    tower_llm_providers::Anthropic::new(
        client_with_connect_timeout(Duration::from_secs(5)),
        tower_llm_providers::AnthropicConfig::new(tower_llm_providers::ApiKey::new("k"))
            .with_base_url(&server.url()),
    )
    .streaming()
}

/// `steps` without their last one (the terminator).
fn without_terminator(mut steps: Vec<Step>) -> Vec<Step> {
    steps.pop().expect("a terminator");
    steps
}

fn usage_of(chunks: &[ChatChunk]) -> Vec<(u32, u32)> {
    chunks
        .iter()
        .filter_map(|c| c.usage.map(|u| (u.prompt_tokens, u.completion_tokens)))
        .collect()
}

/// An OpenAI chunk of choice `index`.
fn openai_choice(index: u32, delta: serde_json::Value, finish: Option<&str>) -> Step {
    let chunk = serde_json::json!({
        "id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0, "model": "m",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}]
    });
    Step::sse(None, &chunk.to_string())
}

#[tokio::test(start_paused = true)]
async fn openai_finish_reason_and_usage_then_a_clean_end_without_done_is_complete() {
    // Role chunk, "Hel", "lo", stop chunk, usage chunk; no `data: [DONE]`.
    let steps = without_terminator(openai_stream_steps(&["Hel", "lo"], true));
    assert!(!format!("{steps:?}").contains("[DONE]"));
    let (chunks, end, server) = play(Wire::OpenAi, steps).await;
    assert!(end.is_none(), "a clean end, not {end:?}");
    assert_eq!(text(&chunks), "Hello");
    assert_eq!(
        chunks
            .iter()
            .filter_map(|c| c.finish_reason)
            .collect::<Vec<_>>(),
        [FinishReason::Stop]
    );
    assert_eq!(usage_of(&chunks), [(10, 2)], "the usage chunk is kept");
    assert_eq!(server.aborted_streams(), 0, "the body was read to its end");

    // The same without the usage chunk: complete too.
    let mut steps = without_terminator(openai_stream_steps(&["Hel", "lo"], true));
    steps.pop(); // the usage chunk
    let server = MockServer::start(Reply::sse_steps(steps))
        .await
        .expect("server");
    let answer = loopback_openai(&server)
        .oneshot(req())
        .await
        .expect("commits")
        .collect_response()
        .await
        .expect("complete");
    assert_eq!(answer.text(), "Hello");
    assert_eq!(answer.finish_reason(), Some(FinishReason::Stop));
}

#[tokio::test(start_paused = true)]
async fn openai_body_ending_before_any_finish_reason_is_a_truncation_error() {
    // Role chunk and "Hel", then the body ends cleanly: truncated.
    let (chunks, end, _) = play(Wire::OpenAi, openai_stream_steps(&["Hel"], false)).await;
    assert_eq!(text(&chunks), "Hel");
    assert_eq!(end.as_ref().and_then(Failure::provider), Some("openai"));
    assert_truncated(end);

    // A finish reason, then the body ends in the middle of the next
    // event (a cut usage chunk): not a clean end, still truncated.
    let mut steps = without_terminator(openai_stream_steps(&["Hel", "lo"], true));
    steps.pop(); // the usage chunk
    steps.push(Step::Send(Bytes::from_static(
        b"data: {\"id\":\"chatcmpl-mock\",\"choices\":[],\"usage\":{\"prompt_tok",
    )));
    let (chunks, end, _) = play(Wire::OpenAi, steps).await;
    assert_eq!(text(&chunks), "Hello");
    assert_truncated(end);
}

#[tokio::test(start_paused = true)]
async fn a_connection_broken_after_the_finish_reason_stays_an_error() {
    // Stop chunk and usage chunk, then the connection breaks off instead
    // of ending the body: the HTTP framing says the body is incomplete.
    let mut steps = without_terminator(openai_stream_steps(&["Hel", "lo"], true));
    // (The pause lets the server flush what came before; virtual time.)
    steps.push(Step::Pause(Duration::from_millis(10)));
    steps.push(Step::Break);
    let (chunks, end, _) = play(Wire::OpenAi, steps).await;
    assert_eq!(text(&chunks), "Hello");
    assert_eq!(usage_of(&chunks), [(10, 2)]);
    let end = end.expect("a terminal error");
    assert_eq!(end.class(), FailureClass::Transient);
    assert_eq!(end.message(), Some("the stream broke off"));
}

#[tokio::test(start_paused = true)]
async fn with_several_choices_every_started_choice_needs_its_finish_reason() {
    let text_of = |i: u32, t: &str| openai_choice(i, serde_json::json!({"content": t}), None);
    let stop = |i: u32| openai_choice(i, serde_json::json!({}), Some("stop"));
    // Choice 0 finished, choice 1 did not: truncated.
    let steps = vec![text_of(0, "a"), text_of(1, "b"), stop(0)];
    let (chunks, end, _) = play(Wire::OpenAi, steps).await;
    assert_eq!(text(&chunks), "ab");
    assert_truncated(end);

    // Both finished: complete.
    let server = MockServer::start(Reply::sse_steps(vec![
        text_of(0, "a"),
        text_of(1, "b"),
        stop(1),
        stop(0),
    ]))
    .await
    .expect("server");
    let answer = loopback_openai(&server)
        .oneshot(req())
        .await
        .expect("commits")
        .collect_response()
        .await
        .expect("complete");
    assert_eq!(answer.choices.len(), 2);
    assert!(
        answer
            .choices
            .iter()
            .all(|c| c.finish_reason == FinishReason::Stop)
    );
}

#[tokio::test(start_paused = true)]
async fn anthropic_stop_reason_then_a_clean_end_without_message_stop_is_complete() {
    // ... message_delta (stop_reason, usage); no message_stop.
    let steps = without_terminator(anthropic_stream_steps(&["Hel", "lo"], true));
    assert!(!format!("{steps:?}").contains("message_stop"));
    let (chunks, end, _) = play(Wire::Anthropic, steps).await;
    assert!(end.is_none(), "a clean end, not {end:?}");
    assert_eq!(text(&chunks), "Hello");
    assert_eq!(
        chunks
            .iter()
            .filter_map(|c| c.finish_reason)
            .collect::<Vec<_>>(),
        [FinishReason::Stop]
    );
    // message_start's input count, message_delta's output count.
    assert_eq!(usage_of(&chunks), [(10, 1), (0, 2)]);
}

#[tokio::test(start_paused = true)]
async fn anthropic_body_ending_before_any_stop_reason_is_a_truncation_error() {
    // Through content_block_stop; no message_delta, no message_stop.
    let mut steps = anthropic_stream_steps(&["Hel", "lo"], true);
    steps.truncate(steps.len() - 2);
    let (chunks, end, _) = play(Wire::Anthropic, steps).await;
    assert_eq!(text(&chunks), "Hello");
    assert_eq!(end.as_ref().and_then(Failure::provider), Some("anthropic"));
    assert_truncated(end);
}

#[tokio::test(start_paused = true)]
async fn bedrock_message_stop_then_a_clean_end_without_metadata_is_complete() {
    // (Already so before this rule: Bedrock's wire treats the end of the
    // body after `messageStop` as the terminator.)
    let mut steps = bedrock_stream_steps(&["Hel", "lo"], true);
    steps.pop(); // metadata
    let t = ScriptedTransport::new(Reply::stream("application/vnd.amazon.eventstream", steps));
    let (chunks, end) = drain(
        bedrock(t)
            .streaming()
            .oneshot(req())
            .await
            .expect("commits"),
    )
    .await;
    assert!(end.is_none(), "a clean end, not {end:?}");
    assert_eq!(text(&chunks), "Hello");
    // Without messageStop: truncated.
    let mut steps = bedrock_stream_steps(&["Hel", "lo"], true);
    steps.truncate(steps.len() - 2);
    let t = ScriptedTransport::new(Reply::stream("application/vnd.amazon.eventstream", steps));
    let (_, end) = drain(
        bedrock(t)
            .streaming()
            .oneshot(req())
            .await
            .expect("commits"),
    )
    .await;
    assert_eq!(
        end.expect("a terminal error").class(),
        FailureClass::Transient
    );
}
