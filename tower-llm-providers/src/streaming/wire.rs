//! How a provider's stream bytes become [`StreamItem`]s: the [`Wire`]
//! trait and its server-sent-events implementation.

use std::collections::VecDeque;
use std::fmt;

use tower_llm_core::{ChatChunk, Failure, FailureClass};

use crate::stream::{SseEvent, SseParser, StreamItem};

/// How a provider's stream bytes become [`StreamItem`]s: the framing of
/// its streamed answers and the meaning of each event, fed the body's
/// bytes as they arrive, in chunks of any size. A
/// [`Dialect`](crate::Dialect) gives one per stream
/// ([`Dialect::wire`](crate::Dialect::wire)): [`SseWire`] for the
/// server-sent events most providers send, or its own (Bedrock's
/// [`EventStreamWire`](crate::bedrock::EventStreamWire)).
///
/// The streaming service reads the items in order: the first content
/// chunk is the commit point, [`StreamItem::Done`] the terminator, and an
/// `Err` ends the stream (feed nothing after it).
pub trait Wire: Send + Unpin + 'static {
    /// Feeds the next bytes of the body; the items they complete (or one
    /// failure, after which the wire stays silent) go to `out`.
    fn feed(&mut self, bytes: &[u8], out: &mut VecDeque<Result<StreamItem, Failure>>);

    /// At a clean end of the body, when no terminator came: `true` when
    /// the stream is complete anyway (the finish reason came and no event
    /// is cut), `false` when it was truncated. Default: `false`.
    fn ended_cleanly(&mut self) -> bool {
        false
    }

    /// Asks the wire to skip, from now on, each malformed event (framing
    /// whole, content that does not decode: an invalid-response failure of
    /// the event's decoder) that comes after the first content chunk it has
    /// produced, counting it in [`skipped`](Self::skipped) instead of
    /// failing. Before that chunk (the stream's commit point) such an event
    /// still fails; framing failures and in-band error events always do.
    /// Returns `true` when the wire can; the default returns `false`, and
    /// the wire fails on a malformed event as before. The streaming service
    /// calls it once, before feeding anything, when set to
    /// [`MalformedChunks::Skip`](crate::streaming::MalformedChunks::Skip).
    fn skip_malformed(&mut self) -> bool {
        false
    }

    /// How many malformed events the wire has skipped so far (0 for a
    /// wire that does not skip).
    fn skipped(&self) -> u64 {
        0
    }
}

/// The decoder of one server-sent event.
type DecodeEvent = Box<dyn FnMut(&SseEvent) -> Result<StreamItem, Failure> + Send>;

/// A [`Wire`] for server-sent events: the bytes are split into events by
/// an [`SseParser`], and each event is decoded by the function given
/// (OpenAI's and Anthropic's are in [`stream`](crate::stream)).
///
/// A body that ends cleanly without its terminator is complete when it
/// ends between two events after a finish reason for every choice that
/// started (a choice starts with its first chunk that is not usage-only).
///
/// It can [skip malformed events](Wire::skip_malformed): an event whose
/// decoder answers an invalid-response failure after the first content
/// chunk is then dropped and counted. The parser's own failures (an event
/// over [`MAX_EVENT`](crate::stream::MAX_EVENT), a line that is not UTF-8)
/// still end the stream: the framing cannot be trusted after them.
///
/// ```
/// use std::collections::VecDeque;
/// use tower_llm_providers::dialect::{SseWire, Wire};
/// use tower_llm_providers::stream::openai_event;
///
/// let mut wire = SseWire::new(openai_event);
/// let mut out = VecDeque::new();
/// wire.feed(b"data: {\"choices\": [{\"delta\": {\"content\": \"Hi\"}}]}\n\n", &mut out);
/// assert!(out.pop_front().unwrap().unwrap().is_content());
/// ```
pub struct SseWire {
    parser: SseParser,
    decode: DecodeEvent,
    failed: bool,
    /// The choices seen so far, and which of them sent a finish reason.
    finishes: Finishes,
    /// Skip malformed events after the first content chunk.
    skip: bool,
    /// A content chunk was produced (the stream's commit point).
    content: bool,
    /// Malformed events skipped.
    skipped: u64,
}

impl SseWire {
    /// Events decoded by `decode`. A decoder that keeps a provider's
    /// message in a failure must remove the secrets sent from it first.
    pub fn new(
        decode: impl FnMut(&SseEvent) -> Result<StreamItem, Failure> + Send + 'static,
    ) -> Self {
        SseWire {
            parser: SseParser::new(),
            decode: Box::new(decode),
            failed: false,
            finishes: Finishes::default(),
            skip: false,
            content: false,
            skipped: 0,
        }
    }
}

impl fmt::Debug for SseWire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseWire")
            .field("parser", &self.parser)
            .field("failed", &self.failed)
            .field("finishes", &self.finishes)
            .field("skip", &self.skip)
            .field("content", &self.content)
            .field("skipped", &self.skipped)
            .finish_non_exhaustive()
    }
}

impl Wire for SseWire {
    fn feed(&mut self, bytes: &[u8], out: &mut VecDeque<Result<StreamItem, Failure>>) {
        if self.failed {
            return;
        }
        let decode = &mut self.decode;
        let mut failed = false;
        let finishes = &mut self.finishes;
        let skip = self.skip;
        let content = &mut self.content;
        let skipped = &mut self.skipped;
        let parsed = self.parser.push_with(bytes, |event| {
            if failed {
                return;
            }
            match decode(&event) {
                Ok(item) => {
                    *content |= item.is_content();
                    match item {
                        StreamItem::Chunks(chunks) => {
                            for c in &chunks {
                                finishes.note(c);
                            }
                            out.extend(chunks.into_iter().map(|c| Ok(StreamItem::Chunk(c))));
                        }
                        item => {
                            if let StreamItem::Chunk(c) = &item {
                                finishes.note(c);
                            }
                            out.push_back(Ok(item));
                        }
                    }
                }
                Err(f) if skip && *content && f.class() == FailureClass::InvalidResponse => {
                    *skipped = skipped.saturating_add(1);
                }
                Err(f) => {
                    failed = true;
                    out.push_back(Err(f));
                }
            }
        });
        if let Err(f) = parsed {
            out.push_back(Err(f));
            failed = true;
        }
        self.failed = failed;
    }

    fn ended_cleanly(&mut self) -> bool {
        // No terminator (`[DONE]`, `message_stop`) came, but the body
        // ended at an event's end after every choice that started sent
        // its finish reason: the answer is complete.
        !self.failed && self.parser.is_between_events() && self.finishes.all_finished()
    }

    fn skip_malformed(&mut self) -> bool {
        self.skip = true;
        true
    }

    fn skipped(&self) -> u64 {
        self.skipped
    }
}

/// Which choices of a stream have started, and which of them have sent
/// their finish reason: the proof that a stream whose body ends cleanly
/// without its terminator is complete.
#[derive(Debug, Default)]
struct Finishes {
    /// Choice index → finished.
    choices: std::collections::BTreeMap<u32, bool>,
    /// How many started choices have no finish reason yet.
    open: usize,
}

impl Finishes {
    /// Notes a decoded chunk: any chunk but a usage-only one (a choice
    /// index of 0 by default) starts its choice; a finish reason ends it.
    fn note(&mut self, chunk: &ChatChunk) {
        let finished = chunk.finish_reason.is_some();
        if !finished && chunk.text.is_none() && chunk.tool_call.is_none() {
            return;
        }
        match self.choices.entry(chunk.index) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(finished);
                self.open += usize::from(!finished);
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                if finished && !*o.get() {
                    o.insert(true);
                    self.open -= 1;
                }
            }
        }
    }

    /// `true` when at least one choice started and every one that did has
    /// sent its finish reason.
    fn all_finished(&self) -> bool {
        !self.choices.is_empty() && self.open == 0
    }
}
