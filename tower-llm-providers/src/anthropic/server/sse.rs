//! Streams out: a committed [`ChatStream`] as Anthropic's server-sent
//! events.

use std::collections::HashSet;
use std::pin::Pin;
use std::task::{Context, Poll};

use serde::Serialize;
use tower_llm_core::{ChatChunk, ChatStream, Failure, FailureClass, FinishReason, Usage};

use super::error::sse_error_event;
use super::response::{UsageBody, stop_reason, tool_id};

/// A committed [`ChatStream`] as Anthropic's server-sent events, each
/// `event: <type>\ndata: <json>\n\n`, in the order Anthropic sends them:
///
/// 1. `message_start` (the message with empty content; its usage has the
///    input tokens when the stream reported them before its first
///    content, else 0) and a `ping`;
/// 2. per content block, in order: `content_block_start`, its
///    `content_block_delta`s and `content_block_stop`. Text is a `text`
///    block of `text_delta`s; each tool call a `tool_use` block (its id
///    and name, `input: {}`) of `input_json_delta`s. Blocks are numbered
///    from 0 in the order they open; a chunk of another kind, or of
///    another tool call, closes the open block;
/// 3. `message_delta` (`stop_reason`, as [`write_response`](super::write_response)
///    names it, and the usage: `output_tokens`, and `input_tokens` and
///    `cache_read_input_tokens` once known) and `message_stop`. A stream
///    that was continued after it broke (see
///    [`ChatStream::continuations`]) says so just before `message_stop`
///    with an SSE comment line, `: continued N` (N continuations), which
///    SSE clients ignore.
///
/// Usage reported in parts (Anthropic: input first, output last; OpenAI:
/// all at the end) keeps every count. A failure after the commit point is
/// one [`sse_error_event`] and the end of the frames (no `message_stop`),
/// as Anthropic ends a stream that fails. So is a fragment of a tool call
/// whose block was already closed (an upstream that interleaves its tool
/// calls: Anthropic's blocks cannot reopen). Chunks of a choice other
/// than the first only count for usage: an Anthropic message has one.
///
/// Each poll yields the events of one chunk (a block's stop and the next
/// one's start travel together); chunks that say nothing send nothing.
///
/// ```
/// # use std::pin::Pin;
/// use futures_core::Stream;
/// use tower_llm_core::{ChatChunk, ChatStream, FinishReason};
/// use tower_llm_providers::anthropic::server::SseFrames;
///
/// let chunk = |t: &str| Ok(ChatChunk { text: Some(t.into()), ..ChatChunk::default() });
/// let stream = ChatStream::from_chunks("mock", "m", vec![chunk("Hel"), chunk("lo")]);
/// let mut frames = SseFrames::new(stream, "msg_1".into());
/// let mut out = String::new();
/// let waker = std::task::Waker::noop();
/// let mut cx = std::task::Context::from_waker(&waker);
/// while let std::task::Poll::Ready(Some(frame)) = Pin::new(&mut frames).poll_next(&mut cx) {
///     out.push_str(std::str::from_utf8(&frame).unwrap());
/// }
/// assert!(out.starts_with("event: message_start\ndata: {"));
/// assert!(out.contains(r#"{"type":"text_delta","text":"lo"}"#));
/// assert!(out.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
/// ```
#[derive(Debug)]
pub struct SseFrames {
    stream: ChatStream,
    id: String,
    model: String,
    /// `message_start` was sent.
    started: bool,
    done: bool,
    /// The block being streamed, if any.
    open: Option<Open>,
    /// The index of the next block.
    next_block: u32,
    /// The tool calls (by their index) whose blocks were closed.
    closed_tools: HashSet<u32>,
    /// A tool call was sent.
    called_tools: bool,
    finish: Option<FinishReason>,
    usage: Usage,
}

/// The kind of the open block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    /// The tool call of this index.
    Tool(u32),
}

impl SseFrames {
    /// The frames of `stream`, as the message `id` (Anthropic's ids start
    /// with `msg_`), named by the stream's model.
    pub fn new(stream: ChatStream, id: String) -> Self {
        let model = stream.model().to_owned();
        SseFrames {
            stream,
            id,
            model,
            started: false,
            done: false,
            open: None,
            next_block: 0,
            closed_tools: HashSet::new(),
            called_tools: false,
            finish: None,
            usage: Usage::default(),
        }
    }

    /// `message_start` and a `ping`, the first time.
    fn start(&mut self, out: &mut Vec<u8>) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        let usage = UsageBody::new(self.usage);
        write_event(
            out,
            "message_start",
            &Event::MessageStart {
                message: StartMessage {
                    id: &self.id,
                    kind: "message",
                    role: "assistant",
                    model: &self.model,
                    content: [],
                    stop_reason: None,
                    stop_sequence: None,
                    usage,
                },
            },
        );
        write_event(out, "ping", &Event::Ping);
    }

    /// `content_block_stop` of the open block, if any.
    fn close(&mut self, out: &mut Vec<u8>) {
        if let Some(open) = self.open.take() {
            if let Open::Tool(index) = open {
                self.closed_tools.insert(index);
            }
            // Blocks are numbered from 0: the open one is the last.
            let index = self.next_block.saturating_sub(1);
            write_event(
                out,
                "content_block_stop",
                &Event::ContentBlockStop { index },
            );
        }
    }

    /// `content_block_start` of a new block, closing the open one.
    fn open(&mut self, out: &mut Vec<u8>, open: Open, block: BlockStart<'_>) {
        self.close(out);
        let index = self.next_block;
        self.next_block = self.next_block.saturating_add(1);
        self.open = Some(open);
        write_event(
            out,
            "content_block_start",
            &Event::ContentBlockStart {
                index,
                content_block: block,
            },
        );
    }

    /// `content_block_delta` to the open block.
    fn delta(&self, out: &mut Vec<u8>, delta: Delta<'_>) {
        let index = self.next_block.saturating_sub(1);
        write_event(
            out,
            "content_block_delta",
            &Event::ContentBlockDelta { index, delta },
        );
    }

    /// The events of one chunk of the first choice.
    fn chunk(&mut self, out: &mut Vec<u8>, chunk: &ChatChunk) -> Result<(), Failure> {
        if let Some(text) = chunk.text.as_deref().filter(|t| !t.is_empty()) {
            self.start(out);
            if self.open != Some(Open::Text) {
                self.open(out, Open::Text, BlockStart::Text { text: "" });
            }
            self.delta(out, Delta::TextDelta { text });
        }
        if let Some(call) = &chunk.tool_call {
            self.start(out);
            if self.open != Some(Open::Tool(call.index)) {
                if self.closed_tools.contains(&call.index) {
                    return Err(Failure::new(FailureClass::InvalidResponse).with_message(
                        "the upstream interleaved its tool calls: a closed tool_use block cannot reopen",
                    ));
                }
                let id = match call.id.as_deref() {
                    Some(id) if !id.is_empty() => id.to_owned(),
                    _ => tool_id(&self.id, self.next_block as usize),
                };
                let name = call.name.as_deref().unwrap_or_default();
                self.open(
                    out,
                    Open::Tool(call.index),
                    BlockStart::ToolUse {
                        id: &id,
                        name,
                        input: Empty {},
                    },
                );
                self.called_tools = true;
            }
            if !call.arguments.is_empty() {
                self.delta(
                    out,
                    Delta::InputJsonDelta {
                        partial_json: &call.arguments,
                    },
                );
            }
        }
        if let Some(reason) = chunk.finish_reason {
            self.finish = Some(reason);
        }
        Ok(())
    }

    /// The end of a clean stream: the open block's stop, `message_delta`
    /// and `message_stop`.
    fn end(&mut self, out: &mut Vec<u8>) {
        self.start(out);
        self.close(out);
        let mut usage = UsageBody::new(self.usage);
        if self.usage.prompt_tokens == 0 {
            usage.input_tokens = None;
        }
        write_event(
            out,
            "message_delta",
            &Event::MessageDelta {
                delta: MessageDelta {
                    stop_reason: stop_reason(self.finish, self.called_tools),
                    stop_sequence: None,
                },
                usage,
            },
        );
        write_continued(out, &self.stream);
        write_event(out, "message_stop", &Event::MessageStop);
    }
}

/// Keeps every count a provider reported (Anthropic: input first, output
/// last).
fn merge_usage(into: &mut Usage, u: Usage) {
    if u.prompt_tokens > 0 {
        into.prompt_tokens = u.prompt_tokens;
    }
    if u.completion_tokens > 0 {
        into.completion_tokens = u.completion_tokens;
    }
    if u.cached_input_tokens > 0 {
        into.cached_input_tokens = u.cached_input_tokens;
    }
}

impl futures_core::Stream for SseFrames {
    type Item = bytes::Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let mut out = Vec::new();
        while out.is_empty() {
            match std::task::ready!(Pin::new(&mut this.stream).poll_next(cx)) {
                Some(Ok(chunk)) => {
                    if let Some(u) = chunk.usage {
                        merge_usage(&mut this.usage, u);
                    }
                    if chunk.index != 0 {
                        continue;
                    }
                    if let Err(f) = this.chunk(&mut out, &chunk) {
                        this.done = true;
                        out.extend_from_slice(&sse_error_event(&f));
                    }
                }
                Some(Err(f)) => {
                    this.done = true;
                    out.extend_from_slice(&sse_error_event(&f));
                }
                None => {
                    this.done = true;
                    this.end(&mut out);
                }
            }
        }
        Poll::Ready(Some(bytes::Bytes::from(out)))
    }
}

/// `: continued N\n\n` when `stream` was continued N > 0 times: an SSE
/// comment, ignored by clients, for those who look.
fn write_continued(out: &mut Vec<u8>, stream: &ChatStream) {
    let n = stream.continuations().count();
    if n > 0 {
        out.extend_from_slice(format!(": continued {n}\n\n").as_bytes());
    }
}

/// Appends `event: <name>\ndata: <event>\n\n` to `out`.
fn write_event(out: &mut Vec<u8>, name: &str, event: &Event<'_>) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    // Writing borrowed strings and numbers to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, event);
    out.extend_from_slice(b"\n\n");
}

/// The events, borrowed from the chunks they encode.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event<'a> {
    MessageStart {
        message: StartMessage<'a>,
    },
    ContentBlockStart {
        index: u32,
        content_block: BlockStart<'a>,
    },
    ContentBlockDelta {
        index: u32,
        delta: Delta<'a>,
    },
    ContentBlockStop {
        index: u32,
    },
    MessageDelta {
        delta: MessageDelta,
        usage: UsageBody,
    },
    MessageStop,
    Ping,
}

#[derive(Serialize)]
struct StartMessage<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: [Empty; 0],
    stop_reason: Option<&'static str>,
    stop_sequence: Option<&'static str>,
    usage: UsageBody,
}

/// `{}`.
#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockStart<'a> {
    Text {
        text: &'static str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Empty,
    },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Delta<'a> {
    TextDelta { text: &'a str },
    InputJsonDelta { partial_json: &'a str },
}

#[derive(Serialize)]
struct MessageDelta {
    stop_reason: &'static str,
    stop_sequence: Option<&'static str>,
}
