//! How a provider's stream bytes become [`StreamItem`]s: the [`Wire`]
//! trait and its server-sent-events implementation.

use std::collections::VecDeque;

use tower_llm_core::{ChatChunk, Failure};

use crate::failure::Scrub;
use crate::stream::{SseEvent, SseParser, StreamItem};

/// How a provider's stream bytes become [`StreamItem`]s.
pub(crate) trait Wire: Send + 'static {
    /// Feeds the next bytes; decoded items (or one failure) go to `out`.
    fn feed(&mut self, bytes: &[u8], out: &mut VecDeque<Result<StreamItem, Failure>>);

    /// At a clean end of the body, when no terminator came: `true` when
    /// the stream is complete anyway (the finish reason came and no event
    /// is cut), `false` when it was truncated.
    fn ended_cleanly(&mut self) -> bool {
        false
    }
}

/// Server-sent events decoded by one of the event functions of
/// [`stream`](crate::stream).
pub(crate) struct SseWire {
    parser: SseParser,
    decode: fn(&SseEvent, &Scrub) -> Result<StreamItem, Failure>,
    failed: bool,
    /// The choices seen so far, and which of them sent a finish reason.
    finishes: Finishes,
    /// The secrets sent, removed from in-band error messages that echo
    /// them (before the message is bounded).
    scrub: Scrub,
}

impl SseWire {
    pub(crate) fn new(
        decode: fn(&SseEvent, &Scrub) -> Result<StreamItem, Failure>,
        scrub: Scrub,
    ) -> Self {
        SseWire {
            parser: SseParser::new(),
            decode,
            failed: false,
            finishes: Finishes::default(),
            scrub,
        }
    }
}

impl Wire for SseWire {
    fn feed(&mut self, bytes: &[u8], out: &mut VecDeque<Result<StreamItem, Failure>>) {
        if self.failed {
            return;
        }
        let decode = self.decode;
        let mut failed = false;
        let scrub = &self.scrub;
        let finishes = &mut self.finishes;
        let parsed = self.parser.push_with(bytes, |event| {
            if failed {
                return;
            }
            match decode(&event, scrub) {
                Ok(StreamItem::Chunks(chunks)) => {
                    for c in &chunks {
                        finishes.note(c);
                    }
                    out.extend(chunks.into_iter().map(|c| Ok(StreamItem::Chunk(c))));
                }
                Ok(item) => {
                    if let StreamItem::Chunk(c) = &item {
                        finishes.note(c);
                    }
                    out.push_back(Ok(item));
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
