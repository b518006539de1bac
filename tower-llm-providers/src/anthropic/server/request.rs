//! Requests in: an Anthropic Messages request body read into a
//! [`ChatRequest`].

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;
use tower_llm_core::{
    ChatRequest, ContentPart, Failure, FailureClass, Message, Role, Tool, ToolCall, ToolChoice,
};

/// `null` reads as the default, as Anthropic's SDKs send absent fields.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Deserialize)]
struct WireRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    messages: Option<Vec<WireMessage>>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default, deserialize_with = "nullable")]
    tools: Vec<Value>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default, deserialize_with = "nullable")]
    stop_sequences: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    stream: bool,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Value,
}

fn bad(message: impl Into<String>) -> Failure {
    Failure::new(FailureClass::BadRequest).with_message(crate::failure::bounded(&message.into()))
}

/// Where a value sits in the request, for error messages
/// (`messages[2].content[0]`).
#[derive(Clone, Copy)]
enum At<'a> {
    Field(&'static str),
    Index(&'a At<'a>, usize),
    Key(&'a At<'a>, &'static str),
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::Field(name) => f.write_str(name),
            At::Index(parent, i) => write!(f, "{parent}[{i}]"),
            At::Key(parent, key) => write!(f, "{parent}.{key}"),
        }
    }
}

/// The required string at `key` of `value`, moved out.
fn take_str(value: &mut Value, key: &'static str, at: &At<'_>) -> Result<String, Failure> {
    take_opt_str(value, key, at)?
        .ok_or_else(|| bad(format!("{}: Field required", At::Key(at, key))))
}

/// The string at `key` of `value`, moved out; absent or `null` is `None`.
fn take_opt_str(
    value: &mut Value,
    key: &'static str,
    at: &At<'_>,
) -> Result<Option<String>, Failure> {
    match value.get_mut(key).map(Value::take) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(bad(format!("{}: must be a string", At::Key(at, key)))),
    }
}

/// The `type` of a block (or a source, a tool choice), moved out.
fn kind(value: &mut Value, at: &At<'_>) -> Result<String, Failure> {
    take_str(value, "type", at)
}

/// Reads an Anthropic Messages request body (`POST /v1/messages`) into a
/// [`ChatRequest`] (`model` as sent: a gateway treats it as a route
/// alias).
///
/// What is carried:
///
/// - `system`, a string or an array of `text` blocks (joined with a
///   blank line), as one system message first;
/// - `messages`, `user` and `assistant`, with `content` a string or
///   blocks: `text`; `image` (a `base64` source becomes a
///   `data:<media_type>;base64,<data>` URL, a `url` source its URL);
///   `tool_use` in an assistant message (a [`ToolCall`] whose
///   `arguments` are its `input` as JSON text); `tool_result` in a user
///   message (a [`Role::Tool`] message answering `tool_use_id`, before
///   the rest of that user message's blocks; its content a string or
///   `text` and `image` blocks, neighbouring texts joined with a blank
///   line). A result with `is_error: true` has no field of its own in a
///   `ChatRequest`, so its text is prefixed with `Error: ` for the model
///   to read;
/// - `tools` (`name`, `description`, `input_schema`), `tool_choice`
///   (`auto`, `any` as [`ToolChoice::Required`], `tool` as
///   [`ToolChoice::Tool`], `none`), `max_tokens`, `temperature`,
///   `top_p`, `stop_sequences`, `stream`.
///
/// What is left out, since the answer stays faithful without it:
/// `thinking` and `redacted_thinking` blocks of earlier assistant turns
/// (the model's private reasoning, which Anthropic itself drops from
/// earlier turns, and which no other provider can read), `cache_control`
/// anywhere, `top_k` (a sampling hint like `temperature`, which no other
/// provider takes), `metadata`, `thinking` (the answer comes without
/// thinking blocks, which clients accept), `tool_choice`'s
/// `disable_parallel_tool_use` (the answer may then hold several tool
/// calls, which clients handle), `service_tier` and every other field.
///
/// What is refused, since ignoring it would change the answer: a
/// missing `max_tokens` (Anthropic requires it, with the same message),
/// server tools (a `type` such as `web_search_20250305`: the gateway
/// serves client tools only), `document` blocks (the model would not see
/// the document), image sources other than `base64` and `url` (a Files
/// API `file`), and every other block type.
///
/// # Errors
///
/// A bad-request failure whose message names what is wrong and where
/// (`messages[1].content[0].type: block type "document" is not
/// supported`): malformed JSON, a missing `model`, `messages` or
/// `max_tokens`, a role other than `user` and `assistant`, a block in
/// the wrong role's message, or any refusal above. Nesting deeper than
/// serde_json's recursion limit (128) is malformed JSON.
///
/// ```
/// use tower_llm_core::Role;
/// use tower_llm_providers::anthropic::server::decode_request;
///
/// let req = decode_request(br#"{"model": "smart", "max_tokens": 1024, "stream": true,
///     "system": "Be brief.",
///     "messages": [{"role": "user", "content": "Hi"}]}"#).unwrap();
/// assert_eq!(&*req.model, "smart");
/// assert_eq!(req.max_tokens, Some(1024));
/// assert_eq!(req.messages[0].role, Role::System);
/// assert!(req.stream);
///
/// let missing = decode_request(br#"{"model": "smart",
///     "messages": [{"role": "user", "content": "Hi"}]}"#).unwrap_err();
/// assert!(missing.is_bad_request());
/// assert_eq!(missing.message(), Some("max_tokens: Field required"));
/// ```
pub fn decode_request(body: &[u8]) -> Result<ChatRequest, Failure> {
    let wire: WireRequest =
        serde_json::from_slice(body).map_err(|e| bad(format!("invalid request body: {e}")))?;
    let model = wire.model.ok_or_else(|| bad("model: Field required"))?;
    let wire_messages = wire
        .messages
        .ok_or_else(|| bad("messages: Field required"))?;
    let max_tokens = wire
        .max_tokens
        .ok_or_else(|| bad("max_tokens: Field required"))?;
    let mut messages = Vec::with_capacity(wire_messages.len() + 1);
    if let Some(system) = system(wire.system)? {
        messages.push(Message::system(system));
    }
    for (i, m) in wire_messages.into_iter().enumerate() {
        let at = At::Index(&At::Field("messages"), i);
        read_message(m, &at, &mut messages)?;
    }
    let tools = wire
        .tools
        .into_iter()
        .enumerate()
        .map(|(i, t)| tool(t, &At::Index(&At::Field("tools"), i)))
        .collect::<Result<Vec<_>, _>>()?;
    let tool_choice = match wire.tool_choice {
        None | Some(Value::Null) => None,
        Some(choice) => Some(tool_choice(choice)?),
    };
    Ok(ChatRequest {
        model: model.into(),
        messages: Arc::new(messages),
        tools: Arc::new(tools),
        tool_choice,
        temperature: wire.temperature,
        top_p: wire.top_p,
        max_tokens: Some(max_tokens),
        stop: Arc::new(wire.stop_sequences),
        stream: wire.stream,
        ..ChatRequest::default()
    })
}

/// The system prompt: a string, or `text` blocks joined with a blank
/// line; `None` when empty.
fn system(system: Option<Value>) -> Result<Option<String>, Failure> {
    let text = match system {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(text)) => text,
        Some(Value::Array(blocks)) => {
            let mut text = String::new();
            for (i, mut block) in blocks.into_iter().enumerate() {
                let at = At::Index(&At::Field("system"), i);
                if kind(&mut block, &at)? != "text" {
                    return Err(bad(format!(
                        "{}: system blocks must be text",
                        At::Key(&at, "type")
                    )));
                }
                let part = take_str(&mut block, "text", &at)?;
                if !text.is_empty() && !part.is_empty() {
                    text.push_str("\n\n");
                }
                text.push_str(&part);
            }
            text
        }
        Some(_) => {
            return Err(bad("system: must be a string or an array of text blocks"));
        }
    };
    Ok((!text.is_empty()).then_some(text))
}

/// Appends the messages of one Anthropic message: one, or for a user
/// message with tool results, a tool message per result and the rest.
fn read_message(m: WireMessage, at: &At<'_>, out: &mut Vec<Message>) -> Result<(), Failure> {
    let role = match m.role.as_deref() {
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some(other) => {
            return Err(bad(format!(
                "{}: unknown role \"{other}\" (expected \"user\" or \"assistant\")",
                At::Key(at, "role")
            )));
        }
        None => return Err(bad(format!("{}: Field required", At::Key(at, "role")))),
    };
    let blocks = match m.content {
        Value::String(text) => {
            out.push(Message::text(role, text));
            return Ok(());
        }
        Value::Array(blocks) => blocks,
        Value::Null => return Err(bad(format!("{}: Field required", At::Key(at, "content")))),
        _ => {
            return Err(bad(format!(
                "{}: must be a string or an array of content blocks",
                At::Key(at, "content")
            )));
        }
    };
    let content_at = At::Key(at, "content");
    let mut message = Message {
        role,
        content: Vec::new(),
        tool_calls: Vec::new(),
        tool_call_id: None,
    };
    let mut emitted = false;
    for (i, mut block) in blocks.into_iter().enumerate() {
        let at = At::Index(&content_at, i);
        match kind(&mut block, &at)?.as_str() {
            "text" => message.content.push(ContentPart::Text {
                text: take_str(&mut block, "text", &at)?,
            }),
            "image" => message.content.push(image(block, &at)?),
            "tool_use" if role == Role::Assistant => {
                let id = take_str(&mut block, "id", &at)?;
                let name = take_str(&mut block, "name", &at)?;
                let arguments = match block.get("input") {
                    None | Some(Value::Null) => "{}".to_owned(),
                    Some(input) => input.to_string(),
                };
                message.tool_calls.push(ToolCall {
                    id,
                    name,
                    arguments,
                });
            }
            "tool_result" if role == Role::User => {
                // The user's own blocks before it keep their place.
                if !message.content.is_empty() {
                    out.push(Message {
                        role,
                        content: std::mem::take(&mut message.content),
                        tool_calls: Vec::new(),
                        tool_call_id: None,
                    });
                }
                out.push(tool_result(block, &at)?);
                emitted = true;
            }
            "tool_use" => {
                return Err(bad(format!(
                    "{at}: a tool_use block belongs to an assistant message"
                )));
            }
            "tool_result" => {
                return Err(bad(format!(
                    "{at}: a tool_result block belongs to a user message"
                )));
            }
            // Earlier turns' reasoning: dropped (see `decode_request`).
            "thinking" | "redacted_thinking" => {}
            other => {
                return Err(bad(format!(
                    "{}: block type \"{other}\" is not supported",
                    At::Key(&at, "type")
                )));
            }
        }
    }
    if !message.content.is_empty() || !message.tool_calls.is_empty() || !emitted {
        out.push(message);
    }
    Ok(())
}

/// An `image` block as an image URL.
fn image(mut block: Value, at: &At<'_>) -> Result<ContentPart, Failure> {
    let at = At::Key(at, "source");
    let Some(source) = block.get_mut("source").filter(|s| s.is_object()) else {
        return Err(bad(format!("{at}: Field required")));
    };
    let url = match kind(source, &at)?.as_str() {
        "base64" => {
            let media_type = take_str(source, "media_type", &at)?;
            let data = take_str(source, "data", &at)?;
            format!("data:{media_type};base64,{data}")
        }
        "url" => take_str(source, "url", &at)?,
        other => {
            return Err(bad(format!(
                "{}: image source \"{other}\" is not supported (expected \"base64\" or \"url\")",
                At::Key(&at, "type")
            )));
        }
    };
    Ok(ContentPart::ImageUrl { url })
}

/// A `tool_result` block as a tool message.
fn tool_result(mut block: Value, at: &At<'_>) -> Result<Message, Failure> {
    let id = take_str(&mut block, "tool_use_id", at)?;
    let is_error = match block.get("is_error") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(bad(format!(
                "{}: must be a boolean",
                At::Key(at, "is_error")
            )));
        }
    };
    let content_at = At::Key(at, "content");
    let mut parts: Vec<ContentPart> = Vec::new();
    match block.get_mut("content").map(Value::take) {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => push_text(&mut parts, text),
        Some(Value::Array(blocks)) => {
            for (i, mut b) in blocks.into_iter().enumerate() {
                let at = At::Index(&content_at, i);
                match kind(&mut b, &at)?.as_str() {
                    "text" => push_text(&mut parts, take_str(&mut b, "text", &at)?),
                    "image" => parts.push(image(b, &at)?),
                    other => {
                        return Err(bad(format!(
                            "{}: block type \"{other}\" is not supported in a tool result",
                            At::Key(&at, "type")
                        )));
                    }
                }
            }
        }
        Some(_) => {
            return Err(bad(format!(
                "{content_at}: must be a string or an array of content blocks"
            )));
        }
    }
    if is_error {
        match parts.first_mut() {
            Some(ContentPart::Text { text }) => text.insert_str(0, "Error: "),
            _ => parts.insert(
                0,
                ContentPart::Text {
                    text: "Error".to_owned(),
                },
            ),
        }
    }
    Ok(Message {
        role: Role::Tool,
        content: parts,
        tool_calls: Vec::new(),
        tool_call_id: Some(id),
    })
}

/// Appends `text`, joined with a blank line to a text just before it.
fn push_text(parts: &mut Vec<ContentPart>, text: String) {
    if let Some(ContentPart::Text { text: last }) = parts.last_mut() {
        last.push_str("\n\n");
        last.push_str(&text);
    } else {
        parts.push(ContentPart::Text { text });
    }
}

/// A client tool; a server tool is refused.
fn tool(mut t: Value, at: &At<'_>) -> Result<Tool, Failure> {
    if !t.is_object() {
        return Err(bad(format!("{at}: must be an object")));
    }
    match t.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(kind)) if kind == "custom" => {}
        Some(Value::String(kind)) => {
            return Err(bad(format!(
                "{at}: server tool type \"{kind}\" is not supported: only client tools (with an input_schema) are served"
            )));
        }
        Some(_) => return Err(bad(format!("{}: must be a string", At::Key(at, "type")))),
    }
    let name = take_str(&mut t, "name", at)?;
    let description = take_opt_str(&mut t, "description", at)?;
    let parameters = match t.get_mut("input_schema").map(Value::take) {
        Some(schema @ Value::Object(_)) => schema,
        None | Some(Value::Null) => {
            return Err(bad(format!(
                "{}: Field required",
                At::Key(at, "input_schema")
            )));
        }
        Some(_) => {
            return Err(bad(format!(
                "{}: must be an object",
                At::Key(at, "input_schema")
            )));
        }
    };
    Ok(Tool {
        name,
        description,
        parameters,
    })
}

/// `tool_choice`: `{"type": "auto" | "any" | "tool" | "none"}`.
fn tool_choice(mut choice: Value) -> Result<ToolChoice, Failure> {
    let at = At::Field("tool_choice");
    Ok(match kind(&mut choice, &at)?.as_str() {
        "auto" => ToolChoice::Auto,
        "any" => ToolChoice::Required,
        "none" => ToolChoice::None,
        "tool" => ToolChoice::Tool(take_str(&mut choice, "name", &at)?),
        other => {
            return Err(bad(format!(
                "tool_choice.type: unknown tool choice \"{other}\" (expected \"auto\", \"any\", \"tool\" or \"none\")"
            )));
        }
    })
}
