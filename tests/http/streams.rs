//! Streaming through the full stack (deadline → fallback → retry → breaker
//! → streaming provider) over real loopback HTTP (`MockServer`): failures
//! before the first content frame fail over, failures after it end the
//! stream with one terminal error and are never retried.

use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm::breaker::{BreakerKey, CircuitState};
use tower_llm::prelude::*;
use tower_llm::providers::https::{HttpsClient, client_with_connect_timeout};
use tower_llm::providers::{
    Anthropic, AnthropicConfig, ApiKey, AwsCredentials, Bedrock, BedrockConfig, OpenAi,
    OpenAiConfig, StreamSource, Streaming,
};
use tower_llm::retry::FixedFraction;
use tower_llm::{ChatChunk, ChatStream};
use tower_llm_providers::mock::{
    MockServer, Recorded, Reply, Step, anthropic_stream_steps, bedrock_stream_steps,
    openai_stream_steps,
};

fn req(prompt: &str) -> ChatRequest {
    ChatRequest::new("m", vec![Message::user(prompt)])
}

fn client() -> HttpsClient {
    client_with_connect_timeout(Duration::from_secs(5))
}

fn openai(server: &MockServer) -> Streaming<OpenAi<HttpsClient>> {
    OpenAi::new(
        client(),
        OpenAiConfig::new(ApiKey::new("k")).with_base_url(&server.url()),
    )
    .streaming()
}

fn anthropic(server: &MockServer) -> Streaming<Anthropic<HttpsClient>> {
    Anthropic::new(
        client(),
        AnthropicConfig::new(ApiKey::new("k")).with_base_url(&server.url()),
    )
    .streaming()
}

/// One link: retry (3 attempts, 200 ms then 800 ms) → breaker → provider.
fn link<P>(
    provider: Streaming<P>,
    breaker: BreakerLayer,
) -> impl tower::Service<
    ChatRequest,
    Response = ChatStream,
    Error = Failure,
    Future = impl Send + 'static,
> + Clone
+ Send
+ Sync
+ 'static
where
    P: StreamSource + Clone + Send + Sync + 'static,
{
    ServiceBuilder::new()
        .llm_retry(RetryLayer::new().with_rng(FixedFraction(0.5)))
        .llm_breaker(breaker)
        .service(provider)
}

/// deadline (30 s) → fallback (primary, backup) → per-link retry → breaker.
fn stack<P, Q>(
    primary: Streaming<P>,
    backup: Streaming<Q>,
) -> (
    impl tower::Service<
        ChatRequest,
        Response = ChatStream,
        Error = Failure,
        Future = impl Send + 'static,
    > + Clone
    + Send
    + 'static,
    BreakerLayer,
)
where
    P: StreamSource + Clone + Send + Sync + 'static,
    Q: StreamSource + Clone + Send + Sync + 'static,
{
    let breaker = BreakerLayer::new();
    let fallback = FallbackLayer::builder(LinkSpec::new("primary", "m"))
        .or(LinkSpec::new("backup", "m"), link(backup, breaker.clone()))
        .build()
        .expect("chain");
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_fallback(fallback)
        .service(link(primary, breaker.clone()));
    (svc, breaker)
}

async fn next(stream: &mut ChatStream) -> Option<Result<ChatChunk, Failure>> {
    std::future::poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)).await
}

/// The text read, and the terminal error if the stream ended with one.
async fn drain(mut stream: ChatStream) -> (String, Option<Failure>) {
    let mut text = String::new();
    while let Some(item) = next(&mut stream).await {
        match item {
            Ok(c) => text.push_str(c.text.as_deref().unwrap_or_default()),
            Err(f) => {
                assert!(next(&mut stream).await.is_none(), "items after the error");
                return (text, Some(f));
            }
        }
    }
    (text, None)
}

use futures_core::Stream as _;

#[tokio::test(start_paused = true)]
async fn a_503_before_the_stream_fails_over_and_the_client_sees_only_the_backup() {
    let primary = MockServer::start(Reply::openai_error(503, "server_error", "down"))
        .await
        .expect("server");
    let backup = MockServer::start(Reply::openai_stream(&["from ", "backup"]))
        .await
        .expect("server");
    let (svc, _) = stack(openai(&primary), openai(&backup));

    let start = Instant::now();
    let stream = svc.oneshot(req("hi")).await.expect("the backup streams");
    assert_eq!(start.elapsed(), Duration::from_millis(1000)); // 200 + 800 ms backoff
    assert_eq!(stream.fallback_position(), 1);
    assert_eq!(stream.provider(), "openai");
    let links: Vec<_> = stream
        .attempts()
        .iter()
        .map(|a| a.provider.to_string())
        .collect();
    assert_eq!(links, ["primary", "primary", "primary", "backup"]);
    let (text, end) = drain(stream).await;
    assert_eq!(text, "from backup");
    assert!(end.is_none());
    assert_eq!(primary.received().len(), 3);
    assert_eq!(backup.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_in_band_overloaded_error_as_the_first_event_fails_over() {
    let primary = MockServer::start(Reply::sse_steps(vec![Step::sse(
        Some("error"),
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    )]))
    .await
    .expect("server");
    let backup = MockServer::start(Reply::openai_stream(&["ok"]))
        .await
        .expect("server");
    let (svc, _) = stack(anthropic(&primary), openai(&backup));

    let stream = svc.oneshot(req("hi")).await.expect("the backup streams");
    assert_eq!(stream.fallback_position(), 1);
    let classes: Vec<_> = stream.attempts().iter().map(|a| a.outcome).collect();
    assert_eq!(
        classes[..3],
        [tower_llm::AttemptOutcome::Failed(FailureClass::Transient); 3]
    );
    let (text, end) = drain(stream).await;
    assert_eq!(text, "ok");
    assert!(end.is_none());
    assert_eq!(primary.received().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn silence_past_the_first_token_timeout_fails_over() {
    let mut steps = openai_stream_steps(&[], false); // headers and a role chunk
    steps.push(Step::Stall);
    let primary = MockServer::start(Reply::sse_steps(steps))
        .await
        .expect("server");
    let backup = MockServer::start(Reply::openai_stream(&["late but fine"]))
        .await
        .expect("server");
    let (svc, _) = stack(
        openai(&primary).with_first_token_timeout(Duration::from_secs(5)),
        openai(&backup),
    );

    let start = Instant::now();
    let stream = svc.oneshot(req("hi")).await.expect("the backup streams");
    // Three 5 s first-token timeouts with 200 ms and 800 ms between them.
    assert_eq!(start.elapsed(), Duration::from_secs(16));
    assert!(
        stream.attempts()[..3]
            .iter()
            .all(|a| a.outcome == tower_llm::AttemptOutcome::Failed(FailureClass::Timeout))
    );
    assert_eq!(drain(stream).await.0, "late but fine");
}

#[tokio::test(start_paused = true)]
async fn a_connection_lost_after_content_ends_the_stream_and_is_never_retried() {
    let mut steps = openai_stream_steps(&["one ", "two"], false);
    // (hyper drops unflushed bytes when a body fails: let them go out)
    steps.push(Step::Pause(Duration::from_millis(100)));
    steps.push(Step::Break);
    let primary = MockServer::start(Reply::sse_steps(steps))
        .await
        .expect("server");
    let backup = MockServer::start(Reply::openai_stream(&["backup"]))
        .await
        .expect("server");
    let (svc, breaker) = stack(openai(&primary), openai(&backup));

    let stream = svc.oneshot(req("hi")).await.expect("commits");
    let (text, end) = drain(stream).await;
    assert_eq!(text, "one two");
    assert_eq!(
        end.expect("terminal error").class(),
        FailureClass::Transient
    );
    assert_eq!(primary.received().len(), 1);
    assert_eq!(backup.received().len(), 0);
    // The breaker saw a success (the commit), not the later failure.
    let snapshot = breaker
        .handle()
        .get(&BreakerKey::new("primary", "m"))
        .expect("circuit");
    assert_eq!(snapshot.state, CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn missing_terminators_end_with_a_terminal_error_after_the_last_frame() {
    let unused = MockServer::start(Reply::openai_stream(&["unused"]))
        .await
        .expect("server");
    let openai_cut = MockServer::start(Reply::sse_steps(openai_stream_steps(&["a", "b"], false)))
        .await
        .expect("server");
    let (svc, _) = stack(openai(&openai_cut), openai(&unused));
    let (text, end) = drain(svc.oneshot(req("hi")).await.expect("commits")).await;
    assert_eq!(text, "ab");
    let end = end.expect("terminal");
    assert_eq!(end.class(), FailureClass::Transient);
    assert!(end.message().unwrap_or_default().contains("terminator"));

    let anthropic_cut =
        MockServer::start(Reply::sse_steps(anthropic_stream_steps(&["c", "d"], false)))
            .await
            .expect("server");
    let (svc, _) = stack(anthropic(&anthropic_cut), openai(&unused));
    let (text, end) = drain(svc.oneshot(req("hi")).await.expect("commits")).await;
    assert_eq!(text, "cd");
    let end = end.expect("terminal");
    assert_eq!(end.class(), FailureClass::Transient);
    assert!(end.message().unwrap_or_default().contains("terminator"));
    assert_eq!(unused.received().len(), 0);
}

/// Streams the request's prompt back in 3-character pieces, 10 ms apart.
fn echo(req: &Recorded) -> Reply {
    let body: serde_json::Value = serde_json::from_slice(&req.body).unwrap_or_default();
    let prompt = body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let chars: Vec<char> = prompt.chars().collect();
    let pieces: Vec<String> = chars.chunks(3).map(|c| c.iter().collect()).collect();
    let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let mut steps = Vec::new();
    for step in openai_stream_steps(&pieces, true) {
        steps.push(Step::Pause(Duration::from_millis(10)));
        steps.push(step);
    }
    Reply::sse_steps(steps)
}

#[tokio::test(start_paused = true)]
async fn a_hundred_concurrent_streams_each_get_their_own_content() {
    let primary = MockServer::start(Reply::With(echo)).await.expect("server");
    let backup = MockServer::start(Reply::openai_stream(&["wrong"]))
        .await
        .expect("server");
    let (svc, _) = stack(openai(&primary), openai(&backup));

    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let prompt = format!("stream {i}: {}", "é∑x".repeat(i % 7 + 1));
                let stream = svc.oneshot(req(&prompt)).await.expect("commits");
                (prompt, drain(stream).await)
            })
        })
        .collect();
    for task in tasks {
        let (prompt, (text, end)) = task.await.expect("task");
        assert!(end.is_none(), "{end:?}");
        assert_eq!(text, prompt);
    }
    assert_eq!(primary.received().len(), 100);
    assert_eq!(backup.received().len(), 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_client_stream_closes_the_upstream_connection() {
    let mut steps = openai_stream_steps(&["first"], false);
    for _ in 0..50 {
        steps.push(Step::Pause(Duration::from_millis(100)));
        steps.push(Step::openai_text("more"));
    }
    let primary = MockServer::start(Reply::sse_steps(steps))
        .await
        .expect("server");
    let backup = MockServer::start(Reply::openai_stream(&["unused"]))
        .await
        .expect("server");
    let (svc, _) = stack(openai(&primary), openai(&backup));

    let mut stream = svc.oneshot(req("hi")).await.expect("commits");
    let first = next(&mut stream).await.expect("a chunk").expect("ok");
    assert_eq!(first.text.as_deref(), Some("first"));
    assert_eq!(primary.aborted_streams(), 0);
    drop(stream);
    // The server notices on its next write to the closed connection.
    for _ in 0..20 {
        if primary.aborted_streams() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(primary.aborted_streams(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_breaker_counts_failures_before_the_commit_only() {
    // Five streams that break after content: the circuit stays closed.
    let mut broken = openai_stream_steps(&["x"], false);
    broken.push(Step::Pause(Duration::from_millis(100)));
    broken.push(Step::Break);
    let server = MockServer::start(Reply::sse_steps(broken))
        .await
        .expect("server");
    let breaker = BreakerLayer::new();
    let svc = ServiceBuilder::new()
        .llm_breaker(breaker.clone())
        .service(openai(&server));
    let key = BreakerKey::new("default", ""); // no fallback link: the layer's own
    for _ in 0..5 {
        let (_, end) = drain(svc.clone().oneshot(req("hi")).await.expect("commits")).await;
        assert!(end.is_some());
    }
    assert_eq!(
        breaker.handle().get(&key).map(|s| s.state),
        Some(CircuitState::Closed)
    );

    // Five in-band errors before any content: the circuit opens.
    for _ in 0..5 {
        server.push(Reply::sse_steps(vec![Step::sse(
            None,
            r#"{"error":{"type":"server_error","message":"boom"}}"#,
        )]));
    }
    for _ in 0..5 {
        let err = svc.clone().oneshot(req("hi")).await.unwrap_err();
        assert!(err.is_transient(), "{err:?}");
    }
    assert_eq!(
        breaker.handle().get(&key).map(|s| s.state),
        Some(CircuitState::Open)
    );
    let err = svc.clone().oneshot(req("hi")).await.unwrap_err();
    assert!(err.is_circuit_open());
    assert_eq!(server.received().len(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_finished_stream_gives_its_connection_back_to_the_pool() {
    // The chunked body's end comes 50 ms after [DONE]. The stream ends at
    // [DONE] (the caller does not wait for the rest), the rest is read in
    // the background, and the connection is back in the pool once it has
    // been: the next call, 100 ms later, reuses it. (A call made before
    // the background read finishes opens a new connection: hyper-util's
    // pool races a new connect against the checkout.)
    let mut steps = openai_stream_steps(&["a"], true);
    steps.push(Step::Pause(Duration::from_millis(50)));
    let server = MockServer::start(Reply::sse_steps(steps))
        .await
        .expect("server");
    let svc = openai(&server);
    for _ in 0..3 {
        let stream = svc.clone().oneshot(req("hi")).await.expect("commits");
        let started = Instant::now();
        let (text, end) = drain(stream).await;
        assert_eq!(started.elapsed(), Duration::ZERO, "ends at [DONE]");
        assert_eq!(text, "a");
        assert!(end.is_none());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(server.received().len(), 3);
    assert_eq!(server.connections(), 1, "one kept-alive connection");
    assert_eq!(server.aborted_streams(), 0);
}

/// `steps` (a complete stream) with a 1 s pause before its last message
/// (the terminator), after which the upstream holds the body open.
fn lingering(mut steps: Vec<Step>) -> Reply {
    let terminator = steps.pop().expect("a terminator");
    steps.push(Step::Pause(Duration::from_secs(1)));
    steps.push(terminator);
    steps.push(Step::Stall);
    Reply::sse_steps(steps)
}

/// Reads a committed stream to its end; the time from the commit point to
/// the end, which must be clean.
async fn time_to_end(stream: ChatStream) -> Duration {
    let started = Instant::now();
    let (text, end) = drain(stream).await;
    assert_eq!(text, "ab");
    assert!(end.is_none(), "a clean end: {end:?}");
    started.elapsed()
}

#[tokio::test(start_paused = true)]
async fn the_stream_ends_at_the_terminator_while_the_upstream_lingers() {
    // Each upstream sends its terminator 1 s after the commit point and
    // then holds the body open: the consumer sees the end at once, not
    // after the idle timeout (30 s).
    let within = |elapsed: Duration| {
        assert!(
            elapsed >= Duration::from_secs(1) && elapsed < Duration::from_millis(1_100),
            "the end came {elapsed:?} after the commit point"
        );
    };

    let server = MockServer::start(lingering(openai_stream_steps(&["a", "b"], true)))
        .await
        .expect("server");
    within(time_to_end(openai(&server).oneshot(req("hi")).await.expect("commits")).await);

    let server = MockServer::start(lingering(anthropic_stream_steps(&["a", "b"], true)))
        .await
        .expect("server");
    within(
        time_to_end(
            anthropic(&server)
                .oneshot(req("hi"))
                .await
                .expect("commits"),
        )
        .await,
    );

    // Bedrock: `metadata` after `messageStop` is the last message.
    let Reply::Stream { steps, .. } = lingering(bedrock_stream_steps(&["a", "b"], true)) else {
        unreachable!("a stream")
    };
    let server = MockServer::start(Reply::stream("application/vnd.amazon.eventstream", steps))
        .await
        .expect("server");
    let bedrock = Bedrock::new(
        client(),
        BedrockConfig::new(AwsCredentials::new("AKIDEXAMPLE", "secret"), "us-east-1")
            .with_endpoint(&server.url()),
    )
    .streaming();
    let stream = bedrock.oneshot(req("hi")).await.expect("commits");
    within(time_to_end(stream).await);
}
