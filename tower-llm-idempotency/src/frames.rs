//! A stored stream's chunks, kept compactly.

use std::fmt;
use std::sync::Arc;

use serde::de::{SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tower_llm_core::{ChatChunk, Failure, FailureClass};

/// A stream's chunks in order, held as their JSON one after another in a
/// single buffer.
///
/// A [`ChatChunk`] in memory is a struct plus a heap string of its own:
/// for a one-token chunk five to ten times its JSON. A stored stream is
/// kept as this buffer instead, so what the store counts
/// ([`len_bytes`](Self::len_bytes)) is what it holds, give or take one
/// allocation. Replaying decodes one chunk at a time.
///
/// It serializes as a sequence of chunks (the same shape as a
/// `Vec<ChatChunk>`), so a shared store's stored answers read the same.
///
/// ```
/// use tower_llm_core::ChatChunk;
/// use tower_llm_idempotency::StreamFrames;
///
/// let mut frames = StreamFrames::builder();
/// for text in ["Hel", "lo"] {
///     frames.push(&ChatChunk {
///         text: Some(text.into()),
///         ..ChatChunk::default()
///     });
/// }
/// let frames = frames.finish();
/// assert_eq!(frames.len(), 2);
/// let texts: Vec<String> = frames
///     .iter()
///     .map(|c| c.unwrap().text.unwrap_or_default())
///     .collect();
/// assert_eq!(texts, ["Hel", "lo"]);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct StreamFrames {
    buf: Arc<[u8]>,
    count: usize,
}

impl StreamFrames {
    /// A builder that appends chunks one by one.
    pub fn builder() -> StreamFramesBuilder {
        StreamFramesBuilder {
            buf: Vec::new(),
            count: 0,
        }
    }

    /// The number of chunks.
    pub fn len(&self) -> usize {
        self.count
    }

    /// `true` when there is no chunk.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The bytes of the buffer (what the frames hold, less one
    /// allocation's bookkeeping).
    pub fn len_bytes(&self) -> usize {
        self.buf.len()
    }

    /// The chunks in order, decoded one at a time. An item is an error
    /// (`invalid_response`) only if the buffer was corrupted, which a
    /// buffer built by [`StreamFramesBuilder`] or deserialized never is.
    pub fn iter(&self) -> FramesIter {
        FramesIter {
            buf: self.buf.clone(),
            at: 0,
            left: self.count,
        }
    }
}

impl fmt::Debug for StreamFrames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamFrames")
            .field("chunks", &self.count)
            .field("bytes", &self.buf.len())
            .finish()
    }
}

impl From<Vec<ChatChunk>> for StreamFrames {
    fn from(chunks: Vec<ChatChunk>) -> Self {
        let mut frames = StreamFrames::builder();
        for chunk in &chunks {
            frames.push(chunk);
        }
        frames.finish()
    }
}

/// Appends chunks to a [`StreamFrames`] (see
/// [`StreamFrames::builder`]).
#[derive(Debug, Default)]
pub struct StreamFramesBuilder {
    buf: Vec<u8>,
    count: usize,
}

impl StreamFramesBuilder {
    /// Appends `chunk`.
    pub fn push(&mut self, chunk: &ChatChunk) {
        // Serializing a chunk into memory cannot fail (no maps with
        // non-string keys, no I/O); were it to, the chunk is not lost
        // silently: the frames would decode short, and are never built
        // from such a chunk (the count is only bumped on success).
        if serde_json::to_writer(&mut self.buf, chunk).is_ok() {
            self.count += 1;
        }
    }

    /// The bytes appended so far (for a per-answer bound while
    /// collecting).
    pub fn len_bytes(&self) -> usize {
        self.buf.len()
    }

    /// The frames, in a buffer of exactly their size.
    pub fn finish(self) -> StreamFrames {
        StreamFrames {
            buf: Arc::from(self.buf),
            count: self.count,
        }
    }
}

/// The chunks of a [`StreamFrames`], decoded one at a time (see
/// [`StreamFrames::iter`]).
#[derive(Debug, Clone)]
pub struct FramesIter {
    buf: Arc<[u8]>,
    at: usize,
    left: usize,
}

impl Iterator for FramesIter {
    type Item = Result<ChatChunk, Failure>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let rest = self.buf.get(self.at..).unwrap_or_default();
        let mut chunks = serde_json::Deserializer::from_slice(rest).into_iter::<ChatChunk>();
        match chunks.next() {
            Some(Ok(chunk)) => {
                self.at += chunks.byte_offset();
                Some(Ok(chunk))
            }
            _ => {
                self.left = 0;
                Some(Err(Failure::new(FailureClass::InvalidResponse)
                    .with_message("a stored stream's frames are corrupted")))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left))
    }
}

impl Serialize for StreamFrames {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.count))?;
        for chunk in self.iter() {
            let chunk = chunk.map_err(serde::ser::Error::custom)?;
            seq.serialize_element(&chunk)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for StreamFrames {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Chunks;
        impl<'de> Visitor<'de> for Chunks {
            type Value = StreamFrames;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence of stream chunks")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StreamFrames, A::Error> {
                let mut frames = StreamFrames::builder();
                while let Some(chunk) = seq.next_element::<ChatChunk>()? {
                    frames.push(&chunk);
                }
                Ok(frames.finish())
            }
        }
        deserializer.deserialize_seq(Chunks)
    }
}
