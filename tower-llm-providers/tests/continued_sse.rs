//! A stream that was continued after it broke says so in both gateway SSE
//! dialects: a `: continued N` comment line, which SSE clients ignore.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use futures_core::Stream;
use tower_llm_core::{
    ChatChunk, ChatStream, Continued, ContinuedPiece, Failure, FailureClass, FinishReason,
};
use tower_llm_providers::stream::{SseEvent, SseParser};
use tower_llm_providers::{anthropic, openai};

fn text(t: &str) -> Result<ChatChunk, Failure> {
    Ok(ChatChunk {
        text: Some(t.into()),
        ..ChatChunk::default()
    })
}

fn stop() -> Result<ChatChunk, Failure> {
    Ok(ChatChunk {
        finish_reason: Some(FinishReason::Stop),
        ..ChatChunk::default()
    })
}

/// A stream whose handle was given `n` continuations.
fn continued(items: Vec<Result<ChatChunk, Failure>>, n: u32) -> ChatStream {
    let handle = Continued::new();
    let piece = ChatStream::from_chunks("anthropic", "claude", vec![]);
    for _ in 0..n {
        handle.record(ContinuedPiece::of(&piece, FailureClass::Transient));
    }
    ChatStream::from_chunks("openai", "gpt", items).with_continuations(handle)
}

/// Every frame of `frames` (all ready at once), joined.
fn all<S: Stream<Item = bytes::Bytes> + Unpin>(mut frames: S) -> String {
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = String::new();
    loop {
        match Pin::new(&mut frames).poll_next(&mut cx) {
            Poll::Ready(Some(frame)) => out.push_str(std::str::from_utf8(&frame).expect("UTF-8")),
            Poll::Ready(None) => return out,
            Poll::Pending => panic!("a stream of ready chunks is never pending"),
        }
    }
}

fn openai(stream: ChatStream) -> String {
    all(openai::server::SseFrames::new(
        stream,
        false,
        "chatcmpl-1".into(),
        7,
    ))
}

fn anthropic(stream: ChatStream) -> String {
    all(anthropic::server::SseFrames::new(stream, "msg_1".into()))
}

fn events(sse: &str) -> Vec<SseEvent> {
    SseParser::new()
        .push(sse.as_bytes())
        .expect("well-formed SSE")
}

#[test]
fn openai_frames_say_continued_just_before_done() {
    let out = openai(continued(vec![text("Hello, "), text("world."), stop()], 2));
    assert!(
        out.ends_with("}\n\n: continued 2\n\ndata: [DONE]\n\n"),
        "{out}"
    );
    // The same frames as a stream never continued, plus the comment.
    let plain = openai(continued(vec![text("Hello, "), text("world."), stop()], 0));
    assert!(!plain.contains(": continued"), "{plain}");
    assert_eq!(out.replacen(": continued 2\n\n", "", 1), plain);
    // An SSE client sees the same events.
    assert_eq!(events(&out), events(&plain));
}

#[test]
fn anthropic_frames_say_continued_just_before_message_stop() {
    let out = anthropic(continued(vec![text("Hello, "), text("world."), stop()], 1));
    assert!(
        out.ends_with(
            ": continued 1\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        ),
        "{out}"
    );
    let plain = anthropic(continued(vec![text("Hello, "), text("world."), stop()], 0));
    assert!(!plain.contains(": continued"), "{plain}");
    assert_eq!(out.replacen(": continued 1\n\n", "", 1), plain);
    assert_eq!(events(&out), events(&plain));
}

#[test]
fn a_count_recorded_while_the_stream_is_read_is_the_one_written() {
    // The handle is read when the stream ends, not when the writer starts.
    let handle = Continued::new();
    let stream = ChatStream::from_chunks("openai", "gpt", vec![text("Hi"), stop()])
        .with_continuations(handle.clone());
    let mut frames = openai::server::SseFrames::new(stream, false, "chatcmpl-1".into(), 7);
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready(Some(first)) = Pin::new(&mut frames).poll_next(&mut cx) else {
        panic!("a first frame");
    };
    assert!(first.starts_with(b"data: {"));
    let piece = ChatStream::from_chunks("anthropic", "claude", vec![]);
    handle.record(ContinuedPiece::of(&piece, FailureClass::Timeout));
    let rest = all(frames);
    assert!(
        rest.ends_with(": continued 1\n\ndata: [DONE]\n\n"),
        "{rest}"
    );
}

#[test]
fn a_stream_that_fails_or_was_never_continued_writes_no_comment() {
    let failed = vec![text("Hel"), Err(Failure::new(FailureClass::Transient))];
    for out in [
        openai(continued(failed.clone_items(), 1)),
        anthropic(continued(failed.clone_items(), 1)),
        openai(ChatStream::from_chunks("openai", "gpt", vec![text("Hi")])),
        anthropic(ChatStream::from_chunks("openai", "gpt", vec![text("Hi")])),
    ] {
        assert!(!out.contains(": continued"), "{out}");
    }
}

/// Copies of items (a `Failure` is not `Clone`).
trait CloneItems {
    fn clone_items(&self) -> Vec<Result<ChatChunk, Failure>>;
}

impl CloneItems for Vec<Result<ChatChunk, Failure>> {
    fn clone_items(&self) -> Vec<Result<ChatChunk, Failure>> {
        self.iter()
            .map(|i| match i {
                Ok(c) => Ok(c.clone()),
                Err(f) => Err(Failure::new(f.class())),
            })
            .collect()
    }
}
