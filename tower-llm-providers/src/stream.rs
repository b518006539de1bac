//! Parsing of streamed answers: server-sent events, and the OpenAI and
//! Anthropic stream shapes turned into [`ChatChunk`]s.
//!
//! These are the pure, incremental parsers under the streaming services:
//! feed them bytes as they arrive, in chunks of any size. The streaming
//! services of [`streaming`](crate::streaming) build on them.

use serde::Deserialize;
use tower_llm_core::{ChatChunk, Failure, FailureClass, FinishReason, ToolCallDelta, Usage};

use crate::failure::Scrub;

/// The largest single event accepted (1 MiB); a larger one is an
/// invalid-response failure, so memory stays bounded.
pub const MAX_EVENT: usize = 1024 * 1024;

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// An incremental server-sent-events parser (the WHATWG rules: a leading
/// byte order mark is skipped; lines end in
/// `\n`, `\r\n` or `\r`; `:` starts a comment; a blank line ends an event;
/// `id:` and `retry:` are ignored; an event with no data is dropped).
///
/// ```
/// use tower_llm_providers::stream::SseParser;
///
/// let mut p = SseParser::new();
/// assert!(p.push(b"event: ping\r\nda").unwrap().is_empty());
/// let events = p.push(b"ta: {}\r\n\r\n").unwrap();
/// assert_eq!(events[0].event.as_deref(), Some("ping"));
/// assert_eq!(events[0].data, "{}");
/// ```
#[derive(Debug, Default)]
pub struct SseParser {
    started: bool,
    line: Vec<u8>,
    skip_lf: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        SseParser::default()
    }

    /// Feeds the next bytes; returns the events they complete.
    ///
    /// # Errors
    ///
    /// An event over [`MAX_EVENT`] bytes, or a line that is not UTF-8: an
    /// invalid-response failure (the stream cannot be trusted after it).
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, Failure> {
        let mut events = Vec::new();
        self.push_with(bytes, |e| events.push(e))?;
        Ok(events)
    }

    /// Feeds the next bytes, handing each event they complete to `on_event`
    /// (no allocation for the events themselves).
    ///
    /// # Errors
    ///
    /// As [`push`](Self::push).
    pub fn push_with(
        &mut self,
        bytes: &[u8],
        mut on_event: impl FnMut(SseEvent),
    ) -> Result<(), Failure> {
        let mut rest = bytes;
        if !self.started && !rest.is_empty() {
            // A UTF-8 byte order mark may open the stream.
            self.started = true;
            rest = rest.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(rest);
        }
        while let Some(&b) = rest.first() {
            if self.skip_lf {
                self.skip_lf = false;
                if b == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            // Copy up to the end of the line in one go.
            let end = rest
                .iter()
                .position(|&c| c == b'\n' || c == b'\r')
                .unwrap_or(rest.len());
            if self.line.len() + self.data.len() + end > MAX_EVENT {
                return Err(too_big());
            }
            self.line.extend_from_slice(&rest[..end]);
            let Some(&terminator) = rest.get(end) else {
                break;
            };
            rest = &rest[end + 1..];
            self.skip_lf = terminator == b'\r';
            if let Some(event) = self.end_line()? {
                on_event(event);
            }
        }
        Ok(())
    }

    /// `true` when no part of an event is buffered: the bytes so far end
    /// exactly at an event's end (or hold only comments and blank lines).
    /// A body that ends here ends cleanly; one that ends elsewhere was cut
    /// in the middle of an event.
    pub(crate) fn is_between_events(&self) -> bool {
        self.line.is_empty() && !self.has_data && self.event.is_none()
    }

    fn end_line(&mut self) -> Result<Option<SseEvent>, Failure> {
        if self.line.is_empty() {
            // Dispatch.
            let event = self.event.take();
            let data = std::mem::take(&mut self.data);
            let had = std::mem::replace(&mut self.has_data, false);
            return Ok(had.then_some(SseEvent { event, data }));
        }
        let SseParser {
            line,
            event,
            data,
            has_data,
            ..
        } = self;
        let text = std::str::from_utf8(line).map_err(|_| {
            Failure::new(FailureClass::InvalidResponse).with_message("an SSE line is not UTF-8")
        })?;
        if !text.starts_with(':') {
            let (field, value) = match text.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (text, ""),
            };
            match field {
                "event" => *event = Some(value.to_owned()),
                "data" => {
                    if *has_data {
                        data.push('\n');
                    }
                    data.push_str(value);
                    *has_data = true;
                    if data.len() > MAX_EVENT {
                        return Err(too_big());
                    }
                }
                _ => {}
            }
        }
        line.clear();
        Ok(None)
    }
}

fn too_big() -> Failure {
    Failure::new(FailureClass::InvalidResponse)
        .with_message(format!("an SSE event is over {MAX_EVENT} bytes"))
}

/// What one streamed event means.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    /// Content (or usage) to hand on.
    Chunk(ChatChunk),
    /// Several chunks from one event (an OpenAI delta carrying more than
    /// one tool call), in order.
    Chunks(Vec<ChatChunk>),
    /// The stream's terminator (`[DONE]`, `message_stop`).
    Done,
    /// Nothing for the caller (a ping, a start or stop marker).
    Skip,
}

impl StreamItem {
    /// `true` for a chunk carrying content (text or a tool-call fragment):
    /// the first one is a stream's commit point.
    pub fn is_content(&self) -> bool {
        let content = |c: &ChatChunk| {
            c.text.as_deref().is_some_and(|t| !t.is_empty()) || c.tool_call.is_some()
        };
        match self {
            StreamItem::Chunk(c) => content(c),
            StreamItem::Chunks(cs) => cs.iter().any(content),
            StreamItem::Done | StreamItem::Skip => false,
        }
    }
}

#[derive(Deserialize)]
struct OpenAiChunk {
    #[serde(default)]
    choices: Vec<OpenAiChoice>,
    #[serde(default)]
    usage: Option<OpenAiUsage>,
    #[serde(default)]
    error: Option<WireError>,
}

#[derive(Deserialize)]
struct OpenAiChoice {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    delta: OpenAiDelta,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct OpenAiDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<OpenAiToolDelta>>,
}

#[derive(Deserialize)]
struct OpenAiToolDelta {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<OpenAiFunctionDelta>,
}

#[derive(Deserialize)]
struct OpenAiFunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct OpenAiUsage {
    #[serde(default)]
    prompt_tokens: Option<u32>,
    #[serde(default)]
    completion_tokens: Option<u32>,
}

#[derive(Deserialize, Default)]
struct WireError {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// The failure class of an in-band stream error, by its `type`; its
/// message is kept with the secrets of `scrub` removed, then bounded.
fn in_band(provider: &'static str, error: WireError, scrub: &Scrub) -> Failure {
    let class = match error.kind.as_deref() {
        Some("overloaded_error" | "server_error" | "api_error") => FailureClass::Transient,
        Some("rate_limit_error" | "tokens" | "requests") => FailureClass::RateLimited,
        Some("insufficient_quota") => FailureClass::QuotaExhausted,
        Some("invalid_request_error") => FailureClass::BadRequest,
        Some("authentication_error" | "permission_error") => FailureClass::Auth,
        // An unknown in-band error: something went wrong upstream.
        _ => FailureClass::Transient,
    };
    let mut f = Failure::new(class).with_provider(provider);
    if let Some(m) = error.message {
        f = f.with_message(scrub.message(&m));
    }
    f
}

fn finish(reason: Option<&str>) -> Option<FinishReason> {
    Some(match reason? {
        "stop" | "end_turn" | "stop_sequence" => FinishReason::Stop,
        "length" | "max_tokens" => FinishReason::Length,
        "tool_calls" | "tool_use" | "function_call" => FinishReason::ToolCalls,
        "content_filter" | "refusal" => FinishReason::ContentFilter,
        _ => FinishReason::Other,
    })
}

/// Turns OpenAI Chat Completions stream events into [`StreamItem`]s.
///
/// # Errors
///
/// An in-band `error` object (classified by its `type`: `server_error` is
/// transient, ...) or malformed JSON (invalid response).
pub fn openai_event(event: &SseEvent) -> Result<StreamItem, Failure> {
    openai_event_scrubbed(event, &Scrub::none())
}

/// As [`openai_event`], removing the secrets of `scrub` from an in-band
/// error's message before it is bounded.
pub(crate) fn openai_event_scrubbed(
    event: &SseEvent,
    scrub: &Scrub,
) -> Result<StreamItem, Failure> {
    if event.data.trim() == "[DONE]" {
        return Ok(StreamItem::Done);
    }
    let chunk: OpenAiChunk = serde_json::from_str(&event.data)
        .map_err(|e| crate::failure::invalid_json("openai", &e))?;
    if let Some(error) = chunk.error {
        return Err(in_band("openai", error, scrub));
    }
    let usage = chunk.usage.map(|u| Usage {
        prompt_tokens: u.prompt_tokens.unwrap_or(0),
        completion_tokens: u.completion_tokens.unwrap_or(0),
        cached_input_tokens: 0,
    });
    let Some(choice) = chunk.choices.into_iter().next() else {
        return Ok(match usage {
            Some(usage) => StreamItem::Chunk(ChatChunk {
                usage: Some(usage),
                ..ChatChunk::default()
            }),
            None => StreamItem::Skip,
        });
    };
    let mut calls = choice
        .delta
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .map(|t| ToolCallDelta {
            index: t.index,
            id: t.id,
            name: t.function.as_ref().and_then(|f| f.name.clone()),
            arguments: t.function.and_then(|f| f.arguments).unwrap_or_default(),
        });
    let first = ChatChunk {
        index: choice.index,
        text: choice.delta.content,
        tool_call: calls.next(),
        finish_reason: finish(choice.finish_reason.as_deref()),
        usage,
    };
    let rest: Vec<ToolCallDelta> = calls.collect();
    if rest.is_empty() {
        return Ok(StreamItem::Chunk(first));
    }
    // One chunk per tool call; the finish reason and usage go last.
    let (finish_reason, usage) = (first.finish_reason, first.usage);
    let mut chunks = vec![ChatChunk {
        finish_reason: None,
        usage: None,
        ..first
    }];
    chunks.extend(rest.into_iter().map(|call| ChatChunk {
        index: choice.index,
        tool_call: Some(call),
        ..ChatChunk::default()
    }));
    if let Some(last) = chunks.last_mut() {
        last.finish_reason = finish_reason;
        last.usage = usage;
    }
    Ok(StreamItem::Chunks(chunks))
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum AnthropicEvent {
    MessageStart {
        message: AnthropicMessageStart,
    },
    ContentBlockStart {
        index: u32,
        content_block: AnthropicBlockStart,
    },
    ContentBlockDelta {
        index: u32,
        delta: AnthropicDelta,
    },
    ContentBlockStop {},
    MessageDelta {
        #[serde(default)]
        delta: AnthropicMessageDelta,
        #[serde(default)]
        usage: Option<AnthropicUsage>,
    },
    MessageStop {},
    Ping {},
    Error {
        error: WireError,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
struct AnthropicMessageStart {
    #[serde(default)]
    usage: Option<AnthropicUsage>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum AnthropicBlockStart {
    ToolUse {
        id: String,
        name: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum AnthropicDelta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
struct AnthropicMessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Deserialize)]
struct AnthropicUsage {
    #[serde(default)]
    input_tokens: Option<u32>,
    #[serde(default)]
    output_tokens: Option<u32>,
    #[serde(default)]
    cache_read_input_tokens: Option<u32>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u32>,
}

/// Turns Anthropic Messages stream events into [`StreamItem`]s.
///
/// # Errors
///
/// An in-band `error` event (`overloaded_error` is transient, ...) or
/// malformed JSON (invalid response).
pub fn anthropic_event(event: &SseEvent) -> Result<StreamItem, Failure> {
    anthropic_event_scrubbed(event, &Scrub::none())
}

/// As [`anthropic_event`], removing the secrets of `scrub` from an in-band
/// error's message before it is bounded.
pub(crate) fn anthropic_event_scrubbed(
    event: &SseEvent,
    scrub: &Scrub,
) -> Result<StreamItem, Failure> {
    let parsed: AnthropicEvent = serde_json::from_str(&event.data)
        .map_err(|e| crate::failure::invalid_json("anthropic", &e))?;
    let usage = |u: AnthropicUsage| {
        let read = u.cache_read_input_tokens.unwrap_or(0);
        Usage {
            prompt_tokens: u
                .input_tokens
                .unwrap_or(0)
                .saturating_add(read)
                .saturating_add(u.cache_creation_input_tokens.unwrap_or(0)),
            completion_tokens: u.output_tokens.unwrap_or(0),
            cached_input_tokens: read,
        }
    };
    Ok(match parsed {
        AnthropicEvent::Error { error } => return Err(in_band("anthropic", error, scrub)),
        AnthropicEvent::MessageStop {} => StreamItem::Done,
        AnthropicEvent::MessageStart { message } => match message.usage {
            Some(u) => StreamItem::Chunk(ChatChunk {
                usage: Some(usage(u)),
                ..ChatChunk::default()
            }),
            None => StreamItem::Skip,
        },
        AnthropicEvent::ContentBlockStart {
            index,
            content_block: AnthropicBlockStart::ToolUse { id, name },
        } => StreamItem::Chunk(ChatChunk {
            tool_call: Some(ToolCallDelta {
                index,
                id: Some(id),
                name: Some(name),
                arguments: String::new(),
            }),
            ..ChatChunk::default()
        }),
        AnthropicEvent::ContentBlockDelta { index, delta } => match delta {
            AnthropicDelta::TextDelta { text } => StreamItem::Chunk(ChatChunk {
                text: Some(text),
                ..ChatChunk::default()
            }),
            AnthropicDelta::InputJsonDelta { partial_json } => StreamItem::Chunk(ChatChunk {
                tool_call: Some(ToolCallDelta {
                    index,
                    id: None,
                    name: None,
                    arguments: partial_json,
                }),
                ..ChatChunk::default()
            }),
            AnthropicDelta::Other => StreamItem::Skip,
        },
        AnthropicEvent::MessageDelta { delta, usage: u } => StreamItem::Chunk(ChatChunk {
            finish_reason: finish(delta.stop_reason.as_deref()),
            usage: u.map(usage),
            ..ChatChunk::default()
        }),
        AnthropicEvent::ContentBlockStart { .. }
        | AnthropicEvent::ContentBlockStop {}
        | AnthropicEvent::Ping {}
        | AnthropicEvent::Unknown => StreamItem::Skip,
    })
}
