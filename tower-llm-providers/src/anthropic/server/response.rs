//! Answers out: a [`ChatResponse`] as an Anthropic `message` body, written
//! from a borrowed view of the answer.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use serde_json::Value;
use tower_llm_core::{ChatResponse, Choice, FinishReason, ToolCall, Usage};

use crate::wire::tool_input;

/// A `message` body for `res`, under the name `model` (the alias the
/// client asked for, or the model that served). [`write_response`]
/// writes the same JSON straight to bytes; see it for what each field
/// holds.
///
/// ```
/// use tower_llm_core::{ChatResponse, FinishReason, ToolCall};
/// use tower_llm_providers::anthropic::server::encode_response;
///
/// let res = ChatResponse::builder("gpt-4o-mini")
///     .id("chatcmpl-1")
///     .tool_call(ToolCall {
///         id: "call_1".into(),
///         name: "get_weather".into(),
///         arguments: r#"{"location": "Paris"}"#.into(),
///     })
///     .finish_reason(FinishReason::ToolCalls)
///     .build();
/// let body = encode_response(&res, "smart");
/// assert_eq!(body["id"], "msg_chatcmpl-1");
/// assert_eq!(body["model"], "smart");
/// assert_eq!(
///     body["content"],
///     serde_json::json!([{"type": "tool_use", "id": "call_1", "name": "get_weather",
///                         "input": {"location": "Paris"}}])
/// );
/// assert_eq!(body["stop_reason"], "tool_use");
/// ```
pub fn encode_response(res: &ChatResponse, model: &str) -> Value {
    serde_json::to_value(MessageBody::new(res, model)).unwrap_or(Value::Null)
}

/// The bytes of an Anthropic `message` body for `res`, under the name
/// `model`, written straight from `res` (no [`Value`] is built but each
/// tool call's `input`):
///
/// - `id`: the answer's id when it starts with `msg_`, else `msg_`
///   followed by it; an answer without an id gets a fresh one
///   (`msg_` and 24 hex digits: the time and a process-wide counter).
/// - `content`: the first choice's text as one `text` block (left out
///   when it is empty and there are tool calls), then one `tool_use`
///   block per tool call. `input` is the call's arguments parsed as a
///   JSON object; arguments that are not one (a model's broken JSON) are
///   `{}`, as Anthropic's clients expect an object there. A call without
///   an id gets `toolu_<message id without msg_>_<block index>`.
/// - `stop_reason`: `end_turn` (stop, other), `max_tokens`, `tool_use`,
///   `refusal` (content filter); `tool_use` whenever there are tool calls
///   (some upstreams stop with "stop" after calling tools, and Anthropic
///   clients loop on `tool_use`). `stop_sequence` is `null`: the
///   normalised answer does not say which stop sequence matched, so a
///   stop sequence reads as `end_turn`.
/// - `usage`: `input_tokens` excludes cache reads, as Anthropic counts
///   (the answer's prompt tokens less its cached input tokens),
///   `output_tokens`, and `cache_read_input_tokens` when there were any.
///   Cache writes are not told apart: they are in `input_tokens`.
///
/// ```
/// use tower_llm_core::{ChatResponse, Choice, FinishReason, Usage};
/// use tower_llm_providers::anthropic::server::write_response;
///
/// let res = ChatResponse {
///     id: "msg_01".into(),
///     choices: vec![Choice {
///         index: 0,
///         text: "Hi".into(),
///         tool_calls: Vec::new(),
///         finish_reason: FinishReason::Stop,
///     }],
///     usage: Usage { prompt_tokens: 10, completion_tokens: 2, cached_input_tokens: 4 },
///     ..ChatResponse::default()
/// };
/// let body: serde_json::Value = serde_json::from_slice(&write_response(&res, "smart")).unwrap();
/// assert_eq!(body["content"][0]["text"], "Hi");
/// assert_eq!(body["stop_reason"], "end_turn");
/// assert_eq!(body["usage"]["input_tokens"], 6);
/// assert_eq!(body["usage"]["cache_read_input_tokens"], 4);
/// ```
pub fn write_response(res: &ChatResponse, model: &str) -> Vec<u8> {
    let text = res.choices.first().map_or(0, |c| c.text.len());
    let mut out = Vec::with_capacity(256 + text);
    // Writing borrowed strings, numbers and JSON values to a Vec cannot
    // fail.
    let _ = serde_json::to_writer(&mut out, &MessageBody::new(res, model));
    out
}

/// The Anthropic `stop_reason` of a normalised finish reason; `tool_use`
/// whenever the answer called tools.
pub(super) fn stop_reason(reason: Option<FinishReason>, called_tools: bool) -> &'static str {
    match reason {
        Some(FinishReason::Length) => "max_tokens",
        Some(FinishReason::ContentFilter) => "refusal",
        _ if called_tools => "tool_use",
        Some(FinishReason::ToolCalls) => "tool_use",
        // Stop, other, none, and reasons the Anthropic wire has no name
        // for.
        _ => "end_turn",
    }
}

/// The id of a tool call that came without one, from its message's id
/// and its block's index: unique within the message.
pub(super) fn tool_id(message_id: &str, index: usize) -> String {
    let id = message_id.strip_prefix("msg_").unwrap_or(message_id);
    format!("toolu_{id}_{index}")
}

/// `id` as an Anthropic message id: as it is when it starts with `msg_`,
/// else prefixed; a fresh one when empty.
fn message_id(id: &str) -> Cow<'_, str> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    if id.starts_with("msg_") {
        Cow::Borrowed(id)
    } else if id.is_empty() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        Cow::Owned(format!("msg_{now:016x}{:08x}", n as u32))
    } else {
        Cow::Owned(format!("msg_{id}"))
    }
}

/// Anthropic's usage counts: `input_tokens` without the cache reads.
#[derive(Serialize)]
pub(super) struct UsageBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) input_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cache_read_input_tokens: Option<u32>,
    pub(super) output_tokens: u32,
}

impl UsageBody {
    /// Every count of `u` (cache reads when there were any).
    pub(super) fn new(u: Usage) -> Self {
        UsageBody {
            input_tokens: Some(u.prompt_tokens.saturating_sub(u.cached_input_tokens)),
            cache_read_input_tokens: (u.cached_input_tokens > 0).then_some(u.cached_input_tokens),
            output_tokens: u.completion_tokens,
        }
    }
}

/// The answer body, borrowed from the answer it encodes.
#[derive(Serialize)]
struct MessageBody<'a> {
    id: Cow<'a, str>,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: Vec<Block<'a>>,
    stop_reason: &'static str,
    stop_sequence: Option<&'a str>,
    usage: UsageBody,
}

impl<'a> MessageBody<'a> {
    fn new(res: &'a ChatResponse, model: &'a str) -> Self {
        let id = message_id(&res.id);
        let mut content = Vec::new();
        // No choice reads as an empty one.
        let (text, tool_calls, reason) = match res.choices.first() {
            Some(Choice {
                text,
                tool_calls,
                finish_reason,
                ..
            }) => (text.as_str(), &tool_calls[..], Some(*finish_reason)),
            None => ("", &[][..], None),
        };
        if !text.is_empty() || tool_calls.is_empty() {
            content.push(Block::Text { text });
        }
        for call in tool_calls {
            content.push(Block::tool_use(call, &id, content.len()));
        }
        MessageBody {
            kind: "message",
            role: "assistant",
            model,
            content,
            stop_reason: stop_reason(reason, !tool_calls.is_empty()),
            stop_sequence: None,
            usage: UsageBody::new(res.usage),
            id,
        }
    }
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: &'a str,
    },
    ToolUse {
        id: Cow<'a, str>,
        name: &'a str,
        input: Value,
    },
}

impl<'a> Block<'a> {
    /// The block of `call`, at `index` in the content of message
    /// `message_id`.
    fn tool_use(call: &'a ToolCall, message_id: &str, index: usize) -> Self {
        Block::ToolUse {
            id: if call.id.is_empty() {
                Cow::Owned(tool_id(message_id, index))
            } else {
                Cow::Borrowed(&call.id)
            },
            name: &call.name,
            input: tool_input(&call.arguments),
        }
    }
}
