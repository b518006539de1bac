//! Answers out: a [`ChatResponse`] as a `chat.completion` body and a
//! [`ChatChunk`] as a `chat.completion.chunk`, written from borrowed views
//! of the answer.

use serde::Serialize;
use serde_json::Value;
use tower_llm_core::{ChatChunk, ChatResponse, FinishReason, ToolCall};

/// The OpenAI `finish_reason` of a normalised one.
pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop | FinishReason::Other => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::ContentFilter => "content_filter",
        // A reason the OpenAI wire has no name for ends as `Other` does.
        _ => "stop",
    }
}

/// A `chat.completion` body for `res`, under the name `model` (the alias
/// the client asked for, or the model that served), created at
/// `created` (Unix seconds). [`write_response`] writes the same JSON
/// straight to bytes.
pub fn encode_response(res: &ChatResponse, model: &str, created: u64) -> Value {
    serde_json::to_value(CompletionBody::new(res, model, created)).unwrap_or(Value::Null)
}

/// The bytes of [`encode_response`]'s body, written straight from `res`
/// (no [`Value`] is built: a gateway's answer path).
///
/// ```
/// use tower_llm_core::{ChatResponse, Choice, FinishReason};
/// use tower_llm_providers::openai::server::write_response;
///
/// let res = ChatResponse {
///     choices: vec![Choice {
///         index: 0,
///         text: "Hi".into(),
///         tool_calls: Vec::new(),
///         finish_reason: FinishReason::Stop,
///     }],
///     ..ChatResponse::default()
/// };
/// let body: serde_json::Value = serde_json::from_slice(&write_response(&res, "smart", 7)).unwrap();
/// assert_eq!(body["choices"][0]["message"]["content"], "Hi");
/// assert_eq!(body["model"], "smart");
/// ```
pub fn write_response(res: &ChatResponse, model: &str, created: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + res.choices.iter().map(|c| c.text.len()).sum::<usize>());
    // Writing borrowed strings and numbers to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut out, &CompletionBody::new(res, model, created));
    out
}

/// A `chat.completion.chunk` body for `chunk` (a usage-only chunk has
/// no choices, as with `stream_options.include_usage`).
pub fn encode_chunk(chunk: &ChatChunk, id: &str, model: &str, created: u64) -> Value {
    serde_json::to_value(ChunkBody::new(chunk, id, model, created, false)).unwrap_or(Value::Null)
}

/// As [`encode_chunk`], with `"role": "assistant"` in the delta (the
/// first chunk of a stream carries it).
pub fn encode_first_chunk(chunk: &ChatChunk, id: &str, model: &str, created: u64) -> Value {
    serde_json::to_value(ChunkBody::new(chunk, id, model, created, true)).unwrap_or(Value::Null)
}

/// Appends `data: <chunk>\n\n` (the SSE event of [`encode_chunk`], or
/// of [`encode_first_chunk`] when `first`) to `out`, written straight
/// from `chunk`.
pub(super) fn write_chunk_event(
    out: &mut Vec<u8>,
    chunk: &ChatChunk,
    id: &str,
    model: &str,
    created: u64,
    first: bool,
) {
    out.extend_from_slice(b"data: ");
    // Writing borrowed strings and numbers to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, &ChunkBody::new(chunk, id, model, created, first));
    out.extend_from_slice(b"\n\n");
}

/// The answer bodies, borrowed from the answer they encode.
#[derive(Serialize)]
struct CompletionBody<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Seq<'a, tower_llm_core::Choice, ChoiceBody<'a>>,
    usage: UsageBody,
}

impl<'a> CompletionBody<'a> {
    fn new(res: &'a ChatResponse, model: &'a str, created: u64) -> Self {
        CompletionBody {
            id: if res.id.is_empty() {
                "chatcmpl-tower-llm"
            } else {
                &res.id
            },
            object: "chat.completion",
            created,
            model,
            choices: Seq(&res.choices, ChoiceBody::new),
            usage: UsageBody::new(res.usage),
        }
    }
}

/// A slice serialized as a sequence of views of its items.
struct Seq<'a, T, B>(&'a [T], fn(&'a T) -> B);

impl<T, B: Serialize> Serialize for Seq<'_, T, B> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(self.1))
    }
}

#[derive(Serialize)]
struct ChoiceBody<'a> {
    index: u32,
    message: MessageBody<'a>,
    finish_reason: &'static str,
}

impl<'a> ChoiceBody<'a> {
    fn new(c: &'a tower_llm_core::Choice) -> Self {
        let tool_calls =
            (!c.tool_calls.is_empty()).then(|| Seq(&c.tool_calls[..], ToolCallBody::new));
        ChoiceBody {
            index: c.index,
            message: MessageBody {
                role: "assistant",
                content: (!c.text.is_empty() || c.tool_calls.is_empty()).then_some(&c.text),
                tool_calls,
            },
            finish_reason: finish_reason(c.finish_reason),
        }
    }
}

#[derive(Serialize)]
struct MessageBody<'a> {
    role: &'static str,
    /// `null` on a tool-call-only answer.
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Seq<'a, ToolCall, ToolCallBody<'a>>>,
}

#[derive(Serialize)]
struct ToolCallBody<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionBody<'a>,
}

impl<'a> ToolCallBody<'a> {
    fn new(t: &'a ToolCall) -> Self {
        ToolCallBody {
            id: &t.id,
            kind: "function",
            function: FunctionBody {
                name: Some(&t.name),
                arguments: &t.arguments,
            },
        }
    }
}

#[derive(Serialize)]
struct FunctionBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

#[derive(Serialize)]
struct UsageBody {
    prompt_tokens: u32,
    completion_tokens: u32,
    total_tokens: u32,
}

impl UsageBody {
    fn new(u: tower_llm_core::Usage) -> Self {
        UsageBody {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.total_tokens(),
        }
    }
}

#[derive(Serialize)]
struct ChunkBody<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    /// A list of none or one.
    #[serde(serialize_with = "zero_or_one")]
    choices: Option<DeltaChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageBody>,
}

impl<'a> ChunkBody<'a> {
    fn new(
        chunk: &'a ChatChunk,
        id: &'a str,
        model: &'a str,
        created: u64,
        first: bool,
    ) -> ChunkBody<'a> {
        let has_choice =
            chunk.text.is_some() || chunk.tool_call.is_some() || chunk.finish_reason.is_some();
        // The first chunk always has a choice: it carries the role.
        let choice = (has_choice || first).then(|| DeltaChoice {
            index: chunk.index,
            delta: DeltaBody {
                role: first.then_some("assistant"),
                content: chunk.text.as_deref(),
                tool_calls: chunk.tool_call.as_ref().map(|t| {
                    [ToolCallDeltaBody {
                        index: t.index,
                        id: t.id.as_deref(),
                        kind: t.id.as_ref().map(|_| "function"),
                        function: FunctionBody {
                            name: t.name.as_deref(),
                            arguments: &t.arguments,
                        },
                    }]
                }),
            },
            finish_reason: chunk.finish_reason.map(finish_reason),
        });
        ChunkBody {
            id,
            object: "chat.completion.chunk",
            created,
            model,
            choices: choice,
            usage: chunk.usage.map(UsageBody::new),
        }
    }
}

/// An optional item as a list of none or one.
fn zero_or_one<T: Serialize, S: serde::Serializer>(
    item: &Option<T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(item)
}

#[derive(Serialize)]
struct DeltaChoice<'a> {
    index: u32,
    delta: DeltaBody<'a>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
struct DeltaBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[ToolCallDeltaBody<'a>; 1]>,
}

#[derive(Serialize)]
struct ToolCallDeltaBody<'a> {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionBody<'a>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_encode_to_openai_shapes_and_bytes_match_values() {
        use tower_llm_core::{Choice, ToolCallDelta, Usage};
        let call = ToolCall {
            id: "call_1".into(),
            name: "lookup".into(),
            arguments: r#"{"q":"x"}"#.into(),
        };
        let res = ChatResponse {
            choices: vec![
                Choice {
                    index: 0,
                    text: "Hi \"there\"".into(),
                    tool_calls: Vec::new(),
                    finish_reason: FinishReason::Length,
                },
                Choice {
                    index: 1,
                    text: String::new(),
                    tool_calls: vec![call],
                    finish_reason: FinishReason::ToolCalls,
                },
            ],
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: 4,
                cached_input_tokens: 0,
            },
            ..ChatResponse::default()
        };
        let want = json!({
            "id": "chatcmpl-tower-llm", "object": "chat.completion", "created": 7,
            "model": "smart",
            "choices": [
                {"index": 0, "finish_reason": "length",
                 "message": {"role": "assistant", "content": "Hi \"there\""}},
                {"index": 1, "finish_reason": "tool_calls",
                 "message": {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "lookup", "arguments": "{\"q\":\"x\"}"}}]}},
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
        });
        assert_eq!(encode_response(&res, "smart", 7), want);
        let bytes: Value =
            serde_json::from_slice(&write_response(&res, "smart", 7)).expect("valid JSON");
        assert_eq!(bytes, want);
        // An empty answer still has its text, empty.
        let empty = encode_response(&ChatResponse::default(), "m", 1);
        assert_eq!(empty["choices"], json!([]));

        let head = json!({"id": "c", "object": "chat.completion.chunk", "created": 7,
                          "model": "smart"});
        let with = |extra: Value| {
            let mut v = head.clone();
            for (k, x) in extra.as_object().expect("object") {
                v[k] = x.clone();
            }
            v
        };
        let text = ChatChunk {
            text: Some("He".into()),
            ..ChatChunk::default()
        };
        assert_eq!(
            encode_chunk(&text, "c", "smart", 7),
            with(json!({"choices": [{"index": 0, "delta": {"content": "He"},
                                      "finish_reason": null}]}))
        );
        assert_eq!(
            encode_first_chunk(&text, "c", "smart", 7),
            with(json!({"choices": [{"index": 0,
                "delta": {"role": "assistant", "content": "He"}, "finish_reason": null}]}))
        );
        // A first chunk with nothing to say still carries the role.
        assert_eq!(
            encode_first_chunk(&ChatChunk::default(), "c", "smart", 7),
            with(
                json!({"choices": [{"index": 0, "delta": {"role": "assistant"},
                                      "finish_reason": null}]})
            )
        );
        let opening = ChatChunk {
            index: 2,
            tool_call: Some(ToolCallDelta {
                index: 1,
                id: Some("call_9".into()),
                name: Some("f".into()),
                arguments: String::new(),
            }),
            ..ChatChunk::default()
        };
        assert_eq!(
            encode_chunk(&opening, "c", "smart", 7),
            with(
                json!({"choices": [{"index": 2, "finish_reason": null, "delta": {
                "tool_calls": [{"index": 1, "id": "call_9", "type": "function",
                                "function": {"name": "f", "arguments": ""}}]}}]})
            )
        );
        let more = ChatChunk {
            tool_call: Some(ToolCallDelta {
                index: 1,
                id: None,
                name: None,
                arguments: "{\"a\"".into(),
            }),
            finish_reason: Some(FinishReason::ToolCalls),
            ..ChatChunk::default()
        };
        assert_eq!(
            encode_chunk(&more, "c", "smart", 7),
            with(
                json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "delta": {
                "tool_calls": [{"index": 1, "function": {"arguments": "{\"a\""}}]}}]})
            )
        );
        let usage = ChatChunk {
            usage: Some(Usage {
                prompt_tokens: 1,
                completion_tokens: 2,
                cached_input_tokens: 0,
            }),
            ..ChatChunk::default()
        };
        assert_eq!(
            encode_chunk(&usage, "c", "smart", 7),
            with(json!({"choices": [], "usage": {"prompt_tokens": 1,
                "completion_tokens": 2, "total_tokens": 3}}))
        );
        // The SSE event is the same JSON, framed.
        let mut event = Vec::new();
        write_chunk_event(&mut event, &opening, "c", "smart", 7, false);
        let event = std::str::from_utf8(&event).expect("UTF-8");
        let json = event
            .strip_prefix("data: ")
            .and_then(|e| e.strip_suffix("\n\n"))
            .expect("one data event");
        assert_eq!(
            serde_json::from_str::<Value>(json).expect("JSON"),
            encode_chunk(&opening, "c", "smart", 7)
        );
    }

    #[test]
    fn answers_and_chunks_encode_in_openai_shape() {
        let res = crate::openai::chat::decode(
            br#"{"id": "x", "model": "m", "choices": [{"index": 0,
                "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1}}"#,
            std::time::Duration::ZERO,
        )
        .expect("decodes");
        let body = encode_response(&res, "smart", 7);
        assert_eq!(body["choices"][0]["message"]["content"], "hi");
        assert_eq!(body["usage"]["total_tokens"], 4);
        assert_eq!(body["model"], "smart");
        let chunk = ChatChunk {
            text: Some("He".into()),
            ..ChatChunk::default()
        };
        let c = encode_chunk(&chunk, "id", "smart", 7);
        assert_eq!(c["choices"][0]["delta"]["content"], "He");
        let usage = ChatChunk {
            usage: Some(tower_llm_core::Usage {
                prompt_tokens: 1,
                completion_tokens: 2,
                cached_input_tokens: 0,
            }),
            ..ChatChunk::default()
        };
        let c = encode_chunk(&usage, "id", "smart", 7);
        assert_eq!(c["choices"], json!([]));
        assert_eq!(c["usage"]["total_tokens"], 3);
        // What we encode, our own client decodes.
        let event = crate::stream::SseEvent {
            event: None,
            data: encode_chunk(&chunk, "id", "smart", 7).to_string(),
        };
        assert!(
            crate::stream::openai_event(&event)
                .expect("decodes")
                .is_content()
        );
    }
}
