//! Requests in: an OpenAI Chat Completions request body read into a
//! [`ChatRequest`].

use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;
use tower_llm_core::{
    ChatRequest, ContentPart, Failure, FailureClass, Message, Role, Tool, ToolCall, ToolChoice,
};

// The tool-call shape is the one answers use.
use crate::openai::chat::WireToolCall;

/// `null` reads as the default, as OpenAI's API accepts.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Deserialize)]
struct WireRequest {
    model: String,
    messages: Vec<WireMessage>,
    #[serde(default, deserialize_with = "nullable")]
    tools: Vec<WireTool>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    stop: Option<Value>,
    #[serde(default, deserialize_with = "nullable")]
    stream: bool,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    response_format: Option<Value>,
}

#[derive(Deserialize)]
struct WireMessage {
    role: String,
    #[serde(default)]
    content: Option<Value>,
    #[serde(default, deserialize_with = "nullable")]
    tool_calls: Vec<WireToolCall>,
    #[serde(default)]
    tool_call_id: Option<String>,
}

#[derive(Deserialize)]
struct WireTool {
    function: WireToolDef,
}

#[derive(Deserialize)]
struct WireToolDef {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Value,
}

fn bad(message: impl Into<String>) -> Failure {
    Failure::new(FailureClass::BadRequest).with_message(crate::failure::bounded(&message.into()))
}

/// Reads an OpenAI Chat Completions request body into a
/// [`ChatRequest`] (`model` as sent: a gateway treats it as a route
/// alias). `developer` messages are system messages;
/// `max_completion_tokens` is `max_tokens`; `null` means absent.
/// Fields with no provider-neutral meaning (`user`, `seed`, penalties,
/// `logprobs`, `stream_options`, ...) are ignored; `n > 1` and a
/// non-text `response_format` are refused, since ignoring them would
/// change the answer.
///
/// # Errors
///
/// A bad-request failure naming what is wrong (malformed JSON, a
/// missing `model` or `messages`, an unknown role, a content part of
/// an unknown type).
///
/// ```
/// use tower_llm_providers::openai::server::decode_request;
///
/// let req = decode_request(br#"{"model": "smart", "stream": true,
///     "messages": [{"role": "user", "content": "Hi"}]}"#).unwrap();
/// assert_eq!(&*req.model, "smart");
/// assert!(req.stream);
/// assert!(decode_request(b"{").unwrap_err().is_bad_request());
/// ```
pub fn decode_request(body: &[u8]) -> Result<ChatRequest, Failure> {
    let wire: WireRequest =
        serde_json::from_slice(body).map_err(|e| bad(format!("invalid request body: {e}")))?;
    // Refused rather than silently dropped: an answer without them
    // would not be what the client asked for.
    if wire.n.is_some_and(|n| n > 1) {
        return Err(bad("n > 1 is not supported: ask once per choice"));
    }
    if let Some(format) = &wire.response_format {
        if format.get("type").and_then(Value::as_str) != Some("text") {
            return Err(bad(
                "response_format other than {\"type\": \"text\"} is not supported yet",
            ));
        }
    }
    let mut messages = Vec::with_capacity(wire.messages.len());
    for m in wire.messages {
        let role = match m.role.as_str() {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            other => return Err(bad(format!("unknown message role \"{other}\""))),
        };
        let content = match m.content {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(text)) => vec![ContentPart::Text { text }],
            Some(Value::Array(parts)) => parts
                .into_iter()
                .map(|part| match part.get("type").and_then(Value::as_str) {
                    Some("text") => Ok(ContentPart::Text {
                        text: part
                            .get("text")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                    }),
                    Some("image_url") => Ok(ContentPart::ImageUrl {
                        url: part
                            .pointer("/image_url/url")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                    }),
                    other => Err(bad(format!("unknown content part type {other:?}"))),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(bad("message content must be a string or an array")),
        };
        messages.push(Message {
            role,
            content,
            tool_calls: m
                .tool_calls
                .into_iter()
                .map(|c| ToolCall {
                    id: c.id,
                    name: c.function.name,
                    arguments: c.function.arguments,
                })
                .collect(),
            tool_call_id: m.tool_call_id,
        });
    }
    let tool_choice = match wire.tool_choice {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => return Err(bad(format!("unknown tool_choice \"{other}\""))),
        }),
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(name) => Some(ToolChoice::Tool(name.to_owned())),
            None => return Err(bad("tool_choice object without function.name")),
        },
    };
    let stop = match wire.stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(v)) => v
            .into_iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        Some(_) => return Err(bad("stop must be a string or an array of strings")),
    };
    let tools: Vec<Tool> = wire
        .tools
        .into_iter()
        .map(|t| Tool {
            name: t.function.name,
            description: t.function.description,
            parameters: t.function.parameters,
        })
        .collect();
    Ok(ChatRequest {
        model: wire.model.into(),
        messages: Arc::new(messages),
        tools: Arc::new(tools),
        tool_choice,
        temperature: wire.temperature,
        top_p: wire.top_p,
        max_tokens: wire.max_tokens.or(wire.max_completion_tokens),
        stop: Arc::new(stop),
        stream: wire.stream,
        ..ChatRequest::default()
    })
}

/// `stream_options.include_usage` in a request body (read without
/// building a copy of the rest of it): whether an OpenAI client asked
/// for the usage chunk at the end of a stream.
pub fn wants_usage(body: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Body {
        #[serde(default)]
        stream_options: Option<StreamOptions>,
    }
    #[derive(Deserialize)]
    struct StreamOptions {
        #[serde(default)]
        include_usage: Option<bool>,
    }
    serde_json::from_slice::<Body>(body)
        .ok()
        .and_then(|b| b.stream_options?.include_usage)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_decode_with_every_shape() {
        let req = decode_request(
            br#"{"model": "smart", "max_completion_tokens": 9, "stop": "END",
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "messages": [
              {"role": "developer", "content": "be brief"},
              {"role": "user", "content": [{"type": "text", "text": "look"},
                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
              {"role": "assistant", "content": null, "tool_calls": [
                 {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
              {"role": "tool", "tool_call_id": "c1", "content": "42"}]}"#,
        )
        .expect("valid");
        assert_eq!(req.messages[0].role, Role::System);
        assert_eq!(req.messages[1].content.len(), 2);
        assert_eq!(req.messages[2].tool_calls[0].id, "c1");
        assert_eq!(req.messages[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(req.max_tokens, Some(9));
        assert_eq!(*req.stop, ["END"]);
        assert_eq!(req.tool_choice, Some(ToolChoice::Tool("f".into())));
        // `null` is absent, as OpenAI's own API reads it.
        let req = decode_request(
            br#"{"model": "m", "stream": null, "tools": null, "n": 1, "user": "u",
            "response_format": {"type": "text"},
            "messages": [{"role": "assistant", "content": "x", "tool_calls": null}]}"#,
        )
        .expect("valid");
        assert!(!req.stream && req.tools.is_empty());
        for bad in [
            &b"{"[..],
            br#"{"messages": []}"#,
            br#"{"model": "m", "messages": [{"role": "robot", "content": "x"}]}"#,
            br#"{"model": "m", "messages": [{"role": "user", "content": 7}]}"#,
            br#"{"model": "m", "messages": [], "tool_choice": "sometimes"}"#,
            br#"{"model": "m", "messages": [], "n": 3}"#,
            br#"{"model": "m", "messages": [], "response_format": {"type": "json_object"}}"#,
        ] {
            assert!(decode_request(bad).unwrap_err().is_bad_request());
        }
    }
}
