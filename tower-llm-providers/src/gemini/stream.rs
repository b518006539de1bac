//! `streamGenerateContent?alt=sse`: each event a whole
//! `GenerateContentResponse` carrying the next piece of the answer.

use std::collections::BTreeSet;

use tower_llm_core::{ChatChunk, Failure, ToolCallDelta};

use super::PROVIDER;
use super::decode::{WireResponse, blocked, finish_reason, in_band};
use crate::failure::{Scrub, invalid_json};
use crate::stream::{SseEvent, StreamItem};

/// The decoder of one Gemini stream's events. It keeps what an event
/// alone does not say: how many function calls came (so each gets its own
/// tool-call index, and `call_{n}` ids match a unary answer's), and which
/// candidates called one (their `STOP` is then
/// [`ToolCalls`](tower_llm_core::FinishReason::ToolCalls)).
pub(super) struct Events {
    scrub: Scrub,
    calls: u32,
    called: BTreeSet<u32>,
}

impl Events {
    /// A decoder removing `scrub`'s secrets from an error event's message.
    pub(super) fn new(scrub: Scrub) -> Self {
        Events {
            scrub,
            calls: 0,
            called: BTreeSet::new(),
        }
    }

    /// One event: its text and function calls as content chunks, in
    /// order; its finish reason on the candidate's last chunk; its usage
    /// (counts so far) on the event's last chunk when the event finishes
    /// a candidate or carries no candidate.
    ///
    /// # Errors
    ///
    /// An error event (classified like an error answer), a blocked prompt
    /// (content filtered), or an event that is not the JSON expected
    /// (invalid response).
    pub(super) fn decode(&mut self, event: &SseEvent) -> Result<StreamItem, Failure> {
        let wire: WireResponse<'_> =
            serde_json::from_str(&event.data).map_err(|e| invalid_json(PROVIDER, &e))?;
        if let Some(error) = wire.error {
            return Err(in_band(error, &self.scrub));
        }
        if wire.candidates.is_empty() {
            if let Some(reason) = wire.prompt_feedback.and_then(|f| f.block_reason) {
                return Err(blocked(&reason));
            }
        }
        let finishes =
            wire.candidates.is_empty() || wire.candidates.iter().any(|c| c.finish_reason.is_some());
        let mut chunks: Vec<ChatChunk> = Vec::new();
        for c in wire.candidates {
            let index = c.index;
            let first = chunks.len();
            for part in c.content.map(|c| c.parts).unwrap_or_default() {
                if let Some(call) = part.function_call {
                    let call = call.into_tool_call(self.calls);
                    chunks.push(ChatChunk {
                        index,
                        tool_call: Some(ToolCallDelta {
                            index: self.calls,
                            id: Some(call.id),
                            name: Some(call.name),
                            arguments: call.arguments,
                        }),
                        ..ChatChunk::default()
                    });
                    self.calls = self.calls.saturating_add(1);
                    self.called.insert(index);
                } else if let (Some(text), false) = (part.text, part.thought) {
                    if text.is_empty() {
                        continue;
                    }
                    // Neighbouring text parts of this candidate make one chunk.
                    let ours = chunks.len() > first;
                    match chunks.last_mut() {
                        Some(ChatChunk { text: Some(t), .. }) if ours => t.push_str(&text),
                        _ => chunks.push(ChatChunk {
                            index,
                            text: Some(text),
                            ..ChatChunk::default()
                        }),
                    }
                }
            }
            let reason = c
                .finish_reason
                .as_deref()
                .filter(|r| *r != "FINISH_REASON_UNSPECIFIED")
                .map(|r| finish_reason(r, self.called.contains(&index)));
            if let Some(reason) = reason {
                if chunks.len() == first {
                    chunks.push(ChatChunk {
                        index,
                        ..ChatChunk::default()
                    });
                }
                if let Some(last) = chunks.last_mut() {
                    last.finish_reason = Some(reason);
                }
            }
        }
        if let Some(usage) = wire.usage_metadata.filter(|_| finishes).map(|u| u.usage()) {
            match chunks.last_mut() {
                Some(last) => last.usage = Some(usage),
                None => chunks.push(ChatChunk {
                    usage: Some(usage),
                    ..ChatChunk::default()
                }),
            }
        }
        Ok(match chunks.len() {
            0 => StreamItem::Skip,
            1 => chunks.pop().map_or(StreamItem::Skip, StreamItem::Chunk),
            _ => StreamItem::Chunks(chunks),
        })
    }
}
