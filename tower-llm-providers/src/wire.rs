//! Request-encoding helpers shared by the providers.

use http::HeaderValue;
use serde_json::{Value, json};
use tower_llm_core::{Failure, FailureClass};

/// A tool's JSON Schema, or an empty object schema when none was given
/// (providers reject `null`).
pub(crate) fn tool_schema(parameters: &Value) -> Value {
    if parameters.is_null() {
        json!({"type": "object", "properties": {}})
    } else {
        parameters.clone()
    }
}

/// A tool call's arguments as a JSON object for providers that want one:
/// empty or invalid arguments (a no-argument call, a model's broken JSON)
/// become `{}`.
pub(crate) fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

/// `data:<media type>;base64,<data>` split into its media type and data.
pub(crate) fn data_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    let media = meta.strip_suffix(";base64")?;
    Some((media, data))
}

/// Merges neighbouring messages of the same role (the APIs that demand
/// alternating turns reject two user turns in a row, as parallel tool
/// results produce), putting tool-result blocks first in a merged turn.
pub(crate) fn merge_turns(messages: Vec<Value>, is_tool_result: fn(&Value) -> bool) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(messages.len());
    for msg in messages {
        let same_role = out
            .last()
            .is_some_and(|last| last.get("role").is_some() && last.get("role") == msg.get("role"));
        if !same_role {
            out.push(msg);
            continue;
        }
        let Some(last) = out.last_mut() else {
            continue;
        };
        let incoming = msg
            .get("content")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if let Some(blocks) = last.get_mut("content").and_then(Value::as_array_mut) {
            blocks.extend(incoming);
            blocks.sort_by_key(|b| !is_tool_result(b));
        }
    }
    out
}

/// A header value holding a secret: marked sensitive, so `Debug` of the
/// request and well-behaved tracing layers never print it.
pub(crate) fn secret_header(provider: &'static str, value: &str) -> Result<HeaderValue, Failure> {
    let mut v = HeaderValue::from_str(value).map_err(|_| {
        Failure::new(FailureClass::Auth)
            .with_provider(provider)
            .with_message("the API key holds characters not allowed in a header")
    })?;
    v.set_sensitive(true);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(tool_schema(&Value::Null)["type"], "object");
        assert_eq!(tool_input(""), json!({}));
        assert_eq!(tool_input("not json"), json!({}));
        assert_eq!(tool_input("[1]"), json!({}));
        assert_eq!(tool_input(r#"{"a":1}"#), json!({"a": 1}));
        assert_eq!(
            data_url("data:image/png;base64,AAAA"),
            Some(("image/png", "AAAA"))
        );
        assert_eq!(data_url("https://x/y.png"), None);
        let merged = merge_turns(
            vec![
                json!({"role": "user", "content": [{"text": "a"}]}),
                json!({"role": "user", "content": [{"toolResult": 1}]}),
                json!({"role": "assistant", "content": [{"text": "b"}]}),
            ],
            |b| b.get("toolResult").is_some(),
        );
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0]["content"][0], json!({"toolResult": 1}));
        let h = secret_header("p", "Bearer sk").expect("valid");
        assert!(h.is_sensitive());
        assert!(secret_header("p", "bad\nkey").is_err());
    }
}
