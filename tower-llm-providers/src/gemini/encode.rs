//! The `generateContent` request: the model's path segment and the body.

use std::collections::HashMap;

use serde_json::{Map, Value, json};
use tower_llm_core::{ChatRequest, ContentPart, Failure, FailureClass, Message, Role, ToolChoice};

use super::PROVIDER;
use crate::wire::{data_url, merge_turns, tool_input, turn};

/// The `thoughtSignature` sent with a function call the model's own
/// signature did not come back with (Google's documented value for calls
/// it did not sign: Gemini 3 validates signatures, and refuses a turn of
/// function calls without one; older models ignore it). Using it costs the
/// model the reasoning context of that turn, not the answer.
pub const UNSIGNED_CALL: &str = "skip_thought_signature_validator";

/// The longest model name accepted (in bytes).
const MAX_MODEL: usize = 256;

/// How deep a tool's JSON Schema may nest (objects in objects, items in
/// arrays) before the request is refused.
const MAX_SCHEMA_DEPTH: usize = 64;

/// A bad-request failure: our own text, never an input value (an image
/// URL may be signed, a tool schema may hold anything).
fn bad_request(message: &'static str) -> Failure {
    Failure::new(FailureClass::BadRequest)
        .with_provider(PROVIDER)
        .with_message(message)
}

/// `model` as the path segment of `/models/{model}:generateContent`: it
/// is sent as is, so it may hold only ASCII letters, digits, `-`, `_` and
/// `.` (and not be `.`, nor hold `..`); anything else would change the
/// path (or the host's reading of it) and is a bad request.
pub(super) fn model_segment(model: &str) -> Result<&str, Failure> {
    let plain = !model.is_empty()
        && model.len() <= MAX_MODEL
        && model
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && model != "."
        && !model.contains("..");
    if plain {
        Ok(model)
    } else {
        Err(bad_request(
            "a Gemini model name may hold only ASCII letters, digits, '-', '_' and '.' (at most 256 bytes, no '..')",
        ))
    }
}

/// The `generateContent` request body for `req` (the same for a stream:
/// Gemini streams at another URL).
///
/// ```
/// use tower_llm_core::{ChatRequest, Message};
/// use tower_llm_providers::gemini;
///
/// let req = ChatRequest::new("gemini-2.5-flash", vec![Message::system("Be brief."), Message::user("Hi")])
///     .with_max_tokens(64);
/// let body = gemini::encode(&req).unwrap();
/// assert_eq!(body["systemInstruction"]["parts"][0]["text"], "Be brief.");
/// assert_eq!(body["contents"][0]["role"], "user");
/// assert_eq!(body["contents"][0]["parts"][0]["text"], "Hi");
/// assert_eq!(body["generationConfig"]["maxOutputTokens"], 64);
/// ```
///
/// # Errors
///
/// A request Gemini cannot take, as a bad-request failure: a tool result
/// whose call no earlier assistant message made (Gemini needs the
/// function's name), an image URL that is neither `http(s)` nor a base64
/// `data:` URL, a tool schema nested deeper than 64 levels.
pub fn encode(req: &ChatRequest) -> Result<Value, Failure> {
    let mut system = Vec::new();
    let mut turns = Vec::with_capacity(req.messages.len());
    // Call id → function name, from the assistant messages so far (a
    // later call with the same id wins).
    let mut names: HashMap<&str, &str> = HashMap::new();
    for m in req.messages.iter() {
        match m.role {
            Role::System => {
                let text = m.joined_text();
                if !text.is_empty() {
                    system.push(text_part(text));
                }
            }
            Role::Tool => {
                let id = m
                    .tool_call_id
                    .as_deref()
                    .ok_or_else(|| bad_request("a tool result has no tool_call_id"))?;
                let name = names.get(id).ok_or_else(|| {
                    bad_request(
                        "a tool result answers a call that no earlier assistant message made (Gemini needs its function name)",
                    )
                })?;
                turns.push(turn("user", vec![function_response(name, m)]));
            }
            Role::Assistant => {
                let mut parts = content_parts(m)?;
                for (i, call) in m.tool_calls.iter().enumerate() {
                    names.insert(&call.id, &call.name);
                    let mut part = json!({"functionCall": {
                        "name": call.name,
                        "args": tool_input(&call.arguments),
                    }});
                    // Gemini 3 refuses a function call of an earlier turn
                    // without the `thoughtSignature` it came with, and a
                    // `ToolCall` (or a client's history) does not carry
                    // it: the first call of a turn gets the signature
                    // Google documents for calls it did not sign.
                    if i == 0 {
                        if let Some(obj) = part.as_object_mut() {
                            obj.insert("thoughtSignature".into(), json!(UNSIGNED_CALL));
                        }
                    }
                    parts.push(part);
                }
                turns.push(turn("model", parts));
            }
            // User, and a role this dialect does not know: the user speaks.
            _ => turns.push(turn("user", content_parts(m)?)),
        }
    }
    let contents: Vec<Value> = merge_turns(turns, |p| p.get("functionResponse").is_some())
        .into_iter()
        .filter_map(into_content)
        .collect();

    let mut body = Map::new();
    body.insert("contents".into(), Value::Array(contents));
    if !system.is_empty() {
        body.insert("systemInstruction".into(), json!({"parts": system}));
    }
    if !req.tools.is_empty() {
        let declarations = req
            .tools
            .iter()
            .map(|t| {
                let mut d = Map::new();
                d.insert("name".into(), json!(t.name));
                if let Some(description) = &t.description {
                    d.insert("description".into(), json!(description));
                }
                if let Some(parameters) = parameters(&t.parameters)? {
                    d.insert("parameters".into(), parameters);
                }
                Ok(Value::Object(d))
            })
            .collect::<Result<Vec<Value>, Failure>>()?;
        body.insert(
            "tools".into(),
            json!([{ "functionDeclarations": declarations }]),
        );
    }
    if let Some(choice) = &req.tool_choice {
        let config = match choice {
            ToolChoice::None => json!({"mode": "NONE"}),
            ToolChoice::Required => json!({"mode": "ANY"}),
            ToolChoice::Tool(name) => json!({"mode": "ANY", "allowedFunctionNames": [name]}),
            // Auto, and a choice this dialect cannot express: the default.
            _ => json!({"mode": "AUTO"}),
        };
        body.insert(
            "toolConfig".into(),
            json!({ "functionCallingConfig": config }),
        );
    }
    let mut generation = Map::new();
    if let Some(t) = req.temperature {
        generation.insert("temperature".into(), json!(t));
    }
    if let Some(p) = req.top_p {
        generation.insert("topP".into(), json!(p));
    }
    if let Some(m) = req.max_tokens {
        generation.insert("maxOutputTokens".into(), json!(m));
    }
    if !req.stop.is_empty() {
        generation.insert("stopSequences".into(), json!(req.stop));
    }
    if !generation.is_empty() {
        body.insert("generationConfig".into(), Value::Object(generation));
    }
    Ok(Value::Object(body))
}

fn text_part(text: String) -> Value {
    let mut part = Map::new();
    part.insert("text".into(), Value::String(text));
    Value::Object(part)
}

/// A merged `{"role", "content"}` turn as a Gemini `Content`
/// (`{"role", "parts"}`); none for a turn with no parts, which Gemini
/// rejects.
fn into_content(mut turn: Value) -> Option<Value> {
    let obj = turn.as_object_mut()?;
    let parts = obj.remove("content")?;
    if parts.as_array().is_none_or(Vec::is_empty) {
        return None;
    }
    obj.insert("parts".into(), parts);
    Some(turn)
}

/// A message's text and images as parts (empty text left out: Gemini
/// rejects an empty text part).
fn content_parts(m: &Message) -> Result<Vec<Value>, Failure> {
    let mut parts = Vec::with_capacity(m.content.len() + m.tool_calls.len());
    for p in &m.content {
        match p {
            ContentPart::Text { text } if text.is_empty() => {}
            ContentPart::Text { text } => parts.push(text_part(text.clone())),
            ContentPart::ImageUrl { url } => parts.push(image_part(url)?),
            // A part this dialect cannot carry is left out.
            _ => {}
        }
    }
    Ok(parts)
}

/// An image: a base64 `data:` URL inline, an `http(s)` URL by reference.
fn image_part(url: &str) -> Result<Value, Failure> {
    if url.starts_with("data:") {
        return match data_url(url) {
            Some((mime_type, data)) if !mime_type.is_empty() => {
                Ok(json!({"inlineData": {"mimeType": mime_type, "data": data}}))
            }
            _ => Err(bad_request(
                "an image data: URL must be base64 with a media type (data:<type>;base64,<data>)",
            )),
        };
    }
    let scheme = url.split_once("://").map(|(s, _)| s);
    if !scheme.is_some_and(|s| s.eq_ignore_ascii_case("https") || s.eq_ignore_ascii_case("http")) {
        return Err(bad_request(
            "Gemini takes an image as a data: URL or an http(s) URL",
        ));
    }
    let mut file = Map::new();
    file.insert("fileUri".into(), json!(url));
    if let Some(mime_type) = image_type(url) {
        file.insert("mimeType".into(), json!(mime_type));
    }
    Ok(json!({ "fileData": file }))
}

/// The media type of an image URL by its extension, for the image types
/// Gemini documents; none when the extension says nothing.
fn image_type(url: &str) -> Option<&'static str> {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let name = path.rsplit('/').next().unwrap_or(path);
    let (_, ext) = name.rsplit_once('.')?;
    Some(match ext.to_ascii_lowercase().as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "webp" => "image/webp",
        "heic" => "image/heic",
        "heif" => "image/heif",
        _ => return None,
    })
}

/// A tool result: `{"functionResponse": {"name", "response"}}`, the
/// response the result itself when it is a JSON object, else
/// `{"output": text}`.
fn function_response(name: &str, m: &Message) -> Value {
    let text = m.joined_text();
    let response = match serde_json::from_str::<Value>(&text) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({ "output": text }),
    };
    json!({"functionResponse": {"name": name, "response": response}})
}

/// A tool's parameters for Gemini, or none when the tool takes none
/// (Gemini rejects an object schema with no properties).
fn parameters(schema: &Value) -> Result<Option<Value>, Failure> {
    let empty_object = schema.as_object().is_some_and(|o| {
        o.get("properties")
            .and_then(Value::as_object)
            .is_none_or(Map::is_empty)
            && o.get("type").and_then(Value::as_str) == Some("object")
    });
    if schema.is_null() || empty_object {
        return Ok(None);
    }
    Ok(Some(gemini_schema(schema, 0)?))
}

/// The keywords of Gemini's `Schema` (a subset of OpenAPI 3.0's) copied as
/// they are; `type`, `format`, `enum`, `properties`, `items`, `anyOf` and
/// `oneOf` are handled on their own, every other keyword is dropped.
const KEEP: &[&str] = &[
    "title",
    "description",
    "nullable",
    "required",
    "propertyOrdering",
    "example",
    "default",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
];

/// A JSON Schema cut down to what Gemini's `Schema` takes; linear in its
/// size.
fn gemini_schema(schema: &Value, depth: usize) -> Result<Value, Failure> {
    if depth > MAX_SCHEMA_DEPTH {
        return Err(bad_request("a tool schema nests deeper than 64 levels"));
    }
    let Value::Object(src) = schema else {
        // `true` (anything goes) and other non-object schemas.
        return Ok(Value::Object(Map::new()));
    };
    let mut out = Map::new();
    let mut nullable = false;
    let mut kind = None;
    match src.get("type") {
        Some(Value::String(t)) => kind = Some(t.as_str()),
        Some(Value::Array(types)) => {
            for t in types.iter().filter_map(Value::as_str) {
                if t == "null" {
                    nullable = true;
                } else if kind.is_none() {
                    kind = Some(t);
                }
            }
        }
        _ => {}
    }
    if let Some(kind) = kind {
        out.insert("type".into(), json!(kind));
    }
    if let Some(format) = src.get("format").and_then(Value::as_str) {
        let allowed = match kind {
            Some("string") => matches!(format, "enum" | "date-time"),
            Some("number") => matches!(format, "float" | "double"),
            Some("integer") => matches!(format, "int32" | "int64"),
            _ => false,
        };
        if allowed {
            out.insert("format".into(), json!(format));
        }
    }
    if let Some(Value::Array(values)) = src.get("enum") {
        // Gemini's enum holds strings.
        let mut strings = Vec::with_capacity(values.len());
        for v in values {
            match v {
                Value::String(s) => strings.push(Value::String(s.clone())),
                Value::Null => nullable = true,
                Value::Bool(_) | Value::Number(_) => strings.push(Value::String(v.to_string())),
                _ => {}
            }
        }
        out.insert("enum".into(), Value::Array(strings));
    }
    if let Some(Value::Object(properties)) = src.get("properties") {
        let mut map = Map::new();
        for (name, property) in properties {
            map.insert(name.clone(), gemini_schema(property, depth + 1)?);
        }
        out.insert("properties".into(), Value::Object(map));
    }
    if let Some(items) = src.get("items") {
        out.insert("items".into(), gemini_schema(items, depth + 1)?);
    }
    if let Some(Value::Array(any_of)) = src.get("anyOf").or_else(|| src.get("oneOf")) {
        let schemas = any_of
            .iter()
            .map(|s| gemini_schema(s, depth + 1))
            .collect::<Result<Vec<Value>, Failure>>()?;
        out.insert("anyOf".into(), Value::Array(schemas));
    }
    for key in KEEP {
        if let Some(v) = src.get(*key) {
            out.insert((*key).into(), v.clone());
        }
    }
    if nullable {
        out.insert("nullable".into(), Value::Bool(true));
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_keep_gemini_keywords_and_property_names() {
        let schema = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "$schema": {"type": "string", "format": "email"},
                "when": {"type": ["string", "null"], "format": "date-time"},
                "tags": {"type": "array", "items": {"type": "string", "const": "x"}, "maxItems": 3},
                "size": {"enum": [1, "big", null]},
                "either": {"oneOf": [{"type": "integer", "format": "int64"}, {"type": "boolean"}]}
            },
            "required": ["when"]
        });
        assert_eq!(
            gemini_schema(&schema, 0).expect("schema"),
            json!({
                "type": "object",
                "properties": {
                    "$schema": {"type": "string"},
                    "when": {"type": "string", "format": "date-time", "nullable": true},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                    "size": {"enum": ["1", "big"], "nullable": true},
                    "either": {"anyOf": [{"type": "integer", "format": "int64"}, {"type": "boolean"}]}
                },
                "required": ["when"]
            })
        );
    }

    #[test]
    fn a_schema_nested_too_deep_is_a_bad_request() {
        let mut schema = json!({"type": "string"});
        for _ in 0..=MAX_SCHEMA_DEPTH {
            schema = json!({"type": "array", "items": schema});
        }
        let err = gemini_schema(&schema, 0).unwrap_err();
        assert!(err.is_bad_request());
        // One level less is fine.
        let inner = schema["items"].clone();
        assert!(gemini_schema(&inner, 0).is_ok());
    }

    #[test]
    fn image_types_come_from_the_extension() {
        assert_eq!(image_type("https://x/a.PNG?sig=1#f"), Some("image/png"));
        assert_eq!(image_type("https://x/a.jpg"), Some("image/jpeg"));
        assert_eq!(image_type("https://x.png/a"), None);
        assert_eq!(image_type("https://x/a.gif"), None);
    }
}
