//! [`input_tokens_bound`]: an upper bound of a request's input tokens,
//! for the layers that hold a call to a limit before sending it.

use crate::{ContentPart, Message, Tool};

/// Tokens counted for each message's framing (role, separators): more
/// than any provider's chat template adds.
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 8;

/// Tokens counted for each image part: more than an image costs at any
/// provider's largest detail level in 2026 (OpenAI's high detail tops out
/// near 1,500, Anthropic's near 1,600).
pub const IMAGE_TOKENS: u64 = 3_000;

/// Tokens counted for a request's fixed framing.
pub const REQUEST_OVERHEAD_TOKENS: u64 = 16;

fn len(s: &str) -> u64 {
    s.len() as u64
}

/// Counts the bytes serde writes, writing nowhere.
struct Count(u64);

impl std::io::Write for Count {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An upper bound of the input tokens a provider bills for `messages`
/// and `tools`: one token per byte of every text, tool call, tool result
/// and tool definition (a token of a byte-pair tokenizer covers at least
/// one byte, so no prompt has more tokens than bytes), plus
/// [`MESSAGE_OVERHEAD_TOKENS`] per message, [`IMAGE_TOKENS`] per image and
/// [`REQUEST_OVERHEAD_TOKENS`]. One pass over the messages, reading
/// lengths only (tool definitions are measured by encoding them into a
/// counter). Shared by the layers that must bound a call before sending
/// it (cost, pacing).
///
/// ```
/// use tower_llm_core::{Message, input_tokens_bound};
///
/// assert_eq!(input_tokens_bound(&[Message::user("hello")], &[]), 16 + 8 + 5);
/// ```
pub fn input_tokens_bound(messages: &[Message], tools: &[Tool]) -> u64 {
    let mut bytes = 0usize;
    let mut parts = 0u64;
    let mut extra = 0u64;
    for m in messages {
        match m.content.as_slice() {
            [ContentPart::Text { text }] => bytes += text.len(),
            content => {
                for part in content {
                    match part {
                        ContentPart::Text { text } => bytes += text.len(),
                        _ => parts += 1,
                    }
                }
            }
        }
        if !m.tool_calls.is_empty() || m.tool_call_id.is_some() {
            for call in &m.tool_calls {
                extra += MESSAGE_OVERHEAD_TOKENS + len(&call.id) + len(&call.name);
                extra += len(&call.arguments);
            }
            extra += m.tool_call_id.as_deref().map_or(0, len);
        }
    }
    for tool in tools {
        let mut params = Count(0);
        // Writing to a counter cannot fail; a value that cannot be
        // encoded counts what was written before.
        let _ = serde_json::to_writer(&mut params, &tool.parameters);
        extra += MESSAGE_OVERHEAD_TOKENS + len(&tool.name) + params.0;
        extra += tool.description.as_deref().map_or(0, len);
    }
    REQUEST_OVERHEAD_TOKENS
        + MESSAGE_OVERHEAD_TOKENS * messages.len() as u64
        + bytes as u64
        + IMAGE_TOKENS * parts
        + extra
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChatRequest, ToolCall};

    #[test]
    fn the_input_bound_counts_every_byte_sent_and_each_image() {
        let mut with_call = Message::assistant("");
        with_call.tool_calls.push(ToolCall {
            id: "c1".into(),
            name: "f".into(),
            arguments: "{\"a\":1}".into(),
        });
        let mut image = Message::user("é");
        image.content.push(ContentPart::ImageUrl {
            url: "data:image/png;base64,AAAA".into(),
        });
        let req = ChatRequest::new(
            "m",
            vec![with_call, image, Message::tool_result("c1", "ok")],
        )
        .with_tools(vec![Tool {
            name: "f".into(),
            description: Some("does".into()),
            parameters: serde_json::json!({"type": "object"}),
        }]);
        let expected =
            16 + (8 + 8 + 2 + 1 + 7) + (8 + 2 + IMAGE_TOKENS) + (8 + 2 + 2) + (8 + 1 + 17 + 4);
        assert_eq!(input_tokens_bound(&req.messages, &req.tools), expected);
    }
}
