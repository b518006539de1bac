//! Streams: stored at their clean end, replayed chunk for chunk.

use std::pin::Pin;

use futures_core::Stream;
use tower_llm_core::{
    ChatChunk, ChatStream, Continued, ContinuedPiece, FinishReason, RecordsAttempts, ToolCallDelta,
    Usage,
};

use super::*;

fn text(t: &str) -> ChatChunk {
    ChatChunk {
        text: Some(t.into()),
        ..ChatChunk::default()
    }
}

/// A whole answer: text, a tool-free finish, then usage.
fn whole() -> Vec<ChatChunk> {
    vec![
        text("Par"),
        text("is"),
        ChatChunk {
            finish_reason: Some(FinishReason::Stop),
            ..ChatChunk::default()
        },
        ChatChunk {
            usage: Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 2,
                cached_input_tokens: 1,
            }),
            ..ChatChunk::default()
        },
    ]
}

/// An answer calling a tool.
fn calling_a_tool() -> Vec<ChatChunk> {
    vec![
        text("Let me check."),
        ChatChunk {
            tool_call: Some(ToolCallDelta {
                index: 1,
                id: Some("call_1".into()),
                name: Some("send_email".into()),
                arguments: "{}".into(),
            }),
            ..ChatChunk::default()
        },
        ChatChunk {
            finish_reason: Some(FinishReason::ToolCalls),
            ..ChatChunk::default()
        },
    ]
}

/// What the streaming provider sends on one call.
enum Sends {
    /// These chunks, then a clean end.
    Clean(Vec<ChatChunk>),
    /// These chunks, then this failure.
    Broken(Vec<ChatChunk>, FailureClass),
    /// These chunks, on a stream a resume layer continued once after it
    /// broke.
    Continued(Vec<ChatChunk>),
    /// These chunks, on a stream a resume layer may continue but did not.
    Continuable(Vec<ChatChunk>),
    /// These chunks, on the fallback layer's degraded stream.
    Degraded(Vec<ChatChunk>),
}

type StreamScript = Arc<dyn Fn(usize) -> Sends + Send + Sync>;

/// A streaming provider counting its calls; call `n` sends `script(n)`.
#[derive(Clone)]
struct Streaming {
    calls: Arc<AtomicUsize>,
    script: StreamScript,
}

impl Streaming {
    fn new(script: impl Fn(usize) -> Sends + Send + Sync + 'static) -> Self {
        Streaming {
            calls: Arc::default(),
            script: Arc::new(script),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn service(
        &self,
    ) -> impl Service<
        ChatRequest,
        Response = ChatStream,
        Error = Failure,
        Future = impl Send + 'static,
    > + Clone
    + Send
    + 'static {
        let this = self.clone();
        service_fn(move |_req: ChatRequest| {
            let n = this.calls.fetch_add(1, Ordering::SeqCst);
            let sends = (this.script)(n);
            async move {
                let stream = |chunks: Vec<ChatChunk>| {
                    ChatStream::from_chunks("mock", "m", chunks.into_iter().map(Ok).collect())
                };
                Ok(match sends {
                    Sends::Clean(chunks) => stream(chunks),
                    Sends::Broken(chunks, class) => {
                        let mut items: Vec<_> = chunks.into_iter().map(Ok).collect();
                        items.push(Err(Failure::new(class)));
                        ChatStream::from_chunks("mock", "m", items)
                    }
                    Sends::Continued(chunks) => {
                        let continued = Continued::new();
                        let stream = stream(chunks).with_continuations(continued.clone());
                        continued.record(ContinuedPiece::of(&stream, FailureClass::Transient));
                        stream
                    }
                    Sends::Continuable(chunks) => {
                        stream(chunks).with_continuations(Continued::new())
                    }
                    Sends::Degraded(chunks) => {
                        let mut stream = stream(chunks);
                        stream.mark_degraded();
                        stream
                    }
                })
            }
        })
    }
}

fn ask_streamed() -> ChatRequest {
    ask().with_stream(true)
}

async fn open<S>(svc: &S) -> ChatStream
where
    S: Service<ChatRequest, Response = ChatStream, Error = Failure> + Clone,
{
    svc.clone().oneshot(ask_streamed()).await.expect("streams")
}

/// Every chunk of `stream`, and the failure it ended with, if any: read
/// until the stream says it has ended, past its error (so the cache sees
/// the end of a broken stream too).
async fn drain(mut stream: ChatStream) -> (Vec<ChatChunk>, Option<FailureClass>) {
    let mut chunks = Vec::new();
    let mut failed = None;
    while let Some(item) = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await {
        match item {
            Ok(c) => chunks.push(c),
            Err(e) => failed = Some(e.class()),
        }
    }
    (chunks, failed)
}

#[tokio::test(start_paused = true)]
async fn a_streamed_answer_is_replayed_chunk_for_chunk_and_marked_a_hit() {
    let provider = Streaming::new(|_| Sends::Clean(whole()));
    let svc = tower::Layer::layer(&cache(config(60_000, 0)), provider.service());
    let first = open(&svc).await;
    assert_eq!(first.cache_outcome(), MISS);
    assert_eq!(drain(first).await, (whole(), None));
    advance(secs(3)).await;
    let replay = open(&svc).await;
    assert_eq!(replay.cache_outcome(), hit(secs(3)));
    assert_eq!((replay.provider(), replay.model()), ("mock", "m"));
    assert!(!replay.is_idempotent_replay());
    assert_eq!(drain(replay).await, (whole(), None));
    assert_eq!(provider.calls(), 1);
    // A replay is replayed whole every time.
    let collected = open(&svc).await.collect_response().await.expect("whole");
    assert_eq!(collected.text(), "Paris");
    assert_eq!(collected.finish_reason(), Some(FinishReason::Stop));
    assert_eq!(collected.usage.completion_tokens, 2);
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stream_is_stored_only_at_its_clean_end() {
    let provider = Streaming::new(|_| Sends::Clean(whole()));
    let svc = tower::Layer::layer(&cache(config(60_000, 0)), provider.service());
    let first = open(&svc).await;
    // The first is still unconsumed: nothing held yet.
    let second = open(&svc).await;
    assert_eq!(second.cache_outcome(), MISS);
    assert_eq!(provider.calls(), 2);
    drop(second);
    assert_eq!(drain(first).await, (whole(), None));
    advance(secs(1)).await;
    let third = open(&svc).await;
    assert_eq!(third.cache_outcome(), hit(secs(1)));
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_stream_dropped_before_its_end_is_not_stored() {
    let provider = Streaming::new(|_| Sends::Clean(whole()));
    let svc = tower::Layer::layer(&cache(config(60_000, 0)), provider.service());
    let mut first = open(&svc).await;
    let head = std::future::poll_fn(|cx| Pin::new(&mut first).poll_next(cx)).await;
    assert_eq!(head.map(|r| r.ok()), Some(Some(text("Par"))));
    drop(first);
    let second = open(&svc).await;
    assert_eq!(second.cache_outcome(), MISS);
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_stream_ending_with_an_error_is_not_stored() {
    let provider = Streaming::new(|n| {
        if n == 0 {
            Sends::Broken(vec![text("Par")], FailureClass::Transient)
        } else {
            Sends::Clean(whole())
        }
    });
    let svc = tower::Layer::layer(&cache(config(60_000, 0)), provider.service());
    let broken = drain(open(&svc).await).await;
    assert_eq!(broken, (vec![text("Par")], Some(FailureClass::Transient)));
    let second = open(&svc).await;
    assert_eq!(second.cache_outcome(), MISS);
    assert_eq!(drain(second).await, (whole(), None));
    let third = open(&svc).await;
    assert_eq!(third.cache_outcome(), hit(ms(0)));
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_stream_continued_after_it_broke_is_not_stored() {
    let provider = Streaming::new(|n| {
        if n == 0 {
            Sends::Continued(whole())
        } else {
            Sends::Continuable(whole())
        }
    });
    let svc = tower::Layer::layer(&cache(config(60_000, 0)), provider.service());
    let continued = open(&svc).await;
    assert_eq!(continued.continuations().count(), 1);
    assert_eq!(drain(continued).await, (whole(), None));
    // Continuable but never continued: stored.
    let second = open(&svc).await;
    assert_eq!(second.cache_outcome(), MISS);
    assert_eq!(second.continuations().count(), 0);
    assert_eq!(drain(second).await, (whole(), None));
    let third = open(&svc).await;
    assert_eq!(third.cache_outcome(), hit(ms(0)));
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_stream_calling_a_tool_is_not_stored_by_default() {
    let provider = Streaming::new(|_| Sends::Clean(calling_a_tool()));
    let svc = tower::Layer::layer(&cache(config(60_000, 0)), provider.service());
    assert_eq!(drain(open(&svc).await).await, (calling_a_tool(), None));
    let second = open(&svc).await;
    assert_eq!(second.cache_outcome(), MISS);
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_stream_calling_a_tool_is_stored_with_store_tool_calls() {
    let provider = Streaming::new(|_| Sends::Clean(calling_a_tool()));
    let layer = cache(CacheConfig {
        store_tool_calls: true,
        ..config(60_000, 0)
    });
    let svc = tower::Layer::layer(&layer, provider.service());
    assert_eq!(drain(open(&svc).await).await, (calling_a_tool(), None));
    advance(secs(4)).await;
    let replay = open(&svc).await;
    assert_eq!(replay.cache_outcome(), hit(secs(4)));
    assert_eq!(drain(replay).await, (calling_a_tool(), None));
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_degraded_stream_is_never_stored() {
    let provider = Streaming::new(|n| {
        if n == 0 {
            Sends::Degraded(whole())
        } else {
            Sends::Clean(whole())
        }
    });
    let svc = tower::Layer::layer(&cache(config(60_000, 0)), provider.service());
    let degraded = open(&svc).await;
    assert!(degraded.is_degraded());
    assert_eq!(degraded.cache_outcome(), MISS);
    assert_eq!(drain(degraded).await, (whole(), None));
    let second = open(&svc).await;
    assert!(!second.is_degraded());
    assert_eq!(second.cache_outcome(), MISS);
    assert_eq!(provider.calls(), 2);
}
