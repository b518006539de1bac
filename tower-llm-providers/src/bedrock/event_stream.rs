//! ConverseStream: AWS event-stream framing and the stream's events.

use serde::Deserialize;
use tower_llm_core::{ChatChunk, Failure, FailureClass, ToolCallDelta};

use super::config::PROVIDER;
use super::converse::{WireError, WireUsage, finish_reason, is_context_window, usage};
use crate::failure::{Scrub, invalid, invalid_json};
use crate::stream::StreamItem;
use crate::streaming::wire::Wire;

/// The [`Wire`] of Bedrock's ConverseStream: the
/// `application/vnd.amazon.eventstream` framing (length-prefixed binary
/// messages with CRC-32 checksums, decoded and checked by
/// `aws-smithy-eventstream`) with JSON payloads. `metadata` after
/// `messageStop` is the terminator; an exception message is a failure
/// classified by its type (throttling is rate limited, validation a bad
/// request, ...), its message scrubbed of the credentials sent. Made by
/// [`BedrockConfig`](crate::BedrockConfig)'s
/// [`Dialect::wire`](crate::Dialect::wire).
#[derive(Debug)]
pub struct EventStreamWire {
    buf: bytes::BytesMut,
    stopped: bool,
    /// `metadata` after `messageStop` came: the terminator was handed on.
    done: bool,
    failed: bool,
    /// The credentials sent, removed from exception messages that echo
    /// them.
    scrub: Scrub,
    /// Skip an event whose payload does not decode, once content came
    /// ([`Wire::skip_malformed`]).
    skip: bool,
    /// A content chunk was handed on.
    content: bool,
    /// Events skipped.
    skipped: u64,
}

impl EventStreamWire {
    pub(crate) fn new(scrub: Scrub) -> Self {
        EventStreamWire {
            buf: bytes::BytesMut::new(),
            stopped: false,
            done: false,
            failed: false,
            scrub,
            skip: false,
            content: false,
            skipped: 0,
        }
    }
}

/// The largest event-stream message accepted (1 MiB, as for SSE events).
const MAX_MESSAGE_LEN: usize = crate::stream::MAX_EVENT;

impl Wire for EventStreamWire {
    fn feed(
        &mut self,
        bytes: &[u8],
        out: &mut std::collections::VecDeque<Result<StreamItem, Failure>>,
    ) {
        if self.failed || self.done {
            return;
        }
        self.buf.extend_from_slice(bytes);
        while let Some(prelude) = self.buf.get(..4) {
            let mut len = [0u8; 4];
            len.copy_from_slice(prelude);
            let total = u32::from_be_bytes(len) as usize;
            if !(16..=MAX_MESSAGE_LEN).contains(&total) {
                self.failed = true;
                out.push_back(Err(invalid(
                    PROVIDER,
                    format!("an event-stream message declares {total} bytes"),
                )));
                return;
            }
            if self.buf.len() < total {
                return;
            }
            let frame = self.buf.split_to(total).freeze();
            let mut last = false;
            // A whole, checksummed message of type `event` whose payload
            // did not decode: the only failure skip mode may skip.
            let mut event_payload = false;
            let item = aws_smithy_eventstream::frame::read_message_from(frame)
                .map_err(|e| invalid(PROVIDER, format!("event-stream message: {e}")))
                .and_then(|message| {
                    let header = |name: &str| {
                        message
                            .headers()
                            .iter()
                            .find(|h| h.name().as_str() == name)
                            .and_then(|h| h.value().as_string().ok())
                            .map(|v| v.as_str().to_owned())
                    };
                    match header(":message-type").as_deref() {
                        Some("event") => {
                            let kind = header(":event-type");
                            let kind = kind.as_deref().unwrap_or_default();
                            // `metadata` (the usage) follows `messageStop`:
                            // the stream's last message.
                            last = self.stopped && kind == "metadata";
                            event_payload = true;
                            event(kind, message.payload())
                        }
                        Some("exception") => Err(exception(
                            header(":exception-type").as_deref().unwrap_or_default(),
                            message.payload(),
                            &self.scrub,
                        )),
                        // The protocol's generic error message (not seen
                        // from Bedrock).
                        _ => Err(Failure::new(FailureClass::Transient)
                            .with_provider(PROVIDER)
                            .with_message(self.scrub.message(&format!(
                                "event-stream error {}: {}",
                                header(":error-code").unwrap_or_default(),
                                header(":error-message").unwrap_or_default()
                            )))),
                    }
                });
            if let Ok(StreamItem::Chunk(c)) = &item {
                self.stopped |= c.finish_reason.is_some();
            }
            match &item {
                Ok(item) => self.content |= item.is_content(),
                Err(f)
                    if self.skip
                        && self.content
                        && event_payload
                        && f.class() == FailureClass::InvalidResponse =>
                {
                    self.skipped = self.skipped.saturating_add(1);
                    continue;
                }
                Err(_) => {}
            }
            self.failed = item.is_err();
            out.push_back(item);
            if self.failed {
                return;
            }
            if last {
                // The terminator: the stream ends here, whether or not the
                // upstream closes the body now.
                out.push_back(Ok(StreamItem::Done));
                self.done = true;
                return;
            }
        }
    }

    fn ended_cleanly(&mut self) -> bool {
        // Without a `metadata` after it, the end of the body after
        // `messageStop` is the terminator.
        !self.done && self.stopped && self.buf.is_empty()
    }

    fn skip_malformed(&mut self) -> bool {
        self.skip = true;
        true
    }

    fn skipped(&self) -> u64 {
        self.skipped
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StreamEvent {
    #[serde(default)]
    content_block_index: u32,
    #[serde(default)]
    start: Option<StreamStart>,
    #[serde(default)]
    delta: Option<StreamDelta>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StreamStart {
    #[serde(default)]
    tool_use: Option<StreamToolStart>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StreamToolStart {
    name: String,
    tool_use_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StreamDelta {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool_use: Option<StreamToolDelta>,
}

#[derive(Deserialize)]
struct StreamToolDelta {
    #[serde(default)]
    input: String,
}

/// One ConverseStream event (`messageStart`, `contentBlockStart`,
/// `contentBlockDelta`, `contentBlockStop`, `messageStop`, `metadata`).
fn event(kind: &str, payload: &[u8]) -> Result<StreamItem, Failure> {
    if !matches!(
        kind,
        "contentBlockStart" | "contentBlockDelta" | "messageStop" | "metadata"
    ) {
        return Ok(StreamItem::Skip);
    }
    let e: StreamEvent = serde_json::from_slice(payload).map_err(|e| invalid_json(PROVIDER, &e))?;
    let index = e.content_block_index;
    let chunk = match kind {
        "contentBlockStart" => match e.start.and_then(|s| s.tool_use) {
            Some(t) => ChatChunk {
                tool_call: Some(ToolCallDelta {
                    index,
                    id: Some(t.tool_use_id),
                    name: Some(t.name),
                    arguments: String::new(),
                }),
                ..ChatChunk::default()
            },
            None => return Ok(StreamItem::Skip),
        },
        "contentBlockDelta" => match e.delta {
            Some(StreamDelta {
                text: Some(text), ..
            }) => ChatChunk {
                text: Some(text),
                ..ChatChunk::default()
            },
            Some(StreamDelta {
                tool_use: Some(t), ..
            }) => ChatChunk {
                tool_call: Some(ToolCallDelta {
                    index,
                    id: None,
                    name: None,
                    arguments: t.input,
                }),
                ..ChatChunk::default()
            },
            // Reasoning, citations, images: not normalised.
            _ => return Ok(StreamItem::Skip),
        },
        "messageStop" => ChatChunk {
            finish_reason: Some(finish_reason(e.stop_reason.as_deref())),
            ..ChatChunk::default()
        },
        _ => match e.usage {
            Some(u) => ChatChunk {
                usage: Some(usage(&u)),
                ..ChatChunk::default()
            },
            None => return Ok(StreamItem::Skip),
        },
    };
    Ok(StreamItem::Chunk(chunk))
}

/// An exception message of a stream, classified by its type (the HTTP
/// codes of the Smithy model: throttling 429, service unavailable 503,
/// internal 500, model stream error 424, validation 400).
fn exception(kind: &str, payload: &[u8], scrub: &Scrub) -> Failure {
    let e: WireError<'_> = serde_json::from_slice(payload).unwrap_or_default();
    let message = e.message.as_deref().unwrap_or_default();
    let class = match kind {
        "throttlingException" => FailureClass::RateLimited,
        "validationException" if is_context_window(message) => FailureClass::ContextWindowExceeded,
        "validationException" => FailureClass::BadRequest,
        "accessDeniedException" => FailureClass::Auth,
        // serviceUnavailable, internalServer, modelStreamError, unknown.
        _ => FailureClass::Transient,
    };
    let mut f = Failure::new(class).with_provider(PROVIDER);
    if !message.is_empty() {
        f = f.with_message(scrub.message(&format!("{kind}: {message}")));
    }
    f
}
