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
/// results produce), putting tool-result blocks first in a merged turn
/// (a stable partition: otherwise the order is kept). A message that merges
/// with no other is left as it is.
///
/// One pass, linear in the number of blocks: each block is moved, never
/// cloned, and `is_tool_result` is asked once per block of a merged turn.
/// (It used to re-sort the whole merged turn after every message: quadratic
/// in a run of same-role messages.)
pub(crate) fn merge_turns(messages: Vec<Value>, is_tool_result: fn(&Value) -> bool) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(messages.len());
    let mut open: Option<Turn> = None;
    for mut msg in messages {
        match open.as_mut() {
            Some(turn)
                if turn.first.get("role").is_some()
                    && turn.first.get("role") == msg.get("role") =>
            {
                let split = turn.split.get_or_insert_with(|| {
                    let mut split = (Vec::new(), Vec::new());
                    partition(take_blocks(&mut turn.first), is_tool_result, &mut split);
                    split
                });
                partition(take_blocks(&mut msg), is_tool_result, split);
            }
            _ => {
                if let Some(turn) = open.take() {
                    out.push(turn.close());
                }
                open = Some(Turn {
                    first: msg,
                    split: None,
                });
            }
        }
    }
    if let Some(turn) = open {
        out.push(turn.close());
    }
    out
}

/// A turn being merged: its first message and, once another message joined
/// it, all its blocks split into tool results and the rest.
struct Turn {
    first: Value,
    split: Option<(Vec<Value>, Vec<Value>)>,
}

impl Turn {
    /// The merged message: tool results first, then the rest.
    fn close(self) -> Value {
        let Turn { mut first, split } = self;
        if let Some((mut results, rest)) = split {
            results.extend(rest);
            if let Some(obj) = first.as_object_mut() {
                obj.insert("content".into(), Value::Array(results));
            }
        }
        first
    }
}

/// A message's content blocks, moved out (none when it has no array).
fn take_blocks(msg: &mut Value) -> Vec<Value> {
    match msg.get_mut("content").map(Value::take) {
        Some(Value::Array(blocks)) => blocks,
        _ => Vec::new(),
    }
}

/// Appends each block to the tool results or to the rest, in order.
fn partition(
    blocks: Vec<Value>,
    is_tool_result: fn(&Value) -> bool,
    (results, rest): &mut (Vec<Value>, Vec<Value>),
) {
    for block in blocks {
        if is_tool_result(&block) {
            results.push(block);
        } else {
            rest.push(block);
        }
    }
}

/// `{"role": role, "content": blocks}`, the blocks moved in (`json!`
/// would copy them: it serialises its values by reference).
pub(crate) fn turn(role: &str, blocks: Vec<Value>) -> Value {
    let mut msg = serde_json::Map::new();
    msg.insert("role".into(), Value::String(role.into()));
    msg.insert("content".into(), Value::Array(blocks));
    Value::Object(msg)
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

    thread_local! {
        static ASKED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// A tool-result predicate that counts how often it is asked.
    fn counted(b: &Value) -> bool {
        ASKED.with(|n| n.set(n.get() + 1));
        b.get("toolResult").is_some()
    }

    #[test]
    fn merging_asks_once_per_block_and_partitions_stably() {
        // 2,000 one-block user messages in a row, a tool result in the
        // middle, then an assistant turn: the old code re-sorted the
        // merged turn after each message (about n²/2 = 2,000,000 questions).
        let n = 2_000;
        let mut messages: Vec<Value> = (0..n)
            .map(|i| json!({"role": "user", "content": [{"text": i}]}))
            .collect();
        messages.insert(
            n / 2,
            json!({"role": "user", "content": [{"toolResult": "r"}]}),
        );
        messages
            .push(json!({"role": "assistant", "content": [{"text": "a"}, {"toolResult": "kept"}]}));
        ASKED.with(|c| c.set(0));
        let merged = merge_turns(messages, counted);
        // Once per block of the merged turn; the lone assistant turn is
        // left as it is (not asked about, not reordered).
        assert_eq!(ASKED.with(std::cell::Cell::get), n + 1);
        assert_eq!(merged.len(), 2);
        let blocks = merged[0]["content"].as_array().expect("blocks");
        assert_eq!(blocks.len(), n + 1);
        assert_eq!(blocks[0], json!({"toolResult": "r"}));
        let order: Vec<i64> = blocks[1..]
            .iter()
            .filter_map(|b| b["text"].as_i64())
            .collect();
        assert_eq!(order, (0..n as i64).collect::<Vec<_>>());
        assert_eq!(
            merged[1],
            json!({"role": "assistant", "content": [{"text": "a"}, {"toolResult": "kept"}]})
        );
    }
}
