//! Streams out: a committed [`ChatStream`](tower_llm_core::ChatStream) as
//! OpenAI server-sent events.

use tower_llm_core::ChatChunk;

use super::error::sse_error_event;
use super::response::write_chunk_event;

/// A committed [`ChatStream`](tower_llm_core::ChatStream) as OpenAI
/// server-sent events, one `data:` frame per item: the first chunk
/// carries the role; usage is summed and sent once at the end, and only
/// when the client asked for it ([`wants_usage`](super::wants_usage)), as OpenAI does; a
/// clean end is `data: [DONE]`, a failure after the commit point one
/// [`sse_error_event`] and no `[DONE]`. Chunks with nothing but usage
/// send no frame. A stream that was continued after it broke (see
/// [`ChatStream::continuations`](tower_llm_core::ChatStream::continuations))
/// says so just before `[DONE]` with an SSE comment line,
/// `: continued N` (N continuations), which SSE clients ignore.
///
/// ```
/// # use std::pin::Pin;
/// use futures_core::Stream;
/// use tower_llm_core::{ChatChunk, ChatStream, FinishReason};
/// use tower_llm_providers::openai::server::SseFrames;
///
/// let chunk = |t: &str| Ok(ChatChunk { text: Some(t.into()), ..ChatChunk::default() });
/// let stream = ChatStream::from_chunks("mock", "m", vec![chunk("Hel"), chunk("lo")]);
/// let mut frames = SseFrames::new(stream, false, "chatcmpl-1".into(), 0);
/// let mut out = String::new();
/// let waker = std::task::Waker::noop();
/// let mut cx = std::task::Context::from_waker(&waker);
/// while let std::task::Poll::Ready(Some(frame)) = Pin::new(&mut frames).poll_next(&mut cx) {
///     out.push_str(std::str::from_utf8(&frame).unwrap());
/// }
/// assert!(out.starts_with("data: {"));
/// assert!(out.contains(r#""role":"assistant""#));
/// assert!(out.ends_with("data: [DONE]\n\n"));
/// ```
#[derive(Debug)]
pub struct SseFrames {
    stream: tower_llm_core::ChatStream,
    done: bool,
    id: String,
    model: String,
    created: u64,
    first: bool,
    include_usage: bool,
    usage: tower_llm_core::Usage,
}

impl SseFrames {
    /// The frames of `stream`, as the answer `id` created at `created`
    /// (Unix seconds), named by the stream's model.
    pub fn new(
        stream: tower_llm_core::ChatStream,
        include_usage: bool,
        id: String,
        created: u64,
    ) -> Self {
        let model = stream.model().to_owned();
        SseFrames {
            stream,
            done: false,
            id,
            model,
            created,
            first: true,
            include_usage,
            usage: tower_llm_core::Usage::default(),
        }
    }
}

impl futures_core::Stream for SseFrames {
    type Item = bytes::Bytes;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let frame = loop {
            match std::task::ready!(std::pin::Pin::new(&mut this.stream).poll_next(cx)) {
                Some(Ok(mut chunk)) => {
                    if let Some(u) = chunk.usage.take() {
                        // Providers report usage in parts (Anthropic:
                        // input first, output last): keep every count.
                        if u.prompt_tokens > 0 {
                            this.usage.prompt_tokens = u.prompt_tokens;
                        }
                        if u.completion_tokens > 0 {
                            this.usage.completion_tokens = u.completion_tokens;
                        }
                        if u.cached_input_tokens > 0 {
                            this.usage.cached_input_tokens = u.cached_input_tokens;
                        }
                    }
                    if chunk.text.is_none()
                        && chunk.tool_call.is_none()
                        && chunk.finish_reason.is_none()
                    {
                        continue; // usage only
                    }
                    let first = std::mem::take(&mut this.first);
                    let text = chunk.text.as_ref().map_or(0, String::len);
                    let mut out = Vec::with_capacity(160 + this.id.len() + text);
                    write_chunk_event(&mut out, &chunk, &this.id, &this.model, this.created, first);
                    break out;
                }
                Some(Err(f)) => {
                    this.done = true;
                    return Poll::Ready(Some(sse_error_event(&f)));
                }
                None => {
                    this.done = true;
                    let mut out = Vec::new();
                    if this.include_usage {
                        let usage = ChatChunk {
                            usage: Some(this.usage),
                            ..ChatChunk::default()
                        };
                        write_chunk_event(
                            &mut out,
                            &usage,
                            &this.id,
                            &this.model,
                            this.created,
                            false,
                        );
                    }
                    write_continued(&mut out, &this.stream);
                    out.extend_from_slice(b"data: [DONE]\n\n");
                    break out;
                }
            }
        };
        Poll::Ready(Some(bytes::Bytes::from(frame)))
    }
}

/// `: continued N\n\n` when `stream` was continued N > 0 times: an SSE
/// comment, ignored by clients, for those who look.
fn write_continued(out: &mut Vec<u8>, stream: &tower_llm_core::ChatStream) {
    let n = stream.continuations().count();
    if n > 0 {
        out.extend_from_slice(format!(": continued {n}\n\n").as_bytes());
    }
}
