//! [`CostAnswer`]: how an answer settles its attempt's [`Meter`].

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;
use tower_llm_core::{ChatChunk, ChatResponse, ChatStream, ChunkStream, Failure, Usage};

use crate::Meter;

/// An answer the cost layer can charge: it settles the attempt's
/// [`Meter`] from its usage, at once or when it is whole.
///
/// - [`ChatResponse`] settles at once from its `usage` (an answer whose
///   usage is all zeros has none).
/// - [`ChatStream`] settles when it ends: from the usage its chunks
///   carried (OpenAI's last chunk with `stream_options.include_usage`,
///   Anthropic's `message_delta`, Bedrock's `metadata`), or, when it was
///   cut (an error item, or dropped by its reader) without usage, one
///   output token per byte of content delivered. The stream's attempt
///   records leave with it at its commit point, before it is charged: its
///   own attempt's cost reaches the budget, the quota and
///   `ai_router_cost_total`, not its record.
pub trait CostAnswer {
    /// Charges this answer through `meter` (a stream: when it ends).
    fn charge(&mut self, meter: Meter);
}

impl CostAnswer for ChatResponse {
    fn charge(&mut self, meter: Meter) {
        let delivered = u64::from(
            self.choices
                .iter()
                .any(|c| !c.text.is_empty() || !c.tool_calls.is_empty()),
        );
        let usage = Some(&self.usage).filter(|u| **u != Usage::default());
        meter.settle_usage(usage, delivered);
    }
}

impl CostAnswer for ChatStream {
    fn charge(&mut self, meter: Meter) {
        self.wrap_chunks(|inner| {
            Box::pin(Metered {
                inner,
                meter: Some(meter),
                usage: None,
                deltas: 0,
                bytes: 0,
            }) as ChunkStream
        });
    }
}

/// A stream's chunks, counted on their way to settle the meter when the
/// stream ends or is dropped.
struct Metered {
    inner: ChunkStream,
    meter: Option<Meter>,
    usage: Option<Usage>,
    /// Non-empty content deltas delivered.
    deltas: u64,
    /// Bytes of content delivered.
    bytes: u64,
}

impl Metered {
    fn count(&mut self, chunk: &ChatChunk) {
        let text = chunk.text.as_deref().map_or(0, str::len);
        let tool = chunk.tool_call.as_ref().map_or(0, |t| t.arguments.len());
        let bytes = (text + tool) as u64;
        if bytes > 0 {
            self.deltas += 1;
            self.bytes += bytes;
        }
        if let Some(u) = chunk.usage {
            self.usage = Some(u);
        }
    }

    fn end(&mut self, whole: bool) {
        let Some(meter) = self.meter.take() else {
            return;
        };
        match (whole, &self.usage) {
            (true, usage) => {
                meter.settle_usage(usage.as_ref(), self.deltas);
            }
            (false, Some(usage)) => {
                meter.settle_usage(Some(usage), self.deltas);
            }
            (false, None) => {
                meter.settle_cut(self.bytes);
            }
        }
    }
}

impl Stream for Metered {
    type Item = Result<ChatChunk, Failure>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let item = std::task::ready!(self.inner.as_mut().poll_next(cx));
        match &item {
            Some(Ok(chunk)) => self.count(chunk),
            Some(Err(_)) => self.end(false),
            None => self.end(true),
        }
        Poll::Ready(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        self.end(false);
    }
}
